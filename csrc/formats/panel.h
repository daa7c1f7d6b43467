/*
 * panel.h - the prompt matmul of the avx512_vnni tier: 16 activation rows side by side in the 16 lanes
 * of a 512-bit vector ("a panel"), against weight rows unpacked to bytes.
 *
 * The multi-row kernels of vec_dot_avx2.inc hold one row's 8 lane sums in a vector and pay a
 * permute, a dot, a conversion and an FMA per row and block. Here lane r of every vector is activation
 * row r: one vpdpbusd takes 4 elements of all 16 rows against 4 weight bytes broadcast from memory, so
 * a block's 8 lane sums for 16 rows are 8 dots, 8 conversions and 8 FMAs. Each output still follows its
 * reference's float steps exactly (quants.h): lane l of the reference is accumulator l here, and the
 * closing lane tree is the same adds between accumulators.
 *
 * The activations are the unsigned operand of vpdpbusd (the weights, broadcast, the signed one), so they
 * are stored plus 128, and each weight row carries per block the corrections -128 * (the sum of each
 * lane's 4 weights): every integer sum stays exact.
 */
#ifndef PYLLM_PANEL_H
#define PYLLM_PANEL_H

#include "formats/quants.h"

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

/* Bytes of 64-byte-aligned scratch for one panel of n-element rows. */
int64_t act_panel_scratch_bytes(int weight_type, int64_t n);

/* Lays out n_rows (1..PANEL_ROWS) activation rows of weight_type's format (q8_0, q8_1 or q8_K), row r at
 * first + r * row_bytes, in scratch: act_panel_prepare is the reference, the tier's (panel_prepare_table) the
 * same bytes. */
typedef void (*panel_prepare_fn)(act_panel *panel, int weight_type, const void *first, int64_t row_bytes,
                                 int n_rows, int64_t n, void *scratch);
void act_panel_prepare(act_panel *panel, int weight_type, const void *first, int64_t row_bytes, int n_rows,
                       int64_t n, void *scratch);
extern const panel_prepare_fn panel_prepare_avx512_vnni;  /* NULL off x86-64 */

/* Points panel's parts into scratch (act_panel_scratch_bytes(weight_type, n)), for n_rows rows. */
void act_panel_layout(act_panel *panel, int weight_type, int n_rows, int64_t n, void *scratch);

/* A weight row unpacked for the panel kernels, in 64-byte-aligned scratch (wide_row_scratch_bytes):
 *   blocks: per block (32-element formats: wide_block) or superblock (wide_q4_K, wide_q6_K);
 *   d: the blocks' (superblocks') scales as floats;
 *   m: their mins (Q4_1 / Q5_1: m, Q4_K: dmin; NULL for the others). */
typedef struct {
    const void *blocks;
    const float *d;
    const float *m;
} wide_row;

/* A block of a 32-element format: its weights as signed bytes (Q4_1 / Q5_1: their unsigned q, at most 31), and
 * correction[l] = -128 * (weights 4 l .. 4 l + 3 summed); Q4_0 (whole-block sums) keeps the block's total in
 * correction[0]. */
typedef struct {
    int8_t q[QK32];
    int32_t correction[8];
} wide_block;
static_assert(sizeof(wide_block) == 64, "wide_block size");

/* A Q4_K superblock: q 0..15 in element order, each 32-element group's correction (-128 * its weights
 * summed), 6-bit scale and min. */
typedef struct {
    int8_t q[QK_K];
    int32_t correction[8];
    float scale[8];
    float min[8];
    uint8_t pad[32];
} wide_q4_K;
static_assert(sizeof(wide_q4_K) == 384, "wide_q4_K size");

/* A Q6_K superblock: q - 32 in element order, each 16-element group's correction and int8 scale. */
typedef struct {
    int8_t q[QK_K];
    int32_t correction[16];
    int32_t scale[16];
} wide_q6_K;
static_assert(sizeof(wide_q6_K) == 384, "wide_q6_K size");

int64_t wide_row_scratch_bytes(int weight_type, int64_t n);

/* Unpacks the weight row w (n elements of weight_type) into scratch. */
typedef void (*wide_unpack_fn)(const void *w, int64_t n, void *scratch, wide_row *row);

/* out[i][r] = vec_dot(n, weight row i, activation row r) for two weight rows and a panel, bit for bit (for
 * scales that are not NaN). */
typedef void (*panel_kernel_fn)(int64_t n, const wide_row rows[2], const act_panel *panel,
                                float out[2][PANEL_ROWS]);

/* NULL where a type has none (or off x86-64). */
extern const wide_unpack_fn wide_unpack_table_avx512_vnni[PYLLM_TYPE_COUNT];
extern const panel_kernel_fn panel_kernel_table_avx512_vnni[PYLLM_TYPE_COUNT];

#endif /* PYLLM_PANEL_H */
