/*
 * vec_dot_neon.c - the kernels of vec_dot_neon.inc with int8 dots by smull + pairwise adds: Advanced SIMD alone,
 * which every aarch64 CPU has (the neon tier).
 */
#include "arm/arm.h"

#if defined(__aarch64__)

#include <arm_neon.h>

/* acc + the 4 exact sums of 4 adjacent products: 8 int16 products a half, added in pairs, then the pairs' pairs */
static inline int32x4_t dot16(int32x4_t acc, int8x16_t q, int8x16_t a) {
    const int16x8_t p0 = vmull_s8(vget_low_s8(q), vget_low_s8(a)), p1 = vmull_high_s8(q, a);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)));
}

#define PYLLM_SFX(name) name##_neon
#include "arm/vec_dot_neon.inc"

#endif
