/* vec_dot_avx2.c - placeholder table until the avx2 kernels land. */
#include "quants.h"

const vec_dot_fn vec_dot_table_avx2[PYLLM_TYPE_COUNT] = {0};
