/*
 * tile_avx2.c - the AVX2 tile kernel of Q4_K_X16 (backend/kernel_set.h: tile_kernel_fn): a 16-row Q4_K tile, as two
 * halves of 8 rows, against one to four q8_K activation rows (a decode step's one, a prompt's four at a time).
 *
 * vec_dot_avx2's Q4_K kernel unpacks one row's superblock and ends in horizontal sums; here 32-bit lane r of every
 * vector is weight row r of a half (formats/blocks.h: tile_q4_K), so one load brings a 4-byte unit of 8 rows, one
 * vpmaddubsw against the activation's 4 bytes broadcast advances all 8, and eight of them add up in int16 before a
 * vpmaddwd applies each row's group scale. Each output keeps vec_dot_generic.c's Q4_K steps: exact int32 sums per
 * 64-element chunk, then sum * (d * d_a) and sum_min * (dmin * d_a) chained by fmaf in two accumulators, and
 * subtracted.
 *
 * Built without global -m flags: the kernel gets its target by pragma and runs only where backends_x86.c has seen
 * the CPU features.
 */
#include "x86/x86.h"

#include <stddef.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#define KERNEL_INLINE static inline __attribute__((always_inline))

/* 4 activation bytes in every 32-bit lane. */
KERNEL_INLINE __m256i broadcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* A shuffle taking, in every 32-bit lane, its bytes j0 and j1 as two int16 (high bytes zero). */
KERNEL_INLINE __m256i byte_pair(int j0, int j1) {
    const __m128i p = _mm_setr_epi8((char)j0, -1, (char)j1, -1, (char)(4 + j0), -1, (char)(4 + j1), -1, (char)(8 + j0),
                                    -1, (char)(8 + j1), -1, (char)(12 + j0), -1, (char)(12 + j1), -1);
    return _mm256_broadcastsi128_si256(p);
}

/* One activation row's per-superblock values every half uses. */
typedef struct {
    const int8_t *q;
    __m256i group_sums;  /* int16 sums of its 8 groups of 32 (from bsums), in both 128-bit halves */
    __m256 d;
} act_superblock;

KERNEL_INLINE act_superblock act_at(const act_rows *row, int64_t b) {
    const block_q8_K *y = (const block_q8_K *)row->rows[0] + b;
    const __m128i sums = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums),
                                        _mm_loadu_si128((const __m128i *)y->bsums + 1));
    return (act_superblock){y->qs, _mm256_broadcastsi128_si256(sums), _mm256_set1_ps(y->d)};
}

#define MAX_ROWS 4

/* A half's superblock (8 rows) against n_rows activation rows: acc[r] and mins[r] advanced by its 4 chunks. */
KERNEL_INLINE void half_superblock(const half_tile_q4_K *x, const act_superblock a[MAX_ROWS], const int n_rows,
                                   __m256 acc[MAX_ROWS], __m256 mins[MAX_ROWS]) {
    const __m256i nibble = _mm256_set1_epi8(0x0F), low6 = _mm256_set1_epi32(0x3F3F3F3F);
    const __m256i low4 = _mm256_set1_epi32(0x0F0F0F0F), low2 = _mm256_set1_epi32(0x03030303);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x->d));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x->dmin));
    const __m256i w0 = _mm256_loadu_si256((const __m256i *)x->scales[0]);
    const __m256i w1 = _mm256_loadu_si256((const __m256i *)x->scales[1]);
    const __m256i w2 = _mm256_loadu_si256((const __m256i *)x->scales[2]);
    /* scale_min_k4's 6-bit fields, a byte each: groups 0..3 in scales[0], 4..7 in scales[1]; the same for mins */
    const __m256i scales[2] = {
        _mm256_and_si256(w0, low6),
        _mm256_or_si256(_mm256_and_si256(w2, low4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w0, 6), low2), 4))};
    const __m256i mins6[2] = {
        _mm256_and_si256(w1, low6),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), low4),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w1, 6), low2), 4))};
    __m256 scale[MAX_ROWS], scale_min[MAX_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < n_rows; ++r) {
        scale[r] = _mm256_mul_ps(d, a[r].d);
        scale_min[r] = _mm256_mul_ps(dmin, a[r].d);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {  /* chunk c: groups 2c (low nibbles) and 2c + 1 (high) */
        const int j = (2 * c) % 4, h = c / 2;
        __m256i p_low[MAX_ROWS], p_high[MAX_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) p_low[r] = p_high[r] = _mm256_setzero_si256();
        /* 8 products of at most 15 * 127 a pair each: their int16 sum cannot overflow (8 * 2 * 1905 < 32768) */
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)x->qs[8 * c + k]);
            const __m256i low = _mm256_and_si256(q, nibble), high = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
#pragma GCC unroll 4
            for (int r = 0; r < n_rows; ++r) {
                p_low[r] = _mm256_add_epi16(p_low[r], _mm256_maddubs_epi16(low, broadcast4(a[r].q + 64 * c + 4 * k)));
                p_high[r] = _mm256_add_epi16(p_high[r], _mm256_maddubs_epi16(high, broadcast4(a[r].q + 64 * c + 32 + 4 * k)));
            }
        }
        const __m256i s_low = _mm256_shuffle_epi8(scales[h], byte_pair(j, j));
        const __m256i s_high = _mm256_shuffle_epi8(scales[h], byte_pair(j + 1, j + 1));
        const __m256i m_pair = _mm256_shuffle_epi8(mins6[h], byte_pair(j, j + 1));
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) {
            const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(p_low[r], s_low), _mm256_madd_epi16(p_high[r], s_high));
            const __m256i g_pair = _mm256_permutevar8x32_epi32(a[r].group_sums, _mm256_set1_epi32(c));
            const __m256i sum_min = _mm256_madd_epi16(m_pair, g_pair);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale[r], acc[r]);
            mins[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_min), scale_min[r], mins[r]);
        }
    }
}

/* Superblock b of the next tile into L2 while a pass over this one (in cache) computes. A tile read from memory asks
 * for nothing: the hardware's stream does as well on its contiguous superblocks. */
KERNEL_INLINE void prefetch_l2(const uint8_t *next, int64_t b) {
    const char *ahead = (const char *)next + b * (int64_t)sizeof(tile_q4_K);
    for (size_t line = 0; line < sizeof(tile_q4_K); line += 64) _mm_prefetch(ahead + line, _MM_HINT_T1);
}

/* Both halves of every superblock in turn: a decode step's one or two rows, the tile read once, in order. */
KERNEL_INLINE void q4_K_tile_rows(int64_t n, const uint8_t *tile, const act_rows *rows, float *out, int64_t stride,
                                  const uint8_t *prefetch, const int next_tile, const int n_rows) {
    __m256 acc[2][MAX_ROWS], mins[2][MAX_ROWS];  /* [half][row] */
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) acc[h][r] = mins[h][r] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const tile_q4_K *x = (const tile_q4_K *)tile + b;
        if (next_tile) prefetch_l2(prefetch, b);
        act_superblock a[MAX_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) a[r] = act_at(&rows[r], b);
        half_superblock(&x->half[0], a, n_rows, acc[0], mins[0]);
        half_superblock(&x->half[1], a, n_rows, acc[1], mins[1]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < n_rows; ++r) {
        _mm256_storeu_ps(out + r * stride, _mm256_sub_ps(acc[0][r], mins[0][r]));
        _mm256_storeu_ps(out + r * stride + 8, _mm256_sub_ps(acc[1][r], mins[1][r]));
    }
}

/* One half after the other: a prompt's three or four rows, whose accumulators for both halves would not fit in the
 * registers (the tile is in cache after the first pass over it). */
KERNEL_INLINE void q4_K_tile_rows_by_half(int64_t n, const uint8_t *tile, const act_rows *rows, float *out,
                                          int64_t stride, const uint8_t *prefetch, const int next_tile,
                                          const int n_rows) {
#pragma GCC unroll 1
    for (int h = 0; h < 2; ++h) {
        __m256 acc[MAX_ROWS], mins[MAX_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) acc[r] = mins[r] = _mm256_setzero_ps();
        for (int64_t b = 0; b < n / QK_K; ++b) {
            const tile_q4_K *x = (const tile_q4_K *)tile + b;
            if (next_tile && h == 0) prefetch_l2(prefetch, b);
            act_superblock a[MAX_ROWS];
#pragma GCC unroll 4
            for (int r = 0; r < n_rows; ++r) a[r] = act_at(&rows[r], b);
            half_superblock(&x->half[h], a, n_rows, acc, mins);
        }
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) _mm256_storeu_ps(out + r * stride + 8 * h, _mm256_sub_ps(acc[r], mins[r]));
    }
}

static void vec_dot_q4_K_x16_q8_K_tile(int64_t n, const void *tile, const act_rows *rows, int n_rows, float *out,
                                       int64_t stride, const uint8_t *prefetch, int next_tile) {
    switch (n_rows) {
    case 4: q4_K_tile_rows_by_half(n, tile, rows, out, stride, prefetch, next_tile, 4); break;
    case 3: q4_K_tile_rows_by_half(n, tile, rows, out, stride, prefetch, next_tile, 3); break;
    case 2: q4_K_tile_rows(n, tile, rows, out, stride, prefetch, next_tile, 2); break;
    default: q4_K_tile_rows(n, tile, rows, out, stride, prefetch, next_tile, 1);
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const tile_kernel_fn tile_kernel_table_avx2[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_Q4_K_X16] = vec_dot_q4_K_x16_q8_K_tile,
};

#endif
