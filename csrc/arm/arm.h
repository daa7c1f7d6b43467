/*
 * arm.h - the aarch64 tiers' kernel tables, each file's, indexed by weight type (NULL where it has no kernel of that
 * type); backends_arm.c makes the neon, neon_dotprod and neon_i8mm backends of them. Defined only on aarch64.
 */
#ifndef PYLLM_ARM_H
#define PYLLM_ARM_H

#include "backend/kernel_set.h"

extern const vec_dot_fn vec_dot_table_neon[PYLLM_TYPE_COUNT];          /* vec_dot_neon.c: int8 dots by smull */
extern const vec_dot_fn vec_dot_table_neon_dotprod[PYLLM_TYPE_COUNT];  /* vec_dot_neon_dotprod.c: by sdot */
/* tile_neon_dotprod.c: Q4_K_X16's tile kernel, by sdot by lane */
extern const tile_kernel_fn tile_kernel_table_neon_dotprod[PYLLM_TYPE_COUNT];
extern const op_kernels op_kernels_neon;  /* ops_neon.c */

/* panel_neon_i8mm.c: a prompt's matmul by smmla, the panel kernels of the neon_i8mm tier (PANEL_LAYOUT_PAIRS) */
extern const panel_unpack_fn panel_unpack_table_neon_i8mm[PYLLM_TYPE_COUNT];
extern const panel_kernel_fn panel_kernel_table_neon_i8mm[PYLLM_TYPE_COUNT];
extern const panel_prepare_fn panel_prepare_neon_i8mm;  /* NULL where the compiler has no i8mm */

#endif /* PYLLM_ARM_H */
