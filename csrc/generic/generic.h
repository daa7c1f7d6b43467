/*
 * generic.h - the generic tier's kernel tables: portable scalar C, the references every other tier gives the bits
 * of (backend_generic.c makes them a backend).
 */
#ifndef PYLLM_GENERIC_H
#define PYLLM_GENERIC_H

#include "backend/kernel_set.h"

extern const vec_dot_fn vec_dot_table_generic[PYLLM_TYPE_COUNT];  /* vec_dot_generic.c */
extern const op_kernels op_kernels_generic;                       /* ops_generic.c */

/* ops_generic.c's kernels that other tiers' tables take as they are */
void geglu_generic(const fp16_t *gelu_table, const float *g, const float *u, float *y, int64_t n);
void rope_head_generic(float *head, const float *cos_sin, int64_t n_rot, int neox);
int64_t argmax_generic(const float *x, int64_t n, int *nan);

#endif /* PYLLM_GENERIC_H */
