/*
 * panel_neon_i8mm.c - the panel kernels (backend/kernel_set.h) of the neon_i8mm tier: two weight rows against a panel
 * of 16 activation rows by smmla (vmmlaq_s32, FEAT_I8MM: Armv8.6, optional from Armv8.2; Graviton 3 on, Apple M2 on,
 * Neoverse N2/V1/V2, Cortex-A510/A710/X2 on).
 *
 * smmla multiplies a 2x8 int8 matrix by the transpose of another: C[i][j] += sum_k A[i][k] * B[j][k], four int32 sums
 * [C00, C01, C10, C11] a vector. Here A is two activation rows' 8 elements (16 bytes of the panel in its
 * PANEL_LAYOUT_PAIRS order, formats/kernel_layouts.h) and B the same 8 elements of the two weight rows, so one
 * instruction gives, for rows r, r + 1 and weights w0, w1, the vector [r.w0, r.w1, r+1.w0, r+1.w1]. Every float
 * accumulator below is laid out the same way, and the float steps are the reference's (generic/vec_dot_generic.c) on
 * the same values, in the same order, four outputs a vector:
 *   - Q4_0 (its whole-block order): the block's exact sum is four smmla over 8 elements each, then
 *     acc = fmaf((float)sum, d_w * d_a, acc): 32 multiply-adds an instruction.
 *   - the lane order (Q8_0, Q4_0_LANES, Q5_0, Q5_0_G8, Q4_1, Q5_1): lane l is the exact sum of 4 elements, and
 *     each lane takes its own fmaf, so the weight rows are unpacked with zeros: B = [lane 2h of w0, 0000, lane 2h of
 *     w1, 0000] gives lane 2h, [0000, lane 2h + 1 of ...] lane 2h + 1. Half of each smmla multiplies zeros (16
 *     useful multiply-adds, as many as an sdot); what the panel saves is the unpacking, the loads and the scale
 *     products, paid once for 16 rows.
 * The activations are signed here (no +128 and no corrections as on x86): weights in [-128, 127], activations in
 * [-127, 127], every sum exact in int32.
 *
 * Built without global -march flags: the kernels get their target by pragma and run only where backends_arm.c has
 * seen the CPU feature. A clang older than 16 declares vmmlaq_s32 only under -march=...+i8mm; there, without it, the
 * tables stay empty and the tier is neon_dotprod's.
 */
#include <string.h>

#include "arm/arm.h"

#if defined(__aarch64__) && ((!defined(__clang__) && __GNUC__ >= 10) || (defined(__clang__) && __clang_major__ >= 16) || \
                              defined(__ARM_FEATURE_MATMUL_INT8))

#include <arm_neon.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod,i8mm"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod+i8mm")  /* arm_neon.h declares vmmlaq_s32 for that target */
#endif

/* ---- the panel: act_panel_prepare's parts, the quants reordered into pairs of rows ---- */

/* act_panel_prepare's layout, then each block's quants from [l][r][4] + 128 to [h][r][8] signed: lanes 2h and 2h + 1
 * of four rows, zipped by 4 bytes, are the 8 elements of two rows, twice. */
static void panel_prepare_pairs(act_panel *panel, int weight_type, const void *first, int64_t row_bytes, int n_rows,
                                int64_t n, void *scratch) {
    act_panel_prepare(panel, weight_type, first, row_bytes, n_rows, n, scratch);
    const uint8x16_t bias = vdupq_n_u8(0x80);
    for (int64_t b = 0; b < n / QK32; ++b) {
        uint8_t *block = (uint8_t *)scratch + b * 8 * PANEL_ROWS * 4, lanes[8 * PANEL_ROWS * 4];
        memcpy(lanes, block, sizeof lanes);
        for (int h = 0; h < 4; ++h) {
            for (int quad = 0; quad < PANEL_ROWS / 4; ++quad) {
                const uint32x4_t lo = vreinterpretq_u32_u8(vld1q_u8(lanes + (2 * h * PANEL_ROWS + 4 * quad) * 4));
                const uint32x4_t hi = vreinterpretq_u32_u8(vld1q_u8(lanes + ((2 * h + 1) * PANEL_ROWS + 4 * quad) * 4));
                uint8_t *out = block + (h * PANEL_ROWS + 4 * quad) * 8;
                vst1q_u8(out, veorq_u8(vreinterpretq_u8_u32(vzip1q_u32(lo, hi)), bias));
                vst1q_u8(out + 16, veorq_u8(vreinterpretq_u8_u32(vzip2q_u32(lo, hi)), bias));
            }
        }
    }
}

/* ---- weight rows, unpacked ---- */

/* A row's 32-element blocks as int8 (what the reference multiplies), its d and m; one reader a format. */
typedef void (*block_reader)(const void *w, int64_t nb, int64_t b, int8_t q[QK32], float *d, float *m);

static void nibbles(const uint8_t qs[16], int offset, int8_t q[QK32]) {
    for (int j = 0; j < 16; ++j) {
        q[j] = (int8_t)((qs[j] & 0x0F) - offset);
        q[j + 16] = (int8_t)((qs[j] >> 4) - offset);
    }
}

/* q[j] += 16 where element j's fifth bit is set */
static void fifth_bits(const uint8_t qh[4], int8_t q[QK32]) {
    const uint32_t high = q5_high_bits(qh);
    for (int j = 0; j < QK32; ++j) q[j] = (int8_t)(q[j] + (int)((high >> j) & 1) * 16);
}

static void read_q4_0(const void *w, int64_t nb, int64_t b, int8_t q[QK32], float *d, float *m) {
    const block_q4_0 *x = (const block_q4_0 *)w + b;
    (void)nb, (void)m;
    nibbles(x->qs, 8, q);
    *d = fp16_to_fp32(x->d);
}

static void read_q4_1(const void *w, int64_t nb, int64_t b, int8_t q[QK32], float *d, float *m) {
    const block_q4_1 *x = (const block_q4_1 *)w + b;
    (void)nb;
    nibbles(x->qs, 0, q);
    *d = fp16_to_fp32(x->d), *m = fp16_to_fp32(x->m);
}

static void read_q5_0_block(const block_q5_0 *x, int8_t q[QK32], float *d) {
    nibbles(x->qs, 16, q);
    fifth_bits(x->qh, q);
    *d = fp16_to_fp32(x->d);
}

static void read_q5_0(const void *w, int64_t nb, int64_t b, int8_t q[QK32], float *d, float *m) {
    (void)nb, (void)m;
    read_q5_0_block((const block_q5_0 *)w + b, q, d);
}

static void read_q5_0_g8(const void *w, int64_t nb, int64_t b, int8_t q[QK32], float *d, float *m) {
    (void)m;
    const block_q5_0 x = q5_0_g8_block(w, nb, b);
    read_q5_0_block(&x, q, d);
}

static void read_q5_1(const void *w, int64_t nb, int64_t b, int8_t q[QK32], float *d, float *m) {
    const block_q5_1 *x = (const block_q5_1 *)w + b;
    (void)nb;
    nibbles(x->qs, 0, q);
    fifth_bits(x->qh, q);
    *d = fp16_to_fp32(x->d), *m = fp16_to_fp32(x->m);
}

static void read_q8_0(const void *w, int64_t nb, int64_t b, int8_t q[QK32], float *d, float *m) {
    const block_q8_0 *x = (const block_q8_0 *)w + b;
    (void)nb, (void)m;
    memcpy(q, x->qs, QK32);
    *d = fp16_to_fp32(x->d);
}

/* The scratch of a row of nb blocks (64 bytes each): blocks, then d, then m (unpacked_row_bytes). */
static void unpacked_layout(void *scratch, int64_t nb, int has_min, unpacked_row *row, float **d, float **m) {
    *d = (float *)((uint8_t *)scratch + nb * 64);
    *m = *d + (nb + 15) / 16 * 16;
    row->blocks = scratch;
    row->d = *d;
    row->m = has_min ? *m : NULL;
}

/* A row's blocks, each 64 bytes: whole, its 32 weights (then 32 unused bytes); otherwise in lanes, 16 bytes for each
 * h = 0..3: [lane 2h, 0000, 0000, lane 2h + 1] (lane l: weights 4l .. 4l + 3), the halves of the two B operands. */
static void unpack_row(block_reader read, int whole, int has_min, const void *w, int64_t n, void *scratch,
                       unpacked_row *row) {
    const int64_t nb = n / QK32;
    float *d, *m;
    unpacked_layout(scratch, nb, has_min, row, &d, &m);
    for (int64_t b = 0; b < nb; ++b) {
        int8_t q[QK32], *out = (int8_t *)scratch + 64 * b;
        float min = 0.0f;
        read(w, nb, b, q, &d[b], &min);
        if (has_min) m[b] = min;
        memset(out, 0, 64);
        if (whole) {
            memcpy(out, q, QK32);
            continue;
        }
        for (int h = 0; h < 4; ++h) {
            memcpy(out + 16 * h, q + 8 * h, 4);
            memcpy(out + 16 * h + 12, q + 8 * h + 4, 4);
        }
    }
}

#define PANEL_UNPACK(name, read, whole, has_min)                                          \
    static void name(const void *w, int64_t n, void *scratch, unpacked_row *row) {       \
        unpack_row(read, whole, has_min, w, n, scratch, row);                            \
    }
PANEL_UNPACK(panel_unpack_q4_0, read_q4_0, 1, 0)
PANEL_UNPACK(panel_unpack_q4_0_lanes, read_q4_0, 0, 0)
PANEL_UNPACK(panel_unpack_q4_1, read_q4_1, 0, 1)
PANEL_UNPACK(panel_unpack_q5_0, read_q5_0, 0, 0)
PANEL_UNPACK(panel_unpack_q5_0_g8, read_q5_0_g8, 0, 0)
PANEL_UNPACK(panel_unpack_q5_1, read_q5_1, 0, 1)
PANEL_UNPACK(panel_unpack_q8_0, read_q8_0, 0, 0)

/* A K-quant superblock unpacked (in unpacked_q4_K's 384 bytes): its 256 weights in element order (Q4_K: 0..15,
 * Q6_K: q - 32), each group's scale as int32 (8 groups of 32 or 16 of 16) and, Q4_K, each group's 6-bit min as a
 * float. */
typedef struct {
    int8_t q[QK_K];
    int32_t scale[16];
    float min[8];
    uint8_t pad[32];
} unpacked_k;
static_assert(sizeof(unpacked_k) == sizeof(unpacked_q4_K), "unpacked_k size");

static void panel_unpack_q4_K(const void *w, int64_t n, void *scratch, unpacked_row *row) {
    const block_q4_K *x = w;
    const int64_t nb = n / QK_K;
    float *d = (float *)((uint8_t *)scratch + nb * (int64_t)sizeof(unpacked_k)), *dmin = d + (nb + 15) / 16 * 16;
    row->blocks = scratch, row->d = d, row->m = dmin;
    for (int64_t b = 0; b < nb; ++b) {
        unpacked_k *out = (unpacked_k *)scratch + b;
        memset(out, 0, sizeof *out);
        for (int chunk = 0; chunk < 4; ++chunk) {  /* 64 elements: the low nibbles of 32 bytes, then their high ones */
            for (int l = 0; l < 32; ++l) {
                out->q[64 * chunk + l] = (int8_t)(x[b].qs[32 * chunk + l] & 0x0F);
                out->q[64 * chunk + 32 + l] = (int8_t)(x[b].qs[32 * chunk + l] >> 4);
            }
        }
        for (int g = 0; g < 8; ++g) {
            uint8_t sc, mn;
            scale_min_k4(g, x[b].scales, &sc, &mn);
            out->scale[g] = sc, out->min[g] = mn;
        }
        d[b] = fp16_to_fp32(x[b].d), dmin[b] = fp16_to_fp32(x[b].dmin);
    }
}

static void panel_unpack_q6_K(const void *w, int64_t n, void *scratch, unpacked_row *row) {
    const block_q6_K *x = w;
    const int64_t nb = n / QK_K;
    float *d = (float *)((uint8_t *)scratch + nb * (int64_t)sizeof(unpacked_k));
    row->blocks = scratch, row->d = d, row->m = NULL;
    for (int64_t b = 0; b < nb; ++b) {
        unpacked_k *out = (unpacked_k *)scratch + b;
        memset(out, 0, sizeof *out);
        for (int half = 0; half < 2; ++half) {
            const uint8_t *ql = x[b].ql + 64 * half, *qh = x[b].qh + 32 * half;
            int8_t *q = out->q + 128 * half;
            for (int l = 0; l < 32; ++l) {
                q[l] = (int8_t)(((ql[l] & 0xF) | (qh[l] & 3) << 4) - 32);
                q[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32);
                q[l + 64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
                q[l + 96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
            }
        }
        for (int g = 0; g < 16; ++g) out->scale[g] = x[b].scales[g];
        d[b] = fp16_to_fp32(x[b].d);
    }
}

/* ---- the kernels ---- */

/* The low (high) 8 bytes of x0 and of x1: a B operand, w0's 8 weights then w1's. */
static inline int8x16_t pair_lo(int8x16_t x0, int8x16_t x1) {
    return vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(x0), vreinterpretq_s64_s8(x1)));
}
static inline int8x16_t pair_hi(int8x16_t x0, int8x16_t x1) {
    return vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(x0), vreinterpretq_s64_s8(x1)));
}

/* [v0, v1, v0, v1]: the two weight rows' values in an accumulator's order */
static inline float32x4_t by_weight(float v0, float v1) {
    const float32x2_t v = vset_lane_f32(v1, vdup_n_f32(v0), 1);
    return vcombine_f32(v, v);
}

/* [v[0], v[0], v[1], v[1]]: two activation rows' values in an accumulator's order */
static inline float32x4_t by_row(const float v[2]) {
    const float32x2_t p = vld1_f32(v);
    return vcombine_f32(vdup_lane_f32(p, 0), vdup_lane_f32(p, 1));
}

/* out[i][r] for the accumulators of rows 4 quad .. 4 quad + 3 ([r.w0, r.w1, r+1.w0, r+1.w1] twice) */
static inline void store_quad(float out[2][PANEL_ROWS], int quad, float32x4_t pair0, float32x4_t pair1) {
    vst1q_f32(out[0] + 4 * quad, vuzp1q_f32(pair0, pair1));
    vst1q_f32(out[1] + 4 * quad, vuzp2q_f32(pair0, pair1));
}

/* Q4_0: each block's exact sum by four smmla a pair of rows, then acc = fmaf((float)sum, d_w * d_a, acc). */
static void vec_dot_q4_0_q8_0_panel(int64_t n, const unpacked_row rows[2], const act_panel *p,
                                    float out[2][PANEL_ROWS]) {
    const int8_t *w0 = rows[0].blocks, *w1 = rows[1].blocks, *a = (const int8_t *)p->quants;
    float32x4_t acc[PANEL_ROWS / 2];
    #pragma GCC unroll 8
    for (int pr = 0; pr < PANEL_ROWS / 2; ++pr) acc[pr] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / QK32; ++b) {
        const int8x16_t x0a = vld1q_s8(w0 + 64 * b), x0b = vld1q_s8(w0 + 64 * b + 16);
        const int8x16_t x1a = vld1q_s8(w1 + 64 * b), x1b = vld1q_s8(w1 + 64 * b + 16);
        const int8x16_t wq0 = pair_lo(x0a, x1a), wq1 = pair_hi(x0a, x1a), wq2 = pair_lo(x0b, x1b),
                        wq3 = pair_hi(x0b, x1b);
        const float32x4_t dw = by_weight(rows[0].d[b], rows[1].d[b]);
        const int8_t *ab = a + b * 8 * PANEL_ROWS * 4;
        const float *da = p->scale + b * PANEL_ROWS;
        #pragma GCC unroll 8
        for (int pr = 0; pr < PANEL_ROWS / 2; ++pr) {  /* rows 2 pr, 2 pr + 1: 16 bytes at [h][2 pr] */
            int32x4_t s = vmmlaq_s32(vdupq_n_s32(0), vld1q_s8(ab + 16 * pr), wq0);
            s = vmmlaq_s32(s, vld1q_s8(ab + 8 * PANEL_ROWS + 16 * pr), wq1);
            s = vmmlaq_s32(s, vld1q_s8(ab + 16 * PANEL_ROWS + 16 * pr), wq2);
            s = vmmlaq_s32(s, vld1q_s8(ab + 24 * PANEL_ROWS + 16 * pr), wq3);
            acc[pr] = vfmaq_f32(acc[pr], vcvtq_f32_s32(s), vmulq_f32(dw, by_row(da + 2 * pr)));
        }
    }
    for (int quad = 0; quad < PANEL_ROWS / 4; ++quad) store_quad(out, quad, acc[2 * quad], acc[2 * quad + 1]);
}

/* The lane order, four rows at a time (16 accumulators: two pairs of rows by 8 lanes): lane l of a block into
 * acc[pair][l] = fmaf(d_w * d_a, (float)lane, acc[pair][l]), the mins (with_mins) fmaf(m, s, mins) in theirs; then
 * reduce_lanes8's tree, plus the mins. */
static inline __attribute__((always_inline)) void panel_lanes(int64_t n, const unpacked_row rows[2],
                                                              const act_panel *p, float out[2][PANEL_ROWS],
                                                              int with_mins) {
    const int8_t *w0 = rows[0].blocks, *w1 = rows[1].blocks, *a = (const int8_t *)p->quants;
    for (int quad = 0; quad < PANEL_ROWS / 4; ++quad) {
        float32x4_t acc[2][8], mins[2];
        #pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
            mins[i] = vdupq_n_f32(0.0f);
            #pragma GCC unroll 8
            for (int l = 0; l < 8; ++l) acc[i][l] = mins[i];
        }
        for (int64_t b = 0; b < n / QK32; ++b) {
            const float32x4_t dw = by_weight(rows[0].d[b], rows[1].d[b]);
            const float *da = p->scale + b * PANEL_ROWS + 4 * quad;
            const float32x4_t scale[2] = {vmulq_f32(dw, by_row(da)), vmulq_f32(dw, by_row(da + 2))};
            const int8_t *ab = a + b * 8 * PANEL_ROWS * 4 + 32 * quad;
            #pragma GCC unroll 4
            for (int h = 0; h < 4; ++h) {
                const int8x16_t x0 = vld1q_s8(w0 + 64 * b + 16 * h), x1 = vld1q_s8(w1 + 64 * b + 16 * h);
                const int8x16_t even = pair_lo(x0, x1), odd = pair_hi(x0, x1);
                #pragma GCC unroll 2
                for (int i = 0; i < 2; ++i) {
                    const int8x16_t rows2 = vld1q_s8(ab + 8 * PANEL_ROWS * h + 16 * i);
                    const int32x4_t le = vmmlaq_s32(vdupq_n_s32(0), rows2, even);
                    const int32x4_t lo = vmmlaq_s32(vdupq_n_s32(0), rows2, odd);
                    acc[i][2 * h] = vfmaq_f32(acc[i][2 * h], vcvtq_f32_s32(le), scale[i]);
                    acc[i][2 * h + 1] = vfmaq_f32(acc[i][2 * h + 1], vcvtq_f32_s32(lo), scale[i]);
                }
            }
            if (with_mins) {
                const float32x4_t m = by_weight(rows[0].m[b], rows[1].m[b]);
                const float *s = p->sum + b * PANEL_ROWS + 4 * quad;
                mins[0] = vfmaq_f32(mins[0], m, by_row(s));
                mins[1] = vfmaq_f32(mins[1], m, by_row(s + 2));
            }
        }
        float32x4_t total[2];
        #pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
            const float32x4_t a4_0 = vaddq_f32(acc[i][0], acc[i][4]), a4_1 = vaddq_f32(acc[i][1], acc[i][5]);
            const float32x4_t a4_2 = vaddq_f32(acc[i][2], acc[i][6]), a4_3 = vaddq_f32(acc[i][3], acc[i][7]);
            total[i] = vaddq_f32(vaddq_f32(a4_0, a4_2), vaddq_f32(a4_1, a4_3));
            if (with_mins) total[i] = vaddq_f32(total[i], mins[i]);
        }
        store_quad(out, quad, total[0], total[1]);
    }
}

static void vec_dot_32_lanes_panel(int64_t n, const unpacked_row rows[2], const act_panel *p,
                                   float out[2][PANEL_ROWS]) {
    panel_lanes(n, rows, p, out, 0);
}

static void vec_dot_32_lanes_min_panel(int64_t n, const unpacked_row rows[2], const act_panel *p,
                                       float out[2][PANEL_ROWS]) {
    panel_lanes(n, rows, p, out, 1);
}

/* [v0, v1, v0, v1] in int32 */
static inline int32x4_t by_weight_s32(int32_t v0, int32_t v1) {
    const int32x2_t v = vset_lane_s32(v1, vdup_n_s32(v0), 1);
    return vcombine_s32(v, v);
}

/* s + the exact sums of elements 8 h .. 8 h + 15 of a panel block (ab) for two rows (pair pr) against the two
 * weight rows' 16 weights from there (x0, x1), by two smmla. */
static inline int32x4_t dot16_pair(int32x4_t s, const int8_t *ab, int h, int pr, int8x16_t x0, int8x16_t x1) {
    s = vmmlaq_s32(s, vld1q_s8(ab + 8 * PANEL_ROWS * h + 16 * pr), pair_lo(x0, x1));
    return vmmlaq_s32(s, vld1q_s8(ab + 8 * PANEL_ROWS * (h + 1) + 16 * pr), pair_hi(x0, x1));
}

/* Q4_K: per 64-element chunk, sum_q = sc0 * (group 2c's exact sum) + sc1 * (group 2c + 1's), acc = fmaf((float)sum_q,
 * d * d_a, acc); the mins' chain (sum_min = m0 * (group 2c's activations summed) + m1 * ..., exact in float) in a
 * loop of its own: mins = fmaf((float)sum_min, dmin * d_a, mins); then acc - mins. */
static void vec_dot_q4_K_q8_K_panel(int64_t n, const unpacked_row rows[2], const act_panel *p,
                                    float out[2][PANEL_ROWS]) {
    const unpacked_k *w0 = rows[0].blocks, *w1 = rows[1].blocks;
    const int8_t *a = (const int8_t *)p->quants;
    float32x4_t acc[PANEL_ROWS / 2], mins[PANEL_ROWS / 2];
    #pragma GCC unroll 8
    for (int pr = 0; pr < PANEL_ROWS / 2; ++pr) acc[pr] = mins[pr] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const float32x4_t dw = by_weight(rows[0].d[b], rows[1].d[b]);
        const float *da = p->scale + b * PANEL_ROWS;
        #pragma GCC unroll 4
        for (int chunk = 0; chunk < 4; ++chunk) {
            int32x4_t sum[PANEL_ROWS / 2];
            #pragma GCC unroll 2
            for (int gi = 0; gi < 2; ++gi) {
                const int g = 2 * chunk + gi;
                const int8x16_t x0a = vld1q_s8(w0[b].q + 32 * g), x0b = vld1q_s8(w0[b].q + 32 * g + 16);
                const int8x16_t x1a = vld1q_s8(w1[b].q + 32 * g), x1b = vld1q_s8(w1[b].q + 32 * g + 16);
                const int32x4_t sc = by_weight_s32(w0[b].scale[g], w1[b].scale[g]);
                const int8_t *ab = a + (8 * b + g) * 8 * PANEL_ROWS * 4;
                #pragma GCC unroll 8
                for (int pr = 0; pr < PANEL_ROWS / 2; ++pr) {
                    const int32x4_t s =
                        dot16_pair(dot16_pair(vdupq_n_s32(0), ab, 0, pr, x0a, x1a), ab, 2, pr, x0b, x1b);
                    sum[pr] = gi == 0 ? vmulq_s32(s, sc) : vmlaq_s32(sum[pr], s, sc);
                }
            }
            #pragma GCC unroll 8
            for (int pr = 0; pr < PANEL_ROWS / 2; ++pr) {
                acc[pr] = vfmaq_f32(acc[pr], vcvtq_f32_s32(sum[pr]), vmulq_f32(dw, by_row(da + 2 * pr)));
            }
        }
    }
        for (int64_t b = 0; b < n / QK_K; ++b) {
        const float32x4_t dmin = by_weight(rows[0].m[b], rows[1].m[b]);
        float32x4_t scale_min[PANEL_ROWS / 2];
#pragma GCC unroll 8
        for (int pr = 0; pr < PANEL_ROWS / 2; ++pr) {
            scale_min[pr] = vmulq_f32(dmin, by_row(p->scale + b * PANEL_ROWS + 2 * pr));
        }
#pragma GCC unroll 4
        for (int chunk = 0; chunk < 4; ++chunk) {
            const int g = 2 * chunk;
            const float32x4_t m0 = by_weight(w0[b].min[g], w1[b].min[g]);
            const float32x4_t m1 = by_weight(w0[b].min[g + 1], w1[b].min[g + 1]);
            const float *gs = p->group_sums + (8 * b + g) * PANEL_ROWS;
#pragma GCC unroll 8
            for (int pr = 0; pr < PANEL_ROWS / 2; ++pr) {
                const float32x4_t sum_min =
                    vfmaq_f32(vmulq_f32(m0, by_row(gs + 2 * pr)), m1, by_row(gs + PANEL_ROWS + 2 * pr));
                mins[pr] = vfmaq_f32(mins[pr], sum_min, scale_min[pr]);
            }
        }
    }
#pragma GCC unroll 8
    for (int pr = 0; pr < PANEL_ROWS / 2; ++pr) acc[pr] = vsubq_f32(acc[pr], mins[pr]);
    for (int quad = 0; quad < PANEL_ROWS / 4; ++quad) store_quad(out, quad, acc[2 * quad], acc[2 * quad + 1]);
}

/* Q6_K: each 16-element group's exact sum (two smmla) times its scale, summed over the superblock in int32, then
 * acc = fmaf(d * (float)sum, d_a, acc). */
static void vec_dot_q6_K_q8_K_panel(int64_t n, const unpacked_row rows[2], const act_panel *p,
                                    float out[2][PANEL_ROWS]) {
    const unpacked_k *w0 = rows[0].blocks, *w1 = rows[1].blocks;
    const int8_t *a = (const int8_t *)p->quants;
    float32x4_t acc[PANEL_ROWS / 2];
    #pragma GCC unroll 8
    for (int pr = 0; pr < PANEL_ROWS / 2; ++pr) acc[pr] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int32x4_t sum[PANEL_ROWS / 2];
        #pragma GCC unroll 8
        for (int pr = 0; pr < PANEL_ROWS / 2; ++pr) sum[pr] = vdupq_n_s32(0);
        for (int g = 0; g < 16; ++g) {  /* elements 16 g ..: panel block 8 b + g / 2, h = 2 (g % 2) and the next */
            const int8x16_t x0 = vld1q_s8(w0[b].q + 16 * g), x1 = vld1q_s8(w1[b].q + 16 * g);
            const int32x4_t sc = by_weight_s32(w0[b].scale[g], w1[b].scale[g]);
            const int8_t *ab = a + (8 * b + g / 2) * 8 * PANEL_ROWS * 4;
            #pragma GCC unroll 8
            for (int pr = 0; pr < PANEL_ROWS / 2; ++pr) {
                sum[pr] = vmlaq_s32(sum[pr], dot16_pair(vdupq_n_s32(0), ab, 2 * (g % 2), pr, x0, x1), sc);
            }
        }
        const float32x4_t dw = by_weight(rows[0].d[b], rows[1].d[b]);
        const float *da = p->scale + b * PANEL_ROWS;
        #pragma GCC unroll 8
        for (int pr = 0; pr < PANEL_ROWS / 2; ++pr) {
            acc[pr] = vfmaq_f32(acc[pr], vmulq_f32(dw, vcvtq_f32_s32(sum[pr])), by_row(da + 2 * pr));
        }
    }
    for (int quad = 0; quad < PANEL_ROWS / 4; ++quad) store_quad(out, quad, acc[2 * quad], acc[2 * quad + 1]);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const panel_unpack_fn panel_unpack_table_neon_i8mm[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_Q4_0] = panel_unpack_q4_0, [PYLLM_TYPE_Q4_0_LANES] = panel_unpack_q4_0_lanes,
    [PYLLM_TYPE_Q4_1] = panel_unpack_q4_1, [PYLLM_TYPE_Q5_0] = panel_unpack_q5_0,
    [PYLLM_TYPE_Q5_0_G8] = panel_unpack_q5_0_g8, [PYLLM_TYPE_Q5_1] = panel_unpack_q5_1,
    [PYLLM_TYPE_Q8_0] = panel_unpack_q8_0, [PYLLM_TYPE_Q4_K] = panel_unpack_q4_K, [PYLLM_TYPE_Q6_K] = panel_unpack_q6_K,
};

const panel_kernel_fn panel_kernel_table_neon_i8mm[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_Q4_0] = vec_dot_q4_0_q8_0_panel, [PYLLM_TYPE_Q4_0_LANES] = vec_dot_32_lanes_panel,
    [PYLLM_TYPE_Q4_1] = vec_dot_32_lanes_min_panel, [PYLLM_TYPE_Q5_0] = vec_dot_32_lanes_panel,
    [PYLLM_TYPE_Q5_0_G8] = vec_dot_32_lanes_panel, [PYLLM_TYPE_Q5_1] = vec_dot_32_lanes_min_panel,
    [PYLLM_TYPE_Q8_0] = vec_dot_32_lanes_panel, [PYLLM_TYPE_Q4_K] = vec_dot_q4_K_q8_K_panel,
    [PYLLM_TYPE_Q6_K] = vec_dot_q6_K_q8_K_panel,
};

const panel_prepare_fn panel_prepare_neon_i8mm = panel_prepare_pairs;

#elif defined(__aarch64__)

const panel_unpack_fn panel_unpack_table_neon_i8mm[PYLLM_TYPE_COUNT] = {0};
const panel_kernel_fn panel_kernel_table_neon_i8mm[PYLLM_TYPE_COUNT] = {0};
const panel_prepare_fn panel_prepare_neon_i8mm = NULL;

#endif
