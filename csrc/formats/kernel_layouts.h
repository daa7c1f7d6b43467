/*
 * kernel_layouts.h - the layouts matmul lays rows out in for the kernels that take more than one row at a time
 * (backend/kernel_set.h): activation rows in groups of four (act_rows) or alone but aligned (act_row_prepare),
 * sixteen side by side in a panel (act_panel), and weight rows unpacked to bytes for the panels (unpacked_row).
 * kernel_layouts.c builds them (the references; a tier may lay a panel out faster, byte for byte the same).
 */
#ifndef PYLLM_KERNEL_LAYOUTS_H
#define PYLLM_KERNEL_LAYOUTS_H

#include "formats/blocks.h"

/* ---- activation rows in groups (the multi-row kernels) and alone (the prepared single-row and tile kernels) ---- */

/* Up to VEC_DOT_MAX_ROWS activation rows for the multi-row kernels. For q8_0 / q8_1 blocks: their quants
 * copied block-major, quants[(b * VEC_DOT_MAX_ROWS + r) * 32 + j] (one pointer for all the rows, which keeps the
 * 8-row kernels within the registers; in a 64-byte-aligned scratch no load splits a cache line),
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

/* One activation row in the same form with one row a block (quants[b * 32 + j], scale[b], sum[b],
 * offsets[b * 8 + l], block_offsets[b]; n_rows = 1), for the single-row kernels of a decode step: the quants
 * 32-byte aligned where q8_0's 34-byte blocks split every other load across cache lines, the scales as
 * floats, and Q5_0's unsigned form (no sign trick) by its offsets. Scratch: act_row_scratch_bytes, 64-aligned. */
int64_t act_row_scratch_bytes(int weight_type, int64_t n);
void act_row_prepare(act_rows *row, int weight_type, const void *act, int64_t n, void *scratch);

/* ---- panels: 16 activation rows side by side (the avx512_vnni tier's prompt matmul) ---- */

/*
 * Lane r of every vector of a panel kernel is activation row r: one vpdpbusd takes 4 elements of all 16 rows
 * against 4 weight bytes broadcast from memory, so a block's 8 lane sums for 16 rows are 8 dots, 8 conversions and
 * 8 FMAs (the multi-row kernels pay a permute, a dot, a conversion and an FMA per row and block). Each output still
 * follows its reference's float steps exactly: lane l of the reference is accumulator l there, and the closing lane
 * tree is the same adds between accumulators. The activations are the unsigned operand of vpdpbusd (the weights,
 * broadcast, the signed one), so they are stored plus 128, and each weight row carries per block the corrections
 * -128 * (the sum of each lane's 4 weights): every integer sum stays exact.
 */
#define PANEL_ROWS 16

/* Activation rows for the panel kernels (act_panel_prepare lays them out), in 32-element blocks (a q8_K
 * superblock is 8 of them):
 *   quants (n / 32, 8, PANEL_ROWS, 4) uint8: [b][l][r][j] = row r's element 32 b + 4 l + j, plus 128;
 *   scale: row r's d, (n / 32, PANEL_ROWS) float for q8_0 / q8_1 rows, (n / 256, PANEL_ROWS) for q8_K;
 *   sum (n / 32, PANEL_ROWS) float: row r's s of block b (q8_1 rows; NULL otherwise);
 *   group_sums (n / 32, PANEL_ROWS) float: row r's activations of block b summed, from its bsums (q8_K
 *     rows; NULL otherwise).
 * Rows n_rows.. of a panel are zeros (scale 0); their outputs are dropped. */
typedef struct {
    const uint8_t *quants;
    const float *scale;
    const float *sum;
    const float *group_sums;
    int n_rows;
} act_panel;

/* The neon_i8mm tier's panels (PANEL_LAYOUT_PAIRS, arm/panel_neon_i8mm.c) hold the same parts, the quants in
 * another order and signed: (n / 32, 4, PANEL_ROWS, 8) int8, [b][h][r][j] = row r's element 32 b + 8 h + j (the
 * operand of smmla: 16 bytes are 8 elements of two rows); scale, sum and group_sums as above. */

/* Bytes of 64-byte-aligned scratch for one panel of n-element rows. */
int64_t act_panel_scratch_bytes(int weight_type, int64_t n);

/* Lays out n_rows (1..PANEL_ROWS) activation rows of weight_type's format (q8_0, q8_1 or q8_K), row r at
 * first + r * row_bytes, in scratch: the reference layout (a tier's panel_prepare writes the same bytes). */
void act_panel_prepare(act_panel *panel, int weight_type, const void *first, int64_t row_bytes, int n_rows,
                       int64_t n, void *scratch);

/* Points panel's parts into scratch (act_panel_scratch_bytes(weight_type, n)), for n_rows rows. */
void act_panel_layout(act_panel *panel, int weight_type, int n_rows, int64_t n, void *scratch);

/* A weight row unpacked for the panel kernels, in 64-byte-aligned scratch (unpacked_row_bytes):
 *   blocks: per block (32-element formats: unpacked_block) or superblock (unpacked_q4_K, unpacked_q6_K);
 *   d: the blocks' (superblocks') scales as floats;
 *   m: their mins (Q4_1 / Q5_1: m, Q4_K: dmin; NULL for the others). */
typedef struct {
    const void *blocks;
    const float *d;
    const float *m;
} unpacked_row;

/* A block of a 32-element format: its weights as signed bytes (Q4_1 / Q5_1: their unsigned q, at most 31), and
 * correction[l] = -128 * (weights 4 l .. 4 l + 3 summed); Q4_0 (whole-block sums) keeps the block's total in
 * correction[0]. */
typedef struct {
    int8_t q[QK32];
    int32_t correction[8];
} unpacked_block;
static_assert(sizeof(unpacked_block) == 64, "unpacked_block size");

/* A Q4_K superblock: q 0..15 in element order, each 32-element group's correction (-128 * its weights
 * summed), 6-bit scale and min. */
typedef struct {
    int8_t q[QK_K];
    int32_t correction[8];
    float scale[8];
    float min[8];
    uint8_t pad[32];
} unpacked_q4_K;
static_assert(sizeof(unpacked_q4_K) == 384, "unpacked_q4_K size");

/* A Q6_K superblock: q - 32 in element order, each 16-element group's correction and int8 scale. */
typedef struct {
    int8_t q[QK_K];
    int32_t correction[16];
    int32_t scale[16];
} unpacked_q6_K;
static_assert(sizeof(unpacked_q6_K) == 384, "unpacked_q6_K size");

/* Bytes of scratch one unpacked weight row of n elements of weight_type takes. */
int64_t unpacked_row_bytes(int weight_type, int64_t n);

#endif /* PYLLM_KERNEL_LAYOUTS_H */
