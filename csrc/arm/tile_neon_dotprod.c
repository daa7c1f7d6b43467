/*
 * tile_neon_dotprod.c - the neon_dotprod tile kernel of Q4_K_X16 (backend/kernel_set.h: tile_kernel_fn): a 16-row
 * Q4_K tile (formats/blocks.h: tile_q4_K) against one to four q8_K activation rows.
 *
 * The tile keeps row r of a half in 32-bit lane r of each 32-byte unit, so a 128-bit load holds one 4-byte unit of
 * four weight rows (a quarter of the tile): one sdot by lane (vdotq_laneq_s32) meets it with 4 activation bytes
 * taken from a 16-byte activation vector and advances all four rows, each lane an exact 4-element sum. A chunk's two
 * groups (low nibbles, high nibbles) each take 8 units into one int32 vector a quarter, so the weight rows never
 * need a horizontal sum, and the scales are unpacked once a superblock for 4 rows at a time, by vector ops.
 *
 * Each output keeps vec_dot_generic.c's Q4_K steps: exact int32 sums per 64-element chunk (sc * group sum, twice;
 * m * the activation's group sums, twice), then sum * (d * d_a) and sum_min * (dmin * d_a) chained by fmaf in two
 * accumulators, and subtracted. vfmaq_f32 is fmaf lane by lane; the products d * d_a are single roundings, as the
 * reference's.
 *
 * Built without global -march flags: the kernel gets its target by pragma and runs only where backends_arm.c has seen
 * FEAT_DotProd (vec_dot_neon_dotprod.c says why the clang version matters).
 */
#include "arm/arm.h"

#if defined(__aarch64__) && (!defined(__clang__) || __clang_major__ >= 16 || defined(__ARM_FEATURE_DOTPROD))

#include <arm_neon.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif

#define KERNEL_INLINE static inline __attribute__((always_inline))
#define MAX_ROWS 4
#define QUARTERS 4  /* 4 weight rows a quarter: rows 4q .. 4q + 3 (half q / 2, lanes 4 (q % 2) ..) */

/* One quarter's scales of a superblock, in the order the chunks read them: chunk c's 6-bit scale of group 2c, of
 * group 2c + 1, then the two groups' mins, each an int32 a row. */
typedef struct {
    int32x4_t s[4][4];  /* [c][0: scale 2c, 1: scale 2c + 1, 2: min 2c, 3: min 2c + 1] */
} quarter_scales;

/* Byte j (0..3) of every 32-bit lane as the lane's int32 (shifts and a mask: GCC reloads a table's index vectors
 * from memory at every use). */
KERNEL_INLINE int32x4_t lane_byte(uint32x4_t v, const int j) {
    const uint32x4_t byte = vdupq_n_u32(0xFF);
    switch (j) {
    case 0: return vreinterpretq_s32_u32(vandq_u32(v, byte));
    case 1: return vreinterpretq_s32_u32(vandq_u32(vshrq_n_u32(v, 8), byte));
    case 2: return vreinterpretq_s32_u32(vandq_u32(vshrq_n_u32(v, 16), byte));
    default: return vreinterpretq_s32_u32(vshrq_n_u32(v, 24));
    }
}

/* scale_min_k4 for four rows at once: the 12 scale bytes of row r are the 32-bit lanes r of w[0], w[1], w[2]. */
KERNEL_INLINE void unpack_quarter_scales(const tile_q4_K *x, int q, quarter_scales *s) {
    const int h = q / 2, first = 4 * (q % 2);
    const uint32x4_t w0 = vld1q_u32(x->scales[h][0] + first), w1 = vld1q_u32(x->scales[h][1] + first);
    const uint32x4_t w2 = vld1q_u32(x->scales[h][2] + first);
    const uint32x4_t low6 = vdupq_n_u32(0x3F3F3F3Fu), low4 = vdupq_n_u32(0x0F0F0F0Fu), top2 = vdupq_n_u32(0x30303030u);
    /* groups 0..3: the low 6 bits of bytes 0..3 (scales) and 4..7 (mins); groups 4..7: bytes 8..11's nibbles, their
     * high 2 bits the top bits of bytes 0..3 (scales) and 4..7 (mins) */
    const uint32x4_t scales[2] = {vandq_u32(w0, low6),
                                  vorrq_u32(vandq_u32(w2, low4), vandq_u32(vshrq_n_u32(w0, 2), top2))};
    const uint32x4_t mins[2] = {vandq_u32(w1, low6),
                                vorrq_u32(vandq_u32(vshrq_n_u32(w2, 4), low4), vandq_u32(vshrq_n_u32(w1, 2), top2))};
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
        const int part = c / 2, j = 2 * (c % 2);
        s->s[c][0] = lane_byte(scales[part], j);
        s->s[c][1] = lane_byte(scales[part], j + 1);
        s->s[c][2] = lane_byte(mins[part], j);
        s->s[c][3] = lane_byte(mins[part], j + 1);
    }
}

/* The running sums of the reference's two accumulators, and the superblock's d * d_a and dmin * d_a, a vector for
 * each quarter and activation row. */
typedef struct {
    float32x4_t acc[QUARTERS][MAX_ROWS], mins[QUARTERS][MAX_ROWS];
} tile_sums;

typedef struct {
    float32x4_t d[QUARTERS][MAX_ROWS], dmin[QUARTERS][MAX_ROWS];
} tile_factors;

/* One activation row's superblock: its quants and the sums of its 8 groups of 32 (from bsums). */
typedef struct {
    const int8_t *q;
    int32_t group_sums[8];
} act_superblock;

/* acc + one unit of 4 weight rows (w) . activation bytes 4 lane .. 4 lane + 3 of a, lane by lane: sdot by lane, whose
 * lane must be a constant (written out at each use). */
#define DOT_UNIT(acc, w, a, lane) acc = vdotq_laneq_s32(acc, w, a, lane)

/* Chunk c of quarters q0 .. q0 + n_q - 1 against n_rows rows: each unit's 4 rows of weights loaded once, split into
 * their low and high nibbles, each met by every row's activations; then each quarter's exact int32 sums, scaled by
 * its rows' 6-bit scales and mins, chained into its accumulators. */
KERNEL_INLINE void chunk_rows(const tile_q4_K *x, const quarter_scales *scales, const tile_factors *f, const int q0,
                              const int n_q, const act_superblock *a, const int n_rows, const int c, tile_sums *sums) {
    const uint8x16_t nibble = vdupq_n_u8(0x0F);
    int32x4_t low[QUARTERS][MAX_ROWS], high[QUARTERS][MAX_ROWS];
    int8x16_t a_low[MAX_ROWS][2], a_high[MAX_ROWS][2];
#pragma GCC unroll 4
    for (int r = 0; r < n_rows; ++r) {
        const int8_t *at = a[r].q + 64 * c;
        a_low[r][0] = vld1q_s8(at), a_low[r][1] = vld1q_s8(at + 16);
        a_high[r][0] = vld1q_s8(at + 32), a_high[r][1] = vld1q_s8(at + 48);
    }
#pragma GCC unroll 4
    for (int i = 0; i < n_q; ++i) {
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) low[i][r] = high[i][r] = vdupq_n_s32(0);
    }
#pragma GCC unroll 2
    for (int u = 0; u < 2; ++u) {
#pragma GCC unroll 4
        for (int i = 0; i < n_q; ++i) {
            const int q = q0 + i, h = q / 2, first = 4 * (q % 2);
            uint8x16_t v[4];
#pragma GCC unroll 4
            for (int l = 0; l < 4; ++l) v[l] = vld1q_u8(x->qs[c][h][4 * u + l][first]);
            int8x16_t lo[4], hi[4];
#pragma GCC unroll 4
            for (int l = 0; l < 4; ++l) {
                lo[l] = vreinterpretq_s8_u8(vandq_u8(v[l], nibble));
                hi[l] = vreinterpretq_s8_u8(vshrq_n_u8(v[l], 4));
            }
#pragma GCC unroll 4
            for (int r = 0; r < n_rows; ++r) {
                DOT_UNIT(low[i][r], lo[0], a_low[r][u], 0);
                DOT_UNIT(low[i][r], lo[1], a_low[r][u], 1);
                DOT_UNIT(low[i][r], lo[2], a_low[r][u], 2);
                DOT_UNIT(low[i][r], lo[3], a_low[r][u], 3);
                DOT_UNIT(high[i][r], hi[0], a_high[r][u], 0);
                DOT_UNIT(high[i][r], hi[1], a_high[r][u], 1);
                DOT_UNIT(high[i][r], hi[2], a_high[r][u], 2);
                DOT_UNIT(high[i][r], hi[3], a_high[r][u], 3);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < n_q; ++i) {
        const int32x4_t *s = scales[q0 + i].s[c];
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) {
            const int32x4_t sum = vmlaq_s32(vmulq_s32(low[i][r], s[0]), high[i][r], s[1]);
            const int32x4_t sum_min = vmlaq_n_s32(vmulq_n_s32(s[2], a[r].group_sums[2 * c]), s[3],
                                                  a[r].group_sums[2 * c + 1]);
            float32x4_t *acc = &sums->acc[q0 + i][r], *mins = &sums->mins[q0 + i][r];
            *acc = vfmaq_f32(*acc, vcvtq_f32_s32(sum), f->d[q0 + i][r]);
            *mins = vfmaq_f32(*mins, vcvtq_f32_s32(sum_min), f->dmin[q0 + i][r]);
        }
    }
}

/* The tile against n_rows rows, superblock by superblock, the tile read once, in order. One row takes all four
 * quarters in each chunk (its activations loaded once); two rows two quarters at a time, more rows one (their sums
 * would not fit the registers). */
KERNEL_INLINE void q4_K_tile_rows(int64_t n, const uint8_t *tile, const act_rows *rows, float *out, int64_t stride,
                                  const uint8_t *prefetch, const int next_tile, const int n_rows) {
    tile_sums sums;
#pragma GCC unroll 4
    for (int q = 0; q < QUARTERS; ++q) {
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) sums.acc[q][r] = sums.mins[q][r] = vdupq_n_f32(0.0f);
    }
    const int quarters_at_once = n_rows == 1 ? 4 : n_rows == 2 ? 2 : 1;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const tile_q4_K *x = (const tile_q4_K *)tile + b;
        if (next_tile) {  /* a later pass over a tile in cache: the next tile's superblock into L2 */
            const uint8_t *at = prefetch + b * (int64_t)sizeof(tile_q4_K);
            for (size_t line = 0; line < sizeof(tile_q4_K); line += 64) __builtin_prefetch(at + line, 0, 2);
        }
        act_superblock a[MAX_ROWS];
        tile_factors f;
#pragma GCC unroll 4
        for (int r = 0; r < n_rows; ++r) {
            const block_q8_K *y = (const block_q8_K *)rows[r].rows[0] + b;
            a[r].q = y->qs;
            const int16x8_t pairs = vpaddq_s16(vld1q_s16(y->bsums), vld1q_s16(y->bsums + 8));  /* |sum| <= 4064 */
            vst1q_s32(a[r].group_sums, vmovl_s16(vget_low_s16(pairs)));
            vst1q_s32(a[r].group_sums + 4, vmovl_high_s16(pairs));
        }
        quarter_scales scales[QUARTERS];
#pragma GCC unroll 4
        for (int q = 0; q < QUARTERS; ++q) {
            unpack_quarter_scales(x, q, &scales[q]);
            const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x->d[q / 2] + 4 * (q % 2))));
            const float32x4_t dmin = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x->dmin[q / 2] + 4 * (q % 2))));
#pragma GCC unroll 4
            for (int r = 0; r < n_rows; ++r) {
                const float d_a = ((const block_q8_K *)rows[r].rows[0] + b)->d;
                f.d[q][r] = vmulq_n_f32(d, d_a);
                f.dmin[q][r] = vmulq_n_f32(dmin, d_a);
            }
        }
#pragma GCC unroll 1
        for (int c = 0; c < 4; ++c) {
#pragma GCC unroll 1
            for (int q = 0; q < QUARTERS; q += quarters_at_once) {
                chunk_rows(x, scales, &f, q, quarters_at_once, a, n_rows, c, &sums);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < n_rows; ++r) {
#pragma GCC unroll 4
        for (int q = 0; q < QUARTERS; ++q) vst1q_f32(out + r * stride + 4 * q, vsubq_f32(sums.acc[q][r], sums.mins[q][r]));
    }
}

static void vec_dot_q4_K_x16_q8_K_tile(int64_t n, const void *tile, const act_rows *rows, int n_rows, float *out,
                                       int64_t stride, const uint8_t *prefetch, int next_tile) {
    switch (n_rows) {
    case 4: q4_K_tile_rows(n, tile, rows, out, stride, prefetch, next_tile, 4); break;
    case 3: q4_K_tile_rows(n, tile, rows, out, stride, prefetch, next_tile, 3); break;
    case 2: q4_K_tile_rows(n, tile, rows, out, stride, prefetch, next_tile, 2); break;
    default: q4_K_tile_rows(n, tile, rows, out, stride, prefetch, next_tile, 1);
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const tile_kernel_fn tile_kernel_table_neon_dotprod[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_Q4_K_X16] = vec_dot_q4_K_x16_q8_K_tile,
};

#elif defined(__aarch64__)

const tile_kernel_fn tile_kernel_table_neon_dotprod[PYLLM_TYPE_COUNT] = {0};

#endif
