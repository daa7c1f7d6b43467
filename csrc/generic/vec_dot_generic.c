/*
 * vec_dot_generic.c - the scalar reference dot products. They define the
 * reduction order every SIMD tier reproduces bit for bit (see quants.h):
 * exact integer partial sums, fmaf into float lanes in a fixed order.
 */
#include <math.h>

#include "formats/quants.h"

/* ---- 32-element formats against q8_0 / q8_1 activations: 8 lanes of 4 elements ---- */

/* lanes[l] = sum_{k<4} q[4l + k] * a[4l + k]: the 8 exact int partial sums of one block */
static inline void dot32_lanes(const int8_t q[QK32], const int8_t a[QK32], int32_t lanes[8]) {
    for (int l = 0; l < 8; ++l) {
        int32_t sum = 0;
        for (int k = 0; k < 4; ++k) sum += (int32_t)q[4 * l + k] * a[4 * l + k];
        lanes[l] = sum;
    }
}

/* acc[l] = fmaf(scale, (float)lanes[l], acc[l]) for the 8 lanes */
static inline void chain_block(float acc[8], float scale, const int8_t q[QK32], const int8_t a[QK32]) {
    int32_t lanes[8];
    dot32_lanes(q, a, lanes);
    for (int l = 0; l < 8; ++l) acc[l] = fmaf(scale, (float)lanes[l], acc[l]);
}

static void unpack_q4(const uint8_t qs[16], int offset, int8_t q[QK32]) {
    for (int j = 0; j < 16; ++j) {
        q[j] = (int8_t)((qs[j] & 0xF) - offset);
        q[j + 16] = (int8_t)((qs[j] >> 4) - offset);
    }
}

static void unpack_q5(const uint8_t qh[4], const uint8_t qs[16], int offset, int8_t q[QK32]) {
    const uint32_t high = q5_high_bits(qh);
    for (int j = 0; j < 16; ++j) {
        q[j] = (int8_t)(((qs[j] & 0xF) | ((high >> j) & 1) << 4) - offset);
        q[j + 16] = (int8_t)(((qs[j] >> 4) | ((high >> (j + 16)) & 1) << 4) - offset);
    }
}

/* Q4_0 in the order of llama.cpp's interleaved x86 layout (what it uses for a Q4_0 matrix whose row count
 * is a multiple of 8): the exact sum of each block, then acc = fmaf(sum, d_w * d_a, acc), blocks in order. */
static float vec_dot_q4_0_q8_0_generic(int64_t n, const void *w, const void *act) {
    const block_q4_0 *x = w;
    const block_q8_0 *y = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK32; ++b) {
        int8_t q[QK32];
        unpack_q4(x[b].qs, 8, q);
        int32_t lanes[8], sum = 0;
        dot32_lanes(q, y[b].qs, lanes);
        for (int l = 0; l < 8; ++l) sum += lanes[l];
        acc = fmaf((float)sum, fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d), acc);
    }
    return acc;
}

static float vec_dot_q4_0_lanes_q8_0_generic(int64_t n, const void *w, const void *act) {
    const block_q4_0 *x = w;
    const block_q8_0 *y = act;
    float acc[8] = {0};
    for (int64_t b = 0; b < n / QK32; ++b) {
        int8_t q[QK32];
        unpack_q4(x[b].qs, 8, q);
        chain_block(acc, fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d), q, y[b].qs);
    }
    return reduce_lanes8(acc);
}

static float vec_dot_q4_1_q8_1_generic(int64_t n, const void *w, const void *act) {
    const block_q4_1 *x = w;
    const block_q8_1 *y = act;
    float acc[8] = {0};
    float mins = 0.0f;
    for (int64_t b = 0; b < n / QK32; ++b) {
        int8_t q[QK32];
        unpack_q4(x[b].qs, 0, q);
        chain_block(acc, fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d), q, y[b].qs);
        mins = fmaf(fp16_to_fp32(x[b].m), fp16_to_fp32(y[b].s), mins);
    }
    return reduce_lanes8(acc) + mins;
}

static float vec_dot_q5_0_q8_0_generic(int64_t n, const void *w, const void *act) {
    const block_q5_0 *x = w;
    const block_q8_0 *y = act;
    float acc[8] = {0};
    for (int64_t b = 0; b < n / QK32; ++b) {
        int8_t q[QK32];
        unpack_q5(x[b].qh, x[b].qs, 16, q);
        chain_block(acc, fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d), q, y[b].qs);
    }
    return reduce_lanes8(acc);
}

/* The same blocks regrouped: each rebuilt as it was, then Q5_0's steps. */
static float vec_dot_q5_0_g8_q8_0_generic(int64_t n, const void *w, const void *act) {
    const block_q8_0 *y = act;
    float acc[8] = {0};
    for (int64_t b = 0; b < n / QK32; ++b) {
        const block_q5_0 x = q5_0_g8_block(w, n / QK32, b);
        int8_t q[QK32];
        unpack_q5(x.qh, x.qs, 16, q);
        chain_block(acc, fp16_to_fp32(x.d) * fp16_to_fp32(y[b].d), q, y[b].qs);
    }
    return reduce_lanes8(acc);
}

static float vec_dot_q5_1_q8_1_generic(int64_t n, const void *w, const void *act) {
    const block_q5_1 *x = w;
    const block_q8_1 *y = act;
    float acc[8] = {0};
    float mins = 0.0f;
    for (int64_t b = 0; b < n / QK32; ++b) {
        int8_t q[QK32];
        unpack_q5(x[b].qh, x[b].qs, 0, q);
        chain_block(acc, fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d), q, y[b].qs);
        mins = fmaf(fp16_to_fp32(x[b].m), fp16_to_fp32(y[b].s), mins);
    }
    return reduce_lanes8(acc) + mins;
}

static float vec_dot_q8_0_q8_0_generic(int64_t n, const void *w, const void *act) {
    const block_q8_0 *x = w;
    const block_q8_0 *y = act;
    float acc[8] = {0};
    for (int64_t b = 0; b < n / QK32; ++b) {
        chain_block(acc, fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d), x[b].qs, y[b].qs);
    }
    return reduce_lanes8(acc);
}

/* ---- K-quants against q8_K activations: one accumulator ---- */

/* sum over the 16-element group g of q[e] * a[e] */
static inline int32_t dot16_int(const int8_t *q, const int8_t *a) {
    int32_t sum = 0;
    for (int j = 0; j < 16; ++j) sum += (int32_t)q[j] * a[j];
    return sum;
}

static float vec_dot_q2_K_q8_K_generic(int64_t n, const void *w, const void *act) {
    const block_q2_K *x = w;
    const block_q8_K *y = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int8_t q[QK_K];
        for (int half = 0; half < 2; ++half) {
            for (int shift = 0; shift < 4; ++shift) {
                for (int l = 0; l < 32; ++l) {
                    q[half * 128 + shift * 32 + l] = (int8_t)((x[b].qs[half * 32 + l] >> (2 * shift)) & 3);
                }
            }
        }
        int32_t sum_q = 0, sum_min = 0;
        for (int g = 0; g < 16; ++g) {
            sum_q += (x[b].scales[g] & 0xF) * dot16_int(q + 16 * g, y[b].qs + 16 * g);
            sum_min += (x[b].scales[g] >> 4) * y[b].bsums[g];
        }
        acc = fmaf(fmaf(-fp16_to_fp32(x[b].dmin), (float)sum_min, fp16_to_fp32(x[b].d) * (float)sum_q), y[b].d, acc);
    }
    return acc;
}

static float vec_dot_q3_K_q8_K_generic(int64_t n, const void *w, const void *act) {
    const block_q3_K *x = w;
    const block_q8_K *y = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int8_t q[QK_K];
        for (int e = 0; e < QK_K; ++e) {
            const int low = (x[b].qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
            const int high = (x[b].hmask[e % 32] >> (e / 32)) & 1;
            q[e] = (int8_t)(low - (high ? 0 : 4));
        }
        int8_t scales[16];
        q3_K_scales(x[b].scales, scales);
        int32_t sum_q = 0;
        for (int g = 0; g < 16; ++g) sum_q += scales[g] * dot16_int(q + 16 * g, y[b].qs + 16 * g);
        acc = fmaf(fp16_to_fp32(x[b].d) * (float)sum_q, y[b].d, acc);
    }
    return acc;
}

/* The exact sums of the 32-element groups first..last - 1 of a q4/q5 K superblock (6-bit scale and min each):
 * sum_q = sum of scale_g * (q . a over group g), sum_min = sum of min_g * (group g's activation sum). */
static void k4_sums(const uint8_t scales[12], const int8_t q[QK_K], const block_q8_K *y, int first, int last,
                    int32_t *sum_q, int32_t *sum_min) {
    *sum_q = 0;
    *sum_min = 0;
    for (int g = first; g < last; ++g) {
        uint8_t sc, m;
        scale_min_k4(g, scales, &sc, &m);
        *sum_q += sc * (dot16_int(q + 32 * g, y->qs + 32 * g) + dot16_int(q + 32 * g + 16, y->qs + 32 * g + 16));
        *sum_min += m * (y->bsums[2 * g] + y->bsums[2 * g + 1]);
    }
}

/* Q4_K in llama.cpp's order for a prompt on x86 (its interleaved Q4_K layout): per 64-element chunk, the
 * scaled sums and the scaled mins chained in two accumulators, then subtracted. */
static float vec_dot_q4_K_q8_K_generic(int64_t n, const void *w, const void *act) {
    const block_q4_K *x = w;
    const block_q8_K *y = act;
    float acc = 0.0f, mins = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int8_t q[QK_K];
        for (int chunk = 0; chunk < 4; ++chunk) {
            for (int l = 0; l < 32; ++l) {
                q[chunk * 64 + l] = (int8_t)(x[b].qs[chunk * 32 + l] & 0xF);
                q[chunk * 64 + 32 + l] = (int8_t)(x[b].qs[chunk * 32 + l] >> 4);
            }
        }
        const float scale = fp16_to_fp32(x[b].d) * y[b].d, scale_min = fp16_to_fp32(x[b].dmin) * y[b].d;
        for (int chunk = 0; chunk < 4; ++chunk) {
            int32_t sum_q, sum_min;
            k4_sums(x[b].scales, q, &y[b], 2 * chunk, 2 * chunk + 2, &sum_q, &sum_min);
            acc = fmaf((float)sum_q, scale, acc);
            mins = fmaf((float)sum_min, scale_min, mins);
        }
    }
    return acc - mins;
}

static float vec_dot_q5_K_q8_K_generic(int64_t n, const void *w, const void *act) {
    const block_q5_K *x = w;
    const block_q8_K *y = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int8_t q[QK_K];
        for (int chunk = 0; chunk < 4; ++chunk) {
            for (int l = 0; l < 32; ++l) {
                const int e = chunk * 64 + l;
                q[e] = (int8_t)((x[b].qs[chunk * 32 + l] & 0xF) | ((x[b].qh[l] >> (e / 32)) & 1) << 4);
                q[e + 32] = (int8_t)((x[b].qs[chunk * 32 + l] >> 4) | ((x[b].qh[l] >> (e / 32 + 1)) & 1) << 4);
            }
        }
        int32_t sum_q, sum_min;
        k4_sums(x[b].scales, q, &y[b], 0, 8, &sum_q, &sum_min);
        acc = fmaf(fmaf(-fp16_to_fp32(x[b].dmin), (float)sum_min, fp16_to_fp32(x[b].d) * (float)sum_q), y[b].d, acc);
    }
    return acc;
}

static float vec_dot_q6_K_q8_K_generic(int64_t n, const void *w, const void *act) {
    const block_q6_K *x = w;
    const block_q8_K *y = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int8_t q[QK_K];
        for (int half = 0; half < 2; ++half) {
            const uint8_t *ql = x[b].ql + 64 * half, *qh = x[b].qh + 32 * half;
            int8_t *out = q + 128 * half;
            for (int l = 0; l < 32; ++l) {
                out[l] = (int8_t)(((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32);
                out[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32);
                out[l + 64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
                out[l + 96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
            }
        }
        int32_t sum_q = 0;
        for (int g = 0; g < 16; ++g) sum_q += x[b].scales[g] * dot16_int(q + 16 * g, y[b].qs + 16 * g);
        acc = fmaf(fp16_to_fp32(x[b].d) * (float)sum_q, y[b].d, acc);
    }
    return acc;
}

/* ---- float weights against activations in the same format: 8 element lanes ---- */

/* llama.cpp's order for a prompt (its tinyBLAS kernels): acc[i % 8] = fmaf(w[i], x[i], acc[i % 8]), then
 * reduce_lanes8; elements past the last multiple of 8 (where llama.cpp takes another path) by fmaf after. */
#define FLOAT_VEC_DOT(name, load)                                              \
    static float name(int64_t n, const void *w, const void *act) {             \
        float acc[8] = {0};                                                    \
        const int64_t n8 = n - n % 8;                                          \
        for (int64_t i = 0; i < n8; ++i) acc[i & 7] = fmaf(load(w, i), load(act, i), acc[i & 7]); \
        float sum = reduce_lanes8(acc);                                        \
        for (int64_t i = n8; i < n; ++i) sum = fmaf(load(w, i), load(act, i), sum); \
        return sum;                                                            \
    }

#define LOAD_F32(p, i) (((const float *)(p))[i])
#define LOAD_F16(p, i) fp16_to_fp32(((const fp16_t *)(p))[i])
#define LOAD_BF16(p, i) bf16_to_fp32(((const bf16_t *)(p))[i])
FLOAT_VEC_DOT(vec_dot_f32_f32_generic, LOAD_F32)
FLOAT_VEC_DOT(vec_dot_f16_f16_generic, LOAD_F16)
FLOAT_VEC_DOT(vec_dot_bf16_bf16_generic, LOAD_BF16)

const vec_dot_fn vec_dot_table_generic[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_F32] = vec_dot_f32_f32_generic,   [PYLLM_TYPE_F16] = vec_dot_f16_f16_generic,
    [PYLLM_TYPE_BF16] = vec_dot_bf16_bf16_generic, [PYLLM_TYPE_Q4_0] = vec_dot_q4_0_q8_0_generic,
    [PYLLM_TYPE_Q4_0_LANES] = vec_dot_q4_0_lanes_q8_0_generic,
    [PYLLM_TYPE_Q4_1] = vec_dot_q4_1_q8_1_generic, [PYLLM_TYPE_Q5_0] = vec_dot_q5_0_q8_0_generic,
    [PYLLM_TYPE_Q5_0_G8] = vec_dot_q5_0_g8_q8_0_generic,
    [PYLLM_TYPE_Q5_1] = vec_dot_q5_1_q8_1_generic, [PYLLM_TYPE_Q8_0] = vec_dot_q8_0_q8_0_generic,
    [PYLLM_TYPE_Q2_K] = vec_dot_q2_K_q8_K_generic, [PYLLM_TYPE_Q3_K] = vec_dot_q3_K_q8_K_generic,
    [PYLLM_TYPE_Q4_K] = vec_dot_q4_K_q8_K_generic, [PYLLM_TYPE_Q5_K] = vec_dot_q5_K_q8_K_generic,
    [PYLLM_TYPE_Q6_K] = vec_dot_q6_K_q8_K_generic,
};

/* ---- the non-matmul inner loops (see op_kernels in quants.h) ---- */

/*
 * exp(x) as llama.cpp's x86 vector code computes it (what its softmax and silu use on an AVX2 build):
 * x = n ln2 + b with n = round(x / ln2) (by the 1.5 * 2^23 shifter), exp(b) by a degree-5 polynomial,
 * the power of two 2^n put into the exponent bits; |n| > 126 scaled in two steps, |n| > 192 to 0 or inf.
 * Every step is one IEEE operation on one lane, so this scalar form gives the vector code's bits.
 */
float exp_ggml(float x) {
    const float shifter = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, shifter);
    const float n = z - shifter;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const uint32_t e = fp32_to_bits(z) << 23;
    const float k = fp32_from_bits(e + fp32_to_bits(1.0f));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, 0x1.ffffecp-1f * b);
    if (!(fabsf(n) > 126.0f)) return fmaf(k, j, k);
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = fp32_from_bits(g + 0x7f000000u);
    const float s2 = fp32_from_bits(e - g);
    if (fabsf(n) > 192.0f) return s1 * s1;
    return fmaf(s2, j, s2) * s1;
}

static void dots_generic(const float *q, const fp16_t *k, int64_t stride, int64_t n, int64_t d, float *out) {
    for (int64_t j = 0; j < n; ++j) {
        const fp16_t *kj = k + j * stride;
        float lane[8] = {0};
        for (int64_t i = 0; i < d; ++i) lane[i % 8] = fmaf(q[i], fp16_to_fp32(kj[i]), lane[i % 8]);
        out[j] = reduce_lanes8(lane);
    }
}

static void softmax_half_generic(float *s, int64_t n, float max) {
    double sum = 0.0;
    for (int64_t g = 0; g < n; g += 8) {
        float e[8] = {0};
        for (int64_t l = 0; l < 8 && g + l < n; ++l) {
            if (s[g + l] != -INFINITY) e[l] = exp_ggml(s[g + l] - max);
            s[g + l] = e[l];
        }
        sum += (double)reduce_lanes8(e);
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t t = 0; t < n; ++t) s[t] = fp16_to_fp32(fp32_to_fp16(s[t] * inv));
}

static void weighted_sum_generic(const float *p, const fp16_t *v, int64_t stride, int64_t n, int64_t d,
                                 float *out) {
    for (int64_t i = 0; i < d; ++i) {
        float lane[8] = {0};
        for (int64_t t = 0; t < n; ++t) {
            if (p[t] != 0.0f) lane[t % 8] = fmaf(p[t], fp16_to_fp32(v[t * stride + i]), lane[t % 8]);
        }
        out[i] = reduce_lanes8(lane);
    }
}

static void swiglu_generic(const float *g, const float *u, float *y, int64_t n) {
    const int64_t grouped = n - n % 8;
    for (int64_t i = 0; i < grouped; ++i) y[i] = g[i] / (1.0f + exp_ggml(0.0f - g[i])) * u[i];
    for (int64_t i = grouped; i < n; ++i) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void geglu_generic(const fp16_t *gelu_table, const float *g, const float *u, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        if (g[i] <= -10.0f) y[i] = 0.0f;
        else if (g[i] >= 10.0f) y[i] = g[i] * u[i];
        else y[i] = fp16_to_fp32(gelu_table[fp32_to_fp16(g[i])]) * u[i];
    }
}

static void to_half_generic(const float *x, fp16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

static void round_half_generic(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
}

static void rope_head_generic(float *head, const float *cos_sin, int64_t n_rot, int neox) {
    rope_head_pairs(head, cos_sin, 0, n_rot, neox);
}

static int64_t argmax_generic(const float *x, int64_t n, int *nan) {
    int64_t best = 0;
    int seen_nan = isnan(x[0]);
    for (int64_t i = 1; i < n; ++i) {
        seen_nan |= isnan(x[i]);
        if (x[i] > x[best]) best = i;
    }
    *nan = seen_nan;
    return best;
}

static float scale_max_generic(float *s, int64_t n, float scale) {
    float max = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
        s[i] *= scale;
        max = s[i] > max ? s[i] : max;
    }
    return max;
}

static void scale_row_generic(const float *x, const float *w, float *y, int64_t n, float scale) {
    for (int64_t i = 0; i < n; ++i) y[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

const op_kernels op_kernels_generic = {dots_generic, softmax_half_generic, weighted_sum_generic, swiglu_generic,
                                       quantize_row_q8_0_act, quantize_row_q8_1_act, quantize_row_q8_K_ref,
                                       geglu_generic, to_half_generic, round_half_generic, rope_head_generic, argmax_generic,
                                       scale_max_generic, scale_row_generic};
