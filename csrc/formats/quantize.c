/*
 * quantize.c - the reference quantizers of the formats pyllm writes, and the activation quantizers matmul feeds its
 * kernels with (llama.cpp's x86 rounding, which a tier's own quantizers reproduce byte for byte).
 */
#include "formats/formats.h"

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

void pack_nibbles_32(const uint8_t q[QK32], uint8_t qs[QK32 / 2]) {
    for (int j = 0; j < QK32 / 2; ++j) qs[j] = (uint8_t)((q[j] & 0xF) | (q[j + QK32 / 2] & 0xF) << 4);
}

void pack_fifth_bits_32(const uint8_t q[QK32], uint8_t qh[4]) {
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
        pack_nibbles_32(q, b[i].qs);
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
        pack_nibbles_32(q, b[i].qs);
    }
}

static void quantize_row_q5_0_ref(const float *x, void *dst, int64_t n) {
    block_q5_0 *b = dst;
    for (int64_t i = 0; i < n / QK32; ++i, x += QK32) {
        uint8_t q[QK32];
        float d;
        quantize_symmetric_block(x, 32, &d, q);
        b[i].d = fp32_to_fp16(d);
        pack_nibbles_32(q, b[i].qs);
        pack_fifth_bits_32(q, b[i].qh);
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
        pack_nibbles_32(q, b[i].qs);
        pack_fifth_bits_32(q, b[i].qh);
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
    [PYLLM_TYPE_Q2_K] = quantize_row_q2_K_ref, [PYLLM_TYPE_Q3_K] = quantize_row_q3_K_ref,
    [PYLLM_TYPE_Q4_K] = quantize_row_q4_K_ref, [PYLLM_TYPE_Q5_K] = quantize_row_q5_K_ref,
    [PYLLM_TYPE_Q6_K] = quantize_row_q6_K_ref,
};

int pyllm_can_quantize(int type) { return type_traits(type) != NULL && quantize_table[type] != NULL; }

int pyllm_quantize_row(int type, const float *src, void *dst, int64_t n) {
    const int status = type_check_row(type, n);
    if (status != PYLLM_OK) return status;
    if (quantize_table[type] == NULL) return PYLLM_ERR_TYPE;
    quantize_table[type](src, dst, n);
    return PYLLM_OK;
}

int pyllm_quantize_rows(int type, const float *src, void *dst, int64_t n_rows, int64_t n, const float *importance) {
    const int status = type_check_row(type, n);
    if (status != PYLLM_OK) return status;
    if (n_rows < 0) return PYLLM_ERR_SHAPE;
    if (quantize_table[type] == NULL || !type_traits(type)->file_type) return PYLLM_ERR_TYPE;
    const int64_t row_bytes = type_row_bytes(type, n);
    /* the float and Q8_0 formats have no search for importance to steer: ggml ignores it there too */
    const int weighted = importance != NULL && type != PYLLM_TYPE_Q8_0 && type_traits(type)->block_size > 1;
    for (int64_t r = 0; r < n_rows; ++r) {
        const float *x = src + r * n;
        void *y = (uint8_t *)dst + r * row_bytes;
        if (weighted) quantize_row_weighted(type, x, y, n, importance);
        else quantize_table[type](x, y, n);
    }
    return PYLLM_OK;
}
