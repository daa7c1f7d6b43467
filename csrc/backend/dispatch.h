/*
 * dispatch.h - internal interface between the dispatcher and the ops that
 * use its kernels (matmul).
 */
#ifndef PYLLM_DISPATCH_H
#define PYLLM_DISPATCH_H

#include "formats/panel.h"
#include "formats/quants.h"

/* The vec_dot kernel of `tier` for weight `type` (falling back to lower tiers). */
vec_dot_fn pyllm_vec_dot_kernel(int tier, int type);

/* The kernel of the active tier. */
vec_dot_fn pyllm_active_vec_dot(int type);

/* The multi-row kernel of the active tier for weight `type`, or NULL (then: vec_dot row by row). */
vec_dot_rows_fn pyllm_active_vec_dot_rows(int type);
vec_dot_rows_fn pyllm_active_vec_dot_rows8(int type);  /* two groups of rows at once, or NULL */
vec_dot_row_fn pyllm_active_vec_dot_row(int type);     /* one prepared row (act_row_prepare), or NULL */
vec_dot_cols_fn pyllm_active_vec_dot_cols(int type);   /* several weight rows against one activation row, or NULL */

/* The tile kernel of the active tier for an interleaved type (quants.h: x16_kernel_fn), or NULL. */
x16_kernel_fn pyllm_active_x16_kernel(int type);

/* The panel kernel of the active tier for weight `type` and the unpacker of its weight rows, or NULL
 * (panel.h: a prompt's rows sixteen at a time). */
panel_kernel_fn pyllm_active_panel_kernel(int type);
wide_unpack_fn pyllm_active_wide_unpack(int type);
panel_prepare_fn pyllm_active_panel_prepare(void);

/* The non-matmul kernels for `tier` (the AVX2 ones serve every tier above it). */
const op_kernels *pyllm_op_kernels(int tier);

/* The prompt attention kernels of `tier`, or NULL (then each query row on its own with op_kernels). */
const prompt_attention_kernels *pyllm_prompt_attention_kernels(int tier);
/* The decode kernels for the heads sharing a kv head of `tier`, or NULL (then head by head with op_kernels). */
const head_group_kernels *pyllm_head_group_kernels(int tier);

/* Bytes of one activation row of n elements for weight_type. */
int64_t pyllm_activation_row_bytes(int weight_type, int64_t n);

#endif /* PYLLM_DISPATCH_H */
