/*
 * vec_dot_neon_dotprod.c - the kernels of vec_dot_neon.inc with int8 dots by sdot (vdotq_s32, FEAT_DotProd: Armv8.2
 * and later, optional there; Apple M1 on, Graviton 2 on, Snapdragon X, Cortex-A55/A76 on): the neon_dotprod tier.
 *
 * Built without global -march flags: the kernels get their target by pragma and run only where backends_arm.c has
 * seen the CPU feature. A clang older than 16 declares vdotq_s32 only under -march=...+dotprod; there, without it,
 * the table stays empty and the tier runs the neon kernels.
 */
#include "arm/arm.h"

#if defined(__aarch64__) && (!defined(__clang__) || __clang_major__ >= 16 || defined(__ARM_FEATURE_DOTPROD))

#include <arm_neon.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")  /* arm_neon.h declares vdotq_s32 for that target */
#endif

/* acc + the 4 exact sums of 4 adjacent products: one sdot */
static inline int32x4_t dot16(int32x4_t acc, int8x16_t q, int8x16_t a) { return vdotq_s32(acc, q, a); }

#define PYLLM_SFX(name) name##_neon_dotprod
#include "arm/vec_dot_neon.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#elif defined(__aarch64__)

const vec_dot_fn vec_dot_table_neon_dotprod[PYLLM_TYPE_COUNT] = {0};

#endif
