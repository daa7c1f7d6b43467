/*
 * ops_avx512.c - a prompt's attention on AVX-512 (backend/kernel_set.h, prompt_attention_kernels): keys and values
 * converted to float once for a block of queries, then 16 keys (dot products) or 16 dimensions (weighted
 * sums) in the lanes of a vector, each lane in the order of the generic dots and weighted_sum. A key block
 * (16 keys of d floats) or a value chunk (16 dimensions of every key) is what stays in L1 while ops.c runs
 * the block's queries over it.
 *
 * And a decode row's attention (head_group_kernels): the heads of a row that share a kv head (GQA) take each
 * key and value converted once, in the 8 lanes of the generic kernels, with the 32 registers AVX-512 gives
 * for 8 keys or 64 dimensions of up to 3 heads at a time (4 keys or 32 dimensions of 4).
 *
 * Compiled for AVX-512 F by pragma; backends_x86.c hands these out only on CPUs with it.
 */
#include "x86/x86.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq")
#endif

#include "x86/simd_avx2.h"

/* kt: 16-key blocks, block b's dimension i of key 16 b + j at kt[(b * d + i) * 16 + j], by gathers of the
 * keys' two halves at i and i + 1 (a last block's missing keys zero; d is even); vf: 16-dimension chunks,
 * chunk c's value of key t at vf[(c * n + t) * 16 + j]. So each kernel below reads its operand in order. */
static void kv_to_float_avx512(const fp16_t *k, const fp16_t *v, int64_t stride, int64_t n, int64_t d, float *kt,
                               float *vf) {
    const __m512i keys = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int32_t)(stride * (int64_t)sizeof(fp16_t))));
    for (int64_t t0 = 0; t0 < n; t0 += 16) {
        const __mmask16 real = n - t0 >= 16 ? 0xFFFF : (__mmask16)((1u << (n - t0)) - 1);
        const fp16_t *block = k + t0 * stride;
        float *out = kt + t0 * d;
        for (int64_t i = 0; i < d; i += 2) {
            const __m512i pairs = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), real, keys, block + i, 1);
            _mm512_store_ps(out + i * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(pairs)));
            _mm512_store_ps(out + (i + 1) * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16))));
        }
    }
    for (int64_t c = 0; c < d / 16; ++c) {
        for (int64_t t = 0; t < n; ++t) {
            const __m256i halves = _mm256_loadu_si256((const __m256i *)(v + t * stride + 16 * c));
            _mm512_store_ps(vf + (c * n + t) * 16, _mm512_cvtph_ps(halves));
        }
    }
}

/* The 16 keys of one block of kt: accumulator l (lanes: the keys) takes dimensions i = l mod 8 in order, then
 * the halving tree across the eight, as dots_generic's lanes. */
static void dots_t_avx512(const float *q, const float *block, int64_t d, float *out) {
    __m512 acc[8];
    for (int l = 0; l < 8; ++l) acc[l] = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
#pragma GCC unroll 8
        for (int l = 0; l < 8; ++l) acc[l] = _mm512_fmadd_ps(_mm512_set1_ps(q[i + l]), _mm512_load_ps(block + (i + l) * 16), acc[l]);
    }
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[2], acc[6])),
                                        _mm512_add_ps(_mm512_add_ps(acc[1], acc[5]), _mm512_add_ps(acc[3], acc[7]))));
}

/* Key t's step of a weighted_sum chain: acc += p[t] * value, skipped (by mask, not a branch) where p[t] is 0. */
static inline __m512 weighted_step(__m512 acc, float p, const float *value) {
    const __m512 weight = _mm512_set1_ps(p);
    return _mm512_mask3_fmadd_ps(weight, _mm512_load_ps(value), acc, _mm512_cmpneq_ps_mask(weight, _mm512_setzero_ps()));
}

/* 16 dimensions of weighted_sum over one chunk of vf (its keys from p's first on): the eight chains of keys
 * t = l mod 8 (t counted from p's start, a multiple of 8 from the cache's) and their tree. */
static void weighted_sum_f_avx512(const float *p, const float *chunk, int64_t n, float *out) {
    __m512 acc[8];
    for (int l = 0; l < 8; ++l) acc[l] = _mm512_setzero_ps();
    int64_t t8 = 0;
    for (; t8 + 8 <= n; t8 += 8) {
#pragma GCC unroll 8
        for (int l = 0; l < 8; ++l) acc[l] = weighted_step(acc[l], p[t8 + l], chunk + (t8 + l) * 16);
    }
    for (int l = 0; t8 + l < n; ++l) acc[l] = weighted_step(acc[l], p[t8 + l], chunk + (t8 + l) * 16);
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[2], acc[6])),
                                        _mm512_add_ps(_mm512_add_ps(acc[1], acc[5]), _mm512_add_ps(acc[3], acc[7]))));
}

/* ---- a decode row's heads that share a kv head: each key or value converted once for all of them ---- */

#define KERNEL_INLINE static inline __attribute__((always_inline))

/* reduce_lanes8 of each of a0..a7 (its tree: lanes l + l + 4, then those 0 + 2 and 1 + 3, then the two), all
 * eight at once: lane j of the result is a_j's total. */
KERNEL_INLINE __m256 totals8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
#define HALVES(x, y) _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31))
    /* s01 = [a0's 4 sums | a1's], s23, s45, s67 likewise */
    const __m256 s01 = HALVES(a0, a1), s23 = HALVES(a2, a3), s45 = HALVES(a4, a5), s67 = HALVES(a6, a7);
#undef HALVES
    /* t0 = [a0's 2 sums, a2's | a1's, a3's], t1 the same of a4..a7 */
    const __m256 t0 = _mm256_add_ps(_mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 t1 = _mm256_add_ps(_mm256_shuffle_ps(s45, s67, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(s45, s67, _MM_SHUFFLE(3, 2, 3, 2)));
    /* [a0, a2, a4, a6 | a1, a3, a5, a7] */
    const __m256 total = _mm256_add_ps(_mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(total, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

KERNEL_INLINE __m256 key_halves(const fp16_t *h) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }

/* n_keys (8, 4 or 1) keys from k against g heads' queries (q + h * d): g * n_keys chains of 8 lanes. */
KERNEL_INLINE void dots_keys(const float *q, const fp16_t *k, int64_t stride, int64_t d, float *out,
                             int64_t out_stride, const int g, const int n_keys) {
    __m256 acc[8][4];
#pragma GCC unroll 8
    for (int j = 0; j < n_keys; ++j) {
#pragma GCC unroll 4
        for (int h = 0; h < g; ++h) acc[j][h] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < d; i += 8) {
        __m256 qi[4];
#pragma GCC unroll 4
        for (int h = 0; h < g; ++h) qi[h] = _mm256_loadu_ps(q + h * d + i);
#pragma GCC unroll 8
        for (int j = 0; j < n_keys; ++j) {
            const __m256 key = key_halves(k + j * stride + i);
#pragma GCC unroll 4
            for (int h = 0; h < g; ++h) acc[j][h] = _mm256_fmadd_ps(qi[h], key, acc[j][h]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < g; ++h) {
        if (n_keys == 8) {
            _mm256_storeu_ps(out + h * out_stride, totals8(acc[0][h], acc[1][h], acc[2][h], acc[3][h], acc[4][h],
                                                           acc[5][h], acc[6][h], acc[7][h]));
        } else if (n_keys == 4) {
            const __m256 t = totals8(acc[0][h], acc[1][h], acc[2][h], acc[3][h], acc[0][h], acc[1][h], acc[2][h], acc[3][h]);
            _mm_storeu_ps(out + h * out_stride, _mm256_castps256_ps128(t));
        } else {
            out[h * out_stride] = lanes_total(acc[0][h]);
        }
    }
}

/* g (1 to 4) heads: blocks of 8 keys (4 for 4 heads: 16 chains in registers), then the last keys one by one. */
KERNEL_INLINE void dots_group(const float *q, const fp16_t *k, int64_t stride, int64_t n, int64_t d, float *out,
                              int64_t out_stride, const int g) {
    const int block = g == 4 ? 4 : 8;
    int64_t j = 0;
    for (; j + block <= n; j += block) dots_keys(q, k + j * stride, stride, d, out + j, out_stride, g, block);
    for (; j < n; ++j) dots_keys(q, k + j * stride, stride, d, out + j, out_stride, g, 1);
}

/* RUN(h, c) for the g heads in runs of four from head h (c: the run's heads, a constant 1 to 4, so each run size
 * gets its own unrolled kernel). */
#define EACH_HEAD_RUN(g, RUN)                                        \
    for (int64_t h = 0; h < (g); h += 4) {                           \
        switch ((g) - h >= 4 ? 4 : (g) - h) {                        \
        case 1: RUN(h, 1); break;                                    \
        case 2: RUN(h, 2); break;                                    \
        case 3: RUN(h, 3); break;                                    \
        default: RUN(h, 4); break;                                   \
        }                                                            \
    }

static void dots_heads_avx512(const float *q, int64_t g, const fp16_t *k, int64_t stride, int64_t n, int64_t d,
                              float *out, int64_t out_stride) {
#define DOTS_RUN(h, c) dots_group(q + (h) * d, k, stride, n, d, out + (h) * out_stride, out_stride, c)
    EACH_HEAD_RUN(g, DOTS_RUN)
#undef DOTS_RUN
}

/* Lane l (keys t = l mod 8 of p) of weighted_sum for g heads over 8 * n_chunks dimensions from i: each value
 * converted once, a head's step skipped (by mask) where its weight is 0; lane[(h * 8 + l) * 64 + 8 c + e]. */
KERNEL_INLINE void weighted_lane_heads(const float *p, int64_t p_stride, const fp16_t *v, int64_t stride, int64_t n,
                                       int64_t i, int l, float *lanes, const int g, const int n_chunks) {
    __m256 acc[4][8];
#pragma GCC unroll 4
    for (int h = 0; h < g; ++h) {
#pragma GCC unroll 8
        for (int c = 0; c < n_chunks; ++c) acc[h][c] = _mm256_setzero_ps();
    }
    for (int64_t t = l; t < n; t += 8) {
        __m256 weight[4];
        __mmask8 live[4], any = 0;
#pragma GCC unroll 4
        for (int h = 0; h < g; ++h) {
            weight[h] = _mm256_set1_ps(p[h * p_stride + t]);
            live[h] = _mm256_cmp_ps_mask(weight[h], _mm256_setzero_ps(), _CMP_NEQ_UQ);
            any |= live[h];
        }
        if (!any) continue;
        const fp16_t *row = v + t * stride + i;
#pragma GCC unroll 8
        for (int c = 0; c < n_chunks; ++c) {
            const __m256 value = key_halves(row + 8 * c);
#pragma GCC unroll 4
            for (int h = 0; h < g; ++h) acc[h][c] = _mm256_mask3_fmadd_ps(weight[h], value, acc[h][c], live[h]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < g; ++h) {
#pragma GCC unroll 8
        for (int c = 0; c < n_chunks; ++c) _mm256_storeu_ps(lanes + (h * 8 + l) * 64 + 8 * c, acc[h][c]);
    }
}

/* g heads' dimensions i .. i + 8 * n_chunks - 1: the eight lanes, then reduce_lanes8's tree across them. */
KERNEL_INLINE void weighted_chunks(const float *p, int64_t p_stride, const fp16_t *v, int64_t stride, int64_t n,
                                   int64_t d, int64_t i, float *out, const int g, const int n_chunks) {
    float lanes[4 * 8 * 64];
    for (int l = 0; l < 8; ++l) weighted_lane_heads(p, p_stride, v, stride, n, i, l, lanes, g, n_chunks);
    for (int h = 0; h < g; ++h) {
        for (int c = 0; c < n_chunks; ++c) {
#define LANE(l) _mm256_loadu_ps(lanes + (h * 8 + (l)) * 64 + 8 * c)
            const __m256 total = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(LANE(0), LANE(4)), _mm256_add_ps(LANE(2), LANE(6))),
                                               _mm256_add_ps(_mm256_add_ps(LANE(1), LANE(5)), _mm256_add_ps(LANE(3), LANE(7))));
#undef LANE
            _mm256_storeu_ps(out + h * d + i + 8 * c, total);
        }
    }
}

/* g (1 to 4) heads: 64 dimensions at a time (32 for 4 heads: 16 chains in registers), then 8 at a time. */
KERNEL_INLINE void weighted_group(const float *p, int64_t p_stride, const fp16_t *v, int64_t stride, int64_t n,
                                  int64_t d, float *out, const int g) {
    const int chunks = g == 4 ? 4 : 8;
    int64_t i = 0;
    for (; i + 8 * chunks <= d; i += 8 * chunks) weighted_chunks(p, p_stride, v, stride, n, d, i, out, g, chunks);
    for (; i < d; i += 8) weighted_chunks(p, p_stride, v, stride, n, d, i, out, g, 1);
}

static void weighted_sum_heads_avx512(const float *p, int64_t p_stride, int64_t g, const fp16_t *v, int64_t stride,
                                      int64_t n, int64_t d, float *out) {
#define WEIGHTED_RUN(h, c) weighted_group(p + (h) * p_stride, p_stride, v, stride, n, d, out + (h) * d, c)
    EACH_HEAD_RUN(g, WEIGHTED_RUN)
#undef WEIGHTED_RUN
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const prompt_attention_kernels prompt_attention_avx512 = {kv_to_float_avx512, dots_t_avx512, weighted_sum_f_avx512};
const head_group_kernels head_group_avx512 = {dots_heads_avx512, weighted_sum_heads_avx512};

#endif
