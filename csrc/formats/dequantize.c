/*
 * dequantize.c - the reference dequantizers of every format: each element computed with the same float operations
 * in the same order as gguf-py's numpy reference (gguf.quants), so the results are bit-identical to it; the build
 * turns off FMA contraction to keep them so.
 */
#include "core/scratch.h"
#include "formats/formats.h"

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

static void dequantize_row_q6_K(const void *src, float *y, int64_t n) {
    const block_q6_K *b = src;
    for (int64_t i = 0; i < n / QK_K; ++i, y += QK_K) {
        const float d = fp16_to_fp32(b[i].d);
        uint8_t q[QK_K];
        q6_K_quants(&b[i], q);
        for (int e = 0; e < QK_K; ++e) y[e] = (d * (float)b[i].scales[e / 16]) * (float)(q[e] - 32);
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

int pyllm_dequantize_row(int type, const void *src, float *dst, int64_t n) {
    const int status = type_check_row(type, n);
    if (status != PYLLM_OK) return status;
    if (dequantize_table[type] == NULL) return PYLLM_ERR_TYPE;
    dequantize_table[type](src, dst, n);
    return PYLLM_OK;
}

int pyllm_dequantize_rows(int type, const void *w, int64_t n_rows, int64_t n, const int64_t *rows, int64_t m,
                          float *out) {
    const int status = type_check_row(type, n);
    if (status != PYLLM_OK) return status;
    const pyllm_type_traits *t = type_traits(type);
    const int tiled = t->tile_rows > 1;  /* its rows gathered back into the plain format's blocks first */
    const dequantize_row_fn dequantize = dequantize_table[tiled ? t->plain_type : type];
    if (dequantize == NULL) return PYLLM_ERR_TYPE;
    if (n_rows < 0 || m < 0 || n_rows % t->tile_rows != 0) return PYLLM_ERR_SHAPE;
    for (int64_t i = 0; i < m; ++i) {
        if (rows[i] < 0 || rows[i] >= n_rows) return PYLLM_ERR_SHAPE;
    }
    const int64_t row_bytes = type_row_bytes(type, n);
    uint8_t *gathered = tiled ? pyllm_scratch(SCRATCH_ROW, (size_t)row_bytes) : NULL;  /* each decode step's embedding */
    if (tiled && gathered == NULL) return PYLLM_ERR_NOMEM;
    for (int64_t i = 0; i < m; ++i) {
        const uint8_t *row = (const uint8_t *)w + rows[i] * row_bytes;
        if (tiled) {
            tile_gather_row(type, w, rows[i], n, gathered);
            row = gathered;
        }
        dequantize(row, out + i * n, n);
    }
    return PYLLM_OK;
}
