/*
 * simd_avx2.h - small AVX2 helpers shared by the AVX2 kernel files.
 *
 * Include after <immintrin.h> and inside the including file's target pragma
 * (avx2, fma, f16c at least): the functions take the including file's target.
 */
#ifndef PYLLM_SIMD_AVX2_H
#define PYLLM_SIMD_AVX2_H

#include <stdint.h>

/* fp16 -> fp32 by F16C: the same value as fp16_to_fp32 for every non-NaN half. */
static inline float half_to_float(fp16_t h) { return _cvtsh_ss(h); }
/* fp32 -> fp16 by F16C: fp32_to_fp16's half (nearest even; NaN quieted, its payload's top bits kept). */
static inline fp16_t float_to_half(float f) { return (fp16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

static inline int32_t hsum_i32x4(__m128i s) {
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

static inline __m128i fold_i32x8(__m256i v) {
    return _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

static inline int32_t hsum_i32x8(__m256i v) { return hsum_i32x4(fold_i32x8(v)); }

/* The largest of the 8 lanes (max_ps: a NaN lane loses to the other operand; either zero on a tie of zeros). */
static inline float lanes_max(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* The 8 lanes summed in reduce_lanes8's order. */
static inline float lanes_total(__m256 acc) {
    const __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
    return _mm_cvtss_f32(_mm_add_ss(a2, _mm_movehdup_ps(a2)));
}

/* lanes_total of four accumulators at once, lane i of the result acc[i]'s: the same additions (each sum's halves,
 * then its pairs, then the last two), four sums a vector, so one row's closing takes a third of the operations. */
static inline __m128 lanes_total4(const __m256 acc[4]) {
    const __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(acc[0], acc[1], 0x20), _mm256_permute2f128_ps(acc[0], acc[1], 0x31));
    const __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(acc[2], acc[3], 0x20), _mm256_permute2f128_ps(acc[2], acc[3], 0x31));
    /* ab = [a4 | b4], cd = [c4 | d4]; pairs: [a4_0 + a4_2, a4_1 + a4_3, c.., c.. | b.., b.., d.., d..] */
    const __m256 pairs = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x44), _mm256_shuffle_ps(ab, cd, 0xEE));
    /* [a, c, a, c | b, d, b, d] */
    const __m256 totals = _mm256_add_ps(_mm256_shuffle_ps(pairs, pairs, 0x88), _mm256_shuffle_ps(pairs, pairs, 0xDD));
    return _mm_unpacklo_ps(_mm256_castps256_ps128(totals), _mm256_extractf128_ps(totals, 1));
}

#endif /* PYLLM_SIMD_AVX2_H */
