/*
 * ops_avx512.c - a prompt's attention on AVX-512 (quants.h, prompt_attention_kernels): keys and values
 * converted to float once for a block of queries, then 16 keys (dot products) or 16 dimensions (weighted
 * sums) in the lanes of a vector, each lane in the order of the generic dots and weighted_sum. A key block
 * (16 keys of d floats) or a value chunk (16 dimensions of every key) is what stays in L1 while ops.c runs
 * the block's queries over it.
 *
 * Compiled for AVX-512 F by pragma; dispatch.c hands these out only on CPUs with it.
 */
#include "quants.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq")
#endif

/* kt: 16-key blocks, block b's dimension i of key 16 b + j at kt[(b * d + i) * 16 + j], by gathers of the
 * keys' two halves at i and i + 1 (a last block's missing keys zero; d is even); vf: 16-dimension chunks,
 * chunk c's value of key t at vf[(c * n + t) * 16 + j]. So each kernel below reads its operand in order. */
static void kv_to_float_avx512(const fp16_t *k, const fp16_t *v, int64_t stride, int64_t n, int64_t d, float *kt,
                               float *vf) {
    const __m512i keys = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int32_t)(stride * (int64_t)sizeof(fp16_t))));
    for (int64_t t0 = 0; t0 < n; t0 += 16) {
        const __mmask16 real = n - t0 >= 16 ? 0xFFFF : (__mmask16)((1u << (n - t0)) - 1);
        const fp16_t *block = k + t0 * stride;
        float *out = kt + t0 * d;
        for (int64_t i = 0; i < d; i += 2) {
            const __m512i pairs = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), real, keys, block + i, 1);
            _mm512_store_ps(out + i * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(pairs)));
            _mm512_store_ps(out + (i + 1) * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16))));
        }
    }
    for (int64_t c = 0; c < d / 16; ++c) {
        for (int64_t t = 0; t < n; ++t) {
            const __m256i halves = _mm256_loadu_si256((const __m256i *)(v + t * stride + 16 * c));
            _mm512_store_ps(vf + (c * n + t) * 16, _mm512_cvtph_ps(halves));
        }
    }
}

/* The 16 keys of one block of kt: accumulator l (lanes: the keys) takes dimensions i = l mod 8 in order, then
 * the halving tree across the eight, as dots_generic's lanes. */
static void dots_t_avx512(const float *q, const float *block, int64_t d, float *out) {
    __m512 acc[8];
    for (int l = 0; l < 8; ++l) acc[l] = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
#pragma GCC unroll 8
        for (int l = 0; l < 8; ++l) acc[l] = _mm512_fmadd_ps(_mm512_set1_ps(q[i + l]), _mm512_load_ps(block + (i + l) * 16), acc[l]);
    }
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[2], acc[6])),
                                        _mm512_add_ps(_mm512_add_ps(acc[1], acc[5]), _mm512_add_ps(acc[3], acc[7]))));
}

/* Key t's step of a weighted_sum chain: acc += p[t] * value, skipped (by mask, not a branch) where p[t] is 0. */
static inline __m512 weighted_step(__m512 acc, float p, const float *value) {
    const __m512 weight = _mm512_set1_ps(p);
    return _mm512_mask3_fmadd_ps(weight, _mm512_load_ps(value), acc, _mm512_cmpneq_ps_mask(weight, _mm512_setzero_ps()));
}

/* 16 dimensions of weighted_sum over one chunk of vf (its keys from p's first on): the eight chains of keys
 * t = l mod 8 (t counted from p's start, a multiple of 8 from the cache's) and their tree. */
static void weighted_sum_f_avx512(const float *p, const float *chunk, int64_t n, float *out) {
    __m512 acc[8];
    for (int l = 0; l < 8; ++l) acc[l] = _mm512_setzero_ps();
    int64_t t8 = 0;
    for (; t8 + 8 <= n; t8 += 8) {
#pragma GCC unroll 8
        for (int l = 0; l < 8; ++l) acc[l] = weighted_step(acc[l], p[t8 + l], chunk + (t8 + l) * 16);
    }
    for (int l = 0; t8 + l < n; ++l) acc[l] = weighted_step(acc[l], p[t8 + l], chunk + (t8 + l) * 16);
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[2], acc[6])),
                                        _mm512_add_ps(_mm512_add_ps(acc[1], acc[5]), _mm512_add_ps(acc[3], acc[7]))));
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const prompt_attention_kernels prompt_attention_avx512 = {kv_to_float_avx512, dots_t_avx512, weighted_sum_f_avx512};

#else /* not x86-64 with GCC or clang */

const prompt_attention_kernels prompt_attention_avx512 = {0};

#endif
