/*
 * vec_dot_avx512.c - the AVX-512 (F/BW/VL/DQ) tier: the kernels of
 * vec_dot_avx512.inc with int8 dots by vpmaddubsw + vpmaddwd.
 *
 * Built without global -m flags: the kernels get their target by pragma and
 * run only where dispatch.c has seen the CPU features.
 */
#include "quants.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>
#include <math.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,bmi2"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,bmi2")
#endif

#define PYLLM_AVX512_VNNI 0
#define PYLLM_SFX(name) name##_avx512
#define PYLLM_AVX512_TABLE vec_dot_table_avx512
#include "vec_dot_avx512.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else /* not x86-64 */

const vec_dot_fn vec_dot_table_avx512[PYLLM_TYPE_COUNT] = {0};

#endif
