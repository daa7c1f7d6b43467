/*
 * ops_avx2.c - AVX2 + FMA + F16C versions of the non-matmul inner loops
 * (attention dots, softmax, weighted sums, activations, the activation
 * quantizers): the generic kernels' operations 8 lanes at a time, giving the
 * same bits (backend/kernel_set.h says what each computes).
 *
 * Compiled for AVX2 by pragma, like vec_dot_avx2.c: backends_x86.c hands these out
 * only on CPUs with AVX2 and FMA.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "x86/x86.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi2")
#endif

#include "x86/simd_avx2.h"

static inline __m256 halves_to_floats8(const fp16_t *h) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }

/* The lanes of acc, then the tail elements from i on, reduced as the generic kernel reduces them. */
static inline float attention_finish(__m256 acc, const float *q, const fp16_t *k, int64_t i, int64_t d) {
    if (i == d) return lanes_total(acc);  /* no tail: the same tree in registers */
    float lane[8];
    _mm256_storeu_ps(lane, acc);
    for (; i < d; ++i) lane[i % 8] = fmaf(q[i], half_to_float(k[i]), lane[i % 8]);
    return reduce_lanes8(lane);
}

/* Eight keys at a time: eight independent FMA chains, enough to cover the FMA latency (four left the
 * multiply pipes half idle: bench/README.md), then any last keys one by one. */
static void attention_dots_avx2(const float *q, const fp16_t *k, int64_t stride, int64_t n, int64_t d, float *out) {
    const int64_t d8 = d / 8 * 8;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const fp16_t *kj = k + j * stride;
        __m256 acc[8];
#pragma GCC unroll 8
        for (int t = 0; t < 8; ++t) acc[t] = _mm256_setzero_ps();
        for (int64_t i = 0; i < d8; i += 8) {
            const __m256 qi = _mm256_loadu_ps(q + i);
#pragma GCC unroll 8
            for (int t = 0; t < 8; ++t) acc[t] = _mm256_fmadd_ps(qi, halves_to_floats8(kj + t * stride + i), acc[t]);
        }
#pragma GCC unroll 8
        for (int t = 0; t < 8; ++t) out[j + t] = attention_finish(acc[t], q, kj + t * stride, d8, d);
    }
    for (; j < n; ++j) {
        const fp16_t *kj = k + j * stride;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < d8; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), halves_to_floats8(kj + i), acc);
        out[j] = attention_finish(acc, q, kj, d8, d);
    }
}

/* exp_ggml (vec_dot_generic.c) on 8 lanes: the same operations, so the same bits. */
static inline __m256 exp_ggml8(__m256 x) {
    const __m256 shifter = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shifter);
    const __m256 n = _mm256_sub_ps(z, shifter);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
    const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    const __m256 normal = _mm256_fmadd_ps(k, j, k);
    if (!_mm256_movemask_ps(big)) return normal;
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 scaled = _mm256_blendv_ps(normal, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1), big);
    return _mm256_blendv_ps(scaled, _mm256_mul_ps(s1, s1), huge);
}

/* softmax_half's exponentials and their sum's inverse, in place of the scores */
static float softmax_exps_avx2(float *s, int64_t n, float max) {
    const __m256 vmax = _mm256_set1_ps(max), masked_score = _mm256_set1_ps(-INFINITY);
    double sum = 0.0;
    for (int64_t g = 0; g < n; g += 8) {
        /* a last partial group goes through a copy padded with masked scores */
        float pad[8];
        const int64_t len = n - g < 8 ? n - g : 8;
        float *group = s + g;
        if (len < 8) {
            for (int64_t l = 0; l < 8; ++l) pad[l] = l < len ? s[g + l] : -INFINITY;
            group = pad;
        }
        const __m256 x = _mm256_loadu_ps(group);
        const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(x, masked_score, _CMP_EQ_OQ),
                                          exp_ggml8(_mm256_sub_ps(x, vmax)));
        _mm256_storeu_ps(group, e);
        if (len < 8) for (int64_t l = 0; l < len; ++l) s[g + l] = pad[l];
        sum += (double)lanes_total(e);
    }
    return (float)(1.0 / sum);
}

static void softmax_half_avx2(float *s, int64_t n, float max) {
    const __m256 inv = _mm256_set1_ps(softmax_exps_avx2(s, n, max));
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const __m128i half = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(s + t), inv), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(s + t, _mm256_cvtph_ps(half));
    }
    for (; t < n; ++t) s[t] = _cvtsh_ss(_cvtss_sh(s[t] * _mm256_cvtss_f32(inv), _MM_FROUND_TO_NEAREST_INT));
}

static void softmax_avx2(float *s, int64_t n, float max) {
    const float inv = softmax_exps_avx2(s, n, max);
    const __m256 inv8 = _mm256_set1_ps(inv);
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) _mm256_storeu_ps(s + t, _mm256_mul_ps(_mm256_loadu_ps(s + t), inv8));
    for (; t < n; ++t) s[t] = s[t] * inv;
}

/* 8 output dims at a time, the 8 slot lanes in registers across all the values. */
/* Lane l of weighted_sum over c vectors (8 dims each) of the values from dim i: the chain of keys
 * t = l, l + 8, ... (each key's 16 * c bytes read once; whole cache lines at c = 8, unrolled by hand so the
 * eight chains stay in registers). */
static void weighted_lane(const float *p, const fp16_t *v, int64_t stride, int64_t n, int64_t i, int c, int l,
                          float *lane) {
    __m256 acc[8];
    for (int j = 0; j < c; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t t = l; t < n; t += 8) {
        if (p[t] == 0.0f) continue;
        const __m256 weight = _mm256_set1_ps(p[t]);
        const fp16_t *row = v + t * stride + i;
        for (int j = 0; j < c; ++j) acc[j] = _mm256_fmadd_ps(weight, halves_to_floats8(row + 8 * j), acc[j]);
    }
    for (int j = 0; j < c; ++j) _mm256_storeu_ps(lane + 8 * j, acc[j]);
}

static void weighted_lane64(const float *p, const fp16_t *v, int64_t stride, int64_t n, int64_t i, int l, float *lane) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int64_t t = l; t < n; t += 8) {
        if (p[t] == 0.0f) continue;
        const __m256 weight = _mm256_set1_ps(p[t]);
        const fp16_t *row = v + t * stride + i;
        a0 = _mm256_fmadd_ps(weight, halves_to_floats8(row), a0);
        a1 = _mm256_fmadd_ps(weight, halves_to_floats8(row + 8), a1);
        a2 = _mm256_fmadd_ps(weight, halves_to_floats8(row + 16), a2);
        a3 = _mm256_fmadd_ps(weight, halves_to_floats8(row + 24), a3);
        a4 = _mm256_fmadd_ps(weight, halves_to_floats8(row + 32), a4);
        a5 = _mm256_fmadd_ps(weight, halves_to_floats8(row + 40), a5);
        a6 = _mm256_fmadd_ps(weight, halves_to_floats8(row + 48), a6);
        a7 = _mm256_fmadd_ps(weight, halves_to_floats8(row + 56), a7);
    }
    _mm256_storeu_ps(lane, a0), _mm256_storeu_ps(lane + 8, a1), _mm256_storeu_ps(lane + 16, a2);
    _mm256_storeu_ps(lane + 24, a3), _mm256_storeu_ps(lane + 32, a4), _mm256_storeu_ps(lane + 40, a5);
    _mm256_storeu_ps(lane + 48, a6), _mm256_storeu_ps(lane + 56, a7);
}

static void weighted_sum_avx2(const float *p, const fp16_t *v, int64_t stride, int64_t n, int64_t d, float *out) {
    float lanes[8][64];
    int64_t i = 0;
    while (i + 8 <= d) {
        const int c = d - i >= 64 ? 8 : (int)((d - i) / 8);
        for (int l = 0; l < 8; ++l) {
            if (c == 8) weighted_lane64(p, v, stride, n, i, l, lanes[l]);
            else weighted_lane(p, v, stride, n, i, c, l, lanes[l]);
        }
        for (int j = 0; j < 8 * c; j += 8) {  /* reduce_lanes8's tree */
#define LANE(l) _mm256_loadu_ps(lanes[l] + j)
            const __m256 total = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(LANE(0), LANE(4)), _mm256_add_ps(LANE(2), LANE(6))),
                                               _mm256_add_ps(_mm256_add_ps(LANE(1), LANE(5)), _mm256_add_ps(LANE(3), LANE(7))));
#undef LANE
            _mm256_storeu_ps(out + i + j, total);
        }
        i += 8 * c;
    }
    for (; i < d; ++i) {
        float lane[8] = {0};
        for (int64_t t = 0; t < n; ++t) {
            if (p[t] != 0.0f) lane[t % 8] = fmaf(p[t], half_to_float(v[t * stride + i]), lane[t % 8]);
        }
        out[i] = reduce_lanes8(lane);
    }
}

static void swiglu_avx2(const float *g, const float *u, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f),
                                                           exp_ggml8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; ++i) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* ---- activation quantizers (the scalar ones' values: max |x| skips NaN, round half to even, clamp) ---- */

static inline float max_abs(const float *x, int64_t n) {
    __m256 amax = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j += 8) {  /* max_ps returns its second operand, amax, when |x| is NaN */
        amax = _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + j)), amax);
    }
    return lanes_max(amax);
}

/* round(x * scale) clamped to [-127, 127], NaN -> -127 (max_ps returns -127 for a NaN first operand) */
static inline __m256i quantize8(const float *x, __m256 scale) {
    const __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x), scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f)));
}

/* 4 x 8 int32 in [-127, 127] -> 32 int8 in order */
static inline void store_i8x32(int8_t *dst, __m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    _mm256_storeu_si256((__m256i *)dst, _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* One q8_0 / q8_1 block: the quants, their sum, and the unrounded d. */
static inline float quantize_block32(const float *x, int8_t *qs, int32_t *sum) {
    const float amax = max_abs(x, QK32);
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    const __m256i a = quantize8(x, id), b = quantize8(x + 8, id), c = quantize8(x + 16, id), d = quantize8(x + 24, id);
    store_i8x32(qs, a, b, c, d);
    *sum = hsum_i32x8(_mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d)));
    return amax / 127.0f;
}

static void quantize_q8_0_avx2(const float *x, void *dst, int64_t n) {
    block_q8_0 *y = dst;
    int32_t sum;
    for (int64_t b = 0; b < n / QK32; ++b) y[b].d = float_to_half(quantize_block32(x + b * QK32, y[b].qs, &sum));
}

static void quantize_q8_1_avx2(const float *x, void *dst, int64_t n) {
    block_q8_1 *y = dst;
    for (int64_t b = 0; b < n / QK32; ++b) {
        int32_t sum;
        const float d = quantize_block32(x + b * QK32, y[b].qs, &sum);
        y[b].d = float_to_half(d);
        y[b].s = float_to_half(d * (float)sum);
    }
}

/* q8_K: the first element of largest |x| maps to -127 */
static void quantize_q8_K_avx2(const float *x, void *dst, int64_t n) {
    block_q8_K *y = dst;
    for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
        const __m256 amax = _mm256_set1_ps(max_abs(x, QK_K));
        float max = 0.0f;
        for (int j = 0; j < QK_K; j += 8) {
            const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + j)), amax, _CMP_EQ_OQ));
            if (hits != 0) {
                max = x[j + __builtin_ctz((unsigned)hits)];
                break;
            }
        }
        if (max == 0.0f) {
            memset(&y[b], 0, sizeof(y[b]));
            continue;
        }
        const float iscale = -127.0f / max;
        const __m256 scale = _mm256_set1_ps(iscale);
        for (int j = 0; j < QK_K; j += 32) {
            const __m256i q0 = quantize8(x + j, scale), q1 = quantize8(x + j + 8, scale);
            const __m256i q2 = quantize8(x + j + 16, scale), q3 = quantize8(x + j + 24, scale);
            store_i8x32(y[b].qs + j, q0, q1, q2, q3);
            y[b].bsums[j / 16] = (int16_t)hsum_i32x8(_mm256_add_epi32(q0, q1));
            y[b].bsums[j / 16 + 1] = (int16_t)hsum_i32x8(_mm256_add_epi32(q2, q3));
        }
        y[b].d = 1.0f / iscale;
    }
}

/* The table entries of 8 halves: 4-byte gathers at 2-byte steps (the table has an entry to spare), the low
 * halves packed, then widened to floats. */
static void geglu_avx2(const fp16_t *gelu_table, const float *g, const float *u, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gate = _mm256_loadu_ps(g + i), up = _mm256_loadu_ps(u + i);
        const __m256i index = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(gate, _MM_FROUND_TO_NEAREST_INT));
        const __m256i pairs = _mm256_i32gather_epi32((const int *)gelu_table, index, 2);
        const __m256i low = _mm256_and_si256(pairs, _mm256_set1_epi32(0xFFFF));
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(low, low), _MM_SHUFFLE(3, 1, 2, 0));
        const __m256 gelu = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
        __m256 out = _mm256_mul_ps(gelu, up);
        out = _mm256_blendv_ps(out, _mm256_mul_ps(gate, up), _mm256_cmp_ps(gate, _mm256_set1_ps(10.0f), _CMP_GE_OQ));
        out = _mm256_andnot_ps(_mm256_cmp_ps(gate, _mm256_set1_ps(-10.0f), _CMP_LE_OQ), out);
        _mm256_storeu_ps(y + i, out);
    }
    for (; i < n; ++i) {
        if (g[i] <= -10.0f) y[i] = 0.0f;
        else if (g[i] >= 10.0f) y[i] = g[i] * u[i];
        else y[i] = half_to_float(gelu_table[fp32_to_fp16(g[i])]) * u[i];
    }
}

static void to_half_avx2(const float *x, fp16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

static void round_half_avx2(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
    }
    for (; i < n; ++i) y[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
}

/* Four pairs (2i, 2i + 1) a vector, their cosines and sines as they lie (c0 s0 c1 s1 ..): lane 2i takes
 * fma(x_a, c, -(x_b * s)), lane 2i + 1 fma(x_a, s, x_b * c), the second operands of both from the swapped
 * angles and the negation a sign flip; or, neox, eight pairs (i, i + half) a vector, the angles split into
 * cosines and sines. The rest pair by pair. */
static void rope_head_avx2(float *head, const float *cos_sin, int64_t n_rot, int neox) {
    const int64_t half = n_rot / 2;
    int64_t i = 0;
    if (neox) {
        for (; i + 8 <= half; i += 8) {
            const __m256 lo = _mm256_loadu_ps(cos_sin + 2 * i), hi = _mm256_loadu_ps(cos_sin + 2 * i + 8);
            const __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8));
            const __m256 s = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8));
            const __m256 x0 = _mm256_loadu_ps(head + i), x1 = _mm256_loadu_ps(head + i + half);
            _mm256_storeu_ps(head + i, _mm256_fmadd_ps(x0, c, _mm256_xor_ps(_mm256_mul_ps(x1, s), _mm256_set1_ps(-0.0f))));
            _mm256_storeu_ps(head + i + half, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
        }
    } else {
        const __m256 negate_even = _mm256_setr_ps(-0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f);
        for (; i + 4 <= half; i += 4) {
            const __m256 cs = _mm256_loadu_ps(cos_sin + 2 * i), x = _mm256_loadu_ps(head + 2 * i);
            const __m256 sc = _mm256_permute_ps(cs, 0xB1);  /* s0 c0 s1 c1 .. */
            const __m256 x_a = _mm256_moveldup_ps(x), x_b = _mm256_movehdup_ps(x);
            _mm256_storeu_ps(head + 2 * i, _mm256_fmadd_ps(x_a, cs, _mm256_xor_ps(_mm256_mul_ps(x_b, sc), negate_even)));
        }
    }
    rope_head_pairs(head, cos_sin, i, n_rot, neox);
}

/* Two passes: the maximum 8 lanes at a time (max_ps keeps the running maximum where x is NaN, which a separate
 * unordered compare records), then the first entry equal to it. */
static int64_t argmax_avx2(const float *x, int64_t n, int *nan) {
    __m256 best = _mm256_set1_ps(-INFINITY), unordered = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        best = _mm256_max_ps(v, best);
        unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float max = lanes_max(best);
    int seen_nan = _mm256_movemask_ps(unordered) != 0;
    for (int64_t j = i; j < n; ++j) {
        seen_nan |= isnan(x[j]);
        if (x[j] > max) max = x[j];
    }
    *nan = seen_nan;
    const __m256 target = _mm256_set1_ps(max);
    for (i = 0; i + 8 <= n; i += 8) {
        const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), target, _CMP_EQ_OQ));
        if (hits) return i + __builtin_ctz((unsigned)hits);
    }
    for (; i < n; ++i) {
        if (x[i] == max) return i;
    }
    return 0;  /* every entry NaN */
}

/* max_ps(v, max) keeps max where v is NaN, as the generic comparison does; which zero a tie of +0 and -0 keeps may
 * differ (the softmax's s - max is the same either way). */
static float scale_max_avx2(float *s, int64_t n, float scale) {
    const __m256 factor = _mm256_set1_ps(scale);
    __m256 best = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + i), factor);
        _mm256_storeu_ps(s + i, v);
        best = _mm256_max_ps(v, best);
    }
    float max = lanes_max(best);
    for (; i < n; ++i) {
        s[i] *= scale;
        max = s[i] > max ? s[i] : max;
    }
    return max;
}

static void scale_row_avx2(const float *x, const float *w, float *y, int64_t n, float scale) {
    const __m256 factor = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(x + i), factor);
        _mm256_storeu_ps(y + i, w ? _mm256_mul_ps(scaled, _mm256_loadu_ps(w + i)) : scaled);
    }
    for (; i < n; ++i) y[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

static void add_scaled_avx2(float *y, float w, const float *x, int64_t n) {
    const __m256 weight = _mm256_set1_ps(w);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(weight, _mm256_loadu_ps(x + i))));
    }
    for (; i < n; ++i) y[i] = y[i] + w * x[i];
}

static void dequantize_q8_0_avx2(const void *blocks, float *y, int64_t n) {
    const block_q8_0 *b = blocks;
    for (int64_t i = 0; i < n / QK32; ++i, y += QK32) {
        const __m256 d = _mm256_set1_ps(fp16_to_fp32(b[i].d));
        for (int j = 0; j < QK32; j += 8) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b[i].qs + j)));
            _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}

static void dequantize_q4_0_avx2(const void *blocks, float *y, int64_t n) {
    const block_q4_0 *b = blocks;
    const __m128i low = _mm_set1_epi8(0xF), eight = _mm_set1_epi8(8);
    for (int64_t i = 0; i < n / QK32; ++i, y += QK32) {
        const __m256 d = _mm256_set1_ps(fp16_to_fp32(b[i].d));
        const __m128i qs = _mm_loadu_si128((const __m128i *)b[i].qs);
        const __m128i halves[2] = {_mm_sub_epi8(_mm_and_si128(qs, low), eight),
                                   _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(qs, 4), low), eight)};
        for (int h = 0; h < 2; ++h) {
            const __m256i q0 = _mm256_cvtepi8_epi32(halves[h]), q1 = _mm256_cvtepi8_epi32(_mm_srli_si128(halves[h], 8));
            _mm256_storeu_ps(y + 16 * h, _mm256_mul_ps(_mm256_cvtepi32_ps(q0), d));
            _mm256_storeu_ps(y + 16 * h + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(q1), d));
        }
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const op_kernels op_kernels_avx2 = {attention_dots_avx2, softmax_half_avx2, weighted_sum_avx2, swiglu_avx2,
                                     quantize_q8_0_avx2, quantize_q8_1_avx2, quantize_q8_K_avx2, geglu_avx2,
                                     to_half_avx2, round_half_avx2, rope_head_avx2, argmax_avx2, scale_max_avx2, scale_row_avx2,
                                     add_scaled_avx2, dequantize_q8_0_avx2, dequantize_q4_0_avx2,
                                     softmax_avx2};

#endif
