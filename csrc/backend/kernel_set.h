/*
 * kernel_set.h - the interface between the tiers' kernels and what runs them (matmul, ops, the model).
 *
 * A backend (one tier: generic/, x86/; later arm/, cuda/) is a record (pyllm_backend) that fills, for every weight
 * type, a kernel set: the kernels of each shape of a matmul, all giving the bits of its vec_dot. The registry
 * (registry.c) builds every (tier, type) set once, at the first call into the core, and the model takes its
 * weights' sets when it loads (pyllm_kernels); nothing looks a kernel up per call. Ops (attention, activations,
 * norms) take their tier's op_set the same way.
 *
 * Kernel names follow one grid, the name stating the contract:
 *   dequantize_row_<fmt>, quantize_row_<fmt>_ref       the formats' references (formats/)
 *   vec_dot_<w>_<a>_<tier>                              one weight row . one activation row of format <a>
 *   vec_dot_<w>_<a>_<shape>_<tier>                      the same dot products in another shape (below)
 * "rows" are always activation rows (X's, matmul's M) and "cols" weight rows (output columns, matmul's N).
 *
 * The fixed reduction order (so every tier gives the same bits; generic/vec_dot_generic.c defines it):
 *   - 32-element formats (llama.cpp's x86 order, so both give the same bits; Q4_0 as PYLLM_TYPE_Q4_0_LANES, the
 *     Q4_0 type itself below): lane l (0..7) of a block is the exact int sum of its elements 4l..4l+3; blocks in
 *     order, acc[l] = fmaf(d_w * d_a, (float)lane l, acc[l]); then acc8 -> 4 -> 2 -> 1 by adding lane i + half
 *     to lane i. Q4_1 / Q5_1 also chain mins = fmaf(m, s, mins) over the blocks (s: the q8_1 activation block's)
 *     and return the lane total + mins.
 *   - K-quants (llama.cpp's orders for a prompt on x86): exact int32 sums per 256-element superblock, then one
 *     accumulator, superblocks in order: acc = fmaf(d * (float)sum, d_a, acc) (Q3_K, Q6_K), or with mins
 *     acc = fmaf(fmaf(-dmin, (float)sum_min, d * (float)sum), d_a, acc) (Q2_K, Q5_K). Q4_K (its interleaved x86
 *     layout) takes the exact sums per 64-element chunk, chains sum * (d * d_a) and sum_min * (dmin * d_a) in
 *     two accumulators, and subtracts.
 *   - Q4_0 (llama.cpp's interleaved x86 layout): the exact sum of each block, acc = fmaf((float)sum, d_w * d_a,
 *     acc), blocks in order.
 *   - float weights, against activations rounded to the weights' format (F16, BF16; F32 as they are), llama.cpp's
 *     prompt order: acc[i % 8] = fmaf(w[i], x[i], acc[i % 8]) (8 lanes), then the same halving tree; elements
 *     past the last multiple of 8 are added after, in order, by fmaf.
 */
#ifndef PYLLM_KERNEL_SET_H
#define PYLLM_KERNEL_SET_H

#include "formats/formats.h"
#include "formats/kernel_layouts.h"

/* The fixed final reduction of 8 lanes shared by every tier: lanes i and i + 4, then i and i + 2, then the two. */
static inline float reduce_lanes8(const float acc[8]) {
    float a4[4], a2[2];
    for (int i = 0; i < 4; ++i) a4[i] = acc[i] + acc[i + 4];
    for (int i = 0; i < 2; ++i) a2[i] = a4[i] + a4[i + 2];
    return a2[0] + a2[1];
}

/* ---- matmul kernels: the shapes of a kernel set ---- */

/* vec_dot_<w>_<a>: one weight row w . one activation row act (n elements). */
typedef float (*vec_dot_fn)(int64_t n, const void *w, const void *act);

/* _rows4 / _rows8: one weight row against a group of activation rows (act_rows), or two groups (group[0],
 * group[1]): out[r] = vec_dot(n, w, group->rows[r]) for r < group->n_rows, bit for bit, the weights unpacked once.
 * out has room for VEC_DOT_MAX_ROWS per group (the padding rows' entries may be written too). */
typedef void (*vec_dot_rows_fn)(int64_t n, const void *w, const act_rows *group, float *out);

/* _prepared: vec_dot(n, w, row->rows[0]), bit for bit (for scales that are not NaN), from a row act_row_prepare laid
 * out. */
typedef float (*vec_dot_prepared_fn)(int64_t n, const void *w, const act_rows *row);

/* _cols4: VEC_DOT_COLS weight rows at once (w, w + stride, ...) against one activation row act in vec_dot's format:
 * out[c] = vec_dot(n, w + c * stride, act), bit for bit. */
#define VEC_DOT_COLS 4
typedef void (*vec_dot_cols_fn)(int64_t n, const void *w, int64_t stride, const void *act, float *out);

/* _panel: out[i][r] = vec_dot(n, weight row i, activation row r) for two weight rows (unpacked by panel_unpack) and
 * a panel of activation rows (laid out by panel_prepare), bit for bit (for scales that are not NaN). The set's
 * panel_layout says which bytes panel_prepare writes: PANEL_LAYOUT_LANES, act_panel_prepare's (the x86 tiers), or
 * PANEL_LAYOUT_PAIRS, the neon_i8mm tier's (formats/kernel_layouts.h); the unpacked weight rows are each tier's own. */
enum { PANEL_LAYOUT_LANES = 0, PANEL_LAYOUT_PAIRS = 1 };
typedef void (*panel_prepare_fn)(act_panel *panel, int weight_type, const void *first, int64_t row_bytes,
                                 int n_rows, int64_t n, void *scratch);
typedef void (*panel_unpack_fn)(const void *w, int64_t n, void *scratch, unpacked_row *row);
typedef void (*panel_kernel_fn)(int64_t n, const unpacked_row rows[2], const act_panel *panel,
                                float out[2][PANEL_ROWS]);

/* _tile: one tile of a tiled layout (16 weight rows) against 1..tile_max_rows (the set's, at most TILE_MAX_ROWS)
 * activation rows, each laid out by act_row_prepare for the tiled type: out[r * stride + i] = vec_dot(n, weight row i,
 * rows[r]) for i < 16 and r < n_rows, bit for bit (for scales that are not NaN). Unless prefetch is NULL, block step b also asks for a
 * block's bytes at prefetch + b * (the tile block's bytes): with `next_tile` into L2 (a later pass over a tile in
 * cache, pointed at the next tile), otherwise into L1 (a pass reading the tile from memory, pointed a few blocks
 * ahead of it; the Q8_0 and Q4_K kernels leave that stream to the hardware). */
typedef void (*tile_kernel_fn)(int64_t n, const void *tile, const act_rows *rows, int n_rows, float *out,
                               int64_t stride, const uint8_t *prefetch, int next_tile);
#define TILE_MAX_ROWS 4

/* Every kernel of one tier for weights in one layout. Each shape but vec_dot may be NULL (the tier has none); the
 * matmul then goes down to the next one that serves (matmul/plan.c). */
struct pyllm_kernel_set {
    int tier;
    int type;                       /* the weights' layout: a weight type, or a pyllm layout of one */
    int plain_type;                 /* the format of their values (traits plain_type) */
    int act_type;                   /* the activation format (traits vec_dot_type) */
    const pyllm_type_traits *traits, *act_traits;  /* type's and act_type's */
    quantize_row_fn quantize_act;   /* x (n floats) -> an activation row: the tier's, in llama.cpp's rounding */
    vec_dot_fn vec_dot;             /* plain_type's; a tiled layout's rows go to it rebuilt (tile_gather_row) */
    vec_dot_rows_fn rows4, rows8;
    vec_dot_prepared_fn prepared;
    vec_dot_cols_fn cols4;
    panel_prepare_fn panel_prepare; /* the panel kernels: all three, or none */
    panel_unpack_fn panel_unpack;
    panel_kernel_fn panel;
    int panel_layout;               /* PANEL_LAYOUT_*: the bytes panel_prepare writes */
    tile_kernel_fn tile;            /* a tiled layout's only */
    int tile_max_rows;              /* the most activation rows one tile call takes */
    int tile_prefill;               /* 1: a prompt's rows go to the tile kernel too; 0: a prompt reads each tile
                                       gathered back into plain rows (rows4 / rows8: the plain type's) */
};

/* ---- the non-matmul kernels of a tier ---- */

/* The inner loops of the ops, bit-identical in every tier (llama.cpp's arithmetic; see ops/):
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
 * scale_row:    y[i] = (x[i] * scale) * w[i], or x[i] * scale where w is NULL (rms_norm's last step; y may be x);
 * add_scaled:   y[i] = y[i] + w * x[i], the product rounded first (a quantized cache's weighted sum of values);
 * softmax:      softmax_half's weights, not rounded to half precision (e * (float)(1 / sum)). */
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
    void (*add_scaled)(float *y, float w, const float *x, int64_t n);
    dequantize_row_fn dequantize_q8_0, dequantize_q4_0;  /* the reference dequantizers' bits */
    void (*softmax)(float *s, int64_t n, float max);
} op_kernels;

/* A prompt's attention (ops/attention.c: a block of queries against one kv head's keys and values, converted once),
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

/* A decode row's g heads that share a kv head (ops/attention.c, attend_heads), head by head the bits of dots and
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

/* A tier's non-matmul kernels: ops always, prompt and heads where it has them (NULL: ops alone serve). */
typedef struct {
    const op_kernels *ops;
    const prompt_attention_kernels *prompt;
    const head_group_kernels *heads;
} op_set;

/* exp(x) as llama.cpp's x86 vector code computes it (generic/ops_generic.c) */
float exp_ggml(float x);

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

/* ---- backends: one record a tier ---- */

/* A tier's kernels. The registry starts each of its sets from its base tier's (the gaps it leaves) and lets fill
 * put in its own; ops it leaves NULL are its base's. A backend file defines one of these; registry.c lists it. */
typedef struct {
    const char *name;                   /* pyllm_tier_name's, and what $PYLLM_TIER names it by */
    int base;                           /* the tier it builds on, -1 for none */
    int (*cpu_runs)(void);              /* whether this CPU (and its OS) runs the kernels */
    void (*fill)(int type, pyllm_kernel_set *set);  /* its kernels for weights in layout `type` */
    const op_kernels *ops;
    const prompt_attention_kernels *prompt;
    const head_group_kernels *heads;
} pyllm_backend;

/* ---- the registry (registry.c): every set built once, at the first call ---- */

/* The kernel set of `tier` (any tier: only running its kernels needs the CPU) for weights in `layout`; NULL for a type
 * that is not a weight type. */
const pyllm_kernel_set *kernel_set(int tier, int layout);

/* Whether this CPU runs `tier`'s kernels. A tier below the best it may not run (an x86 tier on aarch64) has no kernels
 * of its own built there: its sets are its base's, and the tests skip it. */
int tier_runs(int tier);

/* The non-matmul kernels of `tier`, and of the active tier. */
const op_set *tier_ops(int tier);
const op_set *active_ops(void);

#endif /* PYLLM_KERNEL_SET_H */
