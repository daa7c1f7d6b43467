/*
 * arm.h - the aarch64 tiers' kernel tables, each file's, indexed by weight type (NULL where it has no kernel of that
 * type); backends_arm.c makes the neon and neon_dotprod backends of them. Defined only on aarch64.
 */
#ifndef PYLLM_ARM_H
#define PYLLM_ARM_H

#include "backend/kernel_set.h"

extern const vec_dot_fn vec_dot_table_neon[PYLLM_TYPE_COUNT];          /* vec_dot_neon.c: int8 dots by smull */
extern const vec_dot_fn vec_dot_table_neon_dotprod[PYLLM_TYPE_COUNT];  /* vec_dot_neon_dotprod.c: by sdot */
extern const op_kernels op_kernels_neon;                                /* ops_neon.c */

#endif /* PYLLM_ARM_H */
