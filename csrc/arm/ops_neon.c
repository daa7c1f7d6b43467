/*
 * ops_neon.c - Advanced SIMD versions of the non-matmul inner loops a decode step spends its time in (attention
 * dots and weighted sums, the softmax, SwiGLU, RoPE, the norm's scaling, half-precision rounding, a quantized cache's
 * values): the generic kernels' operations 4 lanes at a time, giving the same bits (backend/kernel_set.h says what
 * each computes). The rest of the table is the generic tier's. Every aarch64 CPU runs them (the neon tier and the
 * ones above it).
 */
#include <math.h>

#include "arm/arm.h"
#include "generic/generic.h"

#if defined(__aarch64__)

#include <arm_neon.h>

static inline float32x4_t halves_to_floats4(const fp16_t *h) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* reduce_lanes8 of the lanes lo (0..3) and hi (4..7): (l_i + l_i+4), then pairs two apart, then the last two. */
static inline float lanes8_total(float32x4_t lo, float32x4_t hi) {
    const float32x4_t a4 = vaddq_f32(lo, hi);
    return vaddv_f32(vadd_f32(vget_low_f32(a4), vget_high_f32(a4)));
}

/* The same tree applied lane by lane to eight vectors (acc[l]: lane l of 4 independent sums). */
static inline float32x4_t lanes8_total4(const float32x4_t acc[8]) {
    const float32x4_t a0 = vaddq_f32(acc[0], acc[4]), a1 = vaddq_f32(acc[1], acc[5]);
    const float32x4_t a2 = vaddq_f32(acc[2], acc[6]), a3 = vaddq_f32(acc[3], acc[7]);
    return vaddq_f32(vaddq_f32(a0, a2), vaddq_f32(a1, a3));
}

static void dots_neon(const float *q, const fp16_t *k, int64_t stride, int64_t n, int64_t d, float *out) {
    const int64_t d8 = d / 8 * 8;
    for (int64_t j = 0; j < n; ++j) {
        const fp16_t *kj = k + j * stride;
        float32x4_t lo = vdupq_n_f32(0.0f), hi = vdupq_n_f32(0.0f);
        for (int64_t i = 0; i < d8; i += 8) {
            lo = vfmaq_f32(lo, vld1q_f32(q + i), halves_to_floats4(kj + i));
            hi = vfmaq_f32(hi, vld1q_f32(q + i + 4), halves_to_floats4(kj + i + 4));
        }
        if (d8 == d) {
            out[j] = lanes8_total(lo, hi);
            continue;
        }
        float lane[8];
        vst1q_f32(lane, lo);
        vst1q_f32(lane + 4, hi);
        for (int64_t i = d8; i < d; ++i) lane[i % 8] = fmaf(q[i], fp16_to_fp32(kj[i]), lane[i % 8]);
        out[j] = reduce_lanes8(lane);
    }
}

/* exp_ggml (ops_generic.c) on 4 lanes: the same operations, so the same bits. */
static inline float32x4_t exp_ggml4(float32x4_t x) {
    const float32x4_t shifter = vdupq_n_f32(0x1.8p23f);
    const float32x4_t z = vfmaq_f32(shifter, x, vdupq_n_f32(0x1.715476p+0f));
    const float32x4_t n = vsubq_f32(z, shifter);
    const float32x4_t b = vfmsq_f32(vfmsq_f32(x, n, vdupq_n_f32(0x1.62e4p-1f)), n, vdupq_n_f32(0x1.7f7d1cp-20f));
    const uint32x4_t e = vshlq_n_u32(vreinterpretq_u32_f32(z), 23);
    const float32x4_t k = vreinterpretq_f32_u32(vaddq_u32(e, vreinterpretq_u32_f32(vdupq_n_f32(1.0f))));
    const uint32x4_t big = vcagtq_f32(n, vdupq_n_f32(126.0f));
    const float32x4_t u = vmulq_f32(b, b);
    const float32x4_t j = vfmaq_f32(vmulq_f32(vdupq_n_f32(0x1.ffffecp-1f), b),
                                    vfmaq_f32(vfmaq_f32(vdupq_n_f32(0x1.fffdb6p-2f), vdupq_n_f32(0x1.555e66p-3f), b),
                                              vfmaq_f32(vdupq_n_f32(0x1.573e2ep-5f), vdupq_n_f32(0x1.0e4020p-7f), b),
                                              u),
                                    u);
    const float32x4_t normal = vfmaq_f32(k, k, j);
    if (vmaxvq_u32(big) == 0) return normal;
    const uint32x4_t g = vandq_u32(vcleq_f32(n, vdupq_n_f32(0.0f)), vdupq_n_u32(0x82000000u));
    const float32x4_t s1 = vreinterpretq_f32_u32(vaddq_u32(g, vdupq_n_u32(0x7f000000u)));
    const float32x4_t s2 = vreinterpretq_f32_u32(vsubq_u32(e, g));
    const uint32x4_t huge = vcagtq_f32(n, vdupq_n_f32(192.0f));
    const float32x4_t scaled = vbslq_f32(big, vmulq_f32(vfmaq_f32(s2, s2, j), s1), normal);
    return vbslq_f32(huge, vmulq_f32(s1, s1), scaled);
}

/* softmax_half's exponentials in place and their sum's inverse: a group of 8 is two vectors, its sum
 * reduce_lanes8's, added to the running double. */
static float softmax_exps_neon(float *s, int64_t n, float max) {
    const float32x4_t vmax = vdupq_n_f32(max), masked = vdupq_n_f32(-INFINITY);
    double sum = 0.0;
    for (int64_t g = 0; g < n; g += 8) {
        float pad[8];
        const int64_t len = n - g < 8 ? n - g : 8;
        float *group = s + g;
        if (len < 8) {
            for (int64_t l = 0; l < 8; ++l) pad[l] = l < len ? s[g + l] : -INFINITY;
            group = pad;
        }
        float32x4_t half[2];
        for (int h = 0; h < 2; ++h) {
            const float32x4_t x = vld1q_f32(group + 4 * h);
            const uint32x4_t keep = vmvnq_u32(vceqq_f32(x, masked));
            half[h] = vreinterpretq_f32_u32(vandq_u32(keep, vreinterpretq_u32_f32(exp_ggml4(vsubq_f32(x, vmax)))));
            vst1q_f32(group + 4 * h, half[h]);
        }
        if (len < 8) {
            for (int64_t l = 0; l < len; ++l) s[g + l] = pad[l];
        }
        sum += (double)lanes8_total(half[0], half[1]);
    }
    return (float)(1.0 / sum);
}

static void softmax_half_neon(float *s, int64_t n, float max) {
    const float inv = softmax_exps_neon(s, n, max);
    const float32x4_t inv4 = vdupq_n_f32(inv);
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) vst1q_f32(s + t, vcvt_f32_f16(vcvt_f16_f32(vmulq_f32(vld1q_f32(s + t), inv4))));
    for (; t < n; ++t) s[t] = fp16_to_fp32(fp32_to_fp16(s[t] * inv));
}

static void softmax_neon(float *s, int64_t n, float max) {
    const float inv = softmax_exps_neon(s, n, max);
    const float32x4_t inv4 = vdupq_n_f32(inv);
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) vst1q_f32(s + t, vmulq_f32(vld1q_f32(s + t), inv4));
    for (; t < n; ++t) s[t] = s[t] * inv;
}

/* 4 output dims at a time: 8 slot lanes (t mod 8) of 4 dims each, chains of fused multiply-adds in t order. */
static void weighted_sum_neon(const float *p, const fp16_t *v, int64_t stride, int64_t n, int64_t d, float *out) {
    const int64_t d4 = d / 4 * 4;
    for (int64_t i = 0; i < d4; i += 4) {
        float32x4_t acc[8];
        for (int l = 0; l < 8; ++l) acc[l] = vdupq_n_f32(0.0f);
        for (int64_t t = 0; t < n; ++t) {
            if (p[t] == 0.0f) continue;
            acc[t % 8] = vfmaq_n_f32(acc[t % 8], halves_to_floats4(v + t * stride + i), p[t]);
        }
        vst1q_f32(out + i, lanes8_total4(acc));
    }
    for (int64_t i = d4; i < d; ++i) {
        float lane[8] = {0};
        for (int64_t t = 0; t < n; ++t) {
            if (p[t] != 0.0f) lane[t % 8] = fmaf(p[t], fp16_to_fp32(v[t * stride + i]), lane[t % 8]);
        }
        out[i] = reduce_lanes8(lane);
    }
}

static void swiglu_neon(const float *g, const float *u, float *y, int64_t n) {
    const int64_t grouped = n - n % 8;
    const float32x4_t one = vdupq_n_f32(1.0f), zero = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < grouped; i += 4) {
        const float32x4_t gi = vld1q_f32(g + i);
        const float32x4_t silu = vdivq_f32(gi, vaddq_f32(one, exp_ggml4(vsubq_f32(zero, gi))));
        vst1q_f32(y + i, vmulq_f32(silu, vld1q_f32(u + i)));
    }
    for (int64_t i = grouped; i < n; ++i) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* rope_head_pairs 4 pairs at a time (cos and sin deinterleaved by ld2; the normal style's pairs too), the rest by
 * the scalar form. */
static void rope_head_neon(float *head, const float *cos_sin, int64_t n_rot, int neox) {
    const int64_t half = n_rot / 2, half4 = half / 4 * 4;
    for (int64_t i = 0; i < half4; i += 4) {
        const float32x4x2_t cs = vld2q_f32(cos_sin + 2 * i);
        float32x4_t x0, x1;
        float32x4x2_t pairs;
        if (neox) {
            x0 = vld1q_f32(head + i), x1 = vld1q_f32(head + i + half);
        } else {
            pairs = vld2q_f32(head + 2 * i);
            x0 = pairs.val[0], x1 = pairs.val[1];
        }
        const float32x4_t a = vfmaq_f32(vnegq_f32(vmulq_f32(x1, cs.val[1])), x0, cs.val[0]);
        const float32x4_t b = vfmaq_f32(vmulq_f32(x1, cs.val[0]), x0, cs.val[1]);
        if (neox) {
            vst1q_f32(head + i, a), vst1q_f32(head + i + half, b);
        } else {
            pairs.val[0] = a, pairs.val[1] = b;
            vst2q_f32(head + 2 * i, pairs);
        }
    }
    rope_head_pairs(head, cos_sin, half4, n_rot, neox);
}

static void to_half_neon(const float *x, fp16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

static void round_half_neon(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vcvt_f32_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; ++i) y[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
}

/* Each lane keeps the larger of what it held and the new score (a NaN never, a tie the older): the largest
 * score but NaN, as the scalar loop finds it (which of two zeros it returns may differ, as the contract allows). */
static float scale_max_neon(float *s, int64_t n, float scale) {
    const float32x4_t factor = vdupq_n_f32(scale);
    float32x4_t largest = vdupq_n_f32(-INFINITY);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vmulq_f32(vld1q_f32(s + i), factor);
        vst1q_f32(s + i, x);
        largest = vbslq_f32(vcgtq_f32(x, largest), x, largest);
    }
    float lanes[4], max = -INFINITY;
    vst1q_f32(lanes, largest);
    for (int l = 0; l < 4; ++l) max = lanes[l] > max ? lanes[l] : max;
    for (; i < n; ++i) {
        s[i] *= scale;
        max = s[i] > max ? s[i] : max;
    }
    return max;
}

static void scale_row_neon(const float *x, const float *w, float *y, int64_t n, float scale) {
    const float32x4_t factor = vdupq_n_f32(scale);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t scaled = vmulq_f32(vld1q_f32(x + i), factor);
        vst1q_f32(y + i, w ? vmulq_f32(scaled, vld1q_f32(w + i)) : scaled);
    }
    for (; i < n; ++i) y[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

static void add_scaled_neon(float *y, float w, const float *x, int64_t n) {
    const float32x4_t weight = vdupq_n_f32(w);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_f32(weight, vld1q_f32(x + i))));
    for (; i < n; ++i) y[i] = y[i] + w * x[i];
}

static void dequantize_q8_0_neon(const void *blocks, float *y, int64_t n) {
    const block_q8_0 *b = blocks;
    for (int64_t i = 0; i < n / QK32; ++i, y += QK32) {
        const float32x4_t d = vdupq_n_f32(fp16_to_fp32(b[i].d));
        for (int j = 0; j < QK32; j += 8) {
            const int16x8_t q = vmovl_s8(vld1_s8(b[i].qs + j));
            vst1q_f32(y + j, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(q))), d));
            vst1q_f32(y + j + 4, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(q))), d));
        }
    }
}

static void dequantize_q4_0_neon(const void *blocks, float *y, int64_t n) {
    const block_q4_0 *b = blocks;
    for (int64_t i = 0; i < n / QK32; ++i, y += QK32) {
        const float32x4_t d = vdupq_n_f32(fp16_to_fp32(b[i].d));
        const uint8x16_t qs = vld1q_u8(b[i].qs);
        const int8x16_t halves[2] = {vsubq_s8(vreinterpretq_s8_u8(vandq_u8(qs, vdupq_n_u8(0xF))), vdupq_n_s8(8)),
                                     vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(qs, 4)), vdupq_n_s8(8))};
        for (int h = 0; h < 2; ++h) {
            const int16x8_t lo = vmovl_s8(vget_low_s8(halves[h])), hi = vmovl_s8(vget_high_s8(halves[h]));
            vst1q_f32(y + 16 * h, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
            vst1q_f32(y + 16 * h + 4, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), d));
            vst1q_f32(y + 16 * h + 8, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
            vst1q_f32(y + 16 * h + 12, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), d));
        }
    }
}

const op_kernels op_kernels_neon = {dots_neon, softmax_half_neon, weighted_sum_neon, swiglu_neon,
                                    quantize_row_q8_0_act, quantize_row_q8_1_act, quantize_row_q8_K_ref,
                                    geglu_generic, to_half_neon, round_half_neon, rope_head_neon,
                                    argmax_generic, scale_max_neon, scale_row_neon, add_scaled_neon,
                                    dequantize_q8_0_neon, dequantize_q4_0_neon, softmax_neon};

#endif
