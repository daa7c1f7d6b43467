/*
 * vec_dot_avx512.c - the AVX-512 (F/BW/VL/DQ) tier's own kernels: Q2_K, Q3_K, Q5_K and
 * Q6_K on 512-bit vectors, int8 dots by vpmaddubsw + vpmaddwd.
 *
 * Every kernel reproduces vec_dot_generic.c bit for bit (see backend/kernel_set.h):
 *   - integer sums are exact for every input byte. The unsigned operand of a
 *     u8 x s8 dot is always weight-derived (<= 128 wherever vpmaddubsw sees
 *     it) and the signed one the raw activation byte (any of -128..127), so
 *     vpmaddubsw never saturates and no activation is negated; the offsets of
 *     Q3_K/Q6_K are subtracted as offset * activation sums computed here from
 *     the activations. q8_K bsums are used only where generic uses them: the
 *     mins of Q2_K/Q5_K.
 *   - the float steps are generic's: the same products, the same fmaf chain
 *     (one per K superblock).
 * The float and 32-element formats and Q4_K have no kernel here: their reduction
 * orders (llama.cpp's: 8 lanes chained element by element or block by block, Q4_K
 * per 64-element chunk) gain nothing from 512-bit vectors, so AVX-512 CPUs run
 * the AVX2 kernels for them. CPUs with AVX-512 VNNI run vec_dot_avx2_vnni.c's
 * 256-bit kernels instead of these, faster for each of the four (bench/README.md,
 * `make bench-kernels`).
 *
 * Built without global -m flags: the kernels get their target by pragma and
 * run only where backends_x86.c has seen the CPU features.
 */
#include "x86/x86.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>
#include <math.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,bmi2"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,bmi2")
#endif

/* ------------------------------------------------------------------------ */
/* u8 x s8 dot products                                                       */
/* ------------------------------------------------------------------------ */

/*
 * scaled(u, s, S) / scaled_off(u, o, s, S): int32 lane i = S_i * (the 4-element
 * dot of u, or u - o, with s over lane i: u, o unsigned bytes, s signed), S a
 * scale vector from scale_vec() below: vpmaddwd of the int16 pair sums with
 * (scale, scale). vpmaddubsw is exact when u <= 128 and u, o <= 127 (the int16
 * pair sums, and their difference, cannot overflow). Every use below has
 * |4-element dot| <= 4 * 32 * 128 = 16384.
 */
static inline __m512i scaled(__m512i u, __m512i s, __m512i scale) {
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), scale);
}

static inline __m512i scaled_off(__m512i u, __m512i o, __m512i s, __m512i scale) {
    const __m512i d = _mm512_sub_epi16(_mm512_maddubs_epi16(u, s), _mm512_maddubs_epi16(o, s));
    return _mm512_madd_epi16(d, scale);
}

/* the pshufb pattern of one int32 lane of a scale vector: int16 scale g twice */
#define SCALE_LANE(g) ((int)(0x01000100u + 0x02020202u * (unsigned)(g)))

/*
 * A scale vector: bcast holds 8 int16 scales in each 128-bit chunk (a
 * broadcast); 128-bit chunk c of the result gets scale g_c in the layout
 * scaled() expects.
 */
static inline __m512i scale_vec(__m512i bcast, int g0, int g1, int g2, int g3) {
    const __m512i idx = _mm512_set_epi32(SCALE_LANE(g3), SCALE_LANE(g3), SCALE_LANE(g3), SCALE_LANE(g3),
                                         SCALE_LANE(g2), SCALE_LANE(g2), SCALE_LANE(g2), SCALE_LANE(g2),
                                         SCALE_LANE(g1), SCALE_LANE(g1), SCALE_LANE(g1), SCALE_LANE(g1),
                                         SCALE_LANE(g0), SCALE_LANE(g0), SCALE_LANE(g0), SCALE_LANE(g0));
    return _mm512_shuffle_epi8(bcast, idx);
}

/* ------------------------------------------------------------------------ */
/* small helpers                                                              */
/* ------------------------------------------------------------------------ */

#define KERNEL_INLINE static inline __attribute__((always_inline))

/* Fully unroll the short fixed loops, so that v[4] stays in registers and the
 * per-iteration constants fold. */
#define UNROLL _Pragma("GCC unroll 8")

static inline __m512i load512(const void *p) { return _mm512_loadu_si512(p); }
static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline __m128i load128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }

/* [p[0..31], p[0..31]] */
static inline __m512i bcast256(const void *p) { return _mm512_broadcast_i64x4(load256(p)); }

static inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline float fp16_f32(fp16_t h) { return _cvtsh_ss(h); }

/* the sum of the 16 int32 lanes (exact, wrapping like int32 adds) */
static inline int32_t hsum_i32(__m512i v) {
    const __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
    return _mm_cvtsi128_si32(s4);
}

/* the sums of the 16 lanes of q and of the 8 lanes of m, together */
static inline void hsum2_i32(__m512i q, __m256i m, int32_t *sum_q, int32_t *sum_m) {
    const __m256i q8 = _mm256_add_epi32(_mm512_castsi512_si256(q), _mm512_extracti64x4_epi64(q, 1));
    /* per 128-bit half: [q0+q2, m0+m2, q1+q3, m1+m3] */
    const __m256i t = _mm256_add_epi32(_mm256_unpacklo_epi32(q8, m), _mm256_unpackhi_epi32(q8, m));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    *sum_q = _mm_cvtsi128_si32(s);
    *sum_m = _mm_extract_epi32(s, 1);
}

/* ------------------------------------------------------------------------ */
/* K-quants against q8_K: exact int32 sums per superblock                     */
/* ------------------------------------------------------------------------ */

/*
 * Q2_K / Q3_K / Q6_K: 16 groups of 16 elements. Each 64-element vector is 4
 * groups, one per 128-bit chunk; vector k (elements 64k..64k+63) takes groups
 * 4k..4k+3. sc16 holds the 16 int16 group scales.
 */
typedef struct {
    __m512i s[4];
} k16_scales;

static inline k16_scales k16_scale_vecs(__m256i sc16) {
    const __m512i lo = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc16));
    const __m512i hi = _mm512_broadcast_i32x4(_mm256_extracti128_si256(sc16, 1));
    k16_scales r;
    r.s[0] = scale_vec(lo, 0, 1, 2, 3);
    r.s[1] = scale_vec(lo, 4, 5, 6, 7);
    r.s[2] = scale_vec(hi, 0, 1, 2, 3);
    r.s[3] = scale_vec(hi, 4, 5, 6, 7);
    return r;
}

/* The 2-bit fields of 32 bytes qs, as the 128 elements of one half of a
 * Q2_K/Q3_K superblock: out[0] = elements 0-63 (shifts 0, 2), out[1] = 64-127
 * (shifts 4, 6). */
static inline void unpack_2bit(const uint8_t *qs, __m512i out[2]) {
    const __m512i x = bcast256(qs);
    const __m512i m3 = _mm512_set1_epi8(3);
    out[0] = _mm512_and_si512(_mm512_srlv_epi64(x, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0)), m3);
    out[1] = _mm512_and_si512(_mm512_srlv_epi64(x, _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4)), m3);
}

/* exact sum_g (sc_g & 15) * dot16_g and sum_g (sc_g >> 4) * bsums_g */
KERNEL_INLINE void q2_K_sums(const block_q2_K *x, const block_q8_K *y, int32_t *sum_q, int32_t *sum_min) {
    const __m128i raw = load128(x->scales);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));
    const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
    const __m256i mins = _mm256_madd_epi16(mn16, load256(y->bsums));
    const k16_scales S = k16_scale_vecs(sc16);
    __m512i acc = _mm512_setzero_si512();
    UNROLL
    for (int half = 0; half < 2; ++half) {
        __m512i q[2];
        unpack_2bit(x->qs + 32 * half, q);
        UNROLL
        for (int k = 0; k < 2; ++k) {
            acc = _mm512_add_epi32(acc, scaled(q[k], load512(y->qs + 128 * half + 64 * k), S.s[2 * half + k]));
        }
    }
    hsum2_i32(acc, mins, sum_q, sum_min);
}

/* The 16 six-bit scales of Q3_K minus 32, as int16 */
static inline __m256i q3_K_scales16(const uint8_t *packed) {
    const uint32_t a0 = load_u32(packed), a1 = load_u32(packed + 4), hi = load_u32(packed + 8);
    const uint32_t k2 = 0x0F0F0F0Fu, k1 = 0x03030303u;
    const uint32_t s0 = (a0 & k2) | ((hi >> 0) & k1) << 4;
    const uint32_t s1 = (a1 & k2) | ((hi >> 2) & k1) << 4;
    const uint32_t s2 = ((a0 >> 4) & k2) | ((hi >> 4) & k1) << 4;
    const uint32_t s3 = ((a1 >> 4) & k2) | ((hi >> 6) & k1) << 4;
    const __m128i u = _mm_setr_epi32((int)s0, (int)s1, (int)s2, (int)s3);  /* 0..63 */
    return _mm256_sub_epi16(_mm256_cvtepu8_epi16(u), _mm256_set1_epi16(32));
}

KERNEL_INLINE int32_t q3_K_sum(const block_q3_K *x, const block_q8_K *y) {
    const k16_scales S = k16_scale_vecs(q3_K_scales16(x->scales));
    const __m512i hm = bcast256(x->hmask);
    /* the high bits of runs 4h + 2k (bytes 0-31) and 4h + 2k + 1 (bytes 32-63) */
    const __m512i bit0 = _mm512_inserti64x4(_mm512_set1_epi8(0x01), _mm256_set1_epi8(0x02), 1);
    const __m512i bit2 = _mm512_inserti64x4(_mm512_set1_epi8(0x04), _mm256_set1_epi8(0x08), 1);
    const __m512i c4 = _mm512_set1_epi8(4);
    __m512i acc = _mm512_setzero_si512();
    UNROLL
    for (int half = 0; half < 2; ++half) {
        __m512i q[2];
        unpack_2bit(x->qs + 32 * half, q);
        const __m512i h = half ? _mm512_srli_epi16(hm, 4) : hm;
        UNROLL
        for (int k = 0; k < 2; ++k) {
            /* q + 4 * hbit in 0..7, and (q + 4 * hbit - 4) * a = that * a - 4 * a */
            const __mmask64 set = _mm512_test_epi8_mask(h, k ? bit2 : bit0);
            const __m512i u = _mm512_mask_add_epi8(q[k], set, q[k], c4);
            const __m512i a = load512(y->qs + 128 * half + 64 * k);
            acc = _mm512_add_epi32(acc, scaled_off(u, c4, a, S.s[2 * half + k]));
        }
    }
    return hsum_i32(acc);
}

KERNEL_INLINE int32_t q6_K_sum(const block_q6_K *x, const block_q8_K *y) {
    const k16_scales S = k16_scale_vecs(_mm256_cvtepi8_epi16(load128(x->scales)));
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), c32 = _mm512_set1_epi8(32);
    __m512i acc = _mm512_setzero_si512();
    UNROLL
    for (int half = 0; half < 2; ++half) {
        const __m512i ql = load512(x->ql + 64 * half);
        const __m512i qh = bcast256(x->qh + 32 * half);
        /* elements 0-63: ql & 15 | bits (0,1) resp. (2,3) of qh << 4 */
        const __m512i h0 = _mm512_and_si512(_mm512_sllv_epi64(qh, _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4)), m30);
        const __m512i q0 = _mm512_ternarylogic_epi64(ql, m4, h0, 0xEA);  /* (ql & m4) | h0 */
        /* elements 64-127: ql >> 4 | bits (4,5) resp. (6,7) of qh << 4 */
        const __m512i h1 = _mm512_and_si512(_mm512_srlv_epi64(qh, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0)), m30);
        const __m512i q1 = _mm512_ternarylogic_epi64(_mm512_srli_epi16(ql, 4), m4, h1, 0xEA);
        acc = _mm512_add_epi32(acc, scaled_off(q0, c32, load512(y->qs + 128 * half), S.s[2 * half]));
        acc = _mm512_add_epi32(acc, scaled_off(q1, c32, load512(y->qs + 128 * half + 64), S.s[2 * half + 1]));
    }
    return hsum_i32(acc);
}

/*
 * Q4_K / Q5_K: 8 groups of 32 with 6-bit scales and mins. Vector c (elements
 * 64c..64c+63) is groups 2c (bytes 0-31) and 2c + 1 (bytes 32-63).
 */
typedef struct {
    __m512i bcast;  /* the 8 int16 scales in every 128-bit chunk */
    __m256i mins;   /* 8 int32: m_g * (bsums[2g] + bsums[2g + 1]) */
} k4_scales;

static inline k4_scales k4_unpack_scales(const uint8_t *packed, const block_q8_K *y) {
    const uint32_t q0 = load_u32(packed), q1 = load_u32(packed + 4), q2 = load_u32(packed + 8);
    const uint32_t k1 = 0x3F3F3F3Fu, k2 = 0x0F0F0F0Fu, k3 = 0x03030303u;
    const uint32_t sc_lo = q0 & k1;                                /* sc 0-3 */
    const uint32_t sc_hi = (q2 & k2) | ((q0 >> 6) & k3) << 4;      /* sc 4-7 */
    const uint32_t m_lo = q1 & k1;                                 /* m 0-3 */
    const uint32_t m_hi = ((q2 >> 4) & k2) | ((q1 >> 6) & k3) << 4; /* m 4-7 */
    const __m128i u = _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)m_lo, (int)m_hi);
    /* bytes 8..15 (the mins) each twice, for the bsums pairs */
    const __m128i m_dup = _mm_shuffle_epi8(u, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15));
    k4_scales r;
    r.bcast = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(u));
    r.mins = _mm256_madd_epi16(_mm256_cvtepu8_epi16(m_dup), load256(y->bsums));
    return r;
}

KERNEL_INLINE void q5_K_sums(const block_q5_K *x, const block_q8_K *y, int32_t *sum_q, int32_t *sum_min) {
    const k4_scales sc = k4_unpack_scales(x->scales, y);
    const __m512i m4 = _mm512_set1_epi8(0x0F), c16 = _mm512_set1_epi8(16);
    /* bit 2c of qh for bytes 0-31, bit 2c + 1 for bytes 32-63, after shifting qh right by 2c */
    const __m512i bits = _mm512_inserti64x4(_mm512_set1_epi8(0x01), _mm256_set1_epi8(0x02), 1);
    __m512i qh = bcast256(x->qh);
    __m512i acc = _mm512_setzero_si512();
    UNROLL
    for (int c = 0; c < 4; ++c) {
        const __m512i raw = bcast256(x->qs + 32 * c);
        __m512i q = _mm512_and_si512(_mm512_mask_srli_epi16(raw, 0xFFFF0000u, raw, 4), m4);
        q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(qh, bits), q, c16);
        qh = _mm512_srli_epi16(qh, 2);
        const __m512i S = scale_vec(sc.bcast, 2 * c, 2 * c, 2 * c + 1, 2 * c + 1);
        acc = _mm512_add_epi32(acc, scaled(q, load512(y->qs + 64 * c), S));
    }
    hsum2_i32(acc, sc.mins, sum_q, sum_min);
}

static float vec_dot_q2_K_q8_K_avx512(int64_t n, const void *w, const void *act) {
    const block_q2_K *x = w;
    const block_q8_K *y = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int32_t sum_q, sum_min;
        q2_K_sums(&x[b], &y[b], &sum_q, &sum_min);
        acc = fmaf(fmaf(-fp16_f32(x[b].dmin), (float)sum_min, fp16_f32(x[b].d) * (float)sum_q), y[b].d, acc);
    }
    return acc;
}

static float vec_dot_q3_K_q8_K_avx512(int64_t n, const void *w, const void *act) {
    const block_q3_K *x = w;
    const block_q8_K *y = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const int32_t sum_q = q3_K_sum(&x[b], &y[b]);
        acc = fmaf(fp16_f32(x[b].d) * (float)sum_q, y[b].d, acc);
    }
    return acc;
}

static float vec_dot_q5_K_q8_K_avx512(int64_t n, const void *w, const void *act) {
    const block_q5_K *x = w;
    const block_q8_K *y = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int32_t sum_q, sum_min;
        q5_K_sums(&x[b], &y[b], &sum_q, &sum_min);
        acc = fmaf(fmaf(-fp16_f32(x[b].dmin), (float)sum_min, fp16_f32(x[b].d) * (float)sum_q), y[b].d, acc);
    }
    return acc;
}

static float vec_dot_q6_K_q8_K_avx512(int64_t n, const void *w, const void *act) {
    const block_q6_K *x = w;
    const block_q8_K *y = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const int32_t sum_q = q6_K_sum(&x[b], &y[b]);
        acc = fmaf(fp16_f32(x[b].d) * (float)sum_q, y[b].d, acc);
    }
    return acc;
}

const vec_dot_fn vec_dot_table_avx512[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_Q2_K] = vec_dot_q2_K_q8_K_avx512,
    [PYLLM_TYPE_Q3_K] = vec_dot_q3_K_q8_K_avx512,
    [PYLLM_TYPE_Q5_K] = vec_dot_q5_K_q8_K_avx512,
    [PYLLM_TYPE_Q6_K] = vec_dot_q6_K_q8_K_avx512,
};

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
