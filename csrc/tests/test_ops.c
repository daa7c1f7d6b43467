/*
 * test_ops.c - C-level checks of the rest of the core, run plain and under ASan/UBSan (make test-c,
 * make test-asan):
 *   1. attention (decode rows, a prompt's blocks, batches of sequences) and every op kernel give the generic tier's
 *      bits in every tier the CPU runs;
 *   2. the KV cache's ring, shift and truncate;
 *   3. the thread pool, the per-thread scratch, the sampler's top-k, the string index.
 * Prints "N passed, N failed" last.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/scratch.h"
#include "core/threadpool.h"
#include "test_blocks.h"
#include "test_check.h"

/* Top-k against picking the best remaining entry k times (value descending, ties by id), on rows below and
 * above the size where the slice-maxima floor starts, random, ascending and with many ties. */
static void test_top_k(void) {
    enum { MAX_N = 9000, MAX_K = 300 };
    static float x[MAX_N];
    static int32_t got[MAX_K], want[MAX_K];
    static unsigned char taken[MAX_N];
    const int64_t sizes[] = {1, 7, 4095, 4096, MAX_N}, ks[] = {1, 2, 40, 256, MAX_K};
    int bad = 0, checked = 0;
    for (int si = 0; si < 5; ++si) {
        const int64_t n = sizes[si];
        for (int pattern = 0; pattern < 3; ++pattern) {
            for (int64_t i = 0; i < n; ++i) {
                x[i] = pattern == 0 ? rng_float(-5, 5) : pattern == 1 ? (float)i : (float)(int)rng_float(0, 4);
            }
            for (int ki = 0; ki < 5; ++ki) {
                const int64_t k = ks[ki] < n ? ks[ki] : n;
                CHECK(pyllm_top_k(x, n, k, got) == PYLLM_OK, "top-k: n %lld k %lld runs", (long long)n, (long long)k);
                memset(taken, 0, (size_t)n);
                for (int64_t r = 0; r < k; ++r) {
                    int64_t best = -1;
                    for (int64_t i = 0; i < n; ++i) {
                        if (!taken[i] && (best < 0 || x[i] > x[best])) best = i;
                    }
                    taken[best] = 1;
                    want[r] = (int32_t)best;
                }
                bad += memcmp(got, want, (size_t)k * sizeof(int32_t)) != 0;
                checked++;
            }
        }
    }
    CHECK(bad == 0, "top-k: %d of %d rows differ from the plain selection", bad, checked);
    CHECK(pyllm_top_k(x, 8, 0, got) == PYLLM_ERR_SHAPE && pyllm_top_k(x, 8, 9, got) == PYLLM_ERR_SHAPE,
          "top-k: k outside 1..n");
}

/* Queries (n_q floats) and keys and values (n_kv halves each) of an attention test, uniform in [-2, 2]. */
static void random_attention_inputs(float *q, int n_q, uint16_t *k, uint16_t *v, int n_kv) {
    for (int i = 0; i < n_q; ++i) q[i] = rng_float(-2, 2);
    for (int i = 0; i < n_kv; ++i) {
        k[i] = fp32_to_fp16(rng_float(-2, 2));
        v[i] = fp32_to_fp16(rng_float(-2, 2));
    }
}

/* Attention: every tier gives the generic kernels' bits (head sizes with and without an 8-wide tail, 1 to 8
 * heads a KV head), so do the same rows as several sequences in one batch on 1 to 3 threads, and so does
 * plain multi-head attention with each head's KV head copied out for it (the GQA indexing). */
static void test_attention_tiers_agree(void) {
    enum { M = 3, N_KV = 17, MAX_HEAD = 8, MAX_D = 72 };
    static float q[M * MAX_HEAD * MAX_D], ref[M * MAX_HEAD * MAX_D], got[M * MAX_HEAD * MAX_D];
    static uint16_t k[N_KV * MAX_HEAD * MAX_D], v[N_KV * MAX_HEAD * MAX_D], k_own[N_KV * MAX_HEAD * MAX_D],
        v_own[N_KV * MAX_HEAD * MAX_D];
    const int heads[][2] = {{4, 2}, {8, 1}, {7, 1}, {6, 3}, {3, 3}};  /* n_head, n_head_kv */
    const int32_t qpos[M] = {0, 9, 16};
    int32_t kpos[N_KV];
    for (int t = 0; t < N_KV; ++t) kpos[t] = t == 5 ? -1 : t;
    const int saved = pyllm_active_tier();
    for (int hi = 0; hi < 5; ++hi) {
        const int n_head = heads[hi][0], n_head_kv = heads[hi][1];
        for (int d = 4; d <= MAX_D; d += 17) {  /* 4, 21, 38, 55, 72 */
            random_attention_inputs(q, M * n_head * d, k, v, N_KV * n_head_kv * d);
            pyllm_set_tier(PYLLM_TIER_GENERIC);
            CHECK(pyllm_attention(q, k, v, qpos, kpos, M, N_KV, n_head, n_head_kv, d, 0.3f, 7, 0.0f, ref, 2) ==
                      PYLLM_OK, "attention generic d=%d", d);
            /* the same as multi-head attention, every head's KV head copied out for it alone */
            const int group = n_head / n_head_kv;
            for (int t = 0; t < N_KV; ++t) {
                for (int h = 0; h < n_head; ++h) {
                    memcpy(k_own + (t * n_head + h) * d, k + (t * n_head_kv + h / group) * d, sizeof(uint16_t) * (size_t)d);
                    memcpy(v_own + (t * n_head + h) * d, v + (t * n_head_kv + h / group) * d, sizeof(uint16_t) * (size_t)d);
                }
            }
            CHECK(pyllm_attention(q, k_own, v_own, qpos, kpos, M, N_KV, n_head, n_head, d, 0.3f, 7, 0.0f, got, 1) ==
                      PYLLM_OK, "attention, a KV head per head");
            CHECK(memcmp(ref, got, sizeof(float) * (size_t)(M * n_head * d)) == 0,
                  "attention %d/%d heads d=%d: differs from each head alone", n_head, n_head_kv, d);
            for (int tier = 1; tier <= pyllm_cpu_best_tier(); ++tier) {
                if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
                pyllm_set_tier(tier);
                CHECK(pyllm_attention(q, k, v, qpos, kpos, M, N_KV, n_head, n_head_kv, d, 0.3f, 7, 0.0f, got, 2) ==
                          PYLLM_OK, "attention tier %d", tier);
                CHECK(memcmp(ref, got, sizeof(float) * (size_t)(M * n_head * d)) == 0,
                      "attention %d/%d heads d=%d: tier %s differs from generic", n_head, n_head_kv, d,
                      pyllm_tier_name(tier));
            }
            for (int threads = 1; threads <= 3; ++threads) {
                pyllm_attention_call calls[M];
                for (int r = 0; r < M; ++r) {
                    calls[r] = (pyllm_attention_call){q + r * n_head * d, k, v, &qpos[r], kpos, 1, N_KV,
                                                      got + r * n_head * d, PYLLM_TYPE_F16, PYLLM_TYPE_F16};
                }
                memset(got, 0, sizeof(got));
                CHECK(pyllm_attention_batch(calls, M, n_head, n_head_kv, d, 0.3f, 7, 0.0f, threads) == PYLLM_OK,
                      "attention batch");
                CHECK(memcmp(ref, got, sizeof(float) * (size_t)(M * n_head * d)) == 0,
                      "attention %d/%d heads d=%d as a batch of sequences, %d threads: differs", n_head, n_head_kv,
                      d, threads);
            }
        }
    }
    pyllm_set_tier(saved);
}

/* Bitwise the same, any NaN matching any NaN. */
static int same_or_both_nan(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0 && !(isnan(a[i]) && isnan(b[i]))) return 0;
    }
    return 1;
}

/* Decode rows (each sequence's one query row, the serving batch's shape): the heads that share a kv head taken
 * together (head_group_kernels) give the generic tier's bits, for groups of 1 to 12 heads and head sizes of real
 * models, 1 to 3 threads, slots in ring order with holes, a sliding window, a softcap, a row that sees no key,
 * and a head whose scores are all -inf (its output 0, the others' as usual). */
static void test_decode_attention_heads(void) {
    enum { ROWS = 4, N_KV = 100, MAX_HEAD = 14, MAX_D = 256 };
    static float q[ROWS * MAX_HEAD * MAX_D], ref[ROWS * MAX_HEAD * MAX_D], got[ROWS * MAX_HEAD * MAX_D];
    static uint16_t k[N_KV * MAX_HEAD * MAX_D], v[N_KV * MAX_HEAD * MAX_D];
    const int heads[][2] = {{9, 3}, {4, 1}, {14, 2}, {8, 8}, {12, 1}, {6, 2}}, ds[] = {64, 128, 256, 72};
    int32_t kpos[N_KV];
    for (int t = 0; t < N_KV; ++t) kpos[t] = t % 13 == 6 ? -1 : (t * 37 + 11) % N_KV + 1;  /* a ring's order, holes */
    const int32_t qpos[ROWS] = {0, 40, 77, 200};  /* row 0 sees no key */
    const int saved = pyllm_active_tier();
    int bad = 0, checked = 0;
    for (int hi = 0; hi < 6; ++hi) {
        const int n_head = heads[hi][0], n_head_kv = heads[hi][1];
        for (int di = 0; di < 4; ++di) {
            const int d = ds[di];
            if (n_head * d > MAX_HEAD * MAX_D) continue;
            random_attention_inputs(q, ROWS * n_head * d, k, v, N_KV * n_head_kv * d);
            for (int t = 0; t < N_KV; ++t) k[t * n_head_kv * d] = fp32_to_fp16(rng_float(0.5f, 2));  /* kv head 0, dim 0 */
            q[2 * n_head * d] = -1e9f;  /* row 2, head 0: -inf in half precision, so every score -inf */
            for (int setting = 0; setting < 3; ++setting) {
                const int32_t window = setting == 1 ? 30 : 0;
                const float softcap = setting == 2 ? 30.0f : 0.0f;
                pyllm_attention_call calls[ROWS];
                for (int r = 0; r < ROWS; ++r) calls[r] = (pyllm_attention_call){q + r * n_head * d, k, v, &qpos[r], kpos, 1, N_KV, NULL,
                                                                                  PYLLM_TYPE_F16, PYLLM_TYPE_F16};
                pyllm_set_tier(PYLLM_TIER_GENERIC);
                for (int r = 0; r < ROWS; ++r) calls[r].out = ref + r * n_head * d;
                CHECK(pyllm_attention_batch(calls, ROWS, n_head, n_head_kv, d, 0.3f, window, softcap, 1) == PYLLM_OK,
                      "decode attention, generic");
                if (softcap == 0.0f) {  /* the -inf head is zero, the next one is not */
                    for (int i = 0; i < d; ++i) bad += ref[2 * n_head * d + i] != 0.0f;
                    bad += n_head > 1 && ref[2 * n_head * d + d] == 0.0f;
                }
                for (int tier = 1; tier <= pyllm_cpu_best_tier(); ++tier) {
                    if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
                    pyllm_set_tier(tier);
                    for (int threads = 1; threads <= 3; ++threads) {
                        for (int rows = 1; rows <= ROWS; rows += ROWS - 1) {  /* one row alone splits its heads */
                            memset(got, 0xFF, sizeof(got));
                            for (int r = 0; r < ROWS; ++r) calls[r].out = got + r * n_head * d;
                            CHECK(pyllm_attention_batch(calls + ROWS - rows, rows, n_head, n_head_kv, d, 0.3f, window,
                                                        softcap, threads) == PYLLM_OK, "decode attention");
                            const int64_t first = (int64_t)(ROWS - rows) * n_head * d;
                            bad += !same_or_both_nan(ref + first, got + first, (int64_t)rows * n_head * d);
                            ++checked;
                        }
                    }
                }
            }
        }
    }
    pyllm_set_tier(saved);
    CHECK(bad == 0, "decode attention: %d of %d differ from the generic tier", bad, checked);
}

/* A prompt's attention (37 query rows: two blocks of 16 and a last of 5, where the tier has prompt kernels) is each
 * row's attention alone, bit for bit, and the generic tier's: over slots in ring order with empty ones, rows that
 * see no key, GQA groups, a sliding window and a softcap. */
static void test_prompt_attention_is_row_attention(void) {
    enum { M = 37, N_KV = 70, MAX_HEAD = 8, MAX_D = 80 };
    static float q[M * MAX_HEAD * MAX_D], ref[M * MAX_HEAD * MAX_D], got[M * MAX_HEAD * MAX_D];
    static uint16_t k[N_KV * MAX_HEAD * MAX_D], v[N_KV * MAX_HEAD * MAX_D];
    const int heads[][2] = {{4, 2}, {8, 1}, {3, 3}}, ds[] = {16, 64, 80};
    int32_t qpos[M], kpos[N_KV];
    for (int t = 0; t < N_KV; ++t) kpos[t] = t % 9 == 4 ? -1 : (t * 37 + 11) % N_KV + 3;  /* a ring's order, holes */
    for (int r = 0; r < M; ++r) qpos[r] = 2 * r;  /* rows 0 and 1 see no key */
    const int saved = pyllm_active_tier();
    int bad = 0, checked = 0;
    for (int hi = 0; hi < 3; ++hi) {
        const int n_head = heads[hi][0], n_head_kv = heads[hi][1];
        for (int di = 0; di < 3; ++di) {
            const int d = ds[di];
            random_attention_inputs(q, M * n_head * d, k, v, N_KV * n_head_kv * d);
            for (int setting = 0; setting < 3; ++setting) {
                const int32_t window = setting == 1 ? 7 : 0;
                const float softcap = setting == 2 ? 30.0f : 0.0f;
                pyllm_set_tier(PYLLM_TIER_GENERIC);
                for (int r = 0; r < M; ++r) {
                    CHECK(pyllm_attention(q + r * n_head * d, k, v, &qpos[r], kpos, 1, N_KV, n_head, n_head_kv, d, 0.3f,
                                          window, softcap, ref + r * n_head * d, 1) == PYLLM_OK, "row attention");
                }
                for (int tier = 0; tier <= pyllm_cpu_best_tier(); ++tier) {
                    if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
                    pyllm_set_tier(tier);
                    for (int threads = 1; threads <= 3; threads += 2) {
                        memset(got, 0xFF, sizeof(got));
                        CHECK(pyllm_attention(q, k, v, qpos, kpos, M, N_KV, n_head, n_head_kv, d, 0.3f, window, softcap,
                                              got, threads) == PYLLM_OK, "prompt attention");
                        bad += memcmp(ref, got, sizeof(float) * (size_t)(M * n_head * d)) != 0;
                        ++checked;
                    }
                }
            }
        }
    }
    pyllm_set_tier(saved);
    CHECK(bad == 0, "prompt attention: %d of %d differ from the rows alone", bad, checked);
}

/* The activation quantizers: every tier writes the generic bytes, on rows with zero blocks, NaN and
 * infinities, exact halves (ties), a largest |x| met twice with both signs, and values near the float
 * limits. */
static void test_activation_quantizers_agree(void) {
    enum { N = 4 * QK_K };
    static float x[N];
    static uint8_t ref[N * 2], got[N * 2];
    for (int trial = 0; trial < 40; ++trial) {
        const float range = trial % 4 == 0 ? 1e-38f : trial % 4 == 1 ? 3e38f : rng_float(0.01f, 100.0f);
        for (int i = 0; i < N; ++i) x[i] = rng_float(-range, range);
        for (int i = 0; i < 32; ++i) x[i] = 0.0f;                  /* a zero block */
        for (int i = 32; i < 64; ++i) x[i] = (float)(i - 48) * 0.5f; /* x * 127 / 8 lands on halves */
        x[70] = 5.0f * range, x[75] = -5.0f * range;               /* one |max| twice, + first */
        x[300] = -5.0f * range, x[301] = 5.0f * range;             /* and - first */
        if (trial % 5 == 1) x[rng_u32() % N] = NAN;
        if (trial % 5 == 2) x[rng_u32() % N] = INFINITY;
        if (trial % 5 == 3) x[rng_u32() % N] = -INFINITY;
        for (int tier = 1; tier <= pyllm_cpu_best_tier(); ++tier) {
            if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
            const op_kernels *generic = tier_ops(PYLLM_TIER_GENERIC)->ops, *fast = tier_ops(tier)->ops;
            const quantize_row_fn pairs[3][2] = {{generic->quantize_q8_0, fast->quantize_q8_0},
                                                 {generic->quantize_q8_1, fast->quantize_q8_1},
                                                 {generic->quantize_q8_K, fast->quantize_q8_K}};
            const int sizes[3] = {(int)sizeof(block_q8_0) * N / QK32, (int)sizeof(block_q8_1) * N / QK32,
                                  (int)sizeof(block_q8_K) * N / QK_K};
            for (int f = 0; f < 3; ++f) {
                memset(ref, 0xAB, sizeof(ref));
                memset(got, 0xAB, sizeof(got));
                pairs[f][0](x, ref, N);
                pairs[f][1](x, got, N);
                CHECK(memcmp(ref, got, (size_t)sizes[f]) == 0, "activation quantizer %d, trial %d: tier %s differs",
                      f, trial, pyllm_tier_name(tier));
            }
        }
    }
}

/* GeGLU: every tier gives the generic bits, with any table (random halves here), at the +-10 edges, on
 * gates that round to them in half precision, on tiny and subnormal gates, and on a tail shorter than 8. */
static void test_geglu_agrees(void) {
    enum { N = 203 };
    static fp16_t table[(1 << 16) + 1];
    static float g[N], u[N], y_ref[N], y_got[N];
    for (int i = 0; i <= 1 << 16; ++i) table[i] = fp32_to_fp16(rng_float(-4, 4));
    const float specials[] = {10.0f, -10.0f, 9.999f, -9.999f, 10.001f, -10.001f, 0.0f, -0.0f, 1e-6f, -3e-8f, 6e-5f, 1e30f};
    for (int i = 0; i < N; ++i) {
        g[i] = i < 12 ? specials[i] : rng_float(-12, 12) * (i % 7 == 0 ? 1e-4f : 1.0f);
        u[i] = rng_float(-3, 3);
    }
    const op_kernels *generic = tier_ops(PYLLM_TIER_GENERIC)->ops;
    generic->geglu(table, g, u, y_ref, N);
    for (int tier = 1; tier <= pyllm_cpu_best_tier(); ++tier) {
        if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
        tier_ops(tier)->ops->geglu(table, g, u, y_got, N);
        CHECK(memcmp(y_ref, y_got, sizeof(y_ref)) == 0, "geglu: tier %s differs from generic", pyllm_tier_name(tier));
    }
}

/* to_half and round_half: every tier writes the generic halves (and their floats): overflow to infinity, the
 * largest half and its midpoint, subnormal results and their ties, NaNs (quiet and signalling, with payloads),
 * and random floats. */
static void test_to_half_agrees(void) {
    enum { N = 1000 };
    static float x[N], rounded_ref[N], rounded_got[N];
    static fp16_t ref[N], got[N];
    const uint32_t special_bits[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u, 0xFFA5A5A5u, 0x477FE000u,
                                     0x477FF000u, 0x477FEFFFu, 0x33000000u, 0x33000001u, 0x38800000u, 0x387FFFFFu,
                                     0x00000001u, 0x80000000u, 0x3F800000u, 0x33800000u};
    for (int i = 0; i < N; ++i) {
        uint32_t bits = i < 16 ? special_bits[i] : rng_u32();
        if (i >= 16 && i % 3 == 0) bits = (bits & 0x8FFFFFFFu) | 0x30000000u;  /* many near the half range */
        memcpy(&x[i], &bits, 4);
    }
    tier_ops(PYLLM_TIER_GENERIC)->ops->to_half(x, ref, N);
    tier_ops(PYLLM_TIER_GENERIC)->ops->round_half(x, rounded_ref, N);
    int finite_as_halves = 1;  /* round_half's finite results are to_half's halves, as floats */
    for (int i = 0; i < N; ++i) finite_as_halves &= isnan(rounded_ref[i]) || rounded_ref[i] == fp16_to_fp32(ref[i]);
    CHECK(finite_as_halves, "round_half: generic is not to_half's halves as floats");
    for (int tier = 1; tier <= pyllm_cpu_best_tier(); ++tier) {
        if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
        tier_ops(tier)->ops->to_half(x, got, N);
        CHECK(memcmp(ref, got, sizeof(ref)) == 0, "to_half: tier %s differs from generic", pyllm_tier_name(tier));
        tier_ops(tier)->ops->round_half(x, rounded_got, N - 3);  /* an 8-wide tail too */
        CHECK(memcmp(rounded_ref, rounded_got, (N - 3) * sizeof(float)) == 0, "round_half: tier %s differs from generic",
              pyllm_tier_name(tier));
    }
}

/* The non-matmul kernels: every tier gives the generic bits (lengths with and without an 8-wide tail,
 * masked scores, zero weights, inputs that reach exp_ggml's scaled and overflow branches); exp_ggml is
 * within 2 ulp of exp wherever its result is a normal float. */
/* Each tier's rope_head is generic's, bit for bit: both styles, head sizes and rotated widths with and without
 * a tail past the vector steps, angles from pyllm_rope_angles at far positions. */
static void test_rope_agrees(void) {
    enum { MAX_D = 256 };
    static float ref[MAX_D], got[MAX_D], cos_sin[MAX_D];
    const op_kernels *generic = tier_ops(PYLLM_TIER_GENERIC)->ops;
    const int64_t n_rots[] = {2, 6, 8, 14, 16, 30, 64, 128, 256};
    int checked = 0, bad = 0;
    for (int tier = 1; tier <= pyllm_cpu_best_tier(); ++tier) {
        if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
        const op_kernels *fast = tier_ops(tier)->ops;
        for (int ri = 0; ri < 9; ++ri) {
            for (int neox = 0; neox <= 1; ++neox) {
                const int32_t pos = (int32_t)(rng_u32() % 40000);
                pyllm_rope_angles(&pos, 1, n_rots[ri], 10000.0f, 1.0f, cos_sin);
                for (int i = 0; i < MAX_D; ++i) ref[i] = got[i] = rng_float(-8, 8);
                generic->rope_head(ref, cos_sin, n_rots[ri], neox);
                fast->rope_head(got, cos_sin, n_rots[ri], neox);
                bad += memcmp(ref, got, sizeof ref) != 0;
                ++checked;
            }
        }
    }
    CHECK(bad == 0, "rope_head: %d of %d heads differ from generic's", bad, checked);
}

/* Each tier's argmax is generic's: the first index of the maximum, with ties, infinities, -0 against +0, NaN
 * anywhere (flagged by both), every length up to past two vectors. */
static void test_argmax_agrees(void) {
    enum { MAX_N = 40 };
    float x[MAX_N];
    const op_kernels *generic = tier_ops(PYLLM_TIER_GENERIC)->ops;
    int checked = 0, bad = 0;
    for (int tier = 1; tier <= pyllm_cpu_best_tier(); ++tier) {
        if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
        const op_kernels *fast = tier_ops(tier)->ops;
        for (int n = 1; n <= MAX_N; ++n) {
            for (int kind = 0; kind < 6; ++kind) {
                for (int i = 0; i < n; ++i) {
                    x[i] = kind == 1 ? (float)(rng_u32() % 3) : kind == 2 ? -INFINITY : rng_float(-5, 5);
                    if (kind == 3 && rng_u32() % 4 == 0) x[i] = rng_u32() % 2 ? 0.0f : -0.0f;
                }
                if (kind == 4) x[rng_u32() % n] = INFINITY;
                if (kind == 5) x[rng_u32() % n] = NAN;
                int nan_ref, nan_got;
                const int64_t want = generic->argmax(x, n, &nan_ref), got = fast->argmax(x, n, &nan_got);
                bad += nan_ref != nan_got || (!nan_ref && want != got);
                ++checked;
            }
        }
    }
    CHECK((checked > 0 || pyllm_cpu_best_tier() == PYLLM_TIER_GENERIC) && bad == 0,
          "argmax: %d of %d rows differ from generic's", bad, checked);
    float row[3] = {1.0f, 5.0f, 2.0f}, scratch[3], top;
    const int64_t ids[2] = {1, 2}, outside[1] = {3}, lifted[1] = {0}, tied[2] = {2, 0};
    const float vals[2] = {-10.0f, 1.0f}, lift[1] = {5.0f}, ties[2] = {3.0f, 4.0f};
    int64_t index;
    int nan;
    /* the leader biased down: the whole biased row */
    CHECK(pyllm_argmax(row, 3, ids, vals, 2, scratch, &index, &top, &nan) == PYLLM_OK && index == 2 && top == 3.0f &&
          !nan && row[1] == 5.0f, "argmax with the leader biased");
    /* the leader unbiased: it or a biased entry, the first of equal values */
    CHECK(pyllm_argmax(row, 3, lifted, lift, 1, scratch, &index, &top, &nan) == PYLLM_OK && index == 0 && top == 6.0f &&
          !nan, "argmax with another entry biased past the leader");
    CHECK(pyllm_argmax(row, 3, tied, ties, 2, scratch, &index, &top, &nan) == PYLLM_OK && index == 0 && top == 5.0f &&
          !nan, "argmax with biased entries tied with the leader");
    const float nan_bias[1] = {NAN};
    CHECK(pyllm_argmax(row, 3, lifted, nan_bias, 1, scratch, &index, &top, &nan) == PYLLM_OK && nan,
          "argmax: a NaN bias makes a NaN row");
    CHECK(pyllm_argmax(row, 3, outside, vals, 1, scratch, &index, &top, &nan) == PYLLM_ERR_SHAPE, "argmax: bias id 3 of 3");
}

static void test_op_kernels_agree(void) {
    enum { MAX_N = 100, MAX_D = 140 };
    static float s_ref[MAX_N], s_got[MAX_N], p[MAX_N], out_ref[MAX_D], out_got[MAX_D];
    static float g[MAX_N], u[MAX_N], y_ref[MAX_N], y_got[MAX_N];
    static uint16_t v[MAX_N * 2 * MAX_D];
    const op_kernels *generic = tier_ops(PYLLM_TIER_GENERIC)->ops;
    const int lengths[] = {1, 5, 8, 13, 64, 100};
    const float specials[] = {0.0f, -0.0f, 88.0f, -88.0f, 87.3f, -87.3f, 100.0f, -100.0f, 150.0f, -150.0f,
                              1e30f, -1e30f, 1e-30f, -1e-30f};
    for (int tier = 1; tier <= pyllm_cpu_best_tier(); ++tier) {
        if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
        const op_kernels *fast = tier_ops(tier)->ops;
        for (int li = 0; li < 6; ++li) {
            const int n = lengths[li];
            float max = -INFINITY;
            for (int t = 0; t < n; ++t) {
                s_ref[t] = rng_u32() % 7 == 0 ? -INFINITY : rng_float(-40, 10) * (t % 11 == 3 ? 30.0f : 1.0f);
                max = s_ref[t] > max ? s_ref[t] : max;
            }
            if (max == -INFINITY) {  /* at least one visible score */
                s_ref[0] = 0.0f;
                max = 0.0f;
            }
            memcpy(s_got, s_ref, sizeof(float) * (size_t)n);
            const float max_ref = generic->scale_max(s_ref, n, 0.37f), max_got = fast->scale_max(s_got, n, 0.37f);
            CHECK(memcmp(s_ref, s_got, sizeof(float) * (size_t)n) == 0 && max_ref == max_got &&
                      (max_ref == -INFINITY) == (max == -INFINITY),
                  "scale_max n=%d tier %s: %.9g != generic %.9g", n, pyllm_tier_name(tier), max_got, max_ref);
            max = max_ref;
            static float plain_ref[MAX_N], plain_got[MAX_N];
            memcpy(plain_ref, s_ref, sizeof(float) * (size_t)n);
            memcpy(plain_got, s_ref, sizeof(float) * (size_t)n);
            generic->softmax(plain_ref, n, max);
            fast->softmax(plain_got, n, max);
            CHECK(memcmp(plain_ref, plain_got, sizeof(float) * (size_t)n) == 0, "softmax n=%d tier %s", n,
                  pyllm_tier_name(tier));
            generic->softmax_half(s_ref, n, max);
            fast->softmax_half(s_got, n, max);
            CHECK(memcmp(s_ref, s_got, sizeof(float) * (size_t)n) == 0, "softmax_half n=%d tier %s", n,
                  pyllm_tier_name(tier));
            for (int t = 0; t < n; ++t) {
                g[t] = t < 14 ? specials[t] : rng_float(-20, 20) * (t % 5 == 0 ? 10.0f : 1.0f);
                u[t] = rng_float(-2, 2);
                p[t] = rng_u32() % 5 == 0 ? 0.0f : fp16_to_fp32(fp32_to_fp16(rng_float(0, 1)));
            }
            generic->scale_row(g, u, y_ref, n, 0.37f);
            fast->scale_row(g, u, y_got, n, 0.37f);
            CHECK(memcmp(y_ref, y_got, sizeof(float) * (size_t)n) == 0, "scale_row n=%d tier %s", n, pyllm_tier_name(tier));
            generic->scale_row(g, NULL, y_ref, n, 0.37f);
            memcpy(y_got, g, sizeof(float) * (size_t)n);
            fast->scale_row(y_got, NULL, y_got, n, 0.37f);  /* in place */
            CHECK(memcmp(y_ref, y_got, sizeof(float) * (size_t)n) == 0, "scale_row in place, no weight, n=%d tier %s", n,
                  pyllm_tier_name(tier));
            generic->swiglu(g, u, y_ref, n);
            fast->swiglu(g, u, y_got, n);
            CHECK(memcmp(y_ref, y_got, sizeof(float) * (size_t)n) == 0, "swiglu n=%d tier %s", n, pyllm_tier_name(tier));
            memcpy(y_ref, u, sizeof(float) * (size_t)n);
            memcpy(y_got, u, sizeof(float) * (size_t)n);
            generic->add_scaled(y_ref, 0.37f, g, n);
            fast->add_scaled(y_got, 0.37f, g, n);
            CHECK(memcmp(y_ref, y_got, sizeof(float) * (size_t)n) == 0, "add_scaled n=%d tier %s", n,
                  pyllm_tier_name(tier));
            for (int d = 4; d <= MAX_D; d += 17) {
                for (int i = 0; i < n * 2 * d; ++i) v[i] = fp32_to_fp16(rng_float(-2, 2));
                generic->weighted_sum(p, v, 2 * d, n, d, out_ref);
                fast->weighted_sum(p, v, 2 * d, n, d, out_got);
                CHECK(memcmp(out_ref, out_got, sizeof(float) * (size_t)d) == 0, "weighted_sum n=%d d=%d tier %s", n,
                      d, pyllm_tier_name(tier));
            }
        }
    }
    {  /* a quantized cache's values, decoded */
        static float x[128], ref[128], got[128];
        static uint8_t q8[4 * sizeof(block_q8_0)], q4[4 * sizeof(block_q4_0)];
        for (int i = 0; i < 128; ++i) x[i] = rng_float(-3, 3) * (i % 29 == 0 ? 50.0f : 1.0f);
        quantize_row_q8_0_act(x, q8, 128);
        quantize_table[PYLLM_TYPE_Q4_0](x, q4, 128);
        for (int tier = 1; tier <= pyllm_cpu_best_tier(); ++tier) {
            if (!tier_runs(tier)) continue;
            const op_kernels *fast = tier_ops(tier)->ops;
            generic->dequantize_q8_0(q8, ref, 128);
            fast->dequantize_q8_0(q8, got, 128);
            CHECK(memcmp(ref, got, sizeof(ref)) == 0, "dequantize_q8_0 tier %s", pyllm_tier_name(tier));
            generic->dequantize_q4_0(q4, ref, 128);
            fast->dequantize_q4_0(q4, got, 128);
            CHECK(memcmp(ref, got, sizeof(ref)) == 0, "dequantize_q4_0 tier %s", pyllm_tier_name(tier));
        }
    }
    test_rope_agrees();
    test_argmax_agrees();
    test_activation_quantizers_agree();
    test_geglu_agrees();
    test_to_half_agrees();
    int within = 1;
    for (int i = 0; i < 200000; ++i) {
        const float x = rng_float(-87.0f, 88.0f);
        const double want = exp((double)x);
        const double ulp = (double)nextafterf((float)want, INFINITY) - (double)(float)want;
        if (fabs((double)exp_ggml(x) - want) > 2.0 * ulp) within = 0;
    }
    CHECK(within, "exp_ggml within 2 ulp of exp on [-87, 88]");
    CHECK(exp_ggml(-200.0f) == 0.0f && isinf(exp_ggml(200.0f)) && exp_ggml(0.0f) == 1.0f, "exp_ggml at the edges");
}

/* KV cache layers: a ring keeps the last `capacity` positions in slot p % capacity; a shift drops
 * positions [keep, keep + discard), moves the rest down and re-rotates their keys. */
static void test_kv_cache_layer(void) {
    enum { CAP = 6, HEADS = 2, DIM = 4, ROW = HEADS * DIM, N = 9 };
    uint16_t k[CAP * ROW], v[CAP * ROW];
    int32_t positions[CAP];
    float kin[N * ROW], vin[N * ROW];
    int32_t pos[N];
    for (int i = 0; i < N * ROW; ++i) {
        kin[i] = rng_float(-1, 1);
        vin[i] = rng_float(-1, 1);
    }
    for (int r = 0; r < N; ++r) pos[r] = r;
    const pyllm_kv_layer ring = {k, v, positions, CAP, ROW, ROW, 1, PYLLM_TYPE_F16, PYLLM_TYPE_F16, 0, 0};
    for (int s = 0; s < CAP; ++s) positions[s] = -1;
    CHECK(pyllm_kv_store(&ring, pos, kin, vin, 5) == PYLLM_OK && pyllm_kv_store(&ring, pos + 5, kin + 5 * ROW,
          vin + 5 * ROW, N - 5) == PYLLM_OK, "ring store");
    int ok = 1;
    for (int p = N - CAP; p < N; ++p) {
        ok &= positions[p % CAP] == p && k[p % CAP * ROW + 3] == fp32_to_fp16(kin[p * ROW + 3]) &&
              v[p % CAP * ROW + 5] == fp32_to_fp16(vin[p * ROW + 5]);
    }
    CHECK(ok, "a ring holds the last %d positions at p %% capacity", CAP);
    CHECK(pyllm_kv_store(&ring, (const int32_t[]){-1}, kin, vin, 1) == PYLLM_ERR_SHAPE, "negative position");

    /* full layer: positions 0..5; drop [1, 3): 3, 4, 5 move to 1, 2, 3, keys rotated by -2 */
    const pyllm_kv_layer full = {k, v, positions, CAP, ROW, ROW, 0, PYLLM_TYPE_F16, PYLLM_TYPE_F16, 0, 0};
    for (int s = 0; s < CAP; ++s) positions[s] = -1;
    CHECK(pyllm_kv_store(&full, pos, kin, vin, CAP) == PYLLM_OK, "full store");
    CHECK(pyllm_kv_store(&full, (const int32_t[]){CAP}, kin, vin, 1) == PYLLM_ERR_SHAPE, "past the end");
    CHECK(pyllm_kv_shift(&full, 1, 2, HEADS, DIM, DIM, 10000.0f, 1.0f, 0) == PYLLM_OK, "shift");
    ok = positions[0] == 0 && positions[4] == -1 && positions[5] == -1;
    for (int p = 3; p < CAP; ++p) {
        float want[ROW];
        for (int i = 0; i < ROW; ++i) want[i] = fp16_to_fp32(fp32_to_fp16(kin[p * ROW + i]));
        pyllm_rope(want, (const int32_t[]){-2}, 1, HEADS, DIM, DIM, 10000.0f, 1.0f, 0);
        for (int i = 0; i < ROW; ++i) {
            ok &= k[(p - 2) * ROW + i] == fp32_to_fp16(want[i]) && v[(p - 2) * ROW + i] == fp32_to_fp16(vin[p * ROW + i]);
        }
        ok &= positions[p - 2] == p - 2;
    }
    CHECK(ok, "shift moves, re-rotates and keeps values");
    pyllm_kv_truncate(&full, 1);
    CHECK(positions[0] == 0 && positions[1] == -1, "truncate");
}

/* The pool under rapidly changing team sizes: every task runs exactly once per member, and never
 * after pyllm_pool_run has returned (a stale run would touch the next task's context). */
typedef struct {
    atomic_int runs;
    atomic_int stale;
    atomic_int open;
} pool_probe;

static void probe_task(void *arg, int ith, int nth) {
    pool_probe *probe = arg;
    (void)ith;
    (void)nth;
    if (!atomic_load(&probe->open)) atomic_fetch_add(&probe->stale, 1);
    atomic_fetch_add(&probe->runs, 1);
}

static void test_pool_team_sizes(void) {
    static pool_probe probes[2];
    int bad_runs = 0, stale = 0, errors = 0;
    for (int i = 0; i < 10000; ++i) {
        pool_probe *probe = &probes[i % 2];
        const int nth = 2 + (i * 7 + i / 3) % 3;  /* 2, 3, 4 in a shifting pattern: workers often sit out */
        atomic_store(&probe->runs, 0);
        atomic_store(&probe->open, 1);
        errors += pyllm_pool_run(nth, probe_task, probe) != PYLLM_OK;
        atomic_store(&probe->open, 0);
        bad_runs += atomic_load(&probe->runs) != nth;
        stale += atomic_exchange(&probes[(i + 1) % 2].stale, 0);
    }
    CHECK(bad_runs == 0 && stale == 0 && errors == 0,
          "thread pool: %d tasks ran a wrong number of times, %d stale runs, %d errors", bad_runs, stale, errors);
}

/* The string index against a linear search: first match, repeats, the empty string, absent texts. */
static void test_string_index(void) {
    const char *texts[] = {"ab", "a", "", "abc", "a", "\xe2\x96\x81x", "", "b"};
    const int64_t n = sizeof(texts) / sizeof(texts[0]);
    char blob[64];
    int64_t offsets[sizeof(texts) / sizeof(texts[0]) + 1] = {0};
    for (int64_t i = 0; i < n; ++i) {
        const size_t len = strlen(texts[i]);
        memcpy(blob + offsets[i], texts[i], len);
        offsets[i + 1] = offsets[i] + (int64_t)len;
    }
    int64_t first_repeat = 0;
    pyllm_string_index *index = pyllm_string_index_new(blob, offsets, n, &first_repeat);
    CHECK(index != NULL && first_repeat == 4, "string index: first repeat %lld", (long long)first_repeat);
    const char *queries[] = {"ab", "a", "", "abc", "\xe2\x96\x81x", "b", "abcd", "ba", "\xe2\x96\x81"};
    for (size_t q = 0; index != NULL && q < sizeof(queries) / sizeof(queries[0]); ++q) {
        int64_t want = -1;
        for (int64_t i = 0; i < n && want < 0; ++i) {
            if (strcmp(texts[i], queries[q]) == 0) want = i;
        }
        const int64_t got = pyllm_string_index_find(index, queries[q], (int64_t)strlen(queries[q]));
        CHECK(got == want, "string index: %s -> %lld, want %lld", queries[q], (long long)got, (long long)want);
    }
    pyllm_string_index_free(index);
    const int64_t descending[] = {0, 2, 1};
    CHECK(pyllm_string_index_new(blob, descending, 2, &first_repeat) == NULL, "string index: descending offsets");
}

/* pyllm_scratch: 64-byte aligned, kept for a smaller request, grown for a larger one, one buffer per slot and
 * per thread (a worker's differs from the caller's). */
static void *scratch_in_thread(void *arg) {
    (void)arg;
    return pyllm_scratch(SCRATCH_MATMUL, 100);
}

static void test_scratch(void) {
    unsigned char *a = pyllm_scratch(SCRATCH_MATMUL, 1000);
    CHECK(a != NULL && (uintptr_t)a % 64 == 0, "scratch: aligned");
    memset(a, 7, 1000);
    CHECK(pyllm_scratch(SCRATCH_MATMUL, 10) == a, "scratch: kept for a smaller request");
    unsigned char *blocks = pyllm_scratch(SCRATCH_BLOCKS, 1000);
    CHECK(blocks != NULL && blocks != a, "scratch: one buffer per slot");
    memset(blocks, 1, 1000);
    CHECK(a[999] == 7, "scratch: slots do not overlap");
    unsigned char *big = pyllm_scratch(SCRATCH_MATMUL, 1 << 20);
    CHECK(big != NULL && (uintptr_t)big % 64 == 0, "scratch: grown");
    memset(big, 3, 1 << 20);  /* the whole size is writable (ASan) */
    pthread_t worker;
    void *theirs = NULL;
    CHECK(pthread_create(&worker, NULL, scratch_in_thread, NULL) == 0 && pthread_join(worker, &theirs) == 0,
          "scratch: thread");
    CHECK(theirs != NULL && theirs != big, "scratch: per thread");
    CHECK(pyllm_scratch(SCRATCH_SLOTS, 10) == NULL, "scratch: unknown slot");
}

/* A quantized cache: keys and values stored through pyllm_kv_store (q8_0, q4_0, mixed with f16; a ring
 * overwriting slots), then attention over them: every tier gives the generic bits, and the prompt's 16-row blocks
 * give the bits of each row alone; a key type whose blocks do not fit a head is refused. */
static void test_quantized_cache_attention(void) {
    enum { M = 18, CAP = 24, N_HEAD = 4, N_HEAD_KV = 2, D = 64, ROW = N_HEAD_KV * D };
    static const int types[][2] = {{PYLLM_TYPE_Q8_0, PYLLM_TYPE_Q8_0}, {PYLLM_TYPE_Q4_0, PYLLM_TYPE_F16},
                                   {PYLLM_TYPE_F16, PYLLM_TYPE_Q4_0}, {PYLLM_TYPE_Q5_1, PYLLM_TYPE_Q4_1}};
    static float q[M * N_HEAD * D], kin[30 * ROW], vin[30 * ROW], ref[M * N_HEAD * D], got[M * N_HEAD * D];
    static uint8_t k[CAP * ROW * 2], v[CAP * ROW * 2];
    int32_t positions[CAP], pos[30];
    for (int i = 0; i < M * N_HEAD * D; ++i) q[i] = rng_float(-2, 2);
    for (int i = 0; i < 30 * ROW; ++i) kin[i] = rng_float(-2, 2), vin[i] = rng_float(-2, 2);
    for (int r = 0; r < 30; ++r) pos[r] = r;
    const int saved = pyllm_active_tier();
    for (int ti = 0; ti < 4; ++ti) {
        const pyllm_kv_layer ring = {k, v, positions, CAP, ROW, ROW, 1, types[ti][0], types[ti][1], 0, 0};
        for (int s = 0; s < CAP; ++s) positions[s] = -1;
        CHECK(pyllm_kv_store(&ring, pos, kin, vin, 30) == PYLLM_OK, "quantized store %d", ti);
        const int32_t *qpos = pos + 30 - M;
        pyllm_attention_call call = {q, k, v, qpos, positions, M, CAP, ref, types[ti][0], types[ti][1]};
        pyllm_set_tier(PYLLM_TIER_GENERIC);
        CHECK(pyllm_attention_batch(&call, 1, N_HEAD, N_HEAD_KV, D, 0.2f, 10, 0.0f, 2) == PYLLM_OK, "generic %d", ti);
        for (int tier = 1; tier <= pyllm_cpu_best_tier(); ++tier) {
            if (!tier_runs(tier)) continue;
            pyllm_set_tier(tier);
            call.out = got;
            CHECK(pyllm_attention_batch(&call, 1, N_HEAD, N_HEAD_KV, D, 0.2f, 10, 0.0f, 2) == PYLLM_OK &&
                      memcmp(ref, got, sizeof(ref)) == 0, "quantized cache %d: tier %s differs", ti, pyllm_tier_name(tier));
        }
        pyllm_set_tier(saved);
        pyllm_attention_call rows[M];
        for (int r = 0; r < M; ++r) {
            rows[r] = (pyllm_attention_call){q + r * N_HEAD * D, k, v, qpos + r, positions, 1, CAP, got + r * N_HEAD * D,
                                             types[ti][0], types[ti][1]};
        }
        memset(got, 0, sizeof(got));
        CHECK(pyllm_attention_batch(rows, M, N_HEAD, N_HEAD_KV, D, 0.2f, 10, 0.0f, 3) == PYLLM_OK &&
                  memcmp(ref, got, sizeof(ref)) == 0, "quantized cache %d: rows alone differ from the blocks", ti);
    }
    const pyllm_attention_call odd = {q, k, v, pos, positions, 1, CAP, got, PYLLM_TYPE_Q8_0, PYLLM_TYPE_Q8_0};
    CHECK(pyllm_attention_batch(&odd, 1, N_HEAD, N_HEAD_KV, 48, 0.2f, 0, 0.0f, 1) == PYLLM_ERR_TYPE, "48-wide heads");
    const pyllm_kv_layer bad = {k, v, positions, CAP, ROW, ROW, 1, PYLLM_TYPE_Q2_K, PYLLM_TYPE_F16, 0, 0};
    CHECK(pyllm_kv_store(&bad, pos, kin, vin, 1) == PYLLM_ERR_TYPE, "a q2_K cache");
    const pyllm_kv_layer spanning = {k, v, positions, CAP, ROW, ROW, 0, PYLLM_TYPE_Q8_0, PYLLM_TYPE_Q8_0, 48, 0};
    CHECK(pyllm_kv_store(&spanning, pos, kin, vin, 1) == PYLLM_ERR_TYPE, "a rotation of 48");

    /* a shift of rotated q8_0 keys: each moved key decoded, rotated back, roped by -2, rotated and quantized again */
    CHECK(pyllm_kv_rotation(PYLLM_TYPE_Q8_0, 64, 0) == 64 && pyllm_kv_rotation(PYLLM_TYPE_Q8_0, 256, 0) == 256 &&
              pyllm_kv_rotation(PYLLM_TYPE_Q4_0, 256, 1) == 64 && pyllm_kv_rotation(PYLLM_TYPE_F16, 128, 0) == 0 &&
              pyllm_kv_rotation(PYLLM_TYPE_Q8_0, 96, 0) == 0, "rotation sizes (llama.cpp's rule)");
    const pyllm_kv_layer full = {k, v, positions, CAP, ROW, ROW, 0, PYLLM_TYPE_Q8_0, PYLLM_TYPE_Q8_0, 64, 0};
    for (int s = 0; s < CAP; ++s) positions[s] = -1;
    CHECK(pyllm_kv_store(&full, pos, kin, vin, 8) == PYLLM_OK, "rotated store");
    static uint8_t before[8 * ROW * 2];
    const int64_t row_bytes = ROW / 32 * (int64_t)sizeof(block_q8_0);
    memcpy(before, k, (size_t)(8 * row_bytes));
    CHECK(pyllm_kv_shift(&full, 1, 2, N_HEAD_KV, D, D, 10000.0f, 1.0f, 0) == PYLLM_OK, "rotated shift");
    int same = positions[0] == 0 && positions[1] == 1 && positions[5] == 5 && positions[6] == -1;
    for (int p = 3; p < 8; ++p) {
        float key[ROW];
        uint8_t want[ROW * 2];
        dequantize_table[PYLLM_TYPE_Q8_0](before + p * row_bytes, key, ROW);
        pyllm_hadamard(key, ROW / 64, 64);
        pyllm_rope(key, (const int32_t[]){-2}, 1, N_HEAD_KV, D, D, 10000.0f, 1.0f, 0);
        pyllm_hadamard(key, ROW / 64, 64);
        tier_ops(pyllm_active_tier())->ops->quantize_q8_0(key, want, ROW);
        same &= memcmp(want, k + (p - 2) * row_bytes, (size_t)row_bytes) == 0;
    }
    CHECK(same, "a shift of rotated keys");
}

int main(void) {
    printf("cpu tier: %s\n", pyllm_tier_name(pyllm_cpu_best_tier()));
    test_pool_team_sizes();
    test_attention_tiers_agree();
    test_decode_attention_heads();
    test_prompt_attention_is_row_attention();
    test_op_kernels_agree();
    test_kv_cache_layer();
    test_quantized_cache_attention();
    test_top_k();
    test_string_index();
    test_scratch();
    return check_report();
}
