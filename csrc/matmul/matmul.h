/*
 * matmul.h - Y = X . W^T over quantized weight rows, for one weight or several sharing X (a layer's q, k and v, its
 * gate and up): planned (plan.c: which kernel shape takes which rows, the scratch, the phase), then run (run.c).
 *
 * Every output element depends only on its weight row and its X row, never on how the work was split or on M: each
 * shape of a kernel set gives its vec_dot's bits.
 */
#ifndef PYLLM_MATMUL_H
#define PYLLM_MATMUL_H

#include "backend/kernel_set.h"

/* One weight of a multiplication: n rows (the kernel set's layout, row length k), and its output y (m, n). */
typedef struct {
    const void *data;
    int64_t n;
    float *y;
} matmul_weight;

/* The most weights one call takes. */
#define MATMUL_MAX_WEIGHTS 4

/* Weight rows handled together, so a tile of W stays in cache across X rows (a tiled W's tile). */
#define ROW_TILE X16_ROWS

/* How a matmul goes, decided before it runs.
 *
 * X's rows go, in this order, to panels of PANEL_ROWS (where the set has panel kernels), to groups of
 * VEC_DOT_MAX_ROWS for the multi-row kernels, and one at a time (the single rows) to the prepared kernel, the
 * cols4 kernel or vec_dot. A tiled W takes every X row, tile_max_rows at a time, to its tile kernel (a prompt's as
 * well where the set says tile_prefill); otherwise (a prompt on the ARM tiers' Q4_K tiles, a tier with no tile
 * kernel) each tile is rebuilt into plain rows (tile_gather) for the plain format's panels, multi-row kernels and
 * vec_dot.
 *
 * The weight rows of all the weights, one after another and each rounded up to whole tiles, are dealt out to the
 * threads: a decode step's in one contiguous range a thread, a prefill's in chunks to whichever thread asks next. */
typedef struct {
    const pyllm_kernel_set *ks;
    pyllm_phase phase;
    int tiled;                /* W in a tiled layout: its rows are not one after another */
    int use_tiles;            /* a tiled W read by its tile kernel */
    int group_type;           /* the layout the groups are prepared for: a gathered tiled W's plain type */
    int n_threads;
    const float *x;           /* (m, k) */
    int64_t m, k;
    const matmul_weight *weights;
    int n_weights;
    int64_t first[MATMUL_MAX_WEIGHTS];  /* weight i's rows are rows first[i].. of those dealt out */
    int64_t n_dealt;          /* the rows dealt out: every weight's, each rounded up to whole tiles */
    int64_t w_row_bytes, act_row_bytes;
    int64_t n_panels;         /* X rows 0 .. n_panels * PANEL_ROWS - 1 */
    int64_t n_groups;         /* then n_groups groups (the last one maybe short) */
    int64_t first_single;     /* then the single rows, first_single .. m - 1 */
    int64_t n_prepared;       /* of them, laid out for the prepared or tile kernel (m - first_single), or 0 */
    int64_t panel_bytes, unpacked_bytes, group_bytes, prepared_bytes;  /* each one's scratch */
    int64_t gathered_bytes;   /* a thread's tile of a tiled W rebuilt into plain rows (not use_tiles), or 0 */
    int64_t chunk_rows;       /* a prefill: weight rows dealt out at a time (whole tiles) */
} matmul_plan;

/* Checks the arguments and plans y_i = X . W_i^T for n_weights (1..MATMUL_MAX_WEIGHTS) weights of one kernel set and
 * row length k; PYLLM_ERR_* when they do not fit (plan.c). */
int matmul_plan_make(matmul_plan *plan, const pyllm_kernel_set *ks, const matmul_weight *weights, int n_weights,
                     int64_t k, const float *x, int64_t m, int n_threads);

/* Runs a plan (run.c). */
int matmul_run(const matmul_plan *plan);

/* Both: the bits pyllm_matmul gives each weight alone, X converted and laid out once. */
int matmul_many(const pyllm_kernel_set *ks, const matmul_weight *weights, int n_weights, int64_t k, const float *x,
                int64_t m, int n_threads);

#endif /* PYLLM_MATMUL_H */
