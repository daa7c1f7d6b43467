/*
 * backend_generic.c - the generic tier as a backend: the reference kernels, on every CPU, and the base every other
 * tier fills its gaps from. Its kernel sets have vec_dot alone: matmul goes row by row.
 */
#include "generic/generic.h"

static void fill_generic(int type, pyllm_kernel_set *set) { set->vec_dot = vec_dot_table_generic[type]; }

const pyllm_backend backend_generic = {
    .name = "generic", .base = -1, .cpu_runs = NULL, .fill = fill_generic, .ops = &op_kernels_generic,
};
