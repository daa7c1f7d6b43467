/*
 * half.c - half and bfloat16 conversions, exact (float -> half rounds to nearest, ties to even): the scalar
 * definitions the tiers' F16C conversions agree with.
 */
#include "formats/blocks.h"

float fp16_to_fp32(fp16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exponent = (h >> 10) & 0x1F;
    const uint32_t mantissa = h & 0x3FF;
    if (exponent == 0x1F) {  /* inf, nan */
        return fp32_from_bits(sign | 0x7F800000u | (mantissa << 13));
    }
    if (exponent == 0) {  /* zero, subnormal: mantissa * 2^-24, exact */
        const float v = (float)mantissa * 0x1p-24f;
        return sign ? -v : v;
    }
    return fp32_from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

/* Round to nearest, ties to even; overflow to inf; nan stays nan (quiet). */
fp16_t fp32_to_fp16(float f) {
    const uint32_t x = fp32_to_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) {
        const uint16_t nan_bits = ax > 0x7F800000u ? (uint16_t)(0x200 | ((ax >> 13) & 0x3FF)) : 0;
        return (fp16_t)(sign | 0x7C00 | nan_bits);
    }
    if (ax >= 0x477FF000u) {  /* >= 65520, the midpoint above the largest half */
        return (fp16_t)(sign | 0x7C00);
    }
    if (ax < 0x38800000u) {   /* below 2^-14: a half subnormal or zero */
        if (ax <= 0x33000000u) {  /* <= 2^-25: rounds to zero (2^-25 is a tie, to even) */
            return sign;
        }
        const uint32_t mantissa = (ax & 0x7FFFFFu) | 0x800000u;
        const int shift = 126 - (int)(ax >> 23);  /* 14..24 */
        uint32_t q = mantissa >> shift;
        const uint32_t rest = mantissa & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rest > half || (rest == half && (q & 1))) {
            q++;
        }
        return (fp16_t)(sign | q);
    }
    const uint32_t rebiased = ax - 0x38000000u;  /* exponent - 112 */
    uint32_t q = rebiased >> 13;
    const uint32_t rest = rebiased & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (q & 1))) {
        q++;
    }
    return (fp16_t)(sign | q);
}

bf16_t fp32_to_bf16(float f) {
    const uint32_t x = fp32_to_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) {  /* nan: keep it, quiet */
        return (bf16_t)((x >> 16) | 64);
    }
    return (bf16_t)(((uint64_t)x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}
