/*
 * vec_dot_avx2_vnni.c - the kernels of vec_dot_avx2*.inc with int8 dots by vpdpbusd /
 * vpdpwssd (AVX-512 VNNI + VL, which also give the EVEX forms 32 vector registers): the
 * avx512_vnni tier's kernels, on 256-bit vectors, except the 32-element formats' 4- and
 * 8-row kernels, which put two activation rows in a 512-bit vector.
 *
 * Built without global -m flags: the kernels get their target by pragma and
 * run only where backends_x86.c has seen the CPU features.
 */
#include "x86/x86.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi2,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi2,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")
#endif

#define PYLLM_VNNI 1
#define PYLLM_SFX(name) name##_avx2_vnni
#include "x86/vec_dot_avx2.inc"
#include "x86/vec_dot_avx2_prepared.inc"
#include "x86/vec_dot_avx2_kquants.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
