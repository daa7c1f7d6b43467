/*
 * generic.h - the generic tier's kernel tables: portable scalar C, the references every other tier gives the bits
 * of (backend_generic.c makes them a backend).
 */
#ifndef PYLLM_GENERIC_H
#define PYLLM_GENERIC_H

#include "backend/kernel_set.h"

extern const vec_dot_fn vec_dot_table_generic[PYLLM_TYPE_COUNT];  /* vec_dot_generic.c */
extern const op_kernels op_kernels_generic;                       /* ops_generic.c */

#endif /* PYLLM_GENERIC_H */
