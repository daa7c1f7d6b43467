/* vec_dot_avx512_vnni.c - placeholder table until the avx512_vnni kernels land. */
#include "quants.h"

const vec_dot_fn vec_dot_table_avx512_vnni[PYLLM_TYPE_COUNT] = {0};
