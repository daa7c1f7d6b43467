/*
 * blocks.h - the tensor formats as they lie in memory: one struct per GGUF block format, named after it, laid out
 * exactly as GGUF stores it (a comment per field, bits per weight, a size assert), and the layouts pyllm rebuilds a
 * matrix into at load (Q5_0 regrouped, 16-row tiles), with the scalar helpers that read them.
 *
 * Rows of a matrix are n elements long, stored as n / block_size blocks of type_size bytes (formats/types.c holds
 * both for every type id). n is always a multiple of the format's block size.
 */
#ifndef PYLLM_BLOCKS_H
#define PYLLM_BLOCKS_H

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "pyllm.h"

#define QK32 32   /* elements per block of the 32-element formats */
#define QK_K 256  /* elements per superblock of the K-quants */

typedef uint16_t fp16_t;  /* IEEE binary16 bits */
typedef uint16_t bf16_t;  /* bfloat16 bits */

/* 4.5 bits/weight: x = d * (q - 8) */
typedef struct {
    fp16_t d;
    uint8_t qs[QK32 / 2];  /* element j in the low nibble of qs[j], j + 16 in the high one */
} block_q4_0;
static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");

/* 5 bits/weight: x = d * q + m */
typedef struct {
    fp16_t d;
    fp16_t m;
    uint8_t qs[QK32 / 2];
} block_q4_1;
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");

/* 5.5 bits/weight: x = d * (q - 16), q's fifth bit of element j is bit j of qh */
typedef struct {
    fp16_t d;
    uint8_t qh[4];
    uint8_t qs[QK32 / 2];
} block_q5_0;
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");

/* PYLLM_TYPE_Q5_0_G8: a row's Q5_0 blocks eight at a time, in the same 176 bytes: the eight scales, then
 * qh[j] holding block k's fifth bit of element j in bit k, then the eight blocks' nibbles. The row's last
 * n_blocks % 8 blocks stay plain Q5_0. A kernel takes the eight scales in one load and a block's fifth bits
 * by one shift and mask, where a plain block needs its bits spread to bytes. */
typedef struct {
    fp16_t d[8];
    uint8_t qh[QK32];
    uint8_t qs[8][QK32 / 2];
} group_q5_0;
static_assert(sizeof(group_q5_0) == 8 * sizeof(block_q5_0), "group_q5_0 size");

/* A Q5_0 / Q5_1 block's 32 fifth bits: bit j is element j's. */
static inline uint32_t q5_high_bits(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

/* Block b of a Q5_0_G8 row of nb blocks, as the plain block it was. */
static inline block_q5_0 q5_0_g8_block(const void *row, int64_t nb, int64_t b) {
    block_q5_0 out;
    if (b >= nb / 8 * 8) {
        memcpy(&out, (const uint8_t *)row + b * (int64_t)sizeof(block_q5_0), sizeof out);
        return out;
    }
    const group_q5_0 *g = (const group_q5_0 *)row + b / 8;
    const int k = (int)(b % 8);
    out.d = g->d[k];
    memset(out.qh, 0, sizeof out.qh);
    for (int j = 0; j < QK32; ++j) out.qh[j / 8] |= (uint8_t)(((g->qh[j] >> k) & 1) << (j % 8));
    memcpy(out.qs, g->qs[k], sizeof out.qs);
    return out;
}

/* PYLLM_TYPE_Q4_1_X16 / PYLLM_TYPE_Q8_0_X16 / PYLLM_TYPE_Q5_0_X16: a matrix of Q4_1 / Q8_0 / Q5_0 rows, 16 rows
 * a tile (the row count a multiple of 16), tile t's block b at index t * n_blocks + b: the 16 rows' block b with
 * their scales side by side and their quants interleaved 4 bytes at a time, so that one 64-byte load holds the
 * same 4 elements (a lane of the reduction order) of all 16 rows. The same bits as the plain matrix, moved. */
#define X16_ROWS 16
typedef struct {
    fp16_t d[X16_ROWS];
    fp16_t m[X16_ROWS];
    uint8_t qs[4][X16_ROWS][4];  /* [c][r][j]: row r's qs[4c + j] (elements 4c + j low, 16 + 4c + j high) */
} tile_q4_1;
static_assert(sizeof(tile_q4_1) == X16_ROWS * sizeof(block_q4_1), "tile_q4_1 size");

/* 6 bits/weight: x = d * q + m */
typedef struct {
    fp16_t d;
    fp16_t m;
    uint8_t qh[4];
    uint8_t qs[QK32 / 2];
} block_q5_1;
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");

/* 8.5 bits/weight: x = d * q. Also the activation format of the 32-element formats. */
typedef struct {
    fp16_t d;
    int8_t qs[QK32];
} block_q8_0;
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");

typedef struct {
    fp16_t d[X16_ROWS];
    uint8_t qs[8][X16_ROWS][4];  /* [l][r][j]: row r's element 4l + j plus 128 (0..255: the unsigned operand) */
} tile_q8_0;
static_assert(sizeof(tile_q8_0) == X16_ROWS * sizeof(block_q8_0), "tile_q8_0 size");

/* Q5_0's tile: the nibbles as Q4_1's tile holds them, and each lane's fifth bits as one 64-bit mask, bit
 * 4 r + j row r's element 4l + j's (the mask a byte-masked add takes: q = nibble + 16 where the bit is set). */
typedef struct {
    fp16_t d[X16_ROWS];
    uint64_t qh[8];              /* [l]: bit 4 r + j is row r's fifth bit of element 4l + j */
    uint8_t qs[4][X16_ROWS][4];  /* [c][r][j]: row r's qs[4c + j] (elements 4c + j low, 16 + 4c + j high) */
} tile_q5_0;
static_assert(sizeof(tile_q5_0) == X16_ROWS * sizeof(block_q5_0), "tile_q5_0 size");

/* Activation format of Q4_1 / Q5_1: q8_0 plus s = d * sum(qs), rounded to half precision
 * from the unrounded d (what the minimum term of those formats multiplies). */
typedef struct {
    fp16_t d;
    fp16_t s;
    int8_t qs[QK32];
} block_q8_1;
static_assert(sizeof(block_q8_1) == 36, "block_q8_1 size");

/* 2.625 bits/weight: 16 groups of 16, x = d * (sc & 15) * q - dmin * (sc >> 4) */
typedef struct {
    uint8_t scales[QK_K / 16];  /* low nibble: scale, high nibble: min, per group of 16 */
    uint8_t qs[QK_K / 4];       /* 2-bit quants, 4 per byte (shifts 0, 2, 4, 6 -> 32-element runs) */
    fp16_t d;
    fp16_t dmin;
} block_q2_K;
static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");

/* 3.4375 bits/weight: 16 groups of 16, x = d * (sc - 32) * (q - 4 * !hbit) */
typedef struct {
    uint8_t hmask[QK_K / 8];  /* bit b of hmask[l]: high bit of element 32 * b + l */
    uint8_t qs[QK_K / 4];     /* low 2 bits, as in Q2_K */
    uint8_t scales[12];       /* 16 six-bit scales: low nibbles in 0..7, high 2 bits in 8..11 */
    fp16_t d;
} block_q3_K;
static_assert(sizeof(block_q3_K) == 110, "block_q3_K size");

/* 4.5 bits/weight: 8 groups of 32, x = d * sc * q - dmin * m (6-bit sc, m) */
typedef struct {
    fp16_t d;
    fp16_t dmin;
    uint8_t scales[12];     /* 8 scales and 8 mins, 6 bits each (see scale_min_k4) */
    uint8_t qs[QK_K / 2];   /* 64-element runs: low nibbles of 32 bytes, then their high nibbles */
} block_q4_K;
static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");

/* PYLLM_TYPE_Q4_K_X16: a Q4_K matrix in 16-row tiles (tile t's superblock b at index t * n_blocks + b), each two
 * halves of 8 rows whose fields lie side by side, row r in 32-bit lane r: a 256-bit load holds the same 4-byte unit
 * of 8 rows, and their scales as 8 words, so the AVX2 kernels keep 8 outputs in the lanes of one vector (no
 * horizontal sums). The superblock goes in the order its decode kernel reads it: both halves' scales, then each
 * 64-element chunk's units, both halves. */
typedef struct {
    fp16_t d[2][8];            /* [half][r] */
    fp16_t dmin[2][8];
    uint32_t scales[2][3][8];  /* [half][w][r]: row r's scales[4w .. 4w + 3] */
    uint8_t qs[4][2][8][8][4]; /* [c][half][k][r][j]: row r's qs[4 (8c + k) + j] */
} tile_q4_K;
static_assert(sizeof(tile_q4_K) == X16_ROWS * sizeof(block_q4_K), "tile_q4_K size");

/* 5.5 bits/weight: Q4_K plus a fifth bit, bit b of qh[l] for element 32 * b + l */
typedef struct {
    fp16_t d;
    fp16_t dmin;
    uint8_t scales[12];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;
static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");

/* 6.5625 bits/weight: 16 groups of 16, x = d * sc * (q - 32), 8-bit signed sc */
typedef struct {
    uint8_t ql[QK_K / 2];    /* low 4 bits */
    uint8_t qh[QK_K / 4];    /* high 2 bits */
    int8_t scales[QK_K / 16];
    fp16_t d;
} block_q6_K;
static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");

/* PYLLM_TYPE_Q6_K_X16: a Q6_K matrix in 16-row tiles (tile t's superblock b at index t * n_blocks + b), two halves of
 * 8 rows, row r in 32-bit lane r as in tile_q4_K. The quants are unsigned (0..63); each 16-element group's four
 * 4-element units take three bytes an element: units 0, 1, 2 keep their 6 bits in bits 0..5 of theirs and carry
 * unit 3's bits 4-5, 2-3, 0-1 in bits 6-7. Unpacking a group then takes 11 operations for its 4 vectors (3 ANDs free
 * units 0..2; 3 ANDs, 3 shifts and 2 ORs rebuild unit 3), where Q6_K's nibbles and bit pairs take 17. The
 * superblock goes in the order its decode kernel reads it: scales, then each pair of groups, both halves. */
typedef struct {
    fp16_t d[2][8];                /* [half][r] */
    int8_t scales[8][2][8][2];     /* [p][half][r][j]: row r's scales[2 p + j] */
    uint8_t qs[8][2][2][3][8][4];  /* [p][half][j][x][r][i]: group 2 p + j, unit x's element i, unit 3's bits added */
} tile_q6_K;
static_assert(sizeof(tile_q6_K) == X16_ROWS * sizeof(block_q6_K), "tile_q6_K size");

/* Activation format of the K-quants: x = d * q, with sums of each group of 16 */
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;
static_assert(sizeof(block_q8_K) == 292, "block_q8_K size");

/* ---- scalar conversions (exact; float -> half rounds to nearest even) ---- */

static inline float fp32_from_bits(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }
static inline uint32_t fp32_to_bits(float f) { uint32_t w; memcpy(&w, &f, 4); return w; }

float fp16_to_fp32(fp16_t h);
fp16_t fp32_to_fp16(float f);
static inline float bf16_to_fp32(bf16_t h) { return fp32_from_bits((uint32_t)h << 16); }
bf16_t fp32_to_bf16(float f);


/* The 6-bit scale and min j (0..7) of a Q4_K / Q5_K superblock. */
static inline void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The 16 signed scales of a Q3_K superblock, in group order. */
static inline void q3_K_scales(const uint8_t *packed, int8_t out[16]) {
    for (int k = 0; k < 16; ++k) {
        int low = k < 8 ? (packed[k] & 0xF) : (packed[k - 8] >> 4);
        int high = (packed[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
        out[k] = (int8_t)((low | (high << 4)) - 32);
    }
}

/* A Q6_K superblock's quants (0..63) in element order: each 128-element half's four runs of 32 take the low nibbles of
 * ql[0..31], of ql[32..63], then their high nibbles, and bits 0-1, 2-3, 4-5, 6-7 of qh[0..31]. */
static inline void q6_K_quants(const block_q6_K *x, uint8_t q[QK_K]) {
    for (int half = 0; half < 2; ++half) {
        const uint8_t *ql = x->ql + 64 * half, *qh = x->qh + 32 * half;
        uint8_t *out = q + 128 * half;
        for (int l = 0; l < 32; ++l) {
            out[l] = (uint8_t)((ql[l] & 0xF) | (qh[l] & 3) << 4);
            out[l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (qh[l] >> 2 & 3) << 4);
            out[l + 64] = (uint8_t)((ql[l] >> 4) | (qh[l] >> 4 & 3) << 4);
            out[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (qh[l] >> 6) << 4);
        }
    }
}

/* The inverse: quants 0..63 in element order into a superblock's ql and qh. */
static inline void q6_K_put_quants(const uint8_t q[QK_K], block_q6_K *x) {
    for (int half = 0; half < 2; ++half) {
        const uint8_t *in = q + 128 * half;
        uint8_t *ql = x->ql + 64 * half, *qh = x->qh + 32 * half;
        for (int l = 0; l < 32; ++l) {
            ql[l] = (uint8_t)((in[l] & 0xF) | (in[l + 64] & 0xF) << 4);
            ql[l + 32] = (uint8_t)((in[l + 32] & 0xF) | (in[l + 96] & 0xF) << 4);
            qh[l] = (uint8_t)((in[l] >> 4) | (in[l + 32] >> 4) << 2 | (in[l + 64] >> 4) << 4 | (in[l + 96] >> 4) << 6);
        }
    }
}

#endif /* PYLLM_BLOCKS_H */
