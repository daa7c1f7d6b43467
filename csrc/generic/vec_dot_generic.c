/*
 * vec_dot_generic.c - the scalar reference dot products. They define the
 * reduction order every SIMD tier reproduces bit for bit (see backend/kernel_set.h):
 * exact integer partial sums, fmaf into float lanes in a fixed order.
 */
#include <math.h>

#include "generic/generic.h"

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
        uint8_t quants[QK_K];
        int8_t q[QK_K];
        q6_K_quants(&x[b], quants);
        for (int e = 0; e < QK_K; ++e) q[e] = (int8_t)(quants[e] - 32);
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
