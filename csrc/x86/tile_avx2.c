/*
 * tile_avx2.c - the AVX2 tile kernel of Q4_K_X16 (backend/kernel_set.h: tile_kernel_fn): a 16-row Q4_K tile, as two
 * halves of 8 rows, against one to four q8_K activation rows (a decode step's one, a prompt's four at a time).
 *
 * vec_dot_avx2's Q4_K kernel unpacks one row's superblock and ends in horizontal sums; here 32-bit lane r of every
 * vector is weight row r of a half (formats/blocks.h: tile_q4_K), so one load brings a 4-byte unit of 8 rows, one
 * vpmaddubsw against the activation's 4 bytes broadcast advances all 8, and eight of them add up in int16 before a
 * vpmaddwd applies each row's group scale. Each output keeps vec_dot_generic.c's Q4_K steps: exact int32 sums per
 * 64-element chunk, then sum * (d * d_a) and sum_min * (dmin * d_a) chained by fmaf in two accumulators, and
 * subtracted. Q6_K_X16's kernel is the same shape over tile_q6_K: a group's 16 quants of 8 rows unpacked from three
 * vectors, two units' products added in int16, each group's scale applied by vpmaddwd, vec_dot_generic.c's exact
 * int32 sum per superblock and its one fmaf a superblock.
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

/* One activation row's superblock: its quants, its scale, and its 8 groups' sums of 32 (from bsums) in pairs: pair c
 * holds groups 2c and 2c + 1 as the two int16 of a 32-bit word, what chunk c's mins multiply. */
typedef struct {
    const int8_t *q;
    __m256 d;
    int32_t group_pairs[4];
} act_superblock;

KERNEL_INLINE void act_at(const act_rows *row, int64_t b, act_superblock *a) {
    const block_q8_K *y = (const block_q8_K *)row->rows[0] + b;
    const __m128i sums = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums),
                                        _mm_loadu_si128((const __m128i *)y->bsums + 1));
    _mm_storeu_si128((__m128i *)a->group_pairs, sums);
    a->q = y->qs;
    a->d = _mm256_set1_ps(y->d);
}

#define MAX_ROWS 4

/* A half's scales unpacked once a superblock, into memory on purpose: the chunks take them as operands instead of
 * holding 14 vectors live, which left GCC too few registers for the inner loop (it spilled every broadcast). */
typedef struct {
    __m256i s_low[4], s_high[4];  /* chunk c's groups 2c and 2c + 1: a lane's 6-bit scale as both its int16 */
    __m256i m_pair[4];            /* the two groups' 6-bit mins as a lane's two int16 */
    __m256 d_row[MAX_ROWS], dmin_row[MAX_ROWS];  /* d * d_a and dmin * d_a for each activation row */
} half_scales;

KERNEL_INLINE void unpack_half_scales(const tile_q4_K *x, const int h, const act_superblock *a, const int n_rows,
                                      half_scales *s) {
    const __m256i low6 = _mm256_set1_epi32(0x3F3F3F3F), low4 = _mm256_set1_epi32(0x0F0F0F0F);
    const __m256i low2 = _mm256_set1_epi32(0x03030303);
    const __m256i w0 = _mm256_loadu_si256((const __m256i *)x->scales[h][0]);
    const __m256i w1 = _mm256_loadu_si256((const __m256i *)x->scales[h][1]);
    const __m256i w2 = _mm256_loadu_si256((const __m256i *)x->scales[h][2]);
    /* scale_min_k4's 6-bit fields, a byte each: groups 0..3 in scales[0], 4..7 in scales[1]; the same for mins */
    const __m256i scales[2] = {
        _mm256_and_si256(w0, low6),
        _mm256_or_si256(_mm256_and_si256(w2, low4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w0, 6), low2), 4))};
    const __m256i mins6[2] = {
        _mm256_and_si256(w1, low6),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), low4),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w1, 6), low2), 4))};
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
        const int j = (2 * c) % 4, h = c / 2;
        s->s_low[c] = _mm256_shuffle_epi8(scales[h], byte_pair(j, j));
        s->s_high[c] = _mm256_shuffle_epi8(scales[h], byte_pair(j + 1, j + 1));
        s->m_pair[c] = _mm256_shuffle_epi8(mins6[h], byte_pair(j, j + 1));
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x->d[h]));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x->dmin[h]));
#pragma GCC unroll 4
    for (int r = 0; r < n_rows; ++r) {
        s->d_row[r] = _mm256_mul_ps(d, a[r].d);
        s->dmin_row[r] = _mm256_mul_ps(dmin, a[r].d);
    }
}

/* Per half and activation row: the running sums of vec_dot_generic.c's two Q4_K accumulators, 8 weight rows a vector. */
typedef struct {
    __m256 acc[2][MAX_ROWS], mins[2][MAX_ROWS];
} tile_sums;

/* Chunk c (groups 2c, low nibbles, and 2c + 1, high) of n_halves halves (from first_half) against n_rows rows: the
 * int16 sums of its 8 four-byte units, each row's activations broadcast once for every half, then each half's exact
 * int32 sums (scaled by the groups' 6-bit scales and mins) chained into its accumulators. */
KERNEL_INLINE void chunk_rows(const tile_q4_K *x, const half_scales *scales, const int first_half, const int n_halves,
                              const act_superblock *a, const int n_rows, const int c, tile_sums *sums) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    __m256i p_low[2][MAX_ROWS], p_high[2][MAX_ROWS];
#pragma GCC unroll 2
    for (int h = 0; h < n_halves; ++h) {
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) p_low[h][r] = p_high[h][r] = _mm256_setzero_si256();
    }
    /* 8 products of at most 15 * 128 a pair each: their int16 sum cannot overflow (8 * 2 * 1920 < 32768) */
    if (n_halves == 1) {  /* several rows: each row's broadcasts used at once, so only the sums stay live */
        const __m256i *units = (const __m256i *)x->qs[c][first_half][0];
#pragma GCC unroll 4
        for (int k = 0; k < 8; ++k) {
            const __m256i q = _mm256_loadu_si256(units + k);
            const __m256i low = _mm256_and_si256(q, nibble), high = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
#pragma GCC unroll 4
            for (int r = 0; r < n_rows; ++r) {
                const __m256i a_low = broadcast4(a[r].q + 64 * c + 4 * k);
                const __m256i a_high = broadcast4(a[r].q + 64 * c + 32 + 4 * k);
                p_low[0][r] = _mm256_add_epi16(p_low[0][r], _mm256_maddubs_epi16(low, a_low));
                p_high[0][r] = _mm256_add_epi16(p_high[0][r], _mm256_maddubs_epi16(high, a_high));
                /* pins the sums to registers: GCC 12 spilled two and copied the rest each step (bench/README.md) */
                __asm__("" : "+x"(p_low[0][r]), "+x"(p_high[0][r]));
            }
        }
    } else {  /* one row, both halves: its broadcasts shared */
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
            const __m256i a_low = broadcast4(a[0].q + 64 * c + 4 * k);
            const __m256i a_high = broadcast4(a[0].q + 64 * c + 32 + 4 * k);
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)x->qs[c][h][k]);
                const __m256i low = _mm256_and_si256(q, nibble);
                const __m256i high = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
                p_low[h][0] = _mm256_add_epi16(p_low[h][0], _mm256_maddubs_epi16(low, a_low));
                p_high[h][0] = _mm256_add_epi16(p_high[h][0], _mm256_maddubs_epi16(high, a_high));
                __asm__("" : "+x"(p_low[h][0]), "+x"(p_high[h][0]));  /* the same pin */
            }
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < n_halves; ++h) {
        const half_scales *s = &scales[first_half + h];
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) {
            const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(p_low[h][r], s->s_low[c]),
                                                 _mm256_madd_epi16(p_high[h][r], s->s_high[c]));
            const __m256i sum_min = _mm256_madd_epi16(s->m_pair[c], _mm256_set1_epi32(a[r].group_pairs[c]));
            __m256 *acc = &sums->acc[first_half + h][r], *mins = &sums->mins[first_half + h][r];
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), s->d_row[r], *acc);
            *mins = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_min), s->dmin_row[r], *mins);
        }
    }
}

/* Superblock b's bytes (block_bytes of them) of the next tile into L2, asked for by a pass over a tile in cache
 * (next_tile) while it computes. A tile streamed from memory by its one pass asks for nothing: the hardware's
 * prefetchers keep up better alone (bench/README.md). */
KERNEL_INLINE void prefetch_superblock(const uint8_t *next, int64_t b, size_t block_bytes) {
    const char *at = (const char *)next + b * (int64_t)block_bytes;
    for (size_t line = 0; line < block_bytes; line += 64) _mm_prefetch(at + line, _MM_HINT_T1);
}

/* The tile against n_rows rows, superblock by superblock, the tile read once, in order. One row takes both halves in
 * each chunk (its broadcasts shared); more rows take one half at a time (their sums would not fit the registers). */
KERNEL_INLINE void q4_K_tile_rows(int64_t n, const uint8_t *tile, const act_rows *rows, float *out, int64_t stride,
                                  const uint8_t *prefetch, const int next_tile, const int n_rows) {
    tile_sums sums;
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) sums.acc[h][r] = sums.mins[h][r] = _mm256_setzero_ps();
    }
    const int halves_at_once = n_rows == 1 ? 2 : 1;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const tile_q4_K *x = (const tile_q4_K *)tile + b;
        if (next_tile) prefetch_superblock(prefetch, b, sizeof(tile_q4_K));
        act_superblock a[MAX_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) act_at(&rows[r], b, &a[r]);
        half_scales scales[2];
        unpack_half_scales(x, 0, a, n_rows, &scales[0]);
        unpack_half_scales(x, 1, a, n_rows, &scales[1]);
#pragma GCC unroll 1
        for (int c = 0; c < 4; ++c) {
#pragma GCC unroll 1
            for (int h = 0; h < 2; h += halves_at_once) chunk_rows(x, scales, h, halves_at_once, a, n_rows, c, &sums);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < n_rows; ++r) {
        _mm256_storeu_ps(out + r * stride, _mm256_sub_ps(sums.acc[0][r], sums.mins[0][r]));
        _mm256_storeu_ps(out + r * stride + 8, _mm256_sub_ps(sums.acc[1][r], sums.mins[1][r]));
    }
}

/* A tile kernel (tile_kernel_fn) from an inline kernel of a fixed row count: each count compiled apart. */
#define TILE_KERNEL(name, rows_kernel)                                                                         \
    static void name(int64_t n, const void *tile, const act_rows *rows, int n_rows, float *out, int64_t stride, \
                     const uint8_t *prefetch, int next_tile) {                                                  \
        switch (n_rows) {                                                                                       \
        case 4: rows_kernel(n, tile, rows, out, stride, prefetch, next_tile, 4); break;                        \
        case 3: rows_kernel(n, tile, rows, out, stride, prefetch, next_tile, 3); break;                        \
        case 2: rows_kernel(n, tile, rows, out, stride, prefetch, next_tile, 2); break;                        \
        default: rows_kernel(n, tile, rows, out, stride, prefetch, next_tile, 1);                              \
        }                                                                                                       \
    }

TILE_KERNEL(vec_dot_q4_K_x16_q8_K_tile, q4_K_tile_rows)

/* ---- Q6_K_X16 ---- */

/* Unit u of a group in every lane, unsigned (formats/blocks.h: tile_q6_K): units 0..2 in bits 0..5 of their bytes,
 * unit 3 rebuilt from the three bytes' bits 6-7 (each masked before its 16-bit shift, so no bit crosses a byte). */
KERNEL_INLINE void q6_K_group_units(const uint8_t *bytes, __m256i q[4]) {
    const __m256i low6 = _mm256_set1_epi8(0x3F);
    const __m256i b0 = _mm256_loadu_si256((const __m256i *)bytes);
    const __m256i b1 = _mm256_loadu_si256((const __m256i *)bytes + 1);
    const __m256i b2 = _mm256_loadu_si256((const __m256i *)bytes + 2);
    q[0] = _mm256_and_si256(b0, low6);
    q[1] = _mm256_and_si256(b1, low6);
    q[2] = _mm256_and_si256(b2, low6);
    q[3] = _mm256_or_si256(_mm256_or_si256(_mm256_srli_epi16(_mm256_andnot_si256(low6, b0), 2),
                                           _mm256_srli_epi16(_mm256_andnot_si256(low6, b1), 4)),
                           _mm256_srli_epi16(_mm256_andnot_si256(low6, b2), 6));
}

/* One group's exact sum of q * a for 8 weight rows, times the rows' group scale (a lane's scale as both its int16):
 * the products of two units add up in int16 (at most 2 * 2 * 63 * 128 < 32768) before the scale. */
KERNEL_INLINE __m256i q6_K_group_dot(const __m256i q[4], const int8_t *a, __m256i scale) {
    const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(q[0], broadcast4(a)),
                                         _mm256_maddubs_epi16(q[1], broadcast4(a + 4)));
    const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(q[2], broadcast4(a + 8)),
                                         _mm256_maddubs_epi16(q[3], broadcast4(a + 12)));
    return _mm256_add_epi32(_mm256_madd_epi16(p01, scale), _mm256_madd_epi16(p23, scale));
}

/* Halves first_half .. first_half + n_halves - 1 of one tile superblock against n_rows rows: each row's exact int32
 * sum of scale * (q - 32) * a per weight row (q - 32 as q, less 32 * the scales times the rows' group sums), then
 * vec_dot_generic.c's Q6_K step acc = fmaf(d * (float)sum, d_a, acc), 8 weight rows a vector. */
KERNEL_INLINE void q6_K_tile_superblock(const tile_q6_K *x, const block_q8_K *const *y, const int first_half,
                                        const int n_halves, const int n_rows, __m256 acc[2][MAX_ROWS]) {
    /* in every 32-bit lane, its int16 j twice: the scale of group 2 p + j from the lane's pair */
    const __m256i scale_of[2] = {
        _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13)),
        _mm256_broadcastsi128_si256(_mm_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15))};
    __m256i sums[2][MAX_ROWS];
#pragma GCC unroll 2
    for (int h = 0; h < n_halves; ++h) {
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) sums[h][r] = _mm256_setzero_si256();
    }
#pragma GCC unroll 1
    for (int p = 0; p < 8; ++p) {
#pragma GCC unroll 2
        for (int hi = 0; hi < n_halves; ++hi) {
            const int h = first_half + hi;
            /* a lane's scales of groups 2 p and 2 p + 1 as two int16 */
            const __m256i pair = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales[p][h]));
            const __m256i pair32 = _mm256_slli_epi16(pair, 5);  /* 32 * scale: at most 4096 in magnitude */
#pragma GCC unroll 4
            for (int r = 0; r < n_rows; ++r) {
                int32_t group_sums;  /* bsums[2 p] and bsums[2 p + 1], as the two int16 of a word */
                memcpy(&group_sums, y[r]->bsums + 2 * p, 4);
                sums[hi][r] = _mm256_sub_epi32(sums[hi][r], _mm256_madd_epi16(pair32, _mm256_set1_epi32(group_sums)));
            }
#pragma GCC unroll 2
            for (int j = 0; j < 2; ++j) {
                const __m256i scale = _mm256_shuffle_epi8(pair, scale_of[j]);
                __m256i q[4];
                q6_K_group_units(x->qs[p][h][j][0][0], q);
#pragma GCC unroll 4
                for (int r = 0; r < n_rows; ++r) {
                    sums[hi][r] = _mm256_add_epi32(sums[hi][r], q6_K_group_dot(q, y[r]->qs + 32 * p + 16 * j, scale));
                }
            }
        }
    }
#pragma GCC unroll 2
    for (int hi = 0; hi < n_halves; ++hi) {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x->d[first_half + hi]));
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) {
            __m256 *a = &acc[first_half + hi][r];
            *a = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(sums[hi][r])), _mm256_set1_ps(y[r]->d), *a);
        }
    }
}

/* The tile against n_rows rows, superblock by superblock: one row takes both halves at once, more rows one half at a
 * time (their sums would not fit the registers). */
KERNEL_INLINE void q6_K_tile_rows(int64_t n, const uint8_t *tile, const act_rows *rows, float *out, int64_t stride,
                                  const uint8_t *prefetch, const int next_tile, const int n_rows) {
    __m256 acc[2][MAX_ROWS];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) acc[h][r] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const tile_q6_K *x = (const tile_q6_K *)tile + b;
        if (next_tile) prefetch_superblock(prefetch, b, sizeof(tile_q6_K));
        const block_q8_K *y[MAX_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) y[r] = (const block_q8_K *)rows[r].rows[0] + b;
        if (n_rows == 1) {
            q6_K_tile_superblock(x, y, 0, 2, 1, acc);
        } else {
            q6_K_tile_superblock(x, y, 0, 1, n_rows, acc);
            q6_K_tile_superblock(x, y, 1, 1, n_rows, acc);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < n_rows; ++r) {
        _mm256_storeu_ps(out + r * stride, acc[0][r]);
        _mm256_storeu_ps(out + r * stride + 8, acc[1][r]);
    }
}

TILE_KERNEL(vec_dot_q6_K_x16_q8_K_tile, q6_K_tile_rows)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const tile_kernel_fn tile_kernel_table_avx2[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_Q4_K_X16] = vec_dot_q4_K_x16_q8_K_tile,
    [PYLLM_TYPE_Q6_K_X16] = vec_dot_q6_K_x16_q8_K_tile,
};

#endif
