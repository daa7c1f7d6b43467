/*
 * vec_dot_avx2.c - AVX2 + FMA + F16C dot products for every weight type.
 *
 * Each kernel returns the same float bits as its reference in
 * vec_dot_generic.c: the integer part of a block (or superblock) is summed
 * exactly, in whatever order suits the vector unit, and every float operation
 * the reference does (products of scales, fmaf into a lane, the final lane
 * tree) is done here on the same values in the same order:
 *   - 32-element formats: a block's 8 exact 4-element sums are one vector, so
 *     one _mm256_fmadd_ps per block is exactly the reference's 8 fmaf.
 *   - K-quants: the exact int sums of a superblock, then the reference's
 *     scalar fmaf.
 *   - float weights: one 8-lane accumulator.
 *
 * What the integer tricks below rely on: activations (q8_0 and q8_K) lie in
 * [-127, 127] (the reference quantizers never write -128), and the q8_K
 * bsums are the sums of their 16-element groups (as the reference quantizer
 * writes them; the generic Q2_K/Q4_K/Q5_K use them too, and here Q3_K and
 * Q6_K take their offsets of 4 and 32 off through them). Weights may hold any
 * byte, q8_0's -128 included.
 *
 * The whole file is compiled for AVX2 by pragma (no global -m flags), so one
 * build runs on any x86-64; dispatch.c only uses this table on CPUs with
 * AVX2 and FMA (F16C and BMI2 come with every such CPU).
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "quants.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi2")
#endif

/* ------------------------------------------------------------------------ */
/* helpers                                                                   */
/* ------------------------------------------------------------------------ */

/* fp16 -> fp32 by F16C: the same value as fp16_to_fp32 for every non-NaN half. */
static inline float half_to_float(fp16_t h) { return _cvtsh_ss(h); }

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

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15), then high (16..31). */
static inline __m256i unpack_nibbles32(const uint8_t *qs) {
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    const __m256i shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}

/* 32 bits -> 32 bytes, byte j = 0xFF if bit j is set, else 0. */
static inline __m256i bytes_from_bits32(const uint8_t qh[4]) {
    int32_t bits;
    memcpy(&bits, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits),
        _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL, 0x0202020202020202LL,
                           0x0303030303030303LL));
    const __m256i all_but_bit = _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFELL);
    return _mm256_cmpeq_epi8(_mm256_or_si256(spread, all_but_bit), _mm256_set1_epi8(-1));
}

/* 16 int16 pair sums of q[j] * a[j], q any signed byte (-128 too), a in [-127, 127]. */
static inline __m256i prod_signed(__m256i q, __m256i a) {
    /* |q| as unsigned bytes (-128 -> 128), a with q's sign: pairs within 2 * 128 * 127 */
    return _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q));
}

static inline __m256i widen_sum16(__m256i p) { return _mm256_madd_epi16(p, _mm256_set1_epi16(1)); }

/* ------------------------------------------------------------------------ */
/* 32-element formats: 8 lanes of 4-element sums, chained block by block    */
/* ------------------------------------------------------------------------ */

/* A block's quants as 32 bytes in element order (signed, or unsigned for Q4_1 / Q5_1). */
static inline __m256i unpack_q4_0(const block_q4_0 *x) {
    return _mm256_sub_epi8(unpack_nibbles32(x->qs), _mm256_set1_epi8(8));
}
static inline __m256i unpack_q4_1(const block_q4_1 *x) { return unpack_nibbles32(x->qs); }
static inline __m256i unpack_q5_0(const block_q5_0 *x) {
    /* q - 16 = the nibble | 0xF0 where the fifth bit is clear, the bare nibble where it is set */
    const __m256i high = _mm256_andnot_si256(bytes_from_bits32(x->qh), _mm256_set1_epi8((char)0xF0));
    return _mm256_or_si256(unpack_nibbles32(x->qs), high);
}
static inline __m256i unpack_q5_1(const block_q5_1 *x) {
    const __m256i high = _mm256_and_si256(bytes_from_bits32(x->qh), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(unpack_nibbles32(x->qs), high);
}
static inline __m256i unpack_q8_0(const block_q8_0 *x) { return load32(x->qs); }

/* int32 lane l = sum of q[j] * a[j] over j = 4l..4l+3 (maddubs pairs stay within int16:
 * at most 2 * 128 * 127 for signed q, 2 * 31 * 127 for unsigned q5) */
static inline __m256i lanes_signed(__m256i q, const int8_t *a) { return widen_sum16(prod_signed(q, load32(a))); }
static inline __m256i lanes_unsigned(__m256i q, const int8_t *a) {
    return widen_sum16(_mm256_maddubs_epi16(q, load32(a)));
}

/* The first two halves of a block (d, then m or s where the format has one) as floats in lanes 0 and 1;
 * every block here is at least 8 bytes long. */
static inline __m128 block_halves(const void *block) { return _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)block)); }

/* Weights stream through the single-row (decode) kernels from memory: ask for them 3 KB ahead
 * (prefetch_ahead: a block shorter than a cache line; prefetch_superblock: each line of a K-quant's).
 * Always inlined: GCC takes a prefetch for a function without effects and drops a call to one that
 * an always_inline caller left out of line. */
static inline __attribute__((always_inline)) void prefetch_ahead(const void *p) {
    _mm_prefetch((const char *)p + 3072, _MM_HINT_T0);
}
static inline __attribute__((always_inline)) void prefetch_superblock(const void *p, size_t bytes) {
    for (size_t offset = 0; offset < bytes; offset += 64) prefetch_ahead((const char *)p + offset);
}

static inline float lanes_total(__m256 acc) {  /* reduce_lanes8's order */
    const __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
    return _mm_cvtss_f32(_mm_add_ss(a2, _mm_movehdup_ps(a2)));
}

/* Lane 0 of each block's step: acc += (d_w * d_a) * sums; lane 1 of mins (Q4_1 / Q5_1): mins = fmaf(m, s, mins). */
#define VEC_DOT_32(name, block_t, act_t, unpack, lanes, has_min)                                              \
    static float name(int64_t n, const void *w, const void *act) {                                            \
        const block_t *x = w;                                                                                 \
        const act_t *y = act;                                                                                 \
        __m256 acc = _mm256_setzero_ps();                                                                     \
        __m128 mins = _mm_setzero_ps();                                                                       \
        for (int64_t b = 0; b < n / QK32; ++b) {                                                              \
            prefetch_ahead(x + b);                                                                            \
            const __m128 wd = block_halves(x + b), yd = block_halves(y + b);                                 \
            const __m256 scale = _mm256_broadcastss_ps(_mm_mul_ss(wd, yd));                                   \
            acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lanes(unpack(x + b), y[b].qs)), acc);             \
            if (has_min) mins = _mm_fmadd_ps(wd, yd, mins);                                                   \
        }                                                                                                     \
        return has_min ? lanes_total(acc) + _mm_cvtss_f32(_mm_movehdup_ps(mins)) : lanes_total(acc);          \
    }

VEC_DOT_32(vec_dot_q4_0_lanes_q8_0_avx2, block_q4_0, block_q8_0, unpack_q4_0, lanes_signed, 0)
VEC_DOT_32(vec_dot_q4_1_q8_1_avx2, block_q4_1, block_q8_1, unpack_q4_1, lanes_unsigned, 1)
VEC_DOT_32(vec_dot_q5_0_q8_0_avx2, block_q5_0, block_q8_0, unpack_q5_0, lanes_signed, 0)
VEC_DOT_32(vec_dot_q5_1_q8_1_avx2, block_q5_1, block_q8_1, unpack_q5_1, lanes_unsigned, 1)
VEC_DOT_32(vec_dot_q8_0_q8_0_avx2, block_q8_0, block_q8_0, unpack_q8_0, lanes_signed, 0)

/*
 * The same kernels over several activation rows: each weight block is unpacked once and met by every
 * row, each row's float steps in the single-row order. The rows come in groups of VEC_DOT_MAX_ROWS
 * (act_rows: their scales as floats, block-major, so a block's min terms are one vector operation);
 * a kernel takes one group or two (8 rows, the unpacking shared further). All rows of a group are
 * computed (the missing ones on row 0's data, at scale 0); the caller keeps the real ones.
 */
enum { FMT_Q4_0_LANES, FMT_Q4_1, FMT_Q5_0, FMT_Q5_1, FMT_Q8_0 };

static inline size_t fmt_block_bytes(int fmt) {
    return fmt == FMT_Q4_0_LANES ? sizeof(block_q4_0) : fmt == FMT_Q4_1 ? sizeof(block_q4_1)
         : fmt == FMT_Q5_0 ? sizeof(block_q5_0) : fmt == FMT_Q5_1 ? sizeof(block_q5_1) : sizeof(block_q8_0);
}
static inline int fmt_has_min(int fmt) { return fmt == FMT_Q4_1 || fmt == FMT_Q5_1; }

/* A block's quants for the rows: signed (Q4_0, Q8_0) or unsigned (Q4_1, Q5_1, and Q5_0 as q + 16). */
static inline __m256i fmt_unpack(const uint8_t *block, int fmt) {
    switch (fmt) {
    case FMT_Q4_0_LANES: return unpack_q4_0((const block_q4_0 *)block);
    case FMT_Q4_1: return unpack_q4_1((const block_q4_1 *)block);
    case FMT_Q5_0: {
        const block_q5_0 *x = (const block_q5_0 *)block;
        return _mm256_or_si256(unpack_nibbles32(x->qs), _mm256_and_si256(bytes_from_bits32(x->qh), _mm256_set1_epi8(0x10)));
    }
    case FMT_Q5_1: return unpack_q5_1((const block_q5_1 *)block);
    default: return unpack_q8_0((const block_q8_0 *)block);
    }
}

/* A row's 8 exact lane sums; for Q5_0 the unsigned sums less the offset's share (act_rows offsets). */
static inline __m256i fmt_row_lanes(__m256i q, const int8_t *a, const int32_t *offset, int fmt) {
    switch (fmt) {
    case FMT_Q4_1: case FMT_Q5_1: return lanes_unsigned(q, a);
    case FMT_Q5_0: return _mm256_sub_epi32(lanes_unsigned(q, a), load32(offset));
    default: return lanes_signed(q, a);
    }
}

/* Lane i (0..3) of each 128-bit half, in all 8 lanes: a row's scale by one in-lane permute, where a
 * broadcast load and a multiply a row kept the multiply ports busier (+5-14% on the 4- and 8-row kernels). */
static inline __m256 lane_everywhere(__m256 v, int i) {
    switch (i) {
    case 0: return _mm256_permute_ps(v, 0x00);
    case 1: return _mm256_permute_ps(v, 0x55);
    case 2: return _mm256_permute_ps(v, 0xAA);
    default: return _mm256_permute_ps(v, 0xFF);
    }
}

/* One weight block of rows32 (index b): its quants q, its d in every lane, its (d, m) halves for the min. */
static inline __attribute__((always_inline)) void rows32_step(__m256i q, __m256 d, __m128 halves, int64_t b,
                                                              const act_rows *groups, __m256 *acc, __m128 *mins,
                                                              const int n_groups, const int fmt) {
    __m256 group_scales[2];  /* d * the group's 4 row scales, in both 128-bit halves */
    for (int gi = 0; gi < n_groups; ++gi) {
        group_scales[gi] = _mm256_mul_ps(d, _mm256_broadcast_ps((const __m128 *)(groups[gi].scale + VEC_DOT_MAX_ROWS * b)));
    }
#pragma GCC unroll 8
    for (int r = 0; r < VEC_DOT_MAX_ROWS * n_groups; ++r) {
        const act_rows *group = &groups[r / VEC_DOT_MAX_ROWS];
        const int i = r % VEC_DOT_MAX_ROWS;
        const __m256 scale = lane_everywhere(group_scales[r / VEC_DOT_MAX_ROWS], i);
        const int32_t *offset = fmt == FMT_Q5_0 ? group->offsets + (VEC_DOT_MAX_ROWS * b + i) * 8 : NULL;
        const __m256i sums = fmt_row_lanes(q, group->quants + (VEC_DOT_MAX_ROWS * b + i) * QK32, offset, fmt);
        acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), acc[r]);
    }
    if (fmt_has_min(fmt)) {  /* the rows' mins = fmaf(m, s, mins), a group at once */
        for (int gi = 0; gi < n_groups; ++gi) {
            mins[gi] = _mm_fmadd_ps(_mm_permute_ps(halves, 0x55), _mm_loadu_ps(groups[gi].sum + VEC_DOT_MAX_ROWS * b),
                                    mins[gi]);
        }
    }
}

/* Blocks first..n/32-1 of plain blocks (x: the row's first block) through rows32_step. */
static inline __attribute__((always_inline)) void rows32_blocks(int64_t first, int64_t n, const uint8_t *x,
                                                                const act_rows *groups, __m256 *acc, __m128 *mins,
                                                                const int n_groups, const int fmt) {
    for (int64_t b = first; b < n / QK32; ++b) {
        const uint8_t *block = x + b * fmt_block_bytes(fmt);
        if (n_groups == 1) prefetch_ahead(block);  /* a few rows (decode of a batch): weights from memory */
        const __m128 halves = block_halves(block);
        rows32_step(fmt_unpack(block, fmt), _mm256_broadcastss_ps(halves), halves, b, groups, acc, mins, n_groups, fmt);
    }
}

static inline __attribute__((always_inline)) void rows32_finish(const __m256 *acc, const __m128 *mins, float *out,
                                                                const int n_groups, const int fmt) {
    float min_terms[2 * VEC_DOT_MAX_ROWS];
    _mm_storeu_ps(min_terms, mins[0]);
    _mm_storeu_ps(min_terms + VEC_DOT_MAX_ROWS, mins[1]);
#pragma GCC unroll 8
    for (int r = 0; r < VEC_DOT_MAX_ROWS * n_groups; ++r) {
        out[r] = fmt_has_min(fmt) ? lanes_total(acc[r]) + min_terms[r] : lanes_total(acc[r]);
    }
}

static inline __attribute__((always_inline)) void rows32(int64_t n, const void *w, const act_rows *groups,
                                                         float *out, const int n_groups, const int fmt) {
    __m256 acc[2 * VEC_DOT_MAX_ROWS];
    __m128 mins[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
#pragma GCC unroll 8
    for (int r = 0; r < VEC_DOT_MAX_ROWS * n_groups; ++r) acc[r] = _mm256_setzero_ps();
    rows32_blocks(0, n, w, groups, acc, mins, n_groups, fmt);
    rows32_finish(acc, mins, out, n_groups, fmt);
}

/* Block k (0..7) of a Q5_0_G8 group as unsigned quants (0..31): the nibbles, bit 4 from bit k of qh's bytes
 * (a 16-bit shift moves no bit across a byte into bit 4). */
static inline __attribute__((always_inline)) __m256i unpack_g8(const group_q5_0 *g, __m256i qh, const int k) {
    const __m256i high = k < 4 ? _mm256_slli_epi16(qh, 4 - k) : k == 4 ? qh : _mm256_srli_epi16(qh, k - 4);
    return _mm256_or_si256(unpack_nibbles32(g->qs[k]), _mm256_and_si256(high, _mm256_set1_epi8(0x10)));
}

/* Eight blocks' d from a group, as floats. */
static inline __m256 group_scales8(const group_q5_0 *g) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g->d)); }

/* Lane k of v in every lane. */
static inline __m256 lane8_everywhere(__m256 v, int k) { return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(k)); }

/* The groups' three lines a group ahead (the plain blocks prefetch a block at a time). */
static inline __attribute__((always_inline)) void prefetch_group(const group_q5_0 *g) {
    for (int line = 0; line < 3; ++line) prefetch_ahead((const uint8_t *)g + 64 * line);
}

/* rows32 over a Q5_0_G8 row: the groups' blocks, then the plain ones after them. */
static inline __attribute__((always_inline)) void rows32_g8(int64_t n, const void *w, const act_rows *groups,
                                                            float *out, const int n_groups) {
    const group_q5_0 *x = w;
    __m256 acc[2 * VEC_DOT_MAX_ROWS];
    __m128 mins[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
#pragma GCC unroll 8
    for (int r = 0; r < VEC_DOT_MAX_ROWS * n_groups; ++r) acc[r] = _mm256_setzero_ps();
    const int64_t n_grouped = n / QK32 / 8 * 8;
    for (int64_t b = 0; b < n_grouped; b += 8) {
        const group_q5_0 *g = &x[b / 8];
        if (n_groups == 1) prefetch_group(g);
        const __m256i qh = load32(g->qh);
        const __m256 d = group_scales8(g);
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
            rows32_step(unpack_g8(g, qh, k), lane8_everywhere(d, k), _mm_setzero_ps(), b + k, groups, acc, mins,
                        n_groups, FMT_Q5_0);
        }
    }
    rows32_blocks(n_grouped, n, w, groups, acc, mins, n_groups, FMT_Q5_0);  /* block b at b * 22 bytes */
    rows32_finish(acc, mins, out, n_groups, FMT_Q5_0);
}

/* The one-group (4-row) and two-group (8-row) entry points of a multi-row kernel body
 * body(n, w, groups, out, n_groups). */
#define ROWS_KERNELS(suffix, body)                                                                            \
    static void vec_dot_rows_##suffix##_avx2(int64_t n, const void *w, const act_rows *group, float *out) {  \
        body(n, w, group, out, 1);                                                                            \
    }                                                                                                         \
    static void vec_dot_rows8_##suffix##_avx2(int64_t n, const void *w, const act_rows *group, float *out) { \
        body(n, w, group, out, 2);                                                                            \
    }

/* A group's results (lane r: row r) into out, the second group's after the first's. */
static inline void store_groups(float *out, const __m128 *per_group, int n_groups) {
    for (int g = 0; g < n_groups; ++g) _mm_storeu_ps(out + VEC_DOT_MAX_ROWS * g, per_group[g]);
}

#define ROWS32_KERNELS(suffix, fmt)                                                                           \
    static inline __attribute__((always_inline)) void rows32_##suffix(int64_t n, const void *w,             \
                                                                      const act_rows *groups, float *out,    \
                                                                      const int n_groups) {                  \
        rows32(n, w, groups, out, n_groups, fmt);                                                             \
    }                                                                                                         \
    ROWS_KERNELS(suffix, rows32_##suffix)

ROWS32_KERNELS(q4_0_lanes, FMT_Q4_0_LANES)
ROWS32_KERNELS(q4_1, FMT_Q4_1)
ROWS32_KERNELS(q5_0, FMT_Q5_0)
ROWS32_KERNELS(q5_1, FMT_Q5_1)
ROWS32_KERNELS(q8_0, FMT_Q8_0)
ROWS_KERNELS(q5_0_g8, rows32_g8)

/* The single-row kernels of Q5_0 and Q8_0 again over a row act_row_prepare laid out: quants from aligned
 * storage, the activation's scale a float (d_w * d_a the same product), Q5_0 unsigned less its offsets (the
 * same exact lane sums). From memory, M = 1, alternated: Q5_0 +6-11%, Q8_0 +0-7%; the formats with a min
 * (Q4_1, Q5_1, whose q8_1 rows keep their own layout) and Q4_0's lane order came out 0-20% slower this way. */
static inline __attribute__((always_inline)) __m256 row32_step(__m256 acc, __m256i q, __m256 scale, const act_rows *a,
                                                               int64_t b, const int fmt) {
    const int32_t *offset = fmt == FMT_Q5_0 ? a->offsets + 8 * b : NULL;
    return _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(fmt_row_lanes(q, a->quants + QK32 * b, offset, fmt)), acc);
}

/* Blocks first..n/32-1 of plain blocks (x: the row's first block), chained onto acc. */
static inline __attribute__((always_inline)) __m256 row32_blocks(__m256 acc, int64_t first, int64_t n, const uint8_t *x,
                                                                 const act_rows *a, const int fmt) {
    for (int64_t b = first; b < n / QK32; ++b) {
        const uint8_t *block = x + b * fmt_block_bytes(fmt);
        prefetch_ahead(block);
        const __m256 scale = _mm256_mul_ps(_mm256_broadcastss_ps(block_halves(block)), _mm256_broadcast_ss(a->scale + b));
        acc = row32_step(acc, fmt_unpack(block, fmt), scale, a, b, fmt);
    }
    return acc;
}

static inline __attribute__((always_inline)) float row32(int64_t n, const void *w, const act_rows *a, const int fmt) {
    return lanes_total(row32_blocks(_mm256_setzero_ps(), 0, n, w, a, fmt));
}

/* Q5_0_G8's: a group's eight scales d_w * d_a in one product, each block's fifth bits by a shift (unpack_g8).
 * One row from memory, alternated against Q5_0's row32 (K = 4864): +30-55% (1 and 2 threads). */
static float vec_dot_row_q5_0_g8_avx2(int64_t n, const void *w, const act_rows *a) {
    const group_q5_0 *x = w;
    const int64_t n_grouped = n / QK32 / 8 * 8;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_grouped; b += 8) {
        const group_q5_0 *g = &x[b / 8];
        prefetch_group(g);
        const __m256i qh = load32(g->qh);
        const __m256 scales = _mm256_mul_ps(group_scales8(g), _mm256_loadu_ps(a->scale + b));
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) acc = row32_step(acc, unpack_g8(g, qh, k), lane8_everywhere(scales, k), a, b + k, FMT_Q5_0);
    }
    return lanes_total(row32_blocks(acc, n_grouped, n, w, a, FMT_Q5_0));  /* the plain blocks: b at b * 22 bytes */
}

/* One Q5_0 block over a q8_0 block, as vec_dot_q5_0_q8_0_avx2 takes it: q - 16 signed, the scale d_w * d_a. */
static inline __m256 q5_0_step(__m256 acc, __m256i q_signed, __m128 wd, const block_q8_0 *y) {
    const __m256 scale = _mm256_broadcastss_ps(_mm_mul_ss(wd, block_halves(y)));
    return _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lanes_signed(q_signed, y->qs)), acc);
}

/* Q5_0_G8 over a q8_0 row: Q5_0's steps, a group's blocks by unpack_g8, then the plain blocks. */
static float vec_dot_q5_0_g8_q8_0_avx2(int64_t n, const void *w, const void *act) {
    const group_q5_0 *x = w;
    const block_q8_0 *y = act;
    const int64_t nb = n / QK32, n_grouped = nb / 8 * 8;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_grouped; b += 8) {
        const group_q5_0 *g = &x[b / 8];
        prefetch_group(g);
        const __m256i qh = load32(g->qh);
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
            acc = q5_0_step(acc, _mm256_sub_epi8(unpack_g8(g, qh, k), _mm256_set1_epi8(16)),
                            _mm_cvtph_ps(_mm_cvtsi32_si128(g->d[k])), y + b + k);
        }
    }
    const block_q5_0 *plain = w;  /* the blocks after the groups: b at b * 22 bytes */
    for (int64_t b = n_grouped; b < nb; ++b) acc = q5_0_step(acc, unpack_q5_0(plain + b), block_halves(plain + b), y + b);
    return lanes_total(acc);
}

static float vec_dot_row_q5_0_avx2(int64_t n, const void *w, const act_rows *a) { return row32(n, w, a, FMT_Q5_0); }
static float vec_dot_row_q8_0_avx2(int64_t n, const void *w, const act_rows *a) { return row32(n, w, a, FMT_Q8_0); }

/* Four Q4_0 blocks (72 bytes, at most two lines) ahead. */
static inline __attribute__((always_inline)) void prefetch_q4_0x4(const block_q4_0 *x) {
    prefetch_ahead(x);
    prefetch_ahead(x + 2);
}

/* The 4 int totals of 4 vectors of 8 int32 lanes, in one vector. */
static inline __m128i totals4(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);
    const __m256i abcd = _mm256_hadd_epi32(ab, cd);  /* per 128-bit half: a b c d partial totals */
    return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

/* Four blocks' scales d (the first half of each block) as floats, in one vector. */
#define BLOCK_SCALES4(blocks, b)                                                                              \
    _mm_cvtph_ps(_mm_setr_epi16((short)(blocks)[b].d, (short)(blocks)[(b) + 1].d, (short)(blocks)[(b) + 2].d, \
                                (short)(blocks)[(b) + 3].d, 0, 0, 0, 0))

/* Q4_0's chain over four blocks, in order: acc = fmaf(sum_i, scale_i, acc). */
static inline float q4_0_chain4(float acc, __m128 sums, __m128 scales) {
    float sum[4], scale[4];
    _mm_storeu_ps(sum, sums);
    _mm_storeu_ps(scale, scales);
    for (int i = 0; i < 4; ++i) acc = fmaf(sum[i], scale[i], acc);
    return acc;
}

/* Q4_0 in its interleaved-layout order (see vec_dot_generic.c): each block's exact sum, one fmaf chain;
 * four blocks' sums at a time in one vector (totals4), their scales d_w * d_a in another. */
static float vec_dot_q4_0_q8_0_avx2(int64_t n, const void *w, const void *act) {
    const block_q4_0 *x = w;
    const block_q8_0 *y = act;
    const int64_t nb = n / QK32;
    float acc = 0.0f;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        prefetch_q4_0x4(x + b);
        const __m128i sums = totals4(lanes_signed(unpack_q4_0(x + b), y[b].qs),
                                     lanes_signed(unpack_q4_0(x + b + 1), y[b + 1].qs),
                                     lanes_signed(unpack_q4_0(x + b + 2), y[b + 2].qs),
                                     lanes_signed(unpack_q4_0(x + b + 3), y[b + 3].qs));
        acc = q4_0_chain4(acc, _mm_cvtepi32_ps(sums), _mm_mul_ps(BLOCK_SCALES4(x, b), BLOCK_SCALES4(y, b)));
    }
    for (; b < nb; ++b) {
        const int32_t sum = hsum_i32x8(lanes_signed(unpack_q4_0(x + b), y[b].qs));
        acc = fmaf((float)sum, _mm_cvtss_f32(_mm_mul_ss(block_halves(x + b), block_halves(y + b))), acc);
    }
    return acc;
}

/* Q4_0 over a prepared row: the nibbles unsigned (q + 8), each block's exact sum less 8 * the activations'
 * block sum (block_offsets), four blocks' sums in one vector and their scales d_w * d_a in another. */
static float vec_dot_row_q4_0_avx2(int64_t n, const void *w, const act_rows *a) {
    const block_q4_0 *x = w;
    const int64_t nb = n / QK32;
    float acc = 0.0f;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        prefetch_q4_0x4(x + b);
        const int8_t *q = a->quants + QK32 * b;
        const __m128i unsigned_sums = totals4(lanes_unsigned(unpack_nibbles32(x[b].qs), q),
                                              lanes_unsigned(unpack_nibbles32(x[b + 1].qs), q + QK32),
                                              lanes_unsigned(unpack_nibbles32(x[b + 2].qs), q + 2 * QK32),
                                              lanes_unsigned(unpack_nibbles32(x[b + 3].qs), q + 3 * QK32));
        const __m128i sums = _mm_sub_epi32(unsigned_sums, _mm_loadu_si128((const __m128i *)(a->block_offsets + b)));
        acc = q4_0_chain4(acc, _mm_cvtepi32_ps(sums), _mm_mul_ps(BLOCK_SCALES4(x, b), _mm_loadu_ps(a->scale + b)));
    }
    for (; b < nb; ++b) {
        const int32_t sum = hsum_i32x8(lanes_unsigned(unpack_nibbles32(x[b].qs), a->quants + QK32 * b)) - a->block_offsets[b];
        acc = fmaf((float)sum, half_to_float(x[b].d) * a->scale[b], acc);
    }
    return acc;
}

/* Q4_0 over one or two groups of rows, its nibbles unsigned (q + 8): each block's exact sum is the unsigned
 * one less 8 * the activations' block sum (act_rows block_offsets), four rows' sums in one vector (totals4). */
static inline __attribute__((always_inline)) void rows_q4_0(int64_t n, const void *w, const act_rows *groups,
                                                            float *out, const int n_groups) {
    const block_q4_0 *x = w;
    __m128 acc[2] = {_mm_setzero_ps(), _mm_setzero_ps()};  /* lane r: row r's chain */
    for (int64_t b = 0; b < n / QK32; ++b) {
        if (n_groups == 1) prefetch_ahead(x + b);  /* a decode batch: weights from memory */
        const __m256i u = unpack_nibbles32(x[b].qs);
        const __m128 d = _mm_broadcastss_ps(block_halves(x + b));
#pragma GCC unroll 2
        for (int g = 0; g < n_groups; ++g) {
            const act_rows *group = &groups[g];
            const int8_t *a = group->quants + VEC_DOT_MAX_ROWS * QK32 * b;  /* the block's 4 rows, 32 bytes each */
            const __m128i unsigned_sums = totals4(lanes_unsigned(u, a), lanes_unsigned(u, a + QK32),
                                                  lanes_unsigned(u, a + 2 * QK32), lanes_unsigned(u, a + 3 * QK32));
            const __m128i sums = _mm_sub_epi32(unsigned_sums,
                                               _mm_loadu_si128((const __m128i *)(group->block_offsets + VEC_DOT_MAX_ROWS * b)));
            const __m128 scale = _mm_mul_ps(d, _mm_loadu_ps(group->scale + VEC_DOT_MAX_ROWS * b));
            acc[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(sums), scale, acc[g]);
        }
    }
    store_groups(out, acc, n_groups);
}

ROWS_KERNELS(q4_0, rows_q4_0)

/* ------------------------------------------------------------------------ */
/* K-quants against q8_K: exact superblock sums, then the reference's fmaf  */
/* ------------------------------------------------------------------------ */

/*
 * Scales of 16-element groups as int16: the 32-element chunk k (0..7) covers
 * groups 2k and 2k + 1, so its low 128 bits need scale 2k and its high 128
 * bits scale 2k + 1. With the int16 scales 0..7 (or 8..15) in both halves of
 * a vector, chunk 4 * h + j picks them with group_pair_pattern(j).
 */
static inline __m256i group_pair_pattern(int j) {
    const __m256i base = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    return _mm256_add_epi8(base, _mm256_set1_epi8((char)(4 * j)));
}

/* Broadcast of int16 scale g (0..7) from 8 int16 scales held in both halves. */
static inline __m256i scale_pattern8(int g) { return _mm256_set1_epi16((short)(0x0100 + 0x0202 * g)); }

/* Each byte's bit `from` moved to bit `to` (other bits: garbage to mask off);
 * from, to in 0..7 and compile-time constants once inlined. */
static inline __m256i move_bit(__m256i v, int from, int to) {
    if (from < to) return _mm256_slli_epi16(v, to - from);
    if (from > to) return _mm256_srli_epi16(v, from - to);
    return v;
}

/* int32 partial sums of scale(group) * q[j] * a[j] over a 32-element chunk, q unsigned
 * (q <= 63: pairs within 2 * 63 * 127) */
static inline __m256i chunk_dot(__m256i q, const int8_t *a, __m256i scales16) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, load32(a)), scales16);
}

/* The totals of two vectors of int32 partial sums, converted to float as the
 * reference's (float) casts: lane 0 the sums', lane 2 the mins'. */
static inline __m128 k_totals(__m256i sums, __m256i mins) {
    const __m128i s = fold_i32x8(sums), m = fold_i32x8(mins);
    __m128i t = _mm_add_epi32(_mm_unpacklo_epi64(s, m), _mm_unpackhi_epi64(s, m));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtepi32_ps(t);
}

/* acc = fmaf(fmaf(-dmin, sum_min, d * sum_q), yd, acc), as the reference */
static inline float k_accumulate(float acc, float yd, fp16_t d, fp16_t dmin, __m256i sums, __m256i mins) {
    const __m128 t = k_totals(sums, mins);
    const float scaled = fmaf(-half_to_float(dmin), _mm_cvtss_f32(_mm_movehl_ps(t, t)), half_to_float(d) * _mm_cvtss_f32(t));
    return fmaf(scaled, yd, acc);
}

static float vec_dot_q2_K_q8_K_avx2(int64_t n, const void *w, const void *act) {
    const block_q2_K *x = w;
    const block_q8_K *y = act;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        prefetch_superblock(x + b, sizeof(x[b]));
        const __m128i packed = _mm_loadu_si128((const __m128i *)x[b].scales);
        const __m128i sc = _mm_and_si128(packed, m4);
        const __m256i mins = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4)),
                                               load32(y[b].bsums));
        const __m256i sc_lo = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc));
        const __m256i sc_hi = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_srli_si128(sc, 8)));
        const __m256i q2_lo = load32(x[b].qs), q2_hi = load32(x[b].qs + 32);
        const int8_t *a = y[b].qs;
#define Q2K_CHUNK(q2, h, j)                                                                                   \
    chunk_dot(_mm256_and_si256(_mm256_srli_epi16(q2, 2 * (j)), m3), a + 128 * (h) + 32 * (j),                 \
              _mm256_shuffle_epi8((h) ? sc_hi : sc_lo, group_pair_pattern(j)))
        const __m256i s0 = _mm256_add_epi32(Q2K_CHUNK(q2_lo, 0, 0), Q2K_CHUNK(q2_lo, 0, 1));
        const __m256i s1 = _mm256_add_epi32(Q2K_CHUNK(q2_lo, 0, 2), Q2K_CHUNK(q2_lo, 0, 3));
        const __m256i s2 = _mm256_add_epi32(Q2K_CHUNK(q2_hi, 1, 0), Q2K_CHUNK(q2_hi, 1, 1));
        const __m256i s3 = _mm256_add_epi32(Q2K_CHUNK(q2_hi, 1, 2), Q2K_CHUNK(q2_hi, 1, 3));
#undef Q2K_CHUNK
        const __m256i sums = _mm256_add_epi32(_mm256_add_epi32(s0, s1), _mm256_add_epi32(s2, s3));
        acc = k_accumulate(acc, y[b].d, x[b].d, x[b].dmin, sums, mins);
    }
    return acc;
}

/* The 16 signed Q3_K scales, in group order (as q3_K_scales). */
static inline __m128i q3_K_scales_vec(const uint8_t packed[12]) {
    uint32_t aux[3];
    memcpy(aux, packed, 12);
    const uint32_t k2 = 0x03030303u, k4 = 0x0F0F0F0Fu;
    const uint32_t s0 = (aux[0] & k4) | (((aux[2] >> 0) & k2) << 4);
    const uint32_t s1 = (aux[1] & k4) | (((aux[2] >> 2) & k2) << 4);
    const uint32_t s2 = ((aux[0] >> 4) & k4) | (((aux[2] >> 4) & k2) << 4);
    const uint32_t s3 = ((aux[1] >> 4) & k4) | (((aux[2] >> 6) & k2) << 4);
    const __m128i v = _mm_set_epi64x((long long)((uint64_t)s3 << 32 | s2), (long long)((uint64_t)s1 << 32 | s0));
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

static float vec_dot_q3_K_q8_K_avx2(int64_t n, const void *w, const void *act) {
    const block_q3_K *x = w;
    const block_q8_K *y = act;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i m4 = _mm256_set1_epi8(4);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        prefetch_superblock(x + b, sizeof(x[b]));
        const __m128i sc8 = q3_K_scales_vec(x[b].scales);
        /* q = low - 4 * !high = (low | 4 * high) - 4: the unsigned part here,
         * 4 * sum of scale * group sum of a (bsums) taken off at the end */
        const __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), load32(y[b].bsums));
        const __m256i sc_lo = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc8));
        const __m256i sc_hi = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(sc8, 8)));
        const __m256i hm = load32(x[b].hmask);  /* chunk k: bit k of hmask[l], wanted at bit 2 */
        const __m256i q2_lo = load32(x[b].qs), q2_hi = load32(x[b].qs + 32);
        const int8_t *a = y[b].qs;
#define Q3K_CHUNK(q2, h, j)                                                                                   \
    chunk_dot(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q2, 2 * (j)), m3),                           \
                              _mm256_and_si256(move_bit(hm, 4 * (h) + (j), 2), m4)),                          \
              a + 128 * (h) + 32 * (j), _mm256_shuffle_epi8((h) ? sc_hi : sc_lo, group_pair_pattern(j)))
        const __m256i s0 = _mm256_add_epi32(Q3K_CHUNK(q2_lo, 0, 0), Q3K_CHUNK(q2_lo, 0, 1));
        const __m256i s1 = _mm256_add_epi32(Q3K_CHUNK(q2_lo, 0, 2), Q3K_CHUNK(q2_lo, 0, 3));
        const __m256i s2 = _mm256_add_epi32(Q3K_CHUNK(q2_hi, 1, 0), Q3K_CHUNK(q2_hi, 1, 1));
        const __m256i s3 = _mm256_add_epi32(Q3K_CHUNK(q2_hi, 1, 2), Q3K_CHUNK(q2_hi, 1, 3));
#undef Q3K_CHUNK
        const __m256i sums = _mm256_sub_epi32(_mm256_add_epi32(_mm256_add_epi32(s0, s1), _mm256_add_epi32(s2, s3)),
                                              _mm256_slli_epi32(corr, 2));
        acc = fmaf(half_to_float(x[b].d) * (float)hsum_i32x8(sums), y[b].d, acc);
    }
    return acc;
}

/* The 8 six-bit scales (bytes 0..7) and mins (bytes 8..15) of Q4_K / Q5_K (as scale_min_k4). */
static inline __m128i k4_scales_mins(const uint8_t packed[12]) {
    uint32_t u[3];
    memcpy(u, packed, 12);
    const uint32_t k1 = 0x3F3F3F3Fu, k2 = 0x0F0F0F0Fu, k3 = 0x03030303u;
    const uint32_t sc_lo = u[0] & k1;
    const uint32_t sc_hi = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    const uint32_t mins_lo = u[1] & k1;
    const uint32_t mins_hi = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    return _mm_set_epi64x((long long)((uint64_t)mins_hi << 32 | mins_lo),
                          (long long)((uint64_t)sc_hi << 32 | sc_lo));
}

/* int32 partial sums of min_g * (bsums[2g] + bsums[2g + 1]) */
static inline __m256i k4_mins_product(__m128i scales_mins, const block_q8_K *y) {
    const __m128i mins = _mm_srli_si128(scales_mins, 8);
    return _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins)), load32(y->bsums));
}

/* 64-element chunk c of a Q4_K superblock (groups 2c and 2c + 1): its nibbles and their int16 scales */
typedef struct {
    __m256i lo, hi, scale_lo, scale_hi;
} q4_K_chunk;

static inline q4_K_chunk q4_K_unpack_chunk(const block_q4_K *x, __m256i scales, int c) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), packed = load32(x->qs + 32 * c);
    q4_K_chunk u;
    u.lo = _mm256_and_si256(packed, m4);
    u.hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), m4);
    u.scale_lo = _mm256_shuffle_epi8(scales, scale_pattern8(2 * c));
    u.scale_hi = _mm256_shuffle_epi8(scales, scale_pattern8(2 * c + 1));
    return u;
}

/* int32 partial sums of scale * q * a over the chunk, a its 64 activations */
static inline __m256i q4_K_chunk_dot(const q4_K_chunk *u, const int8_t *a) {
    return _mm256_add_epi32(chunk_dot(u->lo, a, u->scale_lo), chunk_dot(u->hi, a + 32, u->scale_hi));
}

/* The generic order: per 64-element chunk, acc = fmaf(sum, d * yd, acc) and mins = fmaf(min term, dmin * yd, mins).
 * A superblock's four chunk sums come from one transpose (totals4), its four min terms from one hadd, and
 * each chunk's two chain steps are lanes 0 and 1 of one FMA. */
static float vec_dot_q4_K_q8_K_avx2(int64_t n, const void *w, const void *act) {
    const block_q4_K *x = w;
    const block_q8_K *y = act;
    __m128 chains = _mm_setzero_ps();  /* lane 0: acc, lane 1: mins */
    for (int64_t b = 0; b < n / QK_K; ++b) {
        prefetch_superblock(x + b, sizeof(x[b]));
        const __m128i scales_mins = k4_scales_mins(x[b].scales);
        const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scales_mins));
        const int8_t *a = y[b].qs;
        __m256i dots[4];
#pragma GCC unroll 4  /* dots in registers: left rolled, GCC keeps them on the stack (20% slower) */
        for (int c = 0; c < 4; ++c) {
            const q4_K_chunk u = q4_K_unpack_chunk(&x[b], scales, c);
            dots[c] = q4_K_chunk_dot(&u, a + 64 * c);
        }
        const __m128 sums = _mm_cvtepi32_ps(totals4(dots[0], dots[1], dots[2], dots[3]));
        /* chunk c's min term is group lanes 2c + 2c+1: paired by hadd, the two halves' pairs gathered */
        const __m256i pairs = _mm256_hadd_epi32(k4_mins_product(scales_mins, &y[b]), _mm256_setzero_si256());
        const __m128 mins = _mm_cvtepi32_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(pairs, 0x08)));
        const __m128 lo = _mm_unpacklo_ps(sums, mins), hi = _mm_unpackhi_ps(sums, mins);  /* [s0 m0 s1 m1] [s2 m2 s3 m3] */
        const float yd = y[b].d;
        const __m128 scale = _mm_setr_ps(half_to_float(x[b].d) * yd, half_to_float(x[b].dmin) * yd, 0.0f, 0.0f);
        chains = _mm_fmadd_ps(lo, scale, chains);
        chains = _mm_fmadd_ps(_mm_movehl_ps(lo, lo), scale, chains);
        chains = _mm_fmadd_ps(hi, scale, chains);
        chains = _mm_fmadd_ps(_mm_movehl_ps(hi, hi), scale, chains);
    }
    return _mm_cvtss_f32(chains) - _mm_cvtss_f32(_mm_movehdup_ps(chains));
}

/* Q4_K over four (or eight) activation rows: each superblock's nibbles and scales unpacked once; per
 * 64-element chunk a group's four exact sums in one vector (totals4), so each chain step is one vector FMA
 * whose lane r is row r's fmaf. */
static inline __attribute__((always_inline)) void rows_q4_K(int64_t n, const void *w, const act_rows *groups,
                                                            float *out, const int n_groups) {
    const block_q4_K *x = w;
    __m128 acc[2] = {_mm_setzero_ps(), _mm_setzero_ps()}, mins[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t b = 0; b < n / QK_K; ++b) {
        if (n_groups == 1) prefetch_superblock(x + b, sizeof(x[b]));  /* a decode batch: weights from memory */
        const __m128i scales_mins = k4_scales_mins(x[b].scales);
        const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scales_mins));
        const __m128 d = _mm_set1_ps(half_to_float(x[b].d)), dmin = _mm_set1_ps(half_to_float(x[b].dmin));
        const block_q8_K *y[2][VEC_DOT_MAX_ROWS];
        __m256i min01[2], min23[2];
        __m128 scale[2], scale_min[2];
#pragma GCC unroll 2
        for (int g = 0; g < n_groups; ++g) {
            for (int r = 0; r < VEC_DOT_MAX_ROWS; ++r) y[g][r] = (const block_q8_K *)groups[g].rows[r] + b;
            /* group g's min term of rows 0..3, paired per chunk: lane 2c / 2c + 1 of each 128-bit half */
            min01[g] = _mm256_hadd_epi32(k4_mins_product(scales_mins, y[g][0]), k4_mins_product(scales_mins, y[g][1]));
            min23[g] = _mm256_hadd_epi32(k4_mins_product(scales_mins, y[g][2]), k4_mins_product(scales_mins, y[g][3]));
            const __m128 d_act = _mm_setr_ps(y[g][0]->d, y[g][1]->d, y[g][2]->d, y[g][3]->d);
            scale[g] = _mm_mul_ps(d, d_act);
            scale_min[g] = _mm_mul_ps(dmin, d_act);
        }
        for (int c = 0; c < 4; ++c) {
            const q4_K_chunk u = q4_K_unpack_chunk(&x[b], scales, c);
#pragma GCC unroll 2
            for (int g = 0; g < n_groups; ++g) {
                const __m128i sums = totals4(q4_K_chunk_dot(&u, y[g][0]->qs + 64 * c), q4_K_chunk_dot(&u, y[g][1]->qs + 64 * c),
                                             q4_K_chunk_dot(&u, y[g][2]->qs + 64 * c), q4_K_chunk_dot(&u, y[g][3]->qs + 64 * c));
                /* [row0, row1] of chunk c from min01, [row2, row3] from min23: lanes c % 2 and c % 2 + 2 of half c / 2 */
                const __m128i half01 = c < 2 ? _mm256_castsi256_si128(min01[g]) : _mm256_extracti128_si256(min01[g], 1);
                const __m128i half23 = c < 2 ? _mm256_castsi256_si128(min23[g]) : _mm256_extracti128_si256(min23[g], 1);
                const __m128 min_sums = c % 2 == 0
                    ? _mm_shuffle_ps(_mm_castsi128_ps(half01), _mm_castsi128_ps(half23), _MM_SHUFFLE(2, 0, 2, 0))
                    : _mm_shuffle_ps(_mm_castsi128_ps(half01), _mm_castsi128_ps(half23), _MM_SHUFFLE(3, 1, 3, 1));
                acc[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(sums), scale[g], acc[g]);
                mins[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_castps_si128(min_sums)), scale_min[g], mins[g]);
            }
        }
    }
    const __m128 results[2] = {_mm_sub_ps(acc[0], mins[0]), _mm_sub_ps(acc[1], mins[1])};
    store_groups(out, results, n_groups);
}

ROWS_KERNELS(q4_K, rows_q4_K)

static float vec_dot_q5_K_q8_K_avx2(int64_t n, const void *w, const void *act) {
    const block_q5_K *x = w;
    const block_q8_K *y = act;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        prefetch_superblock(x + b, sizeof(x[b]));
        const __m128i scales_mins = k4_scales_mins(x[b].scales);
        const __m256i mins = k4_mins_product(scales_mins, &y[b]);
        const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scales_mins));
        const __m256i qh = load32(x[b].qh);
        const int8_t *a = y[b].qs;
        /* chunk c: low nibbles take bit 2c of qh, high nibbles bit 2c + 1 */
#define Q5K_CHUNK(c)                                                                                          \
    _mm256_add_epi32(                                                                                         \
        chunk_dot(_mm256_or_si256(_mm256_and_si256(load32(x[b].qs + 32 * (c)), m4),                           \
                                  _mm256_and_si256(move_bit(qh, 2 * (c), 4), bit4)),                          \
                  a + 64 * (c), _mm256_shuffle_epi8(scales, scale_pattern8(2 * (c)))),                        \
        chunk_dot(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(load32(x[b].qs + 32 * (c)), 4), m4),     \
                                  _mm256_and_si256(move_bit(qh, 2 * (c) + 1, 4), bit4)),                      \
                  a + 64 * (c) + 32, _mm256_shuffle_epi8(scales, scale_pattern8(2 * (c) + 1))))
        const __m256i sums = _mm256_add_epi32(_mm256_add_epi32(Q5K_CHUNK(0), Q5K_CHUNK(1)),
                                              _mm256_add_epi32(Q5K_CHUNK(2), Q5K_CHUNK(3)));
#undef Q5K_CHUNK
        acc = k_accumulate(acc, y[b].d, x[b].d, x[b].dmin, sums, mins);
    }
    return acc;
}

/* 128 elements of a Q6_K superblock (half h) unpacked: four 32-element chunks of unsigned q (0..63)
 * and the int16 scales each chunk's two groups take. */
typedef struct {
    __m256i q[4], scales[4];
} q6_K_unpacked;

static inline q6_K_unpacked q6_K_unpack_half(const uint8_t *ql, const uint8_t *qh, __m256i scales) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m2 = _mm256_set1_epi8(0x30);
    const __m256i ql0 = load32(ql), ql1 = load32(ql + 32), h = load32(qh);
    q6_K_unpacked u;
    /* two high bits of chunk j: bits 2j, 2j + 1 of qh[l], moved to bits 4, 5 */
    u.q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m2));
    u.q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m2));
    u.q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(h, m2));
    u.q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(h, 2), m2));
    for (int j = 0; j < 4; ++j) u.scales[j] = _mm256_shuffle_epi8(scales, group_pair_pattern(j));
    return u;
}

/* int32 partial sums of scale * q * a over an unpacked half */
static inline __m256i q6_K_half_dot(const q6_K_unpacked *u, const int8_t *a) {
    const __m256i p0 = chunk_dot(u->q[0], a, u->scales[0]), p1 = chunk_dot(u->q[1], a + 32, u->scales[1]);
    const __m256i p2 = chunk_dot(u->q[2], a + 64, u->scales[2]), p3 = chunk_dot(u->q[3], a + 96, u->scales[3]);
    return _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3));
}

static inline __m256i q6_K_half(const uint8_t *ql, const uint8_t *qh, const int8_t *a, __m256i scales) {
    const q6_K_unpacked u = q6_K_unpack_half(ql, qh, scales);
    return q6_K_half_dot(&u, a);
}

static float vec_dot_q6_K_q8_K_avx2(int64_t n, const void *w, const void *act) {
    const block_q6_K *x = w;
    const block_q8_K *y = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        prefetch_superblock(x + b, sizeof(x[b]));
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[b].scales);
        /* q - 32: the unsigned q here, 32 * sum of scale * group sum of a (bsums) taken off at the end */
        const __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), load32(y[b].bsums));
        const __m256i sc_lo = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc8));
        const __m256i sc_hi = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(sc8, 8)));
        const __m256i s0 = q6_K_half(x[b].ql, x[b].qh, y[b].qs, sc_lo);
        const __m256i s1 = q6_K_half(x[b].ql + 64, x[b].qh + 32, y[b].qs + 128, sc_hi);
        const __m256i sums = _mm256_sub_epi32(_mm256_add_epi32(s0, s1), _mm256_slli_epi32(corr, 5));
        acc = fmaf(half_to_float(x[b].d) * (float)hsum_i32x8(sums), y[b].d, acc);
    }
    return acc;
}

/* Q6_K over four activation rows: each superblock unpacked once, the four rows' exact sums in one vector. */
static inline __attribute__((always_inline)) void rows_q6_K(int64_t n, const void *w, const act_rows *groups,
                                                            float *out, const int n_groups) {
    const block_q6_K *x = w;
    __m128 acc[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t b = 0; b < n / QK_K; ++b) {
        if (n_groups == 1) prefetch_superblock(x + b, sizeof(x[b]));  /* a decode batch: weights from memory */
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[b].scales);
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        const q6_K_unpacked lo = q6_K_unpack_half(x[b].ql, x[b].qh, _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc8)));
        const q6_K_unpacked hi = q6_K_unpack_half(x[b].ql + 64, x[b].qh + 32,
                                                  _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(sc8, 8))));
        const __m128 d = _mm_set1_ps(half_to_float(x[b].d));
        for (int g = 0; g < n_groups; ++g) {
            const block_q8_K *y[VEC_DOT_MAX_ROWS];
            __m256i sums[VEC_DOT_MAX_ROWS];
            for (int r = 0; r < VEC_DOT_MAX_ROWS; ++r) {
                y[r] = (const block_q8_K *)groups[g].rows[r] + b;
                const __m256i corr = _mm256_madd_epi16(sc16, load32(y[r]->bsums));
                sums[r] = _mm256_sub_epi32(_mm256_add_epi32(q6_K_half_dot(&lo, y[r]->qs), q6_K_half_dot(&hi, y[r]->qs + 128)),
                                           _mm256_slli_epi32(corr, 5));
            }
            const __m128 scaled = _mm_mul_ps(d, _mm_cvtepi32_ps(totals4(sums[0], sums[1], sums[2], sums[3])));
            acc[g] = _mm_fmadd_ps(scaled, _mm_setr_ps(y[0]->d, y[1]->d, y[2]->d, y[3]->d), acc[g]);
        }
    }
    store_groups(out, acc, n_groups);
}

ROWS_KERNELS(q6_K, rows_q6_K)

/* ------------------------------------------------------------------------ */
/* float weights against activations in the same format: 8 element lanes   */
/* ------------------------------------------------------------------------ */

static inline __m256 load8_f32(const void *w, int64_t i) { return _mm256_loadu_ps((const float *)w + i); }
static inline __m256 load8_f16(const void *w, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const fp16_t *)w + i)));
}
static inline __m256 load8_bf16(const void *w, int64_t i) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const bf16_t *)w + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}

#define LOAD1_F32(w, i) (((const float *)(w))[i])
#define LOAD1_F16(w, i) fp16_to_fp32(((const fp16_t *)(w))[i])
#define LOAD1_BF16(w, i) bf16_to_fp32(((const bf16_t *)(w))[i])

#define FLOAT_VEC_DOT_AVX2(name, load8, load1)                                                                \
    static float name(int64_t n, const void *w, const void *act) {                                            \
        __m256 acc = _mm256_setzero_ps();                                                                     \
        const int64_t n8 = n - n % 8;                                                                         \
        for (int64_t i = 0; i < n8; i += 8) acc = _mm256_fmadd_ps(load8(w, i), load8(act, i), acc);          \
        float lanes[8];                                                                                       \
        _mm256_storeu_ps(lanes, acc);                                                                         \
        float sum = reduce_lanes8(lanes);                                                                     \
        for (int64_t i = n8; i < n; ++i) sum = fmaf(load1(w, i), load1(act, i), sum);                         \
        return sum;                                                                                           \
    }

/* ---- the non-matmul inner loops (the generic kernels' operations, 8 lanes at a time) ---- */

static inline __m256 halves_to_floats8(const fp16_t *h) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }

/* The lanes of acc, then the tail elements from i on, reduced as the generic kernel reduces them. */
static inline float attention_finish(__m256 acc, const float *q, const fp16_t *k, int64_t i, int64_t d) {
    if (i == d) return lanes_total(acc);  /* no tail: the same tree in registers */
    float lane[8];
    _mm256_storeu_ps(lane, acc);
    for (; i < d; ++i) lane[i % 8] = fmaf(q[i], half_to_float(k[i]), lane[i % 8]);
    return reduce_lanes8(lane);
}

/* Four keys at a time: four independent FMA chains instead of one waiting on its own latency. */
static void attention_dots_avx2(const float *q, const fp16_t *k, int64_t stride, int64_t n, int64_t d, float *out) {
    const int64_t d8 = d / 8 * 8;
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const fp16_t *k0 = k + j * stride, *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < d8; i += 8) {
            const __m256 qi = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qi, halves_to_floats8(k0 + i), a0);
            a1 = _mm256_fmadd_ps(qi, halves_to_floats8(k1 + i), a1);
            a2 = _mm256_fmadd_ps(qi, halves_to_floats8(k2 + i), a2);
            a3 = _mm256_fmadd_ps(qi, halves_to_floats8(k3 + i), a3);
        }
        out[j] = attention_finish(a0, q, k0, d8, d);
        out[j + 1] = attention_finish(a1, q, k1, d8, d);
        out[j + 2] = attention_finish(a2, q, k2, d8, d);
        out[j + 3] = attention_finish(a3, q, k3, d8, d);
    }
    for (; j < n; ++j) {
        const fp16_t *kj = k + j * stride;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < d8; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), halves_to_floats8(kj + i), acc);
        out[j] = attention_finish(acc, q, kj, d8, d);
    }
}

/* exp_ggml (vec_dot_generic.c) on 8 lanes: the same operations, so the same bits. */
static inline __m256 exp_ggml8(__m256 x) {
    const __m256 shifter = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shifter);
    const __m256 n = _mm256_sub_ps(z, shifter);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
    const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    const __m256 normal = _mm256_fmadd_ps(k, j, k);
    if (!_mm256_movemask_ps(big)) return normal;
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 scaled = _mm256_blendv_ps(normal, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1), big);
    return _mm256_blendv_ps(scaled, _mm256_mul_ps(s1, s1), huge);
}

static inline float hsum8(__m256 v) {
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    return reduce_lanes8(lanes);
}

static void softmax_half_avx2(float *s, int64_t n, float max) {
    const __m256 vmax = _mm256_set1_ps(max), masked_score = _mm256_set1_ps(-INFINITY);
    double sum = 0.0;
    for (int64_t g = 0; g < n; g += 8) {
        /* a last partial group goes through a copy padded with masked scores */
        float pad[8];
        const int64_t len = n - g < 8 ? n - g : 8;
        float *group = s + g;
        if (len < 8) {
            for (int64_t l = 0; l < 8; ++l) pad[l] = l < len ? s[g + l] : -INFINITY;
            group = pad;
        }
        const __m256 x = _mm256_loadu_ps(group);
        const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(x, masked_score, _CMP_EQ_OQ),
                                          exp_ggml8(_mm256_sub_ps(x, vmax)));
        _mm256_storeu_ps(group, e);
        if (len < 8) for (int64_t l = 0; l < len; ++l) s[g + l] = pad[l];
        sum += (double)hsum8(e);
    }
    const __m256 inv = _mm256_set1_ps((float)(1.0 / sum));
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const __m128i half = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(s + t), inv), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(s + t, _mm256_cvtph_ps(half));
    }
    for (; t < n; ++t) s[t] = _cvtsh_ss(_cvtss_sh(s[t] * _mm256_cvtss_f32(inv), _MM_FROUND_TO_NEAREST_INT));
}

/* 8 output dims at a time, the 8 slot lanes in registers across all the values. */
/* Lane l of weighted_sum over c vectors (8 dims each) of the values from dim i: the chain of keys
 * t = l, l + 8, ... (each key's 16 * c bytes read once; whole cache lines at c = 8, unrolled by hand so the
 * eight chains stay in registers). */
static void weighted_lane(const float *p, const fp16_t *v, int64_t stride, int64_t n, int64_t i, int c, int l,
                          float *lane) {
    __m256 acc[8];
    for (int j = 0; j < c; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t t = l; t < n; t += 8) {
        if (p[t] == 0.0f) continue;
        const __m256 weight = _mm256_set1_ps(p[t]);
        const fp16_t *row = v + t * stride + i;
        for (int j = 0; j < c; ++j) acc[j] = _mm256_fmadd_ps(weight, halves_to_floats8(row + 8 * j), acc[j]);
    }
    for (int j = 0; j < c; ++j) _mm256_storeu_ps(lane + 8 * j, acc[j]);
}

static void weighted_lane64(const float *p, const fp16_t *v, int64_t stride, int64_t n, int64_t i, int l, float *lane) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int64_t t = l; t < n; t += 8) {
        if (p[t] == 0.0f) continue;
        const __m256 weight = _mm256_set1_ps(p[t]);
        const fp16_t *row = v + t * stride + i;
        a0 = _mm256_fmadd_ps(weight, halves_to_floats8(row), a0);
        a1 = _mm256_fmadd_ps(weight, halves_to_floats8(row + 8), a1);
        a2 = _mm256_fmadd_ps(weight, halves_to_floats8(row + 16), a2);
        a3 = _mm256_fmadd_ps(weight, halves_to_floats8(row + 24), a3);
        a4 = _mm256_fmadd_ps(weight, halves_to_floats8(row + 32), a4);
        a5 = _mm256_fmadd_ps(weight, halves_to_floats8(row + 40), a5);
        a6 = _mm256_fmadd_ps(weight, halves_to_floats8(row + 48), a6);
        a7 = _mm256_fmadd_ps(weight, halves_to_floats8(row + 56), a7);
    }
    _mm256_storeu_ps(lane, a0), _mm256_storeu_ps(lane + 8, a1), _mm256_storeu_ps(lane + 16, a2);
    _mm256_storeu_ps(lane + 24, a3), _mm256_storeu_ps(lane + 32, a4), _mm256_storeu_ps(lane + 40, a5);
    _mm256_storeu_ps(lane + 48, a6), _mm256_storeu_ps(lane + 56, a7);
}

static void weighted_sum_avx2(const float *p, const fp16_t *v, int64_t stride, int64_t n, int64_t d, float *out) {
    float lanes[8][64];
    int64_t i = 0;
    while (i + 8 <= d) {
        const int c = d - i >= 64 ? 8 : (int)((d - i) / 8);
        for (int l = 0; l < 8; ++l) {
            if (c == 8) weighted_lane64(p, v, stride, n, i, l, lanes[l]);
            else weighted_lane(p, v, stride, n, i, c, l, lanes[l]);
        }
        for (int j = 0; j < 8 * c; j += 8) {  /* reduce_lanes8's tree */
#define LANE(l) _mm256_loadu_ps(lanes[l] + j)
            const __m256 total = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(LANE(0), LANE(4)), _mm256_add_ps(LANE(2), LANE(6))),
                                               _mm256_add_ps(_mm256_add_ps(LANE(1), LANE(5)), _mm256_add_ps(LANE(3), LANE(7))));
#undef LANE
            _mm256_storeu_ps(out + i + j, total);
        }
        i += 8 * c;
    }
    for (; i < d; ++i) {
        float lane[8] = {0};
        for (int64_t t = 0; t < n; ++t) {
            if (p[t] != 0.0f) lane[t % 8] = fmaf(p[t], half_to_float(v[t * stride + i]), lane[t % 8]);
        }
        out[i] = reduce_lanes8(lane);
    }
}

static void swiglu_avx2(const float *g, const float *u, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f),
                                                           exp_ggml8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; ++i) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* ---- activation quantizers (the scalar ones' values: max |x| skips NaN, round half to even, clamp) ---- */

static inline float max_abs(const float *x, int64_t n) {
    __m256 amax = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j += 8) {  /* max_ps returns its second operand, amax, when |x| is NaN */
        amax = _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + j)), amax);
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* round(x * scale) clamped to [-127, 127], NaN -> -127 (max_ps returns -127 for a NaN first operand) */
static inline __m256i quantize8(const float *x, __m256 scale) {
    const __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x), scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f)));
}

/* 4 x 8 int32 in [-127, 127] -> 32 int8 in order */
static inline void store_i8x32(int8_t *dst, __m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    _mm256_storeu_si256((__m256i *)dst, _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* One q8_0 / q8_1 block: the quants, their sum, and the unrounded d. */
static inline float quantize_block32(const float *x, int8_t *qs, int32_t *sum) {
    const float amax = max_abs(x, QK32);
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    const __m256i a = quantize8(x, id), b = quantize8(x + 8, id), c = quantize8(x + 16, id), d = quantize8(x + 24, id);
    store_i8x32(qs, a, b, c, d);
    *sum = hsum_i32x8(_mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d)));
    return amax / 127.0f;
}

static void quantize_q8_0_avx2(const float *x, void *dst, int64_t n) {
    block_q8_0 *y = dst;
    int32_t sum;
    for (int64_t b = 0; b < n / QK32; ++b) y[b].d = fp32_to_fp16(quantize_block32(x + b * QK32, y[b].qs, &sum));
}

static void quantize_q8_1_avx2(const float *x, void *dst, int64_t n) {
    block_q8_1 *y = dst;
    for (int64_t b = 0; b < n / QK32; ++b) {
        int32_t sum;
        const float d = quantize_block32(x + b * QK32, y[b].qs, &sum);
        y[b].d = fp32_to_fp16(d);
        y[b].s = fp32_to_fp16(d * (float)sum);
    }
}

/* q8_K: the first element of largest |x| maps to -127 */
static void quantize_q8_K_avx2(const float *x, void *dst, int64_t n) {
    block_q8_K *y = dst;
    for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
        const __m256 amax = _mm256_set1_ps(max_abs(x, QK_K));
        float max = 0.0f;
        for (int j = 0; j < QK_K; j += 8) {
            const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + j)), amax, _CMP_EQ_OQ));
            if (hits != 0) {
                max = x[j + __builtin_ctz((unsigned)hits)];
                break;
            }
        }
        if (max == 0.0f) {
            memset(&y[b], 0, sizeof(y[b]));
            continue;
        }
        const float iscale = -127.0f / max;
        const __m256 scale = _mm256_set1_ps(iscale);
        for (int j = 0; j < QK_K; j += 32) {
            const __m256i q0 = quantize8(x + j, scale), q1 = quantize8(x + j + 8, scale);
            const __m256i q2 = quantize8(x + j + 16, scale), q3 = quantize8(x + j + 24, scale);
            store_i8x32(y[b].qs + j, q0, q1, q2, q3);
            y[b].bsums[j / 16] = (int16_t)hsum_i32x8(_mm256_add_epi32(q0, q1));
            y[b].bsums[j / 16 + 1] = (int16_t)hsum_i32x8(_mm256_add_epi32(q2, q3));
        }
        y[b].d = 1.0f / iscale;
    }
}

/* The table entries of 8 halves: 4-byte gathers at 2-byte steps (the table has an entry to spare), the low
 * halves packed, then widened to floats. */
static void geglu_avx2(const fp16_t *gelu_table, const float *g, const float *u, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gate = _mm256_loadu_ps(g + i), up = _mm256_loadu_ps(u + i);
        const __m256i index = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(gate, _MM_FROUND_TO_NEAREST_INT));
        const __m256i pairs = _mm256_i32gather_epi32((const int *)gelu_table, index, 2);
        const __m256i low = _mm256_and_si256(pairs, _mm256_set1_epi32(0xFFFF));
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(low, low), _MM_SHUFFLE(3, 1, 2, 0));
        const __m256 gelu = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
        __m256 out = _mm256_mul_ps(gelu, up);
        out = _mm256_blendv_ps(out, _mm256_mul_ps(gate, up), _mm256_cmp_ps(gate, _mm256_set1_ps(10.0f), _CMP_GE_OQ));
        out = _mm256_andnot_ps(_mm256_cmp_ps(gate, _mm256_set1_ps(-10.0f), _CMP_LE_OQ), out);
        _mm256_storeu_ps(y + i, out);
    }
    for (; i < n; ++i) {
        if (g[i] <= -10.0f) y[i] = 0.0f;
        else if (g[i] >= 10.0f) y[i] = g[i] * u[i];
        else y[i] = half_to_float(gelu_table[fp32_to_fp16(g[i])]) * u[i];
    }
}

static void to_half_avx2(const float *x, fp16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

FLOAT_VEC_DOT_AVX2(vec_dot_f32_f32_avx2, load8_f32, LOAD1_F32)
FLOAT_VEC_DOT_AVX2(vec_dot_f16_f16_avx2, load8_f16, LOAD1_F16)
FLOAT_VEC_DOT_AVX2(vec_dot_bf16_bf16_avx2, load8_bf16, LOAD1_BF16)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const vec_dot_fn vec_dot_table_avx2[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_F32] = vec_dot_f32_f32_avx2,   [PYLLM_TYPE_F16] = vec_dot_f16_f16_avx2,
    [PYLLM_TYPE_BF16] = vec_dot_bf16_bf16_avx2, [PYLLM_TYPE_Q4_0] = vec_dot_q4_0_q8_0_avx2,
    [PYLLM_TYPE_Q4_0_LANES] = vec_dot_q4_0_lanes_q8_0_avx2,
    [PYLLM_TYPE_Q4_1] = vec_dot_q4_1_q8_1_avx2, [PYLLM_TYPE_Q5_0] = vec_dot_q5_0_q8_0_avx2,
    [PYLLM_TYPE_Q5_0_G8] = vec_dot_q5_0_g8_q8_0_avx2,
    [PYLLM_TYPE_Q5_1] = vec_dot_q5_1_q8_1_avx2, [PYLLM_TYPE_Q8_0] = vec_dot_q8_0_q8_0_avx2,
    [PYLLM_TYPE_Q2_K] = vec_dot_q2_K_q8_K_avx2, [PYLLM_TYPE_Q3_K] = vec_dot_q3_K_q8_K_avx2,
    [PYLLM_TYPE_Q4_K] = vec_dot_q4_K_q8_K_avx2, [PYLLM_TYPE_Q5_K] = vec_dot_q5_K_q8_K_avx2,
    [PYLLM_TYPE_Q6_K] = vec_dot_q6_K_q8_K_avx2,
};

const op_kernels op_kernels_avx2 = {attention_dots_avx2, softmax_half_avx2, weighted_sum_avx2, swiglu_avx2,
                                     quantize_q8_0_avx2, quantize_q8_1_avx2, quantize_q8_K_avx2, geglu_avx2,
                                     to_half_avx2};

/* The types with multi-row kernels: each has both the one-group (rows) and the two-group (rows8) entry point. */
#define ROWS_TABLE(kind)                                                                                      \
    {                                                                                                         \
        [PYLLM_TYPE_Q4_0] = vec_dot_##kind##_q4_0_avx2, [PYLLM_TYPE_Q4_0_LANES] = vec_dot_##kind##_q4_0_lanes_avx2, \
        [PYLLM_TYPE_Q4_1] = vec_dot_##kind##_q4_1_avx2, [PYLLM_TYPE_Q5_0] = vec_dot_##kind##_q5_0_avx2,       \
        [PYLLM_TYPE_Q5_0_G8] = vec_dot_##kind##_q5_0_g8_avx2,                                                 \
        [PYLLM_TYPE_Q5_1] = vec_dot_##kind##_q5_1_avx2, [PYLLM_TYPE_Q8_0] = vec_dot_##kind##_q8_0_avx2,       \
        [PYLLM_TYPE_Q4_K] = vec_dot_##kind##_q4_K_avx2, [PYLLM_TYPE_Q6_K] = vec_dot_##kind##_q6_K_avx2,       \
    }

const vec_dot_rows_fn vec_dot_rows_table_avx2[PYLLM_TYPE_COUNT] = ROWS_TABLE(rows);
const vec_dot_rows_fn vec_dot_rows8_table_avx2[PYLLM_TYPE_COUNT] = ROWS_TABLE(rows8);
const vec_dot_row_fn vec_dot_row_table_avx2[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_Q4_0] = vec_dot_row_q4_0_avx2, [PYLLM_TYPE_Q5_0] = vec_dot_row_q5_0_avx2,
    [PYLLM_TYPE_Q5_0_G8] = vec_dot_row_q5_0_g8_avx2, [PYLLM_TYPE_Q8_0] = vec_dot_row_q8_0_avx2,
};

#else /* not x86-64 with GCC or clang: no kernels of this tier */

const vec_dot_fn vec_dot_table_avx2[PYLLM_TYPE_COUNT] = {0};
const op_kernels op_kernels_avx2 = {0};
const vec_dot_rows_fn vec_dot_rows_table_avx2[PYLLM_TYPE_COUNT] = {0};
const vec_dot_rows_fn vec_dot_rows8_table_avx2[PYLLM_TYPE_COUNT] = {0};
const vec_dot_row_fn vec_dot_row_table_avx2[PYLLM_TYPE_COUNT] = {0};

#endif
