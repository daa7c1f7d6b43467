/*
 * panel_avx512_vnni.c - the panel kernels (formats/kernel_layouts.h) on AVX-512 VNNI: weight rows of the 32-element formats,
 * Q4_K and Q6_K unpacked to bytes, and two of them against a panel of 16 activation rows.
 *
 * Built without global -m flags: the kernels get their target by pragma and run only where backends_x86.c
 * has seen the CPU features.
 */
#include "x86/x86.h"

#include <stddef.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi2,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi2,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")
#endif

/* ------------------------------------------------------------------------ */
/* weight rows to bytes                                                      */
/* ------------------------------------------------------------------------ */

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15), then high (16..31). */
static inline __m256i nibbles32(const uint8_t qs[16]) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0F);
    return _mm256_setr_m128i(_mm_and_si128(packed, m4), _mm_and_si128(_mm_srli_epi16(packed, 4), m4));
}

/* 0x10 in byte j where bit j of bits is set. */
static inline __m256i fifth_bits(uint32_t bits) { return _mm256_maskz_mov_epi8(bits, _mm256_set1_epi8(0x10)); }

static inline uint32_t load_u32(const uint8_t p[4]) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* -128 * (the 4-element sums of q), per lane: the corrections of the +128 in the activations. */
static inline __m256i lane_corrections(__m256i q) {
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), q));
}

static inline int32_t lanes_sum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
}

/* A block's 32 weights q into *out with their lane corrections (or, whole_block, the block's in lane 0). */
static inline void unpacked_store(unpacked_block *out, __m256i q, int whole_block) {
    const __m256i lanes = lane_corrections(q);
    _mm256_store_si256((__m256i *)out->q, q);
    _mm256_store_si256((__m256i *)out->correction, whole_block ? _mm256_setr_epi32(lanes_sum(lanes), 0, 0, 0, 0, 0, 0, 0) : lanes);
}

/* The scratch of a row of nb blocks (superblocks) of block_bytes: blocks, then d, then m (unpacked_row_bytes). */
static inline void unpacked_layout(void *scratch, int64_t nb, size_t block_bytes, int has_min, unpacked_row *row,
                               float **d, float **m) {
    *d = (float *)((uint8_t *)scratch + nb * (int64_t)block_bytes);
    *m = *d + (nb + 15) / 16 * 16;
    row->blocks = scratch;
    row->d = *d;
    row->m = has_min ? *m : NULL;
}

/* One unpacker per plain format: q (the weights as the reference multiplies them); store_min: the block's m
 * into m[b], or nothing. */
#define PANEL_UNPACK(name, block_t, weights, has_min, store_min, whole_block)                                 \
    static void name(const void *w, int64_t n, void *scratch, unpacked_row *row) {                               \
        const block_t *x = w;                                                                                \
        const int64_t nb = n / QK32;                                                                         \
        unpacked_block *blocks = scratch;                                                                        \
        float *d, *m;                                                                                        \
        unpacked_layout(scratch, nb, sizeof(unpacked_block), has_min, row, &d, &m);                                  \
        for (int64_t b = 0; b < nb; ++b) {                                                                   \
            unpacked_store(&blocks[b], weights, whole_block);                                                    \
            d[b] = _cvtsh_ss(x[b].d);                                                                        \
            store_min;                                                                                       \
        }                                                                                                    \
    }

#define Q4_SIGNED _mm256_sub_epi8(nibbles32(x[b].qs), _mm256_set1_epi8(8))
#define Q5_UNSIGNED _mm256_or_si256(nibbles32(x[b].qs), fifth_bits(load_u32(x[b].qh)))

#define STORE_MIN m[b] = _cvtsh_ss(x[b].m)
#define NO_MIN (void)m

PANEL_UNPACK(panel_unpack_q4_0, block_q4_0, Q4_SIGNED, 0, NO_MIN, 1)
PANEL_UNPACK(panel_unpack_q4_0_lanes, block_q4_0, Q4_SIGNED, 0, NO_MIN, 0)
PANEL_UNPACK(panel_unpack_q4_1, block_q4_1, nibbles32(x[b].qs), 1, STORE_MIN, 0)
PANEL_UNPACK(panel_unpack_q5_0, block_q5_0, _mm256_sub_epi8(Q5_UNSIGNED, _mm256_set1_epi8(16)), 0, NO_MIN, 0)
PANEL_UNPACK(panel_unpack_q5_1, block_q5_1, Q5_UNSIGNED, 1, STORE_MIN, 0)
PANEL_UNPACK(panel_unpack_q8_0, block_q8_0, _mm256_loadu_si256((const __m256i *)x[b].qs), 0, NO_MIN, 0)

/* Q5_0_G8: a group's block k takes its fifth bits from bit k of the group's qh bytes; the plain tail as Q5_0. */
static void panel_unpack_q5_0_g8(const void *w, int64_t n, void *scratch, unpacked_row *row) {
    const group_q5_0 *groups = w;
    const block_q5_0 *x = w;  /* the blocks after the groups: b at b * 22 bytes */
    const int64_t nb = n / QK32, n_grouped = nb / 8 * 8;
    unpacked_block *blocks = scratch;
    float *d, *m;
    unpacked_layout(scratch, nb, sizeof(unpacked_block), 0, row, &d, &m);
    for (int64_t b = 0; b < n_grouped; ++b) {
        const group_q5_0 *g = &groups[b / 8];
        const __mmask32 bits = _mm256_test_epi8_mask(_mm256_loadu_si256((const __m256i *)g->qh),
                                                     _mm256_set1_epi8((char)(1 << (b % 8))));
        const __m256i q = _mm256_or_si256(nibbles32(g->qs[b % 8]), _mm256_maskz_mov_epi8(bits, _mm256_set1_epi8(0x10)));
        unpacked_store(&blocks[b], _mm256_sub_epi8(q, _mm256_set1_epi8(16)), 0);
        d[b] = _cvtsh_ss(g->d[b % 8]);
    }
    for (int64_t b = n_grouped; b < nb; ++b) {
        unpacked_store(&blocks[b], _mm256_sub_epi8(Q5_UNSIGNED, _mm256_set1_epi8(16)), 0);
        d[b] = _cvtsh_ss(x[b].d);
    }
}

static void panel_unpack_q4_K(const void *w, int64_t n, void *scratch, unpacked_row *row) {
    const block_q4_K *x = w;
    const int64_t nb = n / QK_K;
    unpacked_q4_K *blocks = scratch;
    float *d, *dmin;
    unpacked_layout(scratch, nb, sizeof(unpacked_q4_K), 1, row, &d, &dmin);
    for (int64_t b = 0; b < nb; ++b) {
        unpacked_q4_K *out = &blocks[b];
        for (int c = 0; c < 4; ++c) {  /* 64-element chunk c: low nibbles of 32 bytes, then their high ones */
            const __m256i packed = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * c)), m4 = _mm256_set1_epi8(0x0F);
            const __m256i lo = _mm256_and_si256(packed, m4), hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), m4);
            _mm256_store_si256((__m256i *)(out->q + 64 * c), lo);
            _mm256_store_si256((__m256i *)(out->q + 64 * c + 32), hi);
            out->correction[2 * c] = lanes_sum(lane_corrections(lo));
            out->correction[2 * c + 1] = lanes_sum(lane_corrections(hi));
        }
        for (int g = 0; g < 8; ++g) {
            uint8_t sc, mn;
            scale_min_k4(g, x[b].scales, &sc, &mn);
            out->scale[g] = sc;
            out->min[g] = mn;
        }
        d[b] = _cvtsh_ss(x[b].d);
        dmin[b] = _cvtsh_ss(x[b].dmin);
    }
}

static void panel_unpack_q6_K(const void *w, int64_t n, void *scratch, unpacked_row *row) {
    const block_q6_K *x = w;
    const int64_t nb = n / QK_K;
    unpacked_q6_K *blocks = scratch;
    float *d, *m;
    unpacked_layout(scratch, nb, sizeof(unpacked_q6_K), 0, row, &d, &m);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30), offset = _mm256_set1_epi8(32);
    for (int64_t b = 0; b < nb; ++b) {
        unpacked_q6_K *out = &blocks[b];
        for (int half = 0; half < 2; ++half) {  /* elements 128 half + 32 j + l from ql, qh as the reference */
            const uint8_t *ql = x[b].ql + 64 * half;
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)ql), ql1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x[b].qh + 32 * half));
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2)),
                _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2)),
            };
            for (int j = 0; j < 4; ++j) {
                const __m256i signed_q = _mm256_sub_epi8(q[j], offset);
                _mm256_store_si256((__m256i *)(out->q + 128 * half + 32 * j), signed_q);
                int32_t lanes[8];
                _mm256_storeu_si256((__m256i *)lanes, lane_corrections(signed_q));
                const int g = 8 * half + 2 * j;  /* the two 16-element groups of these 32 */
                out->correction[g] = lanes[0] + lanes[1] + lanes[2] + lanes[3];
                out->correction[g + 1] = lanes[4] + lanes[5] + lanes[6] + lanes[7];
            }
        }
        for (int g = 0; g < 16; ++g) out->scale[g] = x[b].scales[g];
        d[b] = _cvtsh_ss(x[b].d);
    }
}

/* ------------------------------------------------------------------------ */
/* activation rows to a panel                                                */
/* ------------------------------------------------------------------------ */

/* The 8 four-byte units of 16 rows' 32 bytes (rows r and r + 8 in the halves of z[r]), transposed: out[l] =
 * unit l of rows 0..15, flipped to unsigned by xor 0x80 (q + 128 in a byte). The 8 x 8 transpose of each half:
 * pairs of rows interleaved by 32 and then 64 bits, then the 128-bit lanes of two results put together. */
static inline void transpose_units(const __m512i z[8], uint8_t *out) {
    __m512i t[8], u[8];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
        t[2 * k] = _mm512_unpacklo_epi32(z[2 * k], z[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(z[2 * k], z[2 * k + 1]);
    }
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k) {  /* u[4k + j]: rows 4k..4k + 3 of units j (128-bit lanes 0, 2) and j + 4 (1, 3) */
        u[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    const __m512i low = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), high = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    const __m512i flip = _mm512_set1_epi32((int32_t)0x80808080u);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
        _mm512_store_si512((void *)(out + j * 64), _mm512_xor_si512(_mm512_permutex2var_epi64(u[j], low, u[4 + j]), flip));
        _mm512_store_si512((void *)(out + (j + 4) * 64), _mm512_xor_si512(_mm512_permutex2var_epi64(u[j], high, u[4 + j]), flip));
    }
}

/* act_panel_prepare by transposes: a block's 32 quants of the 16 rows (zeros past n_rows) loaded whole and
 * transposed into its 8 units; the scales and sums copied row by row. */
static void panel_prepare_by_transposes(act_panel *panel, int weight_type, const void *first, int64_t row_bytes, int n_rows,
                          int64_t n, void *scratch) {
    act_panel_layout(panel, weight_type, n_rows, n, scratch);
    const int act_type = pyllm_vec_dot_type(weight_type);
    const uint8_t *base = first;
    uint8_t *quants = (uint8_t *)panel->quants;
    float *scale = (float *)panel->scale, *sum = (float *)panel->sum, *group_sums = (float *)panel->group_sums;
    const int64_t block_bytes = act_type == PYLLM_TYPE_Q8_1 ? (int64_t)sizeof(block_q8_1) : (int64_t)sizeof(block_q8_0);
    for (int64_t b = 0; b < n / QK32; ++b) {
        /* block b's offset in a row: its quants, and its (d, s) halves or (q8_K) its superblock */
        const int64_t at = act_type == PYLLM_TYPE_Q8_K ? b / 8 * (int64_t)sizeof(block_q8_K) : b * block_bytes;
        const int64_t qs = act_type == PYLLM_TYPE_Q8_K ? at + (int64_t)offsetof(block_q8_K, qs) + QK32 * (b % 8)
                         : at + (act_type == PYLLM_TYPE_Q8_1 ? (int64_t)offsetof(block_q8_1, qs) : (int64_t)offsetof(block_q8_0, qs));
        __m512i z[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) {
            const __m256i lo = r < n_rows ? _mm256_loadu_si256((const __m256i *)(base + r * row_bytes + qs)) : _mm256_setzero_si256();
            const __m256i hi = r + 8 < n_rows ? _mm256_loadu_si256((const __m256i *)(base + (r + 8) * row_bytes + qs))
                                              : _mm256_setzero_si256();
            z[r] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        }
        transpose_units(z, quants + b * 8 * PANEL_ROWS * 4);
        for (int r = 0; r < PANEL_ROWS; ++r) {
            const uint8_t *row = base + r * row_bytes + at;
            const int real = r < n_rows;
            if (act_type == PYLLM_TYPE_Q8_K) {
                const block_q8_K *y = (const block_q8_K *)row;
                if (b % 8 == 0) scale[b / 8 * PANEL_ROWS + r] = real ? y->d : 0.0f;
                group_sums[b * PANEL_ROWS + r] = real ? (float)(y->bsums[2 * (b % 8)] + y->bsums[2 * (b % 8) + 1]) : 0.0f;
                continue;
            }
            fp16_t halves[2] = {0, 0};  /* d, and q8_1's s */
            if (real) memcpy(halves, row, act_type == PYLLM_TYPE_Q8_1 ? 4 : 2);
            scale[b * PANEL_ROWS + r] = _cvtsh_ss(halves[0]);
            if (sum != NULL) sum[b * PANEL_ROWS + r] = _cvtsh_ss(halves[1]);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* kernels: two weight rows against a panel                                  */
/* ------------------------------------------------------------------------ */

/* Weights 4 u .. 4 u + 3 of q in every lane. */
static inline __m512i weight_unit(const int8_t *q, int u) {
    int32_t unit;
    memcpy(&unit, q + 4 * u, 4);
    return _mm512_set1_epi32(unit);
}

static inline __m512i panel_unit(const act_panel *p, int64_t b, int l) {
    return _mm512_load_si512((const void *)(p->quants + (b * 8 + l) * PANEL_ROWS * 4));
}

/* The 8-lane formats: accumulator l of weight row i is every row's lane l; its chain and the closing tree
 * (lanes l and l + 4, then + 2, then + 1) are the reference's. Q4_1 / Q5_1 also chain mins = fmaf(m, s, mins). */
static inline __attribute__((always_inline)) void panel_lanes(int64_t n, const unpacked_row rows[2], const act_panel *p,
                                                              float out[2][PANEL_ROWS], const int has_min) {
    __m512 acc[2][8], mins[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int i = 0; i < 2; ++i) {
        for (int l = 0; l < 8; ++l) acc[i][l] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < n / QK32; ++b) {
        const __m512 d_act = _mm512_load_ps(p->scale + b * PANEL_ROWS);
        const __m512 scale[2] = {_mm512_mul_ps(_mm512_set1_ps(rows[0].d[b]), d_act),
                                 _mm512_mul_ps(_mm512_set1_ps(rows[1].d[b]), d_act)};
        if (has_min) {
            const __m512 s_act = _mm512_load_ps(p->sum + b * PANEL_ROWS);
            for (int i = 0; i < 2; ++i) mins[i] = _mm512_fmadd_ps(_mm512_set1_ps(rows[i].m[b]), s_act, mins[i]);
        }
        const unpacked_block *w[2] = {(const unpacked_block *)rows[0].blocks + b, (const unpacked_block *)rows[1].blocks + b};
#pragma GCC unroll 8
        for (int l = 0; l < 8; ++l) {
            const __m512i a = panel_unit(p, b, l);
#pragma GCC unroll 2
            for (int i = 0; i < 2; ++i) {
                const __m512i sums = _mm512_dpbusd_epi32(_mm512_set1_epi32(w[i]->correction[l]), a, weight_unit(w[i]->q, l));
                acc[i][l] = _mm512_fmadd_ps(scale[i], _mm512_cvtepi32_ps(sums), acc[i][l]);
            }
        }
    }
    for (int i = 0; i < 2; ++i) {
        const __m512 half0 = _mm512_add_ps(acc[i][0], acc[i][4]), half1 = _mm512_add_ps(acc[i][1], acc[i][5]);
        const __m512 half2 = _mm512_add_ps(acc[i][2], acc[i][6]), half3 = _mm512_add_ps(acc[i][3], acc[i][7]);
        __m512 total = _mm512_add_ps(_mm512_add_ps(half0, half2), _mm512_add_ps(half1, half3));
        if (has_min) total = _mm512_add_ps(total, mins[i]);
        _mm512_storeu_ps(out[i], total);
    }
}

static void vec_dot_32_lanes_panel(int64_t n, const unpacked_row rows[2], const act_panel *p, float out[2][PANEL_ROWS]) {
    panel_lanes(n, rows, p, out, 0);
}

static void vec_dot_32_lanes_min_panel(int64_t n, const unpacked_row rows[2], const act_panel *p, float out[2][PANEL_ROWS]) {
    panel_lanes(n, rows, p, out, 1);
}

/* Q4_0: each block's exact total (four partial sums of two dots each, for the dots' latency), then
 * acc = fmaf((float)total, d_w * d_a, acc). */
static inline __m512 q4_0_block(__m512 acc, const unpacked_block *w, float d, __m512 d_act, const __m512i a[8]) {
    const __m512i s0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_set1_epi32(w->correction[0]), a[0], weight_unit(w->q, 0)),
                                           a[4], weight_unit(w->q, 4));
    const __m512i s1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), a[1], weight_unit(w->q, 1)), a[5],
                                           weight_unit(w->q, 5));
    const __m512i s2 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), a[2], weight_unit(w->q, 2)), a[6],
                                           weight_unit(w->q, 6));
    const __m512i s3 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), a[3], weight_unit(w->q, 3)), a[7],
                                           weight_unit(w->q, 7));
    const __m512i total = _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(_mm512_set1_ps(d), d_act), acc);
}

static void vec_dot_q4_0_q8_0_panel(int64_t n, const unpacked_row rows[2], const act_panel *p, float out[2][PANEL_ROWS]) {
    const unpacked_block *w0 = rows[0].blocks, *w1 = rows[1].blocks;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / QK32; ++b) {
        const __m512 d_act = _mm512_load_ps(p->scale + b * PANEL_ROWS);
        __m512i a[8];
#pragma GCC unroll 8
        for (int l = 0; l < 8; ++l) a[l] = panel_unit(p, b, l);
        acc0 = q4_0_block(acc0, w0 + b, rows[0].d[b], d_act, a);
        acc1 = q4_0_block(acc1, w1 + b, rows[1].d[b], d_act, a);
    }
    _mm512_storeu_ps(out[0], acc0);
    _mm512_storeu_ps(out[1], acc1);
}

/* Q4_K: each 32-element group's exact sum, then per 64-element chunk its scaled sum and scaled min in float
 * (all integers below 2^24, so exactly the reference's int sums converted), chained as the reference:
 * acc = fmaf(sum, d * d_a, acc), mins = fmaf(sum_min, dmin * d_a, mins); acc - mins. */
static void vec_dot_q4_K_q8_K_panel(int64_t n, const unpacked_row rows[2], const act_panel *p, float out[2][PANEL_ROWS]) {
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}, mins[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const __m512 d_act = _mm512_load_ps(p->scale + b * PANEL_ROWS);
        const unpacked_q4_K *w[2] = {(const unpacked_q4_K *)rows[0].blocks + b, (const unpacked_q4_K *)rows[1].blocks + b};
        __m512i dots[2][8];
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
#pragma GCC unroll 8
            for (int g = 0; g < 8; ++g) dots[i][g] = _mm512_set1_epi32(w[i]->correction[g]);
        }
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u) {
#pragma GCC unroll 8
            for (int g = 0; g < 8; ++g) {
                const __m512i a = panel_unit(p, 8 * b + g, u);
#pragma GCC unroll 2
                for (int i = 0; i < 2; ++i) dots[i][g] = _mm512_dpbusd_epi32(dots[i][g], a, weight_unit(w[i]->q + QK32 * g, u));
            }
        }
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
            const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(rows[i].d[b]), d_act);
            const __m512 scale_min = _mm512_mul_ps(_mm512_set1_ps(rows[i].m[b]), d_act);
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
                const __m512 sum = _mm512_fmadd_ps(_mm512_set1_ps(w[i]->scale[2 * c + 1]), _mm512_cvtepi32_ps(dots[i][2 * c + 1]),
                                                   _mm512_mul_ps(_mm512_set1_ps(w[i]->scale[2 * c]), _mm512_cvtepi32_ps(dots[i][2 * c])));
                acc[i] = _mm512_fmadd_ps(sum, scale, acc[i]);
                const float *group_sums = p->group_sums + (8 * b + 2 * c) * PANEL_ROWS;
                const __m512 sum_min = _mm512_fmadd_ps(_mm512_set1_ps(w[i]->min[2 * c + 1]), _mm512_load_ps(group_sums + PANEL_ROWS),
                                                       _mm512_mul_ps(_mm512_set1_ps(w[i]->min[2 * c]), _mm512_load_ps(group_sums)));
                mins[i] = _mm512_fmadd_ps(sum_min, scale_min, mins[i]);
            }
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i) _mm512_storeu_ps(out[i], _mm512_sub_ps(acc[i], mins[i]));
}

/* Q6_K: each 16-element group's exact sum times its scale, summed over the superblock in int32, then
 * acc = fmaf(d * (float)sum, d_a, acc). A half superblock at a time (16 chains of dots in registers). */
static void vec_dot_q6_K_q8_K_panel(int64_t n, const unpacked_row rows[2], const act_panel *p, float out[2][PANEL_ROWS]) {
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const unpacked_q6_K *w[2] = {(const unpacked_q6_K *)rows[0].blocks + b, (const unpacked_q6_K *)rows[1].blocks + b};
        __m512i sums[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 2
        for (int half = 0; half < 2; ++half) {
            __m512i dots[2][8];
#pragma GCC unroll 2
            for (int i = 0; i < 2; ++i) {
#pragma GCC unroll 8
                for (int j = 0; j < 8; ++j) dots[i][j] = _mm512_set1_epi32(w[i]->correction[8 * half + j]);
            }
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u) {
#pragma GCC unroll 8
                for (int j = 0; j < 8; ++j) {  /* group g = 8 half + j: units 4 (g % 2) + u of 32-element block g / 2 */
                    const int g = 8 * half + j;
                    const __m512i a = panel_unit(p, 8 * b + g / 2, 4 * (g % 2) + u);
#pragma GCC unroll 2
                    for (int i = 0; i < 2; ++i) dots[i][j] = _mm512_dpbusd_epi32(dots[i][j], a, weight_unit(w[i]->q + 16 * g, u));
                }
            }
#pragma GCC unroll 2
            for (int i = 0; i < 2; ++i) {
#pragma GCC unroll 8
                for (int j = 0; j < 8; ++j) {
                    sums[i] = _mm512_add_epi32(sums[i], _mm512_mullo_epi32(dots[i][j], _mm512_set1_epi32(w[i]->scale[8 * half + j])));
                }
            }
        }
        const __m512 d_act = _mm512_load_ps(p->scale + b * PANEL_ROWS);
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
            acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(rows[i].d[b]), _mm512_cvtepi32_ps(sums[i])), d_act, acc[i]);
        }
    }
    _mm512_storeu_ps(out[0], acc[0]);
    _mm512_storeu_ps(out[1], acc[1]);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const panel_unpack_fn panel_unpack_table_avx512_vnni[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_Q4_0] = panel_unpack_q4_0, [PYLLM_TYPE_Q4_0_LANES] = panel_unpack_q4_0_lanes,
    [PYLLM_TYPE_Q4_1] = panel_unpack_q4_1, [PYLLM_TYPE_Q5_0] = panel_unpack_q5_0,
    [PYLLM_TYPE_Q5_0_G8] = panel_unpack_q5_0_g8, [PYLLM_TYPE_Q5_1] = panel_unpack_q5_1,
    [PYLLM_TYPE_Q8_0] = panel_unpack_q8_0, [PYLLM_TYPE_Q4_K] = panel_unpack_q4_K, [PYLLM_TYPE_Q6_K] = panel_unpack_q6_K,
};

const panel_kernel_fn panel_kernel_table_avx512_vnni[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_Q4_0] = vec_dot_q4_0_q8_0_panel, [PYLLM_TYPE_Q4_0_LANES] = vec_dot_32_lanes_panel,
    [PYLLM_TYPE_Q4_1] = vec_dot_32_lanes_min_panel, [PYLLM_TYPE_Q5_0] = vec_dot_32_lanes_panel,
    [PYLLM_TYPE_Q5_0_G8] = vec_dot_32_lanes_panel, [PYLLM_TYPE_Q5_1] = vec_dot_32_lanes_min_panel,
    [PYLLM_TYPE_Q8_0] = vec_dot_32_lanes_panel, [PYLLM_TYPE_Q4_K] = vec_dot_q4_K_q8_K_panel, [PYLLM_TYPE_Q6_K] = vec_dot_q6_K_q8_K_panel,
};

const panel_prepare_fn panel_prepare_avx512_vnni = panel_prepare_by_transposes;

#endif
