/*
 * tile_avx512_vnni.c - the tile kernels of the tiled layouts (backend/kernel_set.h: tile_kernel_fn) on
 * AVX-512 VNNI: 16 weight rows in the 16 lanes of a vector against one or two activation rows (the K-quants': two to
 * four, and one by avx2's kernel).
 *
 * The multi-row kernels of vec_dot_avx2.inc hold one output's 8 lane sums in a vector and pay a dot, a
 * permute, a conversion and an FMA per row and block; the single-row ones also unpack every block for one
 * row. Here lane r of every vector is weight row r: one vpdpbusd takes the same 4 elements of 16 rows
 * (unsigned: Q4_1's nibbles, Q8_0's q + 128) against an activation's 4 bytes broadcast, so a block's 8 lane
 * sums for 16 outputs are 8 dots, 8 conversions and 8 FMAs, and the unpacking is shared by the rows. Each
 * output follows vec_dot_generic.c's float steps exactly: lane l of the reference is accumulator l here, its
 * scale d_w * d_a is the same product, and the closing tree is the same adds between accumulators. Q8_0's
 * offset of 128 comes back out exactly: each lane's sum starts from -128 * its 4 activations (act_rows
 * offsets); Q5_0's q (0..31: the nibble, plus 16 by a byte-masked add where the lane's mask has the fifth
 * bit) the same way with 16. Q4_K_X16 and Q6_K_X16 put both 8-row halves of their tiles (formats/blocks.h) in one
 * vector; their quants are the unsigned operand as they are (Q6_K's -32 is the start of each group's dot: -32 times
 * the row's group sum), and a group's scale multiplies its exact int32 dot in the lanes (vpmulld), so a chunk's (a
 * superblock's) sum is the reference's integer before its one conversion.
 *
 * Built without global -m flags: the kernels get their target by pragma and run only where backends_x86.c has
 * seen the CPU features.
 */
#include "x86/x86.h"

#include <stddef.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")
#endif

#define KERNEL_INLINE static inline __attribute__((always_inline))

enum { FMT_Q4_1, FMT_Q8_0, FMT_Q5_0 };

KERNEL_INLINE size_t tile_block_bytes(int fmt) {
    return fmt == FMT_Q4_1 ? sizeof(tile_q4_1) : fmt == FMT_Q5_0 ? sizeof(tile_q5_0) : sizeof(tile_q8_0);
}

/* Lane l's 4 activations of block b of a prepared row, in every lane. */
KERNEL_INLINE __m512i act_lane(const act_rows *row, int64_t b, int l) {
    int32_t v;
    memcpy(&v, row->quants + QK32 * b + 4 * l, 4);
    return _mm512_set1_epi32(v);
}

/* acc (16 outputs' lane l) = fma(scale, the lane's exact sums, acc): q the 16 rows' unsigned quants of the
 * lane, each lane's sum started from start (zero, or Q8_0's offset share). */
KERNEL_INLINE __m512 lane_step(__m512 acc, __m512 scale, __m512i start, __m512i q, __m512i a) {
    return _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, q, a)), acc);
}

/* The body of every tile kernel: n_rows (1 or 2) activation rows, fmt's blocks. */
KERNEL_INLINE void tile_rows(int64_t n, const uint8_t *tile, const act_rows *rows, float *out, int64_t stride,
                             const uint8_t *prefetch, const int next_tile, const int n_rows, const int fmt) {
    const size_t block_bytes = tile_block_bytes(fmt);
    __m512 acc[2][8], mins[2];
#pragma GCC unroll 2
    for (int r = 0; r < n_rows; ++r) {
#pragma GCC unroll 8
        for (int l = 0; l < 8; ++l) acc[r][l] = _mm512_setzero_ps();
        mins[r] = _mm512_setzero_ps();
    }
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < n / QK32; ++b) {
        const uint8_t *block = tile + b * block_bytes;
        const char *ahead = prefetch != NULL ? (const char *)prefetch + b * block_bytes : NULL;
        if (ahead != NULL && next_tile) {  /* into L2: a tile's worth of lines in L1's few fill buffers would stall this pass */
#pragma GCC unroll 9
            for (size_t line = 0; line < block_bytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T1);
        } else if (ahead != NULL && fmt == FMT_Q4_1) {  /* Q8_0's blocks straddle lines: its stream does better
                                                          * without; Q5_0's (Gemma's 1-row steps) no better with */
#pragma GCC unroll 9
            for (size_t line = 0; line < block_bytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)block));
        __m512 scale[2];
#pragma GCC unroll 2
        for (int r = 0; r < n_rows; ++r) scale[r] = _mm512_mul_ps(d, _mm512_set1_ps(rows[r].scale[b]));
        if (fmt == FMT_Q4_1) {
            const tile_q4_1 *x = (const tile_q4_1 *)block;
            const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)x->m));
#pragma GCC unroll 2
            for (int r = 0; r < n_rows; ++r) mins[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(rows[r].sum[b]), mins[r]);
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {  /* lanes c (low nibbles) and c + 4 (high) */
                const __m512i q = _mm512_loadu_si512(x->qs[c]);
                const __m512i low = _mm512_and_si512(q, nibble), high = _mm512_and_si512(_mm512_srli_epi16(q, 4), nibble);
#pragma GCC unroll 2
                for (int r = 0; r < n_rows; ++r) {
                    acc[r][c] = lane_step(acc[r][c], scale[r], _mm512_setzero_si512(), low, act_lane(&rows[r], b, c));
                    acc[r][c + 4] = lane_step(acc[r][c + 4], scale[r], _mm512_setzero_si512(), high, act_lane(&rows[r], b, c + 4));
                }
            }
        } else if (fmt == FMT_Q5_0) {
            const tile_q5_0 *x = (const tile_q5_0 *)block;
            const __m512i sixteen = _mm512_set1_epi8(16);
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {  /* lanes c (low nibbles) and c + 4 (high), each plus its fifth bits */
                const __m512i q = _mm512_loadu_si512(x->qs[c]);
                const __m512i low = _mm512_and_si512(q, nibble), high = _mm512_and_si512(_mm512_srli_epi16(q, 4), nibble);
                const __m512i q_low = _mm512_mask_add_epi8(low, _cvtu64_mask64(x->qh[c]), low, sixteen);
                const __m512i q_high = _mm512_mask_add_epi8(high, _cvtu64_mask64(x->qh[c + 4]), high, sixteen);
#pragma GCC unroll 2
                for (int r = 0; r < n_rows; ++r) {
                    const __m512i start_low = _mm512_set1_epi32(rows[r].offsets[8 * b + c]);
                    const __m512i start_high = _mm512_set1_epi32(rows[r].offsets[8 * b + c + 4]);
                    acc[r][c] = lane_step(acc[r][c], scale[r], start_low, q_low, act_lane(&rows[r], b, c));
                    acc[r][c + 4] = lane_step(acc[r][c + 4], scale[r], start_high, q_high, act_lane(&rows[r], b, c + 4));
                }
            }
        } else {
            const tile_q8_0 *x = (const tile_q8_0 *)block;
#pragma GCC unroll 8
            for (int l = 0; l < 8; ++l) {
                const __m512i q = _mm512_loadu_si512(x->qs[l]);
#pragma GCC unroll 2
                for (int r = 0; r < n_rows; ++r) {
                    const __m512i start = _mm512_set1_epi32(rows[r].offsets[8 * b + l]);
                    acc[r][l] = lane_step(acc[r][l], scale[r], start, q, act_lane(&rows[r], b, l));
                }
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < n_rows; ++r) {  /* reduce_lanes8, between accumulators */
        __m512 a4[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) a4[i] = _mm512_add_ps(acc[r][i], acc[r][i + 4]);
        const __m512 total = _mm512_add_ps(_mm512_add_ps(a4[0], a4[2]), _mm512_add_ps(a4[1], a4[3]));
        _mm512_storeu_ps(out + r * stride, fmt == FMT_Q4_1 ? _mm512_add_ps(total, mins[r]) : total);
    }
}

#define TILE_KERNEL(name, fmt)                                                                                  \
    static void name(int64_t n, const void *tile, const act_rows *rows, int n_rows, float *out, int64_t stride, \
                     const uint8_t *prefetch, int next_tile) {                                                  \
        if (n_rows == 2) tile_rows(n, tile, rows, out, stride, prefetch, next_tile, 2, fmt);                    \
        else tile_rows(n, tile, rows, out, stride, prefetch, next_tile, 1, fmt);                                \
    }

TILE_KERNEL(vec_dot_q4_1_x16_q8_1_tile, FMT_Q4_1)
TILE_KERNEL(vec_dot_q8_0_x16_q8_0_tile, FMT_Q8_0)
TILE_KERNEL(vec_dot_q5_0_x16_q8_0_tile, FMT_Q5_0)

/* ---- Q4_K_X16: both halves of a tile in one vector, lane i weight row i ---- */

#define K_QUANT_MAX_ROWS 4  /* the rows the K-quant kernels' registers hold */

/* The same 32 bytes of both halves of a tile_q4_K field (half 1's at half0 + offset): lane i is row i. */
KERNEL_INLINE __m512i both_halves(const void *half0, size_t offset) {
    const __m256i low = _mm256_loadu_si256((const __m256i *)half0);
    return _mm512_inserti64x4(_mm512_castsi256_si512(low), _mm256_loadu_si256((const __m256i *)((const char *)half0 + offset)), 1);
}

/* dpbusd(acc, q, the 4 signed bytes at a in every lane), the bytes a memory operand broadcast by the instruction itself
 * (GCC 12 loads them into a register first: a separate instruction each). */
typedef int32_t any_int32 __attribute__((may_alias, aligned(1)));
KERNEL_INLINE __m512i dpbusd_broadcast(__m512i acc, __m512i q, const int8_t *a) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(q), "m"(*(const any_int32 *)a));
    return acc;
}

/* A superblock's 6-bit scales and mins (scale_min_k4's fields) of the 16 rows: scale[g] group g's scale as the
 * lane's int32, min_pair[c] chunk c's two groups' mins as its two int16 (what a group-sum pair multiplies). */
typedef struct {
    __m512i scale[8], min_pair[4];
} q4_K_scales;

KERNEL_INLINE void q4_K_unpack_scales(const tile_q4_K *x, q4_K_scales *s) {
    const size_t half = sizeof x->scales[0];
    const __m512i w0 = both_halves(x->scales[0][0], half), w1 = both_halves(x->scales[0][1], half);
    const __m512i w2 = both_halves(x->scales[0][2], half);
    const __m512i low6 = _mm512_set1_epi8(0x3F), low4 = _mm512_set1_epi8(0x0F), low2 = _mm512_set1_epi8(0x03);
    const __m512i scales[2] = {
        _mm512_and_si512(w0, low6),
        _mm512_or_si512(_mm512_and_si512(w2, low4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w0, 6), low2), 4))};
    const __m512i mins[2] = {
        _mm512_and_si512(w1, low6),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), low4),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w1, 6), low2), 4))};
    const __m512i byte = _mm512_set1_epi32(0xFF), third = _mm512_set1_epi32(0xFF0000);
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) s->scale[g] = _mm512_and_si512(_mm512_srli_epi32(scales[g / 4], 8 * (g % 4)), byte);
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {  /* bytes 2 (c % 2) and 2 (c % 2) + 1 of the lane into its two int16 */
        const __m512i m = _mm512_srli_epi32(mins[c / 2], 16 * (c % 2));
        s->min_pair[c] = _mm512_or_si512(_mm512_and_si512(m, byte), _mm512_and_si512(_mm512_slli_epi32(m, 8), third));
    }
}

/* The tile against n_rows q8_K rows. Per 64-element chunk: each group's exact int32 dot (vpdpbusd: the nibbles
 * unsigned, the activations' 4 bytes broadcast signed), times its scale, the two added (exact: below 2^24), and
 * chained as vec_dot_generic.c's acc = fmaf(sum, d * d_a, acc); its mins' sum by one vpdpwssd of the lanes' min pair
 * and the row's group-sum pair, chained into mins the same way; acc - mins. */
KERNEL_INLINE void q4_K_tile_rows(int64_t n, const uint8_t *tile, const act_rows *rows, float *out, int64_t stride,
                                  const uint8_t *prefetch, const int next_tile, const int n_rows) {
    __m512 acc[K_QUANT_MAX_ROWS], mins[K_QUANT_MAX_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < n_rows; ++r) acc[r] = mins[r] = _mm512_setzero_ps();
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const size_t half = sizeof ((const tile_q4_K *)tile)->qs[0][0];
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const tile_q4_K *x = (const tile_q4_K *)tile + b;
        if (next_tile) {  /* the next tile into L2 while this pass computes on a tile in cache */
            const char *ahead = (const char *)prefetch + b * (int64_t)sizeof(tile_q4_K);
            for (size_t line = 0; line < sizeof(tile_q4_K); line += 64) _mm_prefetch(ahead + line, _MM_HINT_T1);
        }
        q4_K_scales s;
        q4_K_unpack_scales(x, &s);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)x->d));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)x->dmin));
        const block_q8_K *y[K_QUANT_MAX_ROWS];
        __m512 d_row[K_QUANT_MAX_ROWS], dmin_row[K_QUANT_MAX_ROWS];
        int32_t group_pairs[K_QUANT_MAX_ROWS][4];  /* chunk c's two groups' activation sums, as two int16 */
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) {
            y[r] = (const block_q8_K *)rows[r].rows[0] + b;
            d_row[r] = _mm512_mul_ps(d, _mm512_set1_ps(y[r]->d));
            dmin_row[r] = _mm512_mul_ps(dmin, _mm512_set1_ps(y[r]->d));
            const __m128i sums = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y[r]->bsums),
                                                _mm_loadu_si128((const __m128i *)y[r]->bsums + 1));
            _mm_storeu_si128((__m128i *)group_pairs[r], sums);
        }
#pragma GCC unroll 1
        for (int c = 0; c < 4; ++c) {
            __m512i dot_low[K_QUANT_MAX_ROWS], dot_high[K_QUANT_MAX_ROWS];
#pragma GCC unroll 4
            for (int r = 0; r < n_rows; ++r) dot_low[r] = dot_high[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int k = 0; k < 8; ++k) {
                const __m512i q = both_halves(x->qs[c][0][k], half);
                const __m512i low = _mm512_and_si512(q, nibble), high = _mm512_and_si512(_mm512_srli_epi16(q, 4), nibble);
#pragma GCC unroll 4
                for (int r = 0; r < n_rows; ++r) {
                    dot_low[r] = dpbusd_broadcast(dot_low[r], low, y[r]->qs + 64 * c + 4 * k);
                    dot_high[r] = dpbusd_broadcast(dot_high[r], high, y[r]->qs + 64 * c + 32 + 4 * k);
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < n_rows; ++r) {
                const __m512i sum = _mm512_add_epi32(_mm512_mullo_epi32(dot_low[r], s.scale[2 * c]),
                                                     _mm512_mullo_epi32(dot_high[r], s.scale[2 * c + 1]));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), d_row[r], acc[r]);
                const __m512i sum_min = _mm512_dpwssd_epi32(_mm512_setzero_si512(), s.min_pair[c],
                                                            _mm512_set1_epi32(group_pairs[r][c]));
                mins[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum_min), dmin_row[r], mins[r]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < n_rows; ++r) _mm512_storeu_ps(out + r * stride, _mm512_sub_ps(acc[r], mins[r]));
}

/* A K-quant tile kernel (tile_kernel_fn) from an inline kernel of a fixed row count, for two to four rows; a decode
 * step's one goes to avx2's kernel of the layout, which streams the tiles from memory faster through a whole decode
 * step (bench/README.md). */
#define K_QUANT_TILE_KERNEL(name, rows_kernel, layout)                                                           \
    static void name(int64_t n, const void *tile, const act_rows *rows, int n_rows, float *out, int64_t stride, \
                     const uint8_t *prefetch, int next_tile) {                                                  \
        switch (n_rows) {                                                                                       \
        case 4: rows_kernel(n, tile, rows, out, stride, prefetch, next_tile, 4); break;                        \
        case 3: rows_kernel(n, tile, rows, out, stride, prefetch, next_tile, 3); break;                        \
        case 2: rows_kernel(n, tile, rows, out, stride, prefetch, next_tile, 2); break;                        \
        default: tile_kernel_table_avx2[layout](n, tile, rows, n_rows, out, stride, prefetch, next_tile);       \
        }                                                                                                       \
    }

K_QUANT_TILE_KERNEL(vec_dot_q4_K_x16_q8_K_tile, q4_K_tile_rows, PYLLM_TYPE_Q4_K_X16)

/* ---- Q6_K_X16: the same, over tile_q6_K ---- */

/* A group's 4 units of the 16 rows, unsigned (formats/blocks.h: tile_q6_K): units 0..2 in bits 0..5 of their bytes,
 * unit 3 rebuilt from the three bytes' bits 6-7 (each masked before its 16-bit shift, so no bit crosses a byte). */
KERNEL_INLINE void q6_K_units(const uint8_t *bytes, size_t half, __m512i q[4]) {
    const __m512i low6 = _mm512_set1_epi8(0x3F);
    const __m512i b0 = both_halves(bytes, half), b1 = both_halves(bytes + 32, half), b2 = both_halves(bytes + 64, half);
    q[0] = _mm512_and_si512(b0, low6);
    q[1] = _mm512_and_si512(b1, low6);
    q[2] = _mm512_and_si512(b2, low6);
    q[3] = _mm512_or_si512(_mm512_or_si512(_mm512_srli_epi16(_mm512_andnot_si512(low6, b0), 2),
                                           _mm512_srli_epi16(_mm512_andnot_si512(low6, b1), 4)),
                           _mm512_srli_epi16(_mm512_andnot_si512(low6, b2), 6));
}

/* The tile against n_rows q8_K rows: each group's exact int32 sum of (q - 32) * a (the dots started from -32 times
 * the row's group sum), times the lanes' scales (vpmulld), summed over the superblock, then vec_dot_generic.c's
 * acc = fmaf(d * (float)sum, d_a, acc). */
KERNEL_INLINE void q6_K_tile_rows(int64_t n, const uint8_t *tile, const act_rows *rows, float *out, int64_t stride,
                                  const uint8_t *prefetch, const int next_tile, const int n_rows) {
    __m512 acc[K_QUANT_MAX_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < n_rows; ++r) acc[r] = _mm512_setzero_ps();
    const size_t half_units = sizeof ((const tile_q6_K *)tile)->qs[0][0];
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const tile_q6_K *x = (const tile_q6_K *)tile + b;
        if (next_tile) {
            const char *ahead = (const char *)prefetch + b * (int64_t)sizeof(tile_q6_K);
            for (size_t line = 0; line < sizeof(tile_q6_K); line += 64) _mm_prefetch(ahead + line, _MM_HINT_T1);
        }
        const block_q8_K *y[K_QUANT_MAX_ROWS];
        int32_t start[K_QUANT_MAX_ROWS][16];  /* -32 * group g's activations summed */
        __m512i sums[K_QUANT_MAX_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) {
            y[r] = (const block_q8_K *)rows[r].rows[0] + b;
            const __m512i group_sums = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)y[r]->bsums));
            _mm512_storeu_si512(start[r], _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(group_sums, 5)));
            sums[r] = _mm512_setzero_si512();
        }
#pragma GCC unroll 1
        for (int p = 0; p < 8; ++p) {
            /* lane i's scales of groups 2 p and 2 p + 1: the two bytes of its word, sign-extended */
            const __m512i pair = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)x->scales[p]));
            const __m512i scale[2] = {_mm512_srai_epi32(_mm512_slli_epi32(pair, 24), 24), _mm512_srai_epi32(pair, 8)};
#pragma GCC unroll 2
            for (int j = 0; j < 2; ++j) {
                __m512i q[4];
                q6_K_units(x->qs[p][0][j][0][0], half_units, q);
                const int g = 2 * p + j;
#pragma GCC unroll 4
                for (int r = 0; r < n_rows; ++r) {
                    __m512i dot = _mm512_set1_epi32(start[r][g]);
#pragma GCC unroll 4
                    for (int u = 0; u < 4; ++u) dot = dpbusd_broadcast(dot, q[u], y[r]->qs + 16 * g + 4 * u);
                    sums[r] = _mm512_add_epi32(sums[r], _mm512_mullo_epi32(dot, scale[j]));
                }
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)x->d));
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) {
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(sums[r])), _mm512_set1_ps(y[r]->d), acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < n_rows; ++r) _mm512_storeu_ps(out + r * stride, acc[r]);
}

K_QUANT_TILE_KERNEL(vec_dot_q6_K_x16_q8_K_tile, q6_K_tile_rows, PYLLM_TYPE_Q6_K_X16)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const tile_kernel_fn tile_kernel_table_avx512_vnni[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_Q4_1_X16] = vec_dot_q4_1_x16_q8_1_tile, [PYLLM_TYPE_Q8_0_X16] = vec_dot_q8_0_x16_q8_0_tile,
    [PYLLM_TYPE_Q5_0_X16] = vec_dot_q5_0_x16_q8_0_tile, [PYLLM_TYPE_Q4_K_X16] = vec_dot_q4_K_x16_q8_K_tile,
    [PYLLM_TYPE_Q6_K_X16] = vec_dot_q6_K_x16_q8_K_tile,
};

#endif
