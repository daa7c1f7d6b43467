/*
 * ops_generic.c - the scalar non-matmul kernels (backend/kernel_set.h: op_kernels): llama.cpp's arithmetic for
 * attention, activations and norms, the definitions the SIMD tiers' ops reproduce bit for bit.
 */
#include <math.h>

#include "generic/generic.h"

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

/* softmax_half's exponentials and their sum's inverse, in place of the scores */
static float softmax_exps_generic(float *s, int64_t n, float max) {
    double sum = 0.0;
    for (int64_t g = 0; g < n; g += 8) {
        float e[8] = {0};
        for (int64_t l = 0; l < 8 && g + l < n; ++l) {
            if (s[g + l] != -INFINITY) e[l] = exp_ggml(s[g + l] - max);
            s[g + l] = e[l];
        }
        sum += (double)reduce_lanes8(e);
    }
    return (float)(1.0 / sum);
}

static void softmax_half_generic(float *s, int64_t n, float max) {
    const float inv = softmax_exps_generic(s, n, max);
    for (int64_t t = 0; t < n; ++t) s[t] = fp16_to_fp32(fp32_to_fp16(s[t] * inv));
}

static void softmax_generic(float *s, int64_t n, float max) {
    const float inv = softmax_exps_generic(s, n, max);
    for (int64_t t = 0; t < n; ++t) s[t] = s[t] * inv;
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

void geglu_generic(const fp16_t *gelu_table, const float *g, const float *u, float *y, int64_t n) {
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

void rope_head_generic(float *head, const float *cos_sin, int64_t n_rot, int neox) {
    rope_head_pairs(head, cos_sin, 0, n_rot, neox);
}

int64_t argmax_generic(const float *x, int64_t n, int *nan) {
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

static void add_scaled_generic(float *y, float w, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] + w * x[i];
}

static void dequantize_q8_0_generic(const void *blocks, float *y, int64_t n) {
    dequantize_table[PYLLM_TYPE_Q8_0](blocks, y, n);
}

static void dequantize_q4_0_generic(const void *blocks, float *y, int64_t n) {
    dequantize_table[PYLLM_TYPE_Q4_0](blocks, y, n);
}

const op_kernels op_kernels_generic = {dots_generic, softmax_half_generic, weighted_sum_generic, swiglu_generic,
                                       quantize_row_q8_0_act, quantize_row_q8_1_act, quantize_row_q8_K_ref,
                                       geglu_generic, to_half_generic, round_half_generic, rope_head_generic, argmax_generic,
                                       scale_max_generic, scale_row_generic, add_scaled_generic,
                                       dequantize_q8_0_generic, dequantize_q4_0_generic, softmax_generic};
