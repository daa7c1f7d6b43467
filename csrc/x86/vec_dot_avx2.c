/*
 * vec_dot_avx2.c - the AVX2 + FMA + F16C kernels of vec_dot_avx2*.inc, int8 dots by
 * vpmaddubsw + vpmaddwd: every x86-64 CPU with AVX2 runs them.
 *
 * Built without global -m flags: the kernels get their target by pragma and
 * run only where backends_x86.c has seen the CPU features.
 */
#include "x86/x86.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi2")
#endif

#define PYLLM_VNNI 0
#define PYLLM_SFX(name) name##_avx2
#include "x86/vec_dot_avx2.inc"
#include "x86/vec_dot_avx2_prepared.inc"
#include "x86/vec_dot_avx2_kquants.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
