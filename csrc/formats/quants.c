/*
 * quants.c - half/bfloat conversions, the reference dequantizers of every
 * format and the reference quantizers of the formats pyllm writes.
 *
 * The dequantizers compute each element with the same float operations in the
 * same order as gguf-py's numpy reference (gguf.quants), so the results are
 * bit-identical to it; the build turns off FMA contraction to keep them so.
 */
#include <math.h>
#include <stdlib.h>

#include "formats/quants.h"

/* ------------------------------------------------------------------------ */
/* conversions                                                               */
/* ------------------------------------------------------------------------ */

float fp16_to_fp32(fp16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exponent = (h >> 10) & 0x1F;
    const uint32_t mantissa = h & 0x3FF;
    if (exponent == 0x1F) {  /* inf, nan */
        return fp32_from_bits(sign | 0x7F800000u | (mantissa << 13));
    }
    if (exponent == 0) {  /* zero, subnormal: mantissa * 2^-24, exact */
        const float v = (float)mantissa * 0x1p-24f;
        return sign ? -v : v;
    }
    return fp32_from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

/* Round to nearest, ties to even; overflow to inf; nan stays nan (quiet). */
fp16_t fp32_to_fp16(float f) {
    const uint32_t x = fp32_to_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) {
        const uint16_t nan_bits = ax > 0x7F800000u ? (uint16_t)(0x200 | ((ax >> 13) & 0x3FF)) : 0;
        return (fp16_t)(sign | 0x7C00 | nan_bits);
    }
    if (ax >= 0x477FF000u) {  /* >= 65520, the midpoint above the largest half */
        return (fp16_t)(sign | 0x7C00);
    }
    if (ax < 0x38800000u) {   /* below 2^-14: a half subnormal or zero */
        if (ax <= 0x33000000u) {  /* <= 2^-25: rounds to zero (2^-25 is a tie, to even) */
            return sign;
        }
        const uint32_t mantissa = (ax & 0x7FFFFFu) | 0x800000u;
        const int shift = 126 - (int)(ax >> 23);  /* 14..24 */
        uint32_t q = mantissa >> shift;
        const uint32_t rest = mantissa & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rest > half || (rest == half && (q & 1))) {
            q++;
        }
        return (fp16_t)(sign | q);
    }
    const uint32_t rebiased = ax - 0x38000000u;  /* exponent - 112 */
    uint32_t q = rebiased >> 13;
    const uint32_t rest = rebiased & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (q & 1))) {
        q++;
    }
    return (fp16_t)(sign | q);
}

bf16_t fp32_to_bf16(float f) {
    const uint32_t x = fp32_to_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) {  /* nan: keep it, quiet */
        return (bf16_t)((x >> 16) | 64);
    }
    return (bf16_t)(((uint64_t)x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

float pyllm_fp16_table[1 << 16];

void pyllm_init_tables(void) {
    for (uint32_t i = 0; i < (1u << 16); ++i) {
        pyllm_fp16_table[i] = fp16_to_fp32((fp16_t)i);
    }
}

/* ------------------------------------------------------------------------ */
/* dequantize_row_<fmt>: blocks -> y[n]                                      */
/* ------------------------------------------------------------------------ */

static void dequantize_row_f32(const void *src, float *y, int64_t n) {
    memcpy(y, src, (size_t)n * sizeof(float));
}

static void dequantize_row_f16(const void *src, float *y, int64_t n) {
    const fp16_t *x = src;
    for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

static void dequantize_row_bf16(const void *src, float *y, int64_t n) {
    const bf16_t *x = src;
    for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(x[i]);
}

static void dequantize_row_q4_0(const void *src, float *y, int64_t n) {
    const block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK32; ++i, y += QK32) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK32 / 2; ++j) {
            y[j] = d * (float)((b[i].qs[j] & 0xF) - 8);
            y[j + QK32 / 2] = d * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}

static void dequantize_row_q4_1(const void *src, float *y, int64_t n) {
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK32; ++i, y += QK32) {
        const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
        for (int j = 0; j < QK32 / 2; ++j) {
            y[j] = d * (float)(b[i].qs[j] & 0xF) + m;
            y[j + QK32 / 2] = d * (float)(b[i].qs[j] >> 4) + m;
        }
    }
}

/* The 5-bit quant j (0..31) of a Q5_0 / Q5_1 block. */
static inline int q5_value(const uint8_t qh[4], const uint8_t qs[16], int j) {
    const uint32_t high_bits = q5_high_bits(qh);
    const int low = j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
    return low | (int)((high_bits >> j) & 1) << 4;
}

static void dequantize_row_q5_0(const void *src, float *y, int64_t n) {
    const block_q5_0 *b = src;
    for (int64_t i = 0; i < n / QK32; ++i, y += QK32) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK32; ++j) y[j] = d * (float)(q5_value(b[i].qh, b[i].qs, j) - 16);
    }
}

static void dequantize_row_q5_0_g8(const void *src, float *y, int64_t n) {
    for (int64_t b = 0; b < n / QK32; ++b, y += QK32) {
        const block_q5_0 block = q5_0_g8_block(src, n / QK32, b);
        dequantize_row_q5_0(&block, y, QK32);
    }
}

static void dequantize_row_q5_1(const void *src, float *y, int64_t n) {
    const block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK32; ++i, y += QK32) {
        const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
        for (int j = 0; j < QK32; ++j) y[j] = d * (float)q5_value(b[i].qh, b[i].qs, j) + m;
    }
}

static void dequantize_row_q8_0(const void *src, float *y, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK32; ++i, y += QK32) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK32; ++j) y[j] = (float)b[i].qs[j] * d;
    }
}

/* 2-bit field of element e (0..255) in the Q2_K / Q3_K qs layout:
 * 128-element halves of 32 bytes, each byte holding elements l, l+32, l+64, l+96. */
static inline int q2_field(const uint8_t *qs, int e) {
    const int half = e / 128, shift = (e % 128) / 32, l = e % 32;
    return (qs[half * 32 + l] >> (2 * shift)) & 3;
}

static void dequantize_row_q2_K(const void *src, float *y, int64_t n) {
    const block_q2_K *b = src;
    for (int64_t i = 0; i < n / QK_K; ++i, y += QK_K) {
        const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
        for (int e = 0; e < QK_K; ++e) {
            const uint8_t sc = b[i].scales[e / 16];
            const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
            y[e] = dl * (float)q2_field(b[i].qs, e) - ml;
        }
    }
}

static void dequantize_row_q3_K(const void *src, float *y, int64_t n) {
    const block_q3_K *b = src;
    for (int64_t i = 0; i < n / QK_K; ++i, y += QK_K) {
        const float d = fp16_to_fp32(b[i].d);
        int8_t scales[16];
        q3_K_scales(b[i].scales, scales);
        for (int e = 0; e < QK_K; ++e) {
            const int high = (b[i].hmask[e % 32] >> (e / 32)) & 1;
            const int q = q2_field(b[i].qs, e) - (high ? 0 : 4);
            y[e] = (d * (float)scales[e / 16]) * (float)q;
        }
    }
}

/* 4-bit field of element e in the Q4_K / Q5_K qs layout: 64-element chunks of
 * 32 bytes, low nibbles first. */
static inline int q4k_field(const uint8_t *qs, int e) {
    const int chunk = e / 64, l = e % 32;
    return (e % 64) < 32 ? (qs[chunk * 32 + l] & 0xF) : (qs[chunk * 32 + l] >> 4);
}

static void dequantize_row_q4_K(const void *src, float *y, int64_t n) {
    const block_q4_K *b = src;
    for (int64_t i = 0; i < n / QK_K; ++i, y += QK_K) {
        const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
        for (int e = 0; e < QK_K; ++e) {
            uint8_t sc, m;
            scale_min_k4(e / 32, b[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            y[e] = d1 * (float)q4k_field(b[i].qs, e) - m1;
        }
    }
}

static void dequantize_row_q5_K(const void *src, float *y, int64_t n) {
    const block_q5_K *b = src;
    for (int64_t i = 0; i < n / QK_K; ++i, y += QK_K) {
        const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
        for (int e = 0; e < QK_K; ++e) {
            uint8_t sc, m;
            scale_min_k4(e / 32, b[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            const int q = q4k_field(b[i].qs, e) | ((b[i].qh[e % 32] >> (e / 32)) & 1) << 4;
            y[e] = d1 * (float)q - m1;
        }
    }
}

/* The 6-bit quant (0..63) of element e of a Q6_K superblock: 128-element
 * halves; low nibbles from 64 ql bytes (low then high nibble), high 2 bits
 * from 32 qh bytes (shifts 0, 2, 4, 6 -> 32-element runs). */
static inline int q6k_value(const block_q6_K *b, int e) {
    const int half = e / 128, r = e % 128;
    const uint8_t low_byte = b->ql[half * 64 + r % 64];
    const int low = r < 64 ? (low_byte & 0xF) : (low_byte >> 4);
    const int high = (b->qh[half * 32 + r % 32] >> (2 * (r / 32))) & 3;
    return low | high << 4;
}

static void dequantize_row_q6_K(const void *src, float *y, int64_t n) {
    const block_q6_K *b = src;
    for (int64_t i = 0; i < n / QK_K; ++i, y += QK_K) {
        const float d = fp16_to_fp32(b[i].d);
        for (int e = 0; e < QK_K; ++e) {
            y[e] = (d * (float)b[i].scales[e / 16]) * (float)(q6k_value(&b[i], e) - 32);
        }
    }
}

static void dequantize_row_q8_1(const void *src, float *y, int64_t n) {
    const block_q8_1 *b = src;
    for (int64_t i = 0; i < n / QK32; ++i, y += QK32) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK32; ++j) y[j] = (float)b[i].qs[j] * d;
    }
}

static void dequantize_row_q8_K(const void *src, float *y, int64_t n) {
    const block_q8_K *b = src;
    for (int64_t i = 0; i < n / QK_K; ++i, y += QK_K) {
        for (int e = 0; e < QK_K; ++e) y[e] = b[i].d * (float)b[i].qs[e];
    }
}

const dequantize_row_fn dequantize_table[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_F32] = dequantize_row_f32,   [PYLLM_TYPE_F16] = dequantize_row_f16,
    [PYLLM_TYPE_BF16] = dequantize_row_bf16, [PYLLM_TYPE_Q4_0] = dequantize_row_q4_0,
    [PYLLM_TYPE_Q4_0_LANES] = dequantize_row_q4_0,
    [PYLLM_TYPE_Q4_1] = dequantize_row_q4_1, [PYLLM_TYPE_Q5_0] = dequantize_row_q5_0,
    [PYLLM_TYPE_Q5_0_G8] = dequantize_row_q5_0_g8,
    [PYLLM_TYPE_Q5_1] = dequantize_row_q5_1, [PYLLM_TYPE_Q8_0] = dequantize_row_q8_0,
    [PYLLM_TYPE_Q2_K] = dequantize_row_q2_K, [PYLLM_TYPE_Q3_K] = dequantize_row_q3_K,
    [PYLLM_TYPE_Q4_K] = dequantize_row_q4_K, [PYLLM_TYPE_Q5_K] = dequantize_row_q5_K,
    [PYLLM_TYPE_Q6_K] = dequantize_row_q6_K, [PYLLM_TYPE_Q8_K] = dequantize_row_q8_K,
    [PYLLM_TYPE_Q8_1] = dequantize_row_q8_1,
};

/* ------------------------------------------------------------------------ */
/* quantize_row_<fmt>_ref: x[n] -> blocks                                    */
/* ------------------------------------------------------------------------ */

static void quantize_row_f32_ref(const float *x, void *dst, int64_t n) {
    memcpy(dst, x, (size_t)n * sizeof(float));
}

static void quantize_row_f16_ref(const float *x, void *dst, int64_t n) {
    fp16_t *y = dst;
    for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

static void quantize_row_bf16_ref(const float *x, void *dst, int64_t n) {
    bf16_t *y = dst;
    for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_bf16(x[i]);
}

/* The element of largest magnitude (the first one on ties), with its sign. */
static float signed_absmax(const float *x, int len) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < len; ++j) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

/* (int)v clamped to [lo, hi]; nan -> lo. Never converts an out-of-range float (UB in C). */
static inline int float_to_int_clamped(float v, int lo, int hi) {
    return v >= (float)lo && v <= (float)hi ? (int)v : v > (float)hi ? hi : lo;
}

/* Symmetric 4/5-bit: the extreme element maps to -2^(bits-1) (the d is negative when it is positive). */
static void quantize_symmetric_block(const float *x, int levels, float *d_out, uint8_t q[QK32]) {
    const float max = signed_absmax(x, QK32);
    const float d = max / (float)-(levels / 2);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK32; ++j) {
        q[j] = (uint8_t)float_to_int_clamped(x[j] * id + ((float)(levels / 2) + 0.5f), 0, levels - 1);
    }
    *d_out = d;
}

/* Asymmetric 4/5-bit over [min, max]. */
static void quantize_asymmetric_block(const float *x, int levels, float *d_out, float *m_out,
                                      uint8_t q[QK32]) {
    float min = x[0], max = x[0];
    for (int j = 1; j < QK32; ++j) {
        min = x[j] < min ? x[j] : min;
        max = x[j] > max ? x[j] : max;
    }
    const float d = (max - min) / (float)(levels - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK32; ++j) {
        q[j] = (uint8_t)float_to_int_clamped((x[j] - min) * id + 0.5f, 0, levels - 1);
    }
    *d_out = d;
    *m_out = min;
}

static void pack_nibbles(const uint8_t q[QK32], uint8_t qs[QK32 / 2]) {
    for (int j = 0; j < QK32 / 2; ++j) qs[j] = (uint8_t)((q[j] & 0xF) | (q[j + QK32 / 2] & 0xF) << 4);
}

static void pack_fifth_bits(const uint8_t q[QK32], uint8_t qh[4]) {
    uint32_t bits = 0;
    for (int j = 0; j < QK32; ++j) bits |= (uint32_t)(q[j] >> 4) << j;
    for (int k = 0; k < 4; ++k) qh[k] = (uint8_t)(bits >> (8 * k));
}

static void quantize_row_q4_0_ref(const float *x, void *dst, int64_t n) {
    block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / QK32; ++i, x += QK32) {
        uint8_t q[QK32];
        float d;
        quantize_symmetric_block(x, 16, &d, q);
        b[i].d = fp32_to_fp16(d);
        pack_nibbles(q, b[i].qs);
    }
}

static void quantize_row_q4_1_ref(const float *x, void *dst, int64_t n) {
    block_q4_1 *b = dst;
    for (int64_t i = 0; i < n / QK32; ++i, x += QK32) {
        uint8_t q[QK32];
        float d, m;
        quantize_asymmetric_block(x, 16, &d, &m, q);
        b[i].d = fp32_to_fp16(d);
        b[i].m = fp32_to_fp16(m);
        pack_nibbles(q, b[i].qs);
    }
}

static void quantize_row_q5_0_ref(const float *x, void *dst, int64_t n) {
    block_q5_0 *b = dst;
    for (int64_t i = 0; i < n / QK32; ++i, x += QK32) {
        uint8_t q[QK32];
        float d;
        quantize_symmetric_block(x, 32, &d, q);
        b[i].d = fp32_to_fp16(d);
        pack_nibbles(q, b[i].qs);
        pack_fifth_bits(q, b[i].qh);
    }
}

static void quantize_row_q5_1_ref(const float *x, void *dst, int64_t n) {
    block_q5_1 *b = dst;
    for (int64_t i = 0; i < n / QK32; ++i, x += QK32) {
        uint8_t q[QK32];
        float d, m;
        quantize_asymmetric_block(x, 32, &d, &m, q);
        b[i].d = fp32_to_fp16(d);
        b[i].m = fp32_to_fp16(m);
        pack_nibbles(q, b[i].qs);
        pack_fifth_bits(q, b[i].qh);
    }
}

/* d = max|x| / 127, q = round-half-away(x / d) */
static void quantize_row_q8_0_ref(const float *x, void *dst, int64_t n) {
    block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK32; ++i, x += QK32) {
        float amax = 0.0f;
        for (int j = 0; j < QK32; ++j) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < QK32; ++j) b[i].qs[j] = (int8_t)float_to_int_clamped(roundf(x[j] * id), -127, 127);
        b[i].d = fp32_to_fp16(d);
    }
}

/* Activations for the 32-element formats, as llama.cpp's x86 CPU backend makes
 * them: the same d as the reference, but q = round-half-even(x * 127 / amax)
 * (not x / d, rounded away from zero). Matching it keeps our products closer
 * to llama.cpp's. Returns the unrounded d. */
static float quantize_block_act(const float *x, int8_t qs[QK32]) {
    float amax = 0.0f;
    for (int j = 0; j < QK32; ++j) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < QK32; ++j) qs[j] = (int8_t)float_to_int_clamped(nearbyintf(x[j] * id), -127, 127);
    return amax / 127.0f;
}

void quantize_row_q8_0_act(const float *x, void *dst, int64_t n) {
    block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK32; ++i, x += QK32) b[i].d = fp32_to_fp16(quantize_block_act(x, b[i].qs));
}

/* s = d * sum(q) with the unrounded d, then rounded to half, as llama.cpp's q8_1 */
void quantize_row_q8_1_act(const float *x, void *dst, int64_t n) {
    block_q8_1 *b = dst;
    for (int64_t i = 0; i < n / QK32; ++i, x += QK32) {
        const float d = quantize_block_act(x, b[i].qs);
        int32_t sum = 0;
        for (int j = 0; j < QK32; ++j) sum += b[i].qs[j];
        b[i].d = fp32_to_fp16(d);
        b[i].s = fp32_to_fp16(d * (float)sum);
    }
}

/* Round to nearest, ties to even, for |v| < 2^22. */
static inline int nearest_int(float v) {
    const float shifted = v + 12582912.0f;  /* 1.5 * 2^23 */
    return (int)(fp32_to_bits(shifted) & 0x007FFFFF) - 0x00400000;
}

/* The extreme element maps to -127; d = 1 / scale keeps full float precision. */
void quantize_row_q8_K_ref(const float *x, void *dst, int64_t n) {
    block_q8_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        const float max = signed_absmax(x, QK_K);
        if (max == 0.0f) {
            memset(&b[i], 0, sizeof(b[i]));
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; ++j) {
            const float scaled = iscale * x[j];  /* |scaled| <= 127 for finite rows */
            b[i].qs[j] = (int8_t)(fabsf(scaled) <= 127.0f ? nearest_int(scaled) : scaled > 0 ? 127 : -127);
        }
        for (int g = 0; g < QK_K / 16; ++g) {
            int sum = 0;
            for (int j = 0; j < 16; ++j) sum += b[i].qs[16 * g + j];
            b[i].bsums[g] = (int16_t)sum;
        }
        b[i].d = 1.0f / iscale;
    }
}

const quantize_row_fn quantize_table[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_F32] = quantize_row_f32_ref,   [PYLLM_TYPE_F16] = quantize_row_f16_ref,
    [PYLLM_TYPE_BF16] = quantize_row_bf16_ref, [PYLLM_TYPE_Q4_0] = quantize_row_q4_0_ref,
    [PYLLM_TYPE_Q4_0_LANES] = quantize_row_q4_0_ref,
    [PYLLM_TYPE_Q4_1] = quantize_row_q4_1_ref, [PYLLM_TYPE_Q5_0] = quantize_row_q5_0_ref,
    [PYLLM_TYPE_Q5_1] = quantize_row_q5_1_ref, [PYLLM_TYPE_Q8_0] = quantize_row_q8_0_ref,
    [PYLLM_TYPE_Q8_K] = quantize_row_q8_K_ref, [PYLLM_TYPE_Q8_1] = quantize_row_q8_1_act,
};

/* The 32-element blocks a row has in act_rows' copies (q8_K keeps its own float scales: none). */
static int64_t act_rows_blocks(int weight_type, int64_t n) {
    return pyllm_vec_dot_type(weight_type) == PYLLM_TYPE_Q8_K ? 0 : n / QK32;
}

/* Q5_0's kernels take the unsigned q (0..31) and each lane's share of the offset 16 apart, the interleaved
 * Q8_0's q + 128 and the share of 128: the offset, or 0 for weights without one. */
static int lane_offset(int weight_type) {
    if (weight_type == PYLLM_TYPE_Q5_0 || weight_type == PYLLM_TYPE_Q5_0_G8 || weight_type == PYLLM_TYPE_Q5_0_X16) {
        return 16;
    }
    return weight_type == PYLLM_TYPE_Q8_0_X16 ? 128 : 0;
}

/* Scratch for a layout of `slots` rows a block (VEC_DOT_MAX_ROWS for a group, 1 for a lone row). */
static int64_t layout_scratch_bytes(int weight_type, int64_t n, int slots) {
    const int64_t nb = act_rows_blocks(weight_type, n) * slots;
    const int64_t offset_ints = lane_offset(weight_type) ? nb * 8 : weight_type == PYLLM_TYPE_Q4_0 ? nb : 0;
    const int64_t bytes = nb * QK32 + nb * 2 * (int64_t)sizeof(float) + offset_ints * (int64_t)sizeof(int32_t);
    return bytes > 0 ? (bytes + 63) / 64 * 64 : 64;  /* at least a line, so a group's scratch always exists */
}

int64_t act_rows_scratch_bytes(int weight_type, int64_t n) { return layout_scratch_bytes(weight_type, n, VEC_DOT_MAX_ROWS); }
int64_t act_row_scratch_bytes(int weight_type, int64_t n) { return layout_scratch_bytes(weight_type, n, 1); }

/* Rows 0..n_rows-1 into a layout of `slots` rows a block: entry (b, r) at index b * slots + r. */
static void prepare_layout(act_rows *group, int weight_type, const void *const *rows, int n_rows, int64_t n,
                           void *scratch, int slots) {
    const int act_type = pyllm_vec_dot_type(weight_type);
    const int64_t nb = act_rows_blocks(weight_type, n);
    int8_t *quants = scratch;
    float *scale = (float *)(quants + nb * slots * QK32), *sum = scale + nb * slots;
    int32_t *offsets = (int32_t *)(sum + nb * slots);
    group->n_rows = n_rows;
    group->quants = nb ? quants : NULL;
    group->scale = nb ? scale : NULL;
    group->sum = act_type == PYLLM_TYPE_Q8_1 ? sum : NULL;
    const int offset = lane_offset(weight_type);
    group->offsets = offset ? offsets : NULL;
    group->block_offsets = weight_type == PYLLM_TYPE_Q4_0 ? offsets : NULL;
    for (int r = 0; r < VEC_DOT_MAX_ROWS; ++r) group->rows[r] = rows[r < n_rows ? r : 0];
    for (int r = 0; r < slots; ++r) {
        const int real = r < n_rows;
        for (int64_t b = 0; b < nb; ++b) {
            float d = 0.0f, s = 0.0f;
            if (real && act_type == PYLLM_TYPE_Q8_1) {
                const block_q8_1 *y = rows[r];
                d = fp16_to_fp32(y[b].d);
                s = fp16_to_fp32(y[b].s);
            } else if (real) {
                d = fp16_to_fp32(((const block_q8_0 *)rows[r])[b].d);
            }
            const int8_t *qs = act_type == PYLLM_TYPE_Q8_1 ? ((const block_q8_1 *)group->rows[r])[b].qs
                                                           : ((const block_q8_0 *)group->rows[r])[b].qs;
            const int64_t at = b * slots + r;
            memcpy(quants + at * QK32, qs, QK32);
            scale[at] = d;
            if (group->sum != NULL) sum[at] = s;
            if (group->block_offsets != NULL) {
                int32_t total = 0;
                for (int j = 0; j < QK32; ++j) total += qs[j];
                offsets[at] = 8 * total;
            }
            if (group->offsets != NULL) {
                for (int l = 0; l < 8; ++l) {
                    offsets[at * 8 + l] = -offset * (qs[4 * l] + qs[4 * l + 1] + qs[4 * l + 2] + qs[4 * l + 3]);
                }
            }
        }
    }
}

void act_rows_prepare(act_rows *group, int weight_type, const void *const *rows, int n_rows, int64_t n,
                      void *scratch) {
    prepare_layout(group, weight_type, rows, n_rows, n, scratch, VEC_DOT_MAX_ROWS);
}

void act_row_prepare(act_rows *row, int weight_type, const void *act, int64_t n, void *scratch) {
    const void *rows[1] = {act};
    prepare_layout(row, weight_type, rows, 1, n, scratch, 1);
}

/* ------------------------------------------------------------------------ */
/* Q5_0 regrouped (PYLLM_TYPE_Q5_0_G8)                                       */
/* ------------------------------------------------------------------------ */

int pyllm_group_q5_0(const void *src, void *dst, int64_t n_rows, int64_t n) {
    if (n_rows < 0 || n <= 0 || n % QK32 != 0) return PYLLM_ERR_SHAPE;
    const int64_t nb = n / QK32, row_bytes = nb * (int64_t)sizeof(block_q5_0);
    for (int64_t r = 0; r < n_rows; ++r) {
        const block_q5_0 *blocks = (const block_q5_0 *)((const uint8_t *)src + r * row_bytes);
        uint8_t *row = (uint8_t *)dst + r * row_bytes;
        group_q5_0 *groups = (group_q5_0 *)row;
        for (int64_t gi = 0; gi < nb / 8; ++gi) {
            group_q5_0 *g = &groups[gi];
            memset(g->qh, 0, sizeof g->qh);
            for (int k = 0; k < 8; ++k) {
                const block_q5_0 *b = &blocks[8 * gi + k];
                const uint32_t bits = q5_high_bits(b->qh);
                g->d[k] = b->d;
                memcpy(g->qs[k], b->qs, sizeof g->qs[k]);
                for (int j = 0; j < QK32; ++j) g->qh[j] |= (uint8_t)(((bits >> j) & 1) << k);
            }
        }
        memcpy(row + nb / 8 * (int64_t)sizeof(group_q5_0), blocks + nb / 8 * 8,
               (size_t)(nb % 8) * sizeof(block_q5_0));
    }
    return PYLLM_OK;
}
