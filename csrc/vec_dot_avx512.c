/* vec_dot_avx512.c - placeholder table until the avx512 kernels land. */
#include "quants.h"

const vec_dot_fn vec_dot_table_avx512[PYLLM_TYPE_COUNT] = {0};
