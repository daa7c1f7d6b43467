/*
 * quants.h - block layouts of the GGUF tensor formats and the kernel grid.
 *
 * One struct per format, named after it, laid out exactly as GGUF stores it.
 * Kernel names follow one grid:
 *   dequantize_row_<fmt>(blocks, y, n)         blocks -> y[n] float32
 *   quantize_row_<fmt>_ref(x, blocks, n)       x[n] float32 -> blocks
 *   vec_dot_<w>_<act>_<tier>(n, w, act)        dot product of n elements
 * n is always a multiple of the format's block size.
 *
 * The fixed reduction order (so every tier gives the same bits; see
 * vec_dot_generic.c, which defines it):
 *   - 32-element formats (llama.cpp's x86 order, so both give the same bits;
 *     Q4_0 as PYLLM_TYPE_Q4_0_LANES, the Q4_0 type itself below):
 *     lane l (0..7) of a block is the exact int sum of its elements 4l..4l+3;
 *     blocks in order, acc[l] = fmaf(d_w * d_a, (float)lane l, acc[l]); then
 *     acc8 -> 4 -> 2 -> 1 by adding lane i + half to lane i. Q4_1 / Q5_1 also
 *     chain mins = fmaf(m, s, mins) over the blocks (s: the q8_1 activation
 *     block's) and return the lane total + mins.
 *   - K-quants (llama.cpp's orders for a prompt on x86): exact int32 sums
 *     per 256-element superblock, then one accumulator, superblocks in order:
 *     acc = fmaf(d * (float)sum, d_a, acc) (Q3_K, Q6_K), or with mins
 *     acc = fmaf(fmaf(-dmin, (float)sum_min, d * (float)sum), d_a, acc)
 *     (Q2_K, Q5_K). Q4_K (its interleaved x86 layout) takes the exact sums per
 *     64-element chunk, chains sum * (d * d_a) and sum_min * (dmin * d_a) in
 *     two accumulators, and subtracts.
 *   - Q4_0 (llama.cpp's interleaved x86 layout): the exact sum of each block,
 *     acc = fmaf((float)sum, d_w * d_a, acc), blocks in order.
 *   - float weights, against activations rounded to the weights' format
 *     (F16, BF16; F32 as they are), llama.cpp's prompt order:
 *     acc[i % 8] = fmaf(w[i], x[i], acc[i % 8]) (8 lanes), then the same
 *     halving tree; elements past the last multiple of 8 are
 *     added after, in order, by fmaf.
 */
#ifndef PYLLM_QUANTS_H
#define PYLLM_QUANTS_H

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

/* The plain type of an interleaved one (PYLLM_TYPE_Q4_1 for PYLLM_TYPE_Q4_1_X16, ...), or -1. */
int x16_base_type(int type);

/* Row `row` of an interleaved matrix w of n-element rows, as the plain blocks it was, into dst. */
void x16_gather_row(int type, const void *w, int64_t row, int64_t n, void *dst);

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

/* 65536-entry fp16 -> fp32 table, filled by pyllm_init_tables() */
extern float pyllm_fp16_table[1 << 16];
static inline float fp16_lookup(fp16_t h) { return pyllm_fp16_table[h]; }
void pyllm_init_tables(void);

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

/* ---- kernel signatures ---- */

typedef void (*dequantize_row_fn)(const void *blocks, float *y, int64_t n);
typedef void (*quantize_row_fn)(const float *x, void *blocks, int64_t n);
typedef float (*vec_dot_fn)(int64_t n, const void *w, const void *act);
/* Up to VEC_DOT_MAX_ROWS activation rows for the multi-row kernels. For q8_0 / q8_1 blocks: their quants
 * copied block-major, quants[(b * VEC_DOT_MAX_ROWS + r) * 32 + j] (one pointer for all the rows, where the 8-row
 * Q5_0 kernel had run out of registers for eight; in a 64-byte-aligned scratch no load splits a cache line),
 * and their scales as floats, block-major: scale[b * VEC_DOT_MAX_ROWS + r] is row r's d in block b, sum[...]
 * its s (q8_1 only); for Q5_0 weights, offsets[(b * VEC_DOT_MAX_ROWS + r) * 8 + l] = -16 * the sum of row
 * r's quants 4l..4l+3 in block b (what the weights' offset of 16 contributes to lane l, negated: the start
 * of that lane's sum of products), and -128 * that sum for Q8_0_X16 weights (stored plus 128); for Q4_0 weights,
 * block_offsets[b * VEC_DOT_MAX_ROWS + r] = 8 * the sum of row r's quants in block b. Rows from n_rows on
 * repeat row 0's blocks (with scale and sum 0; act_rows_prepare), and their results are dropped. */
#define VEC_DOT_MAX_ROWS 4
typedef struct {
    const void *rows[VEC_DOT_MAX_ROWS];
    const int8_t *quants;  /* q8_0 / q8_1 rows (NULL for q8_K) */
    const float *scale;
    const float *sum;
    const int32_t *offsets;
    const int32_t *block_offsets;
    int n_rows;
} act_rows;

/* Bytes of scratch act_rows_prepare needs for a group of rows of n elements against weight_type: whole
 * 64-byte lines, so groups' scratch side by side in a 64-byte-aligned buffer keeps every group's quants aligned. */
int64_t act_rows_scratch_bytes(int weight_type, int64_t n);

/* Points group at the n_rows rows (1..VEC_DOT_MAX_ROWS) of weight_type's activation format and fills its
 * scales (and sums, offsets) in scratch (act_rows_scratch_bytes(weight_type, n), float-aligned). */
void act_rows_prepare(act_rows *group, int weight_type, const void *const *rows, int n_rows, int64_t n,
                      void *scratch);

/* out[r] = vec_dot(n, w, group->rows[r]) for r < group->n_rows, bit for bit: one weight row against several
 * activation rows, unpacking the weights once. out has room for VEC_DOT_MAX_ROWS per group (the padding
 * rows' entries may be written too). */
typedef void (*vec_dot_rows_fn)(int64_t n, const void *w, const act_rows *group, float *out);

/* One activation row in the same form with one row a block (quants[b * 32 + j], scale[b], sum[b],
 * offsets[b * 8 + l], block_offsets[b]; n_rows = 1), for the single-row kernels of a decode step: the quants
 * 32-byte aligned where q8_0's 34-byte blocks split every other load across cache lines, the scales as
 * floats, and Q5_0's unsigned form (no sign trick) by its offsets. Scratch: act_row_scratch_bytes, 64-aligned. */
int64_t act_row_scratch_bytes(int weight_type, int64_t n);
void act_row_prepare(act_rows *row, int weight_type, const void *act, int64_t n, void *scratch);

/* vec_dot(n, w, row->rows[0]), bit for bit (for scales that are not NaN), from a row act_row_prepare laid out. */
typedef float (*vec_dot_row_fn)(int64_t n, const void *w, const act_rows *row);

/* VEC_DOT_COLS weight rows at once (w, w + stride, ...) against one activation row act in vec_dot's format:
 * out[c] = vec_dot(n, w + c * stride, act), bit for bit. */
#define VEC_DOT_COLS 4
typedef void (*vec_dot_cols_fn)(int64_t n, const void *w, int64_t stride, const void *act, float *out);

/* One tile of an interleaved matrix (16 weight rows) against one or two activation rows, each laid out by
 * act_row_prepare for the interleaved type: out[r * stride + i] = vec_dot(n, weight row i, rows[r]) for i < 16
 * and r < n_rows, bit for bit (for scales that are not NaN). Unless prefetch is NULL, block step b also asks
 * for a block's bytes at prefetch + b * (the tile block's bytes): with `next_tile` into L2 (a later pass over a
 * tile in cache, pointed at the next tile), otherwise into L1 (a pass reading the tile from memory, pointed a few
 * blocks ahead of it; the Q8_0 kernel leaves that stream to the hardware). */
typedef void (*x16_kernel_fn)(int64_t n, const void *tile, const act_rows *rows, int n_rows, float *out,
                              int64_t stride, const uint8_t *prefetch, int next_tile);
extern const x16_kernel_fn x16_kernel_table_avx512_vnni[PYLLM_TYPE_COUNT];  /* NULL off x86-64 */

/* Per-tier vec_dot tables, indexed by weight type; NULL where the tier has no
 * kernel of its own (the dispatcher then looks further down the tier's list: dispatch.c). */
extern const vec_dot_fn vec_dot_table_generic[PYLLM_TYPE_COUNT];
extern const vec_dot_fn vec_dot_table_avx2[PYLLM_TYPE_COUNT];
extern const vec_dot_fn vec_dot_table_avx512[PYLLM_TYPE_COUNT];
/* vec_dot_avx2.inc's 256-bit kernels with VNNI dots: the avx512_vnni tier's. */
extern const vec_dot_fn vec_dot_table_avx2_vnni[PYLLM_TYPE_COUNT];
/* Multi-row kernels of the AVX2 family and its VNNI twin (NULL elsewhere: matmul then calls vec_dot row by
 * row), each giving its family's vec_dot bits. */
extern const vec_dot_rows_fn vec_dot_rows_table_avx2[PYLLM_TYPE_COUNT];
extern const vec_dot_rows_fn vec_dot_rows_table_avx2_vnni[PYLLM_TYPE_COUNT];
/* The same over two groups (2 * VEC_DOT_MAX_ROWS rows: group[0], group[1]; out[2 * VEC_DOT_MAX_ROWS]). */
extern const vec_dot_rows_fn vec_dot_rows8_table_avx2[PYLLM_TYPE_COUNT];
extern const vec_dot_rows_fn vec_dot_rows8_table_avx2_vnni[PYLLM_TYPE_COUNT];
/* Single-row kernels over a prepared row (NULL elsewhere: matmul calls vec_dot). */
extern const vec_dot_row_fn vec_dot_row_table_avx2[PYLLM_TYPE_COUNT];
extern const vec_dot_row_fn vec_dot_row_table_avx2_vnni[PYLLM_TYPE_COUNT];
/* Kernels of several weight rows against one activation row, for the formats without a row kernel (NULL
 * elsewhere: matmul calls vec_dot). */
extern const vec_dot_cols_fn vec_dot_cols_table_avx2[PYLLM_TYPE_COUNT];
extern const vec_dot_cols_fn vec_dot_cols_table_avx2_vnni[PYLLM_TYPE_COUNT];

/* The non-matmul inner loops, one set per tier, bit-identical (llama.cpp's arithmetic; see ops.c):
 * dots:         out[j] = q[d] . k_j[d] for the n keys k_j = k + j * stride, each in 8 lanes (lane i % 8 takes
 *               fmaf in index order), summed as reduce_lanes8 does;
 * softmax_half: s[n] scores (-INFINITY: masked) -> the softmax weights rounded to half precision (as floats):
 *               e = exp_ggml(s - max) (0 where masked), summed in double by groups of 8 (each group's 8 as
 *               reduce_lanes8), then round_half(e * (float)(1 / sum));
 * weighted_sum: out[i] = sum over the n values v_t = v + t * stride of p[t] * v_t[i]: 8 lanes by t mod 8,
 *               each a chain of fmaf in t order (a zero p skipped), then reduce_lanes8 across the lanes;
 * swiglu:       y[i] = g[i] / (1 + exp_ggml(0 - g[i])) * u[i] over the whole groups of 8, with libm's expf
 *               in place of exp_ggml on the rest;
 * quantize_*:   quantize_row_q8_0_act, quantize_row_q8_1_act and the q8_K reference quantizer;
 * geglu:        y[i] = 0 where g[i] <= -10, g[i] * u[i] where g[i] >= 10, otherwise
 *               (float)gelu_table[half(g[i])] * u[i] (the table: gelu at every half, rounded to half);
 * to_half:      y[i] = fp32_to_fp16(x[i]);
 * round_half:   y[i] = fp16_to_fp32(fp32_to_fp16(x[i])) (x rounded to half precision, kept as floats);
 * rope_head:    one head's first n_rot dims rotated by cos_sin (pyllm_rope_angles' row): pairs (a, b) = (2i, 2i + 1)
 *               or, neox, (i, i + n_rot / 2) become (fmaf(x_a, c_i, -(x_b * s_i)), fmaf(x_a, s_i, x_b * c_i)) (the
 *               fused multiply-adds of llama.cpp's x86 build: its compiler contracts the rotation);
 * argmax:       the first index of the largest of x[0..n) (n > 0); *nan <- whether x holds a NaN (then any index);
 * scale_max:    s[i] *= scale, returning the largest (NaN skipped; -INFINITY if none; either zero on a tie of
 *               zeros);
 * scale_row:    y[i] = (x[i] * scale) * w[i], or x[i] * scale where w is NULL (rms_norm's last step; y may be x). */
typedef struct {
    void (*dots)(const float *q, const fp16_t *k, int64_t stride, int64_t n, int64_t d, float *out);
    void (*softmax_half)(float *s, int64_t n, float max);
    void (*weighted_sum)(const float *p, const fp16_t *v, int64_t stride, int64_t n, int64_t d, float *out);
    void (*swiglu)(const float *g, const float *u, float *y, int64_t n);
    quantize_row_fn quantize_q8_0, quantize_q8_1, quantize_q8_K;  /* activation rows for the weight formats */
    void (*geglu)(const fp16_t *gelu_table, const float *g, const float *u, float *y, int64_t n);
    void (*to_half)(const float *x, fp16_t *y, int64_t n);
    void (*round_half)(const float *x, float *y, int64_t n);
    void (*rope_head)(float *head, const float *cos_sin, int64_t n_rot, int neox);
    int64_t (*argmax)(const float *x, int64_t n, int *nan);
    float (*scale_max)(float *s, int64_t n, float scale);
    void (*scale_row)(const float *x, const float *w, float *y, int64_t n, float scale);
} op_kernels;

extern const op_kernels op_kernels_generic;
extern const op_kernels op_kernels_avx2;  /* all NULL off x86-64 */

/* A prompt's attention (ops.c: a block of queries against one kv head's keys and values, converted once),
 * the same bits as dots and weighted_sum above:
 * kv_to_float:    keys k_t and values v_t (t < n, at k + t * stride, v + t * stride) to float: kt in blocks of 16
 *                 keys (block b at kt + 16 * b * d; a last block's missing keys zero), vf in chunks of 16
 *                 dimensions (chunk c of key t at vf + (c * n + t) * 16); both 64-byte aligned, d a multiple
 *                 of 16;
 * dots_t:         out[j] = q . key j of one block of kt, for its 16 keys, as dots;
 * weighted_sum_f: out[j] = weighted_sum's dimension j of a chunk of vf, over the n keys of p (chunk: p's first
 *                 key's values in the chunk, that key a multiple of 8 after the first converted one). */
typedef struct {
    void (*kv_to_float)(const fp16_t *k, const fp16_t *v, int64_t stride, int64_t n, int64_t d, float *kt, float *vf);
    void (*dots_t)(const float *q, const float *block, int64_t d, float *out);
    void (*weighted_sum_f)(const float *p, const float *chunk, int64_t n, float *out);
} prompt_attention_kernels;

extern const prompt_attention_kernels prompt_attention_avx512;  /* all NULL off x86-64 */

/* A decode row's g heads that share a kv head (ops.c, attend_heads), head by head the bits of dots and
 * weighted_sum above; d a multiple of 8:
 * dots_heads:         out[h * out_stride + j] = dots of query h (q + h * d) and key j (k + j * stride), j < n;
 * weighted_sum_heads: out[h * d .. h * d + d - 1] = weighted_sum of head h's weights (p + h * p_stride) over
 *                     the n values at v + t * stride. */
typedef struct {
    void (*dots_heads)(const float *q, int64_t g, const fp16_t *k, int64_t stride, int64_t n, int64_t d, float *out,
                       int64_t out_stride);
    void (*weighted_sum_heads)(const float *p, int64_t p_stride, int64_t g, const fp16_t *v, int64_t stride, int64_t n,
                               int64_t d, float *out);
} head_group_kernels;

extern const head_group_kernels head_group_avx512;  /* all NULL off x86-64 */

/* exp(x) as llama.cpp's x86 vector code computes it (see vec_dot_generic.c) */
float exp_ggml(float x);

/* The activation quantizers of the 32-element formats (llama.cpp's x86 rounding). */
void quantize_row_q8_0_act(const float *x, void *blocks, int64_t n);
void quantize_row_q8_1_act(const float *x, void *blocks, int64_t n);
/* q8_K as llama.cpp quantizes it: the first element of largest |x| maps to -127. */
void quantize_row_q8_K_ref(const float *x, void *blocks, int64_t n);

/* Reference dequantizers and quantizers (quants.c) */
extern const dequantize_row_fn dequantize_table[PYLLM_TYPE_COUNT];
extern const quantize_row_fn quantize_table[PYLLM_TYPE_COUNT];

/* op_kernels' rope_head on pairs i0..n_rot/2 - 1, one by one: the generic kernel, and a SIMD one's last pairs. */
static inline void rope_head_pairs(float *head, const float *cos_sin, int64_t i0, int64_t n_rot, int neox) {
    const int64_t half = n_rot / 2;
    for (int64_t i = i0; i < half; ++i) {
        const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
        const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = head[a], x1 = head[b];
        head[a] = fmaf(x0, c, -(x1 * s));
        head[b] = fmaf(x0, s, x1 * c);
    }
}

/* The fixed final reductions shared by every tier. */
static inline float reduce_lanes8(const float acc[8]) {
    float a4[4], a2[2];
    for (int i = 0; i < 4; ++i) a4[i] = acc[i] + acc[i + 4];
    for (int i = 0; i < 2; ++i) a2[i] = a4[i] + a4[i + 2];
    return a2[0] + a2[1];
}

static inline float reduce_lanes16(const float acc[16]) {
    float a8[8];
    for (int i = 0; i < 8; ++i) a8[i] = acc[i] + acc[i + 8];
    return reduce_lanes8(a8);
}

#endif /* PYLLM_QUANTS_H */
