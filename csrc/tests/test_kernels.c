/*
 * test_kernels.c - C-level checks of the matmul kernels, run plain and under ASan/UBSan (make test-c,
 * make test-asan):
 *   1. every SIMD tier's vec_dot gives the same bits as the generic one, on random blocks of every weight type and
 *      lengths of 1..9 blocks, and is close to the float dot of the dequantized inputs;
 *   2. every other shape of every tier's kernel sets (rows4, rows8, prepared, cols4, panels, tiles) gives its
 *      vec_dot's bits;
 *   3. matmul rows are bit-identical whatever M and the thread count, several weights at once as each alone, the
 *      repacked layouts as their plain matrices;
 *   4. bad arguments are refused.
 * Prints "N passed, N failed" last. test_ops.c checks the rest of the core.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "matmul/matmul.h"
#include "test_blocks.h"
#include "test_check.h"

/* Q4_1 / Q5_1 multiply each block's m by its q8_1 activation's s = half(d * sum(a)), taken
 * from the unrounded d: within 2^-10 (relative) of the sum of the dequantized activations. */
static double min_term_rounding(int type, const uint8_t *w, const uint8_t *act, int64_t n) {
    if (type != PYLLM_TYPE_Q4_1 && type != PYLLM_TYPE_Q5_1) return 0.0;
    const int64_t ts = pyllm_type_size(type);
    const block_q8_1 *a = (const block_q8_1 *)act;
    double bound = 0.0;
    for (int64_t b = 0; b < n / QK32; ++b) {
        fp16_t m;
        memcpy(&m, w + b * ts + 2, sizeof(m));
        int32_t sum = 0;
        for (int j = 0; j < QK32; ++j) sum += a[b].qs[j];
        bound += fabs((double)fp16_to_fp32(m)) * fabs((double)fp16_to_fp32(a[b].d) * sum) * 0x1p-10 * 1.01;
    }
    return bound;
}

/* Whether the best tier is an x86 SIMD one: those have row, cols and tile kernels, so a check of them that found
 * none is a failure there (the neon tiers have vec_dot, panels from neon_i8mm and tiles from neon_dotprod). */
static int best_is_x86_simd(void) {
    return pyllm_cpu_best_tier() >= PYLLM_TIER_AVX2 && pyllm_cpu_best_tier() <= PYLLM_TIER_AVX512_VNNI;
}

static void test_tiers_agree(void) {
    const int best = pyllm_cpu_best_tier();
    for (int ti = 0; ti < N_WEIGHT_TYPES; ++ti) {
        const int type = weight_types[ti];
        const int64_t bs = pyllm_type_block_size(type);
        const int64_t unit = bs == 1 ? 1 : bs;
        for (int blocks = 1; blocks <= 9; ++blocks) {
            /* float types: odd lengths too, to reach the tail */
            const int64_t n = bs == 1 ? 16 * blocks + (blocks % 3) * 5 : unit * blocks;
            uint8_t *w = malloc((size_t)(n / bs * pyllm_type_size(type)));
            float *x = malloc((size_t)n * sizeof(float));
            float *wf = malloc((size_t)n * sizeof(float));
            float *xf = malloc((size_t)n * sizeof(float));
            uint8_t *act = malloc((size_t)activation_row_bytes(type, n));
            random_weights(type, w, 1, n, FILL_RANDOM);
            for (int64_t i = 0; i < n; ++i) x[i] = rng_float(-1, 1);
            if (blocks == 3) {  /* a zero activation row and zero weights */
                memset(x, 0, (size_t)n * sizeof(float));
            }
            pyllm_quantize_activations(type, x, act, n);
            float ref;
            CHECK(pyllm_vec_dot(PYLLM_TIER_GENERIC, type, w, act, n, &ref) == PYLLM_OK, "generic %s", pyllm_type_name(type));
            for (int tier = 1; tier <= best; ++tier) {
                if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
                float got;
                CHECK(pyllm_vec_dot(tier, type, w, act, n, &got) == PYLLM_OK, "tier %d", tier);
                CHECK(memcmp(&got, &ref, 4) == 0, "%s n=%lld tier %s: %.9g != generic %.9g", pyllm_type_name(type),
                      (long long)n, pyllm_tier_name(tier), got, ref);
            }
            /* close to the float dot of the dequantized operands */
            pyllm_dequantize_row(type, w, wf, n);
            const int act_type = pyllm_vec_dot_type(type);
            if (act_type == PYLLM_TYPE_F32) memcpy(xf, x, (size_t)n * sizeof(float));
            else pyllm_dequantize_row(act_type, act, xf, n);
            double exact = 0, magnitude = 0;
            for (int64_t i = 0; i < n; ++i) {
                exact += (double)wf[i] * xf[i];
                magnitude += fabs((double)wf[i] * xf[i]);
            }
            CHECK(fabs(ref - exact) <= 1e-5 * magnitude + min_term_rounding(type, w, act, n) + 1e-6,
                  "%s n=%lld: %.9g vs float dot %.9g", pyllm_type_name(type), (long long)n, ref, exact);
            free(w); free(x); free(wf); free(xf); free(act);
        }
    }
}

/* Every row of a matmul is the row's matmul alone, whatever M and the thread count (1..4): M = 7 goes through
 * groups and a lone row, M = 37 also through two panels where the tier has panel kernels. */
static void test_matmul_invariance(void) {
    const int types[] = {PYLLM_TYPE_Q4_0, PYLLM_TYPE_Q4_0_LANES, PYLLM_TYPE_Q4_1, PYLLM_TYPE_Q5_0_G8, PYLLM_TYPE_Q5_1,
                         PYLLM_TYPE_Q8_0, PYLLM_TYPE_Q4_K, PYLLM_TYPE_Q6_K, PYLLM_TYPE_F16};
    const int64_t n = 37, k = 512, ms[] = {7, 37};
    for (int ti = 0; ti < (int)(sizeof(types) / sizeof(types[0])); ++ti) {
        const int type = types[ti];
        for (int mi = 0; mi < 2; ++mi) {
            const int64_t m = ms[mi];
            uint8_t *w = malloc((size_t)(n * k / pyllm_type_block_size(type) * pyllm_type_size(type)));
            float *x = malloc((size_t)(m * k) * sizeof(float));
            float *y_all = malloc((size_t)(m * n) * sizeof(float));
            float *y_one = malloc((size_t)n * sizeof(float));
            random_weights(type, w, n, k, FILL_RANDOM);
            for (int64_t i = 0; i < m * k; ++i) x[i] = rng_float(-1, 1);
            for (int threads = 1; threads <= 4; ++threads) {
                CHECK(matmul_type(type, w, n, k, x, m, y_all, threads) == PYLLM_OK, "matmul");
                for (int64_t r = 0; r < m; ++r) {
                    CHECK(matmul_type(type, w, n, k, x + r * k, 1, y_one, 5 - threads) == PYLLM_OK, "matmul row");
                    CHECK(memcmp(y_one, y_all + r * n, (size_t)n * sizeof(float)) == 0,
                          "%s M=%lld row %lld differs alone (threads %d vs %d)", pyllm_type_name(type), (long long)m,
                          (long long)r, 5 - threads, threads);
                }
            }
            free(w); free(x); free(y_all); free(y_one);
        }
    }
}

/* Several weights over one input (matmul_many: a layer's q, k, v) give each weight's matmul alone, bit for
 * bit: plain types with row counts off the 16-row tile (37, 5, 16), interleaved ones, M through lone rows, tile
 * passes, groups and panels, 1-3 threads. */
static void test_matmul_many_is_matmul_each(void) {
    const int types[] = {PYLLM_TYPE_Q4_1,     PYLLM_TYPE_Q8_0,     PYLLM_TYPE_Q4_K,     PYLLM_TYPE_Q4_1_X16,
                         PYLLM_TYPE_Q8_0_X16, PYLLM_TYPE_Q5_0_X16, PYLLM_TYPE_Q4_K_X16, PYLLM_TYPE_Q6_K_X16};
    const int64_t k = 512, ms[] = {1, 4, 7, 37};
    enum { N_W = 3 };
    for (int ti = 0; ti < (int)(sizeof(types) / sizeof(types[0])); ++ti) {
        const int type = types[ti], base = tiled_base(type) >= 0 ? tiled_base(type) : type;
        const int64_t ns[N_W] = {tiled_base(type) >= 0 ? 48 : 37, tiled_base(type) >= 0 ? 32 : 5, 16};
        const int64_t row_bytes = k / pyllm_type_block_size(base) * pyllm_type_size(base);
        uint8_t *w[N_W];
        float *x = malloc((size_t)(37 * k) * sizeof(float)), *together[N_W], *alone = malloc(37 * 48 * sizeof(float));
        for (int i = 0; i < N_W; ++i) {
            uint8_t *plain = malloc((size_t)(ns[i] * row_bytes));
            w[i] = malloc((size_t)(ns[i] * row_bytes));
            random_weights(base, plain, ns[i], k, FILL_RANDOM);
            if (type == base) memcpy(w[i], plain, (size_t)(ns[i] * row_bytes));
            else pyllm_repack(base, type, plain, w[i], ns[i], k);
            free(plain);
            together[i] = malloc((size_t)(37 * ns[i]) * sizeof(float));
        }
        for (int64_t i = 0; i < 37 * k; ++i) x[i] = rng_float(-1, 1);
        for (int mi = 0; mi < 4; ++mi) {
            for (int threads = 1; threads <= 3; ++threads) {
                const int64_t m = ms[mi];
                matmul_weight matrices[N_W];
                for (int i = 0; i < N_W; ++i) matrices[i] = (matmul_weight){w[i], ns[i], together[i]};
                CHECK(matmul_many(pyllm_kernels(type), matrices, N_W, k, x, m, threads) == PYLLM_OK, "matmul_many");
                for (int i = 0; i < N_W; ++i) {
                    CHECK(matmul_type(type, w[i], ns[i], k, x, m, alone, 4 - threads) == PYLLM_OK &&
                          memcmp(alone, together[i], (size_t)(m * ns[i]) * sizeof(float)) == 0,
                          "%s M=%lld threads %d: weight %d differs from its matmul alone", pyllm_type_name(type),
                          (long long)m, threads, i);
                }
            }
        }
        for (int i = 0; i < N_W; ++i) { free(w[i]); free(together[i]); }
        free(x); free(alone);
    }
    float x[32] = {0}, y[16];
    uint8_t w[16 * sizeof(block_q8_0)] = {0};
    const matmul_weight five[5] = {{w, 16, y}, {w, 16, y}, {w, 16, y}, {w, 16, y}, {w, 16, y}};
    CHECK(matmul_many(pyllm_kernels(PYLLM_TYPE_Q8_0), five, 0, 32, x, 1, 1) == PYLLM_ERR_SHAPE, "matmul_many: no weight");
    CHECK(matmul_many(pyllm_kernels(PYLLM_TYPE_Q8_0), five, 5, 32, x, 1, 1) == PYLLM_ERR_SHAPE, "matmul_many: five weights");
}

/* One type's panel kernel (a kernel set's) against the generic vec_dot on 1..20 blocks of every kind of weight bytes,
 * for full panels and partial ones, and for a weight row paired with itself. */
static void compare_panel_kernel(const pyllm_kernel_set *ks, int *checked, int *bad) {
    const int type = ks->type;
    const panel_kernel_fn kernel = ks->panel;
    const panel_unpack_fn unpack = ks->panel_unpack;
    const vec_dot_fn generic = kernel_set(PYLLM_TIER_GENERIC, type)->vec_dot;
    for (int mode = 0; mode < FILL_MODES; ++mode) {
        for (int blocks = 1; blocks <= 20; ++blocks) {
            const int64_t n = pyllm_type_block_size(type) * blocks, row_bytes = blocks * pyllm_type_size(type);
            const int64_t act_bytes = activation_row_bytes(type, n);
            uint8_t *w = malloc((size_t)(2 * row_bytes)), *act = malloc((size_t)(PANEL_ROWS * act_bytes));
            float *x = malloc((size_t)n * sizeof(float));
            random_weights(type, w, 2, n, mode);
            for (int r = 0; r < PANEL_ROWS; ++r) {
                for (int64_t i = 0; i < n; ++i) x[i] = rng_float(-1, 1);
                pyllm_quantize_activations(type, x, act + r * act_bytes, n);
            }
            const int64_t unpacked_bytes = unpacked_row_bytes(type, n);
            uint8_t *unpacked = aligned_alloc(64, (size_t)(2 * unpacked_bytes));
            uint8_t *scratch = aligned_alloc(64, (size_t)act_panel_scratch_bytes(type, n));
            unpacked_row rows[2];
            for (int i = 0; i < 2; ++i) unpack(w + i * row_bytes, n, unpacked + i * unpacked_bytes, &rows[i]);
            const int panel_rows[2] = {PANEL_ROWS, 1 + blocks % PANEL_ROWS};
            for (int pi = 0; pi < 2; ++pi) {
                act_panel panel;
                ks->panel_prepare(&panel, type, act, act_bytes, panel_rows[pi], n, scratch);
                for (int same = 0; same < 2; ++same) {
                    const unpacked_row two[2] = {rows[0], rows[same ? 0 : 1]};
                    float out[2][PANEL_ROWS];
                    kernel(n, two, &panel, out);
                    for (int i = 0; i < 2; ++i) {
                        for (int r = 0; r < panel_rows[pi]; ++r) {
                            const float want = generic(n, w + (same ? 0 : i) * row_bytes, act + r * act_bytes);
                            *bad += memcmp(&want, &out[i][r], sizeof(float)) != 0;
                            ++*checked;
                        }
                    }
                }
            }
            free(scratch); free(unpacked); free(x); free(w); free(act);
        }
    }
}

/* Panel kernels (a prompt's activation rows sixteen at a time: formats/kernel_layouts.h), in every tier the CPU runs
 * that has them, each on its own panel layout: each output is the generic vec_dot's, bit for bit; and a prompt's
 * matmul plan gives them its rows (37 rows: two panels). Where the CPU runs neon_i8mm, its sets have panels for
 * every 32-element format. */
static void test_panel_kernels_agree(void) {
    int checked = 0, bad = 0, sets = 0, i8mm_sets = 0, unplanned = 0;
    for (int tier = 0; tier <= pyllm_cpu_best_tier(); ++tier) {
        if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
        for (int ti = 0; ti < N_WEIGHT_TYPES; ++ti) {
            const pyllm_kernel_set *ks = kernel_set(tier, weight_types[ti]);
            if (ks->panel == NULL) continue;
            sets++;
            i8mm_sets += tier == PYLLM_TIER_NEON_I8MM;
            compare_panel_kernel(ks, &checked, &bad);
            const int64_t k = 8 * pyllm_type_block_size(ks->type);
            const matmul_weight weight = {NULL, 16, NULL};  /* planned, not run */
            matmul_plan plan;
            unplanned += matmul_plan_make(&plan, ks, &weight, 1, k, NULL, 37, 1) != PYLLM_OK || plan.n_panels != 2;
        }
    }
    CHECK(sets == 0 || (checked > 0 && bad == 0), "panel kernels: %d of %d outputs differ from generic vec_dot", bad,
          checked);
    CHECK(unplanned == 0, "panel kernels: %d sets' prompt plans have no panels", unplanned);
    CHECK(!tier_runs(PYLLM_TIER_NEON_I8MM) || i8mm_sets >= 7, "neon_i8mm: panel kernels for only %d types", i8mm_sets);
}

/* The tier's panel layout (gathers) is act_panel_prepare's, byte for byte, where its sets say PANEL_LAYOUT_LANES, for
 * every activation format, 1..16 rows and 1..20 blocks (superblocks); the rows sit at the end of their buffer (ASan:
 * nothing read past). A layout of its own is checked by its kernels' outputs (test_panel_kernels_agree). */
static void test_panel_prepare_agrees(void) {
    const int types[] = {PYLLM_TYPE_Q8_0, PYLLM_TYPE_Q5_1, PYLLM_TYPE_Q4_K};  /* q8_0, q8_1, q8_K rows */
    int checked = 0, bad = 0;
    for (int tt = 0; tt < 3 * (pyllm_cpu_best_tier() + 1); ++tt) {
        const int type = types[tt % 3];
        const panel_prepare_fn prepare = kernel_set(tt / 3, type)->panel_prepare;
        if (prepare == NULL || kernel_set(tt / 3, type)->panel_layout != PANEL_LAYOUT_LANES) continue;
        for (int blocks = 1; blocks <= 20; ++blocks) {
            const int64_t n = pyllm_type_block_size(type) * blocks, act_bytes = activation_row_bytes(type, n);
            uint8_t *act = malloc((size_t)(PANEL_ROWS * act_bytes));
            float *x = malloc((size_t)n * sizeof(float));
            for (int r = 0; r < PANEL_ROWS; ++r) {
                for (int64_t i = 0; i < n; ++i) x[i] = rng_float(-1, 1);
                pyllm_quantize_activations(type, x, act + r * act_bytes, n);
            }
            const int64_t bytes = act_panel_scratch_bytes(type, n);
            uint8_t *want = aligned_alloc(64, (size_t)bytes), *got = aligned_alloc(64, (size_t)bytes);
            for (int n_rows = 1; n_rows <= PANEL_ROWS; ++n_rows) {
                const uint8_t *first = act + (PANEL_ROWS - n_rows) * act_bytes;
                act_panel a, b;
                memset(want, 1, (size_t)bytes), memset(got, 2, (size_t)bytes);
                act_panel_prepare(&a, type, first, act_bytes, n_rows, n, want);
                prepare(&b, type, first, act_bytes, n_rows, n, got);
                bad += memcmp(want, got, (size_t)bytes) != 0 || a.n_rows != b.n_rows || (a.sum == NULL) != (b.sum == NULL) ||
                       (a.group_sums == NULL) != (b.group_sums == NULL);
                ++checked;
            }
            free(want); free(got); free(act); free(x);
        }
    }
    CHECK(bad == 0, "panel layout: %d of %d differ from act_panel_prepare's", bad, checked);
}

static void test_bad_arguments(void) {
    float out, y[4] = {0}, x[32] = {0};
    uint8_t w[64] = {0};
    CHECK(pyllm_vec_dot(PYLLM_TIER_GENERIC, 99, w, x, 32, &out) == PYLLM_ERR_TYPE, "unknown type");
    CHECK(pyllm_vec_dot(PYLLM_TIER_GENERIC, PYLLM_TYPE_Q4_0, w, x, 31, &out) == PYLLM_ERR_SHAPE, "bad n");
    CHECK(pyllm_vec_dot(PYLLM_TIER_COUNT, PYLLM_TYPE_Q4_0, w, x, 32, &out) == PYLLM_ERR_TIER, "bad tier");
    CHECK(matmul_type(PYLLM_TYPE_Q8_K, w, 1, 256, x, 1, y, 1) == PYLLM_ERR_TYPE, "q8_K is not a weight type");
    CHECK(matmul_type(PYLLM_TYPE_Q4_0, w, 1, 32, x, 1, y, PYLLM_MAX_THREADS + 1) == PYLLM_ERR_THREADS, "threads");
    CHECK(pyllm_dequantize_row(-1, w, y, 4) == PYLLM_ERR_TYPE, "negative type");

    /* transformer blocks: a bad configuration or segment list is refused before anything runs */
    pyllm_block_config cfg = {.n_embd = 32, .n_head = 2, .n_head_kv = 2, .head_dim = 16, .n_rot = 16, .n_ff = 32,
                              .norm_eps = 1e-6f, .attn_scale = 0.25f};
    int32_t pos[1] = {0};
    pyllm_segment seg = {.row0 = 0, .n_rows = 1, .positions = pos, .kv = NULL};
    float row[32] = {0};
    pyllm_block_config odd_rot = cfg, bad_heads = cfg;
    odd_rot.n_rot = 15;
    bad_heads.n_head_kv = 3;
    CHECK(pyllm_blocks_forward(&odd_rot, NULL, 0, row, 1, &seg, 1, 1) == PYLLM_ERR_SHAPE, "blocks: odd n_rot");
    CHECK(pyllm_blocks_forward(&bad_heads, NULL, 0, row, 1, &seg, 1, 1) == PYLLM_ERR_SHAPE, "blocks: heads");
    CHECK(pyllm_blocks_forward(&cfg, NULL, 0, row, 2, &seg, 1, 1) == PYLLM_ERR_SHAPE, "blocks: rows != segments");
    CHECK(pyllm_blocks_forward(&cfg, NULL, 0, row, 1, &seg, 1, PYLLM_MAX_THREADS + 1) == PYLLM_ERR_THREADS,
          "blocks: threads");
    CHECK(pyllm_blocks_forward(&cfg, NULL, 0, row, 1, &seg, 1, 1) == PYLLM_OK && row[0] == 0.0f,
          "blocks: no layers leave x as it is");
    int32_t negative[2] = {-1, 0}, descending[2] = {4, 3};
    pyllm_segment two = {.row0 = 0, .n_rows = 2, .positions = negative, .kv = NULL};
    float rows2[64] = {0};
    CHECK(pyllm_blocks_forward(&cfg, NULL, 0, rows2, 2, &two, 1, 1) == PYLLM_ERR_SHAPE, "blocks: position < 0");
    two.positions = descending;
    CHECK(pyllm_blocks_forward(&cfg, NULL, 0, rows2, 2, &two, 1, 1) == PYLLM_ERR_SHAPE, "blocks: positions descend");

    /* a layer whose norm weights or biases are shorter (or longer) than its steps read is refused before
     * anything runs; one of the right lengths runs */
    static const float weights[32 * 32], norm[32];
    uint16_t cache_k[32], cache_v[32];
    int32_t cache_pos[1] = {-1};
    pyllm_kv_layer kv = {.k = cache_k, .v = cache_v, .positions = cache_pos, .capacity = 1, .k_row = 32, .v_row = 32,
                         .k_type = PYLLM_TYPE_F16, .v_type = PYLLM_TYPE_F16};
    pyllm_kv_layer *kv_layers[1] = {&kv};
    pyllm_segment one = {.row0 = 0, .n_rows = 1, .positions = pos, .kv = kv_layers};
    const pyllm_weight square = {pyllm_kernels(PYLLM_TYPE_F32), weights, 32, 32};
    pyllm_block block = {.wq = square, .wk = square, .wv = square, .wo = square, .w_gate = square, .w_up = square,
                         .w_down = square, .attn_norm = {norm, 31}, .ffn_norm = {norm, 32}, .rope_base = 10000.0f,
                         .rope_scale = 1.0f};
    CHECK(pyllm_blocks_forward(&cfg, &block, 1, row, 1, &one, 1, 1) == PYLLM_ERR_SHAPE, "blocks: short attn_norm");
    block.attn_norm.n = 32;
    block.bk = (pyllm_vector){norm, 16};
    CHECK(pyllm_blocks_forward(&cfg, &block, 1, row, 1, &one, 1, 1) == PYLLM_ERR_SHAPE, "blocks: short k bias");
    block.bk.n = 32;
    block.q_norm = (pyllm_vector){norm, 32};
    CHECK(pyllm_blocks_forward(&cfg, &block, 1, row, 1, &one, 1, 1) == PYLLM_ERR_SHAPE, "blocks: long q norm");
    block.q_norm.n = 16;
    CHECK(cache_pos[0] == -1, "blocks: a refused call stores nothing");
    CHECK(pyllm_blocks_forward(&cfg, &block, 1, row, 1, &one, 1, 1) == PYLLM_OK && cache_pos[0] == 0,
          "blocks: a layer of the right lengths runs");
    CHECK(pyllm_rope(row, pos, 1, 2, 16, 15, 10000.0f, 1.0f, 0) == PYLLM_ERR_SHAPE, "rope: odd n_rot");
}

/* One multi-row kernel (n_groups groups of rows) against its single-row kernel, on 1..20 blocks a row and
 * every number of rows in the last group: counts the outputs checked and those that differ. */
static void compare_rows_kernel(int type, vec_dot_fn one, vec_dot_rows_fn rows, int n_groups, int *checked, int *bad) {
    enum { MAX_ROWS = 2 * VEC_DOT_MAX_ROWS };
    const int64_t bs = pyllm_type_block_size(type);
    for (int blocks = 1; blocks <= 20; ++blocks) {
        const int64_t n = bs * blocks;
        uint8_t *w = malloc((size_t)(blocks * pyllm_type_size(type)));
        uint8_t *act[MAX_ROWS];
        float *x = malloc((size_t)n * sizeof(float));
        random_weights(type, w, 1, n, FILL_RANDOM);
        for (int r = 0; r < MAX_ROWS; ++r) {
            act[r] = malloc((size_t)activation_row_bytes(type, n));
            for (int64_t i = 0; i < n; ++i) x[i] = rng_float(-1, 1);
            pyllm_quantize_activations(type, x, act[r], n);
        }
        const int64_t group_bytes = act_rows_scratch_bytes(type, n);
        uint8_t *scratch = malloc((size_t)(2 * group_bytes));
        for (int last_rows = 1; last_rows <= VEC_DOT_MAX_ROWS; ++last_rows) {
            float out[MAX_ROWS];
            act_rows groups[2];
            for (int g = 0; g < n_groups; ++g) {
                const int n_rows = g == n_groups - 1 ? last_rows : VEC_DOT_MAX_ROWS;
                act_rows_prepare(&groups[g], type, (const void *const *)(act + g * VEC_DOT_MAX_ROWS), n_rows, n,
                                 scratch + g * group_bytes);
            }
            rows(n, w, groups, out);
            for (int r = 0; r < (n_groups - 1) * VEC_DOT_MAX_ROWS + last_rows; ++r) {
                const float want = one(n, w, act[r]);
                *bad += memcmp(&want, &out[r], sizeof(float)) != 0;
                ++*checked;
            }
        }
        free(scratch);
        for (int r = 0; r < MAX_ROWS; ++r) free(act[r]);
        free(w);
        free(x);
    }
}

/* Multi-row kernels (one group of rows, and two where a type has the 8-row kernel), in every tier the CPU runs:
 * each output is the tier's vec_dot's, bit for bit, for every block count (groups of 8 and tails) and every number of
 * rows in the (last) group. */
static void test_rows_kernels_agree(void) {
    int checked = 0, bad = 0;
    for (int tier = 1; tier <= pyllm_cpu_best_tier(); ++tier) {
        if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
        for (int ti = 0; ti < N_WEIGHT_TYPES; ++ti) {
            const pyllm_kernel_set *ks = kernel_set(tier, weight_types[ti]);
            for (int n_groups = 1; n_groups <= 2; ++n_groups) {
                const vec_dot_rows_fn rows = n_groups == 1 ? ks->rows4 : ks->rows8;
                if (rows != NULL) compare_rows_kernel(ks->type, ks->vec_dot, rows, n_groups, &checked, &bad);
            }
        }
    }
    CHECK(bad == 0, "multi-row kernels: %d of %d outputs differ from the single-row kernel", bad, checked);
}

/* One row kernel against its single-row kernel on 1..20 blocks of every kind of weight bytes. */
static void compare_row_kernel(int type, vec_dot_fn one, vec_dot_prepared_fn row_kernel, int *checked, int *bad) {
    const int64_t bs = pyllm_type_block_size(type);
    for (int mode = 0; mode < FILL_MODES; ++mode) {
        for (int blocks = 1; blocks <= 20; ++blocks) {
            const int64_t n = bs * blocks;
            uint8_t *w = malloc((size_t)(blocks * pyllm_type_size(type)));
            uint8_t *act = malloc((size_t)activation_row_bytes(type, n));
            float *x = malloc((size_t)n * sizeof(float));
            uint8_t *scratch = aligned_alloc(64, (size_t)act_row_scratch_bytes(type, n));
            random_weights(type, w, 1, n, mode);
            for (int64_t i = 0; i < n; ++i) x[i] = rng_float(-1, 1);
            pyllm_quantize_activations(type, x, act, n);
            act_rows row;
            act_row_prepare(&row, type, act, n, scratch);
            const float want = one(n, w, act), got = row_kernel(n, w, &row);
            *bad += memcmp(&want, &got, sizeof(float)) != 0;
            ++*checked;
            free(scratch);
            free(x);
            free(act);
            free(w);
        }
    }
}

/* One cols kernel (VEC_DOT_COLS weight rows at once) against its single-row kernel on 1..20 blocks of every
 * kind of weight bytes, the weight rows a row and a block apart (the block: rows whose bytes overlap). */
static void compare_cols_kernel(int type, vec_dot_fn one, vec_dot_cols_fn cols, int *checked, int *bad) {
    const int64_t bs = pyllm_type_block_size(type), block_bytes = pyllm_type_size(type);
    for (int mode = 0; mode < FILL_MODES; ++mode) {
        for (int blocks = 1; blocks <= 20; ++blocks) {
            const int64_t n = bs * blocks, row_bytes = blocks * block_bytes;
            uint8_t *w = malloc((size_t)(VEC_DOT_COLS * row_bytes));
            uint8_t *act = malloc((size_t)activation_row_bytes(type, n));
            float *x = malloc((size_t)n * sizeof(float));
            random_weights(type, w, VEC_DOT_COLS, n, mode);
            for (int64_t i = 0; i < n; ++i) x[i] = rng_float(-1, 1);
            pyllm_quantize_activations(type, x, act, n);
            const int64_t strides[2] = {row_bytes, block_bytes};
            for (int si = 0; si < 2; ++si) {
                float got[VEC_DOT_COLS];
                cols(n, w, strides[si], act, got);
                for (int c = 0; c < VEC_DOT_COLS; ++c) {
                    const float want = one(n, w + c * strides[si], act);
                    *bad += memcmp(&want, &got[c], sizeof(float)) != 0;
                    ++*checked;
                }
            }
            free(x);
            free(act);
            free(w);
        }
    }
}

/* Row kernels (a lone activation row, prepared by act_row_prepare) and cols kernels (a lone row against
 * several weight rows), in every family the CPU runs: the single-row kernel's bits for every block count (the
 * four-block steps of Q4_0 and their tails) and every kind of weight bytes, extremes too; and pyllm_matmul of
 * one row, which goes through the active tier's, equals the single-row kernel on 1 to 3 threads. */
static void test_row_kernels_agree(void) {
    if (pyllm_cpu_best_tier() == PYLLM_TIER_GENERIC) return;
    int checked = 0, bad = 0, types = 0, cols_types = 0;
    for (int tier = 1; tier <= pyllm_cpu_best_tier(); ++tier) {
        if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
        for (int ti = 0; ti < N_WEIGHT_TYPES; ++ti) {
            const pyllm_kernel_set *ks = kernel_set(tier, weight_types[ti]);
            if (ks->cols4 != NULL) {
                cols_types++;
                compare_cols_kernel(ks->type, ks->vec_dot, ks->cols4, &checked, &bad);
            }
            if (ks->prepared == NULL) continue;
            types++;
            compare_row_kernel(ks->type, ks->vec_dot, ks->prepared, &checked, &bad);
        }
    }
    for (int ti = 0; ti < N_WEIGHT_TYPES; ++ti) {
        const int type = weight_types[ti];
        if (pyllm_kernels(type)->prepared == NULL && pyllm_kernels(type)->cols4 == NULL) continue;
        const vec_dot_fn one = pyllm_kernels(type)->vec_dot;
        enum { N_OUT = 37, BLOCKS = 7 };  /* rows not a multiple of the tile, so threads split unevenly */
        const int64_t n = pyllm_type_block_size(type) * BLOCKS, row_bytes = BLOCKS * pyllm_type_size(type);
        uint8_t *w = malloc((size_t)(N_OUT * row_bytes)), *act = malloc((size_t)activation_row_bytes(type, n));
        float x[7 * 256], y[N_OUT];
        random_weights(type, w, N_OUT, n, FILL_RANDOM);
        for (int64_t i = 0; i < n; ++i) x[i] = rng_float(-1, 1);
        pyllm_quantize_activations(type, x, act, n);
        for (int threads = 1; threads <= 3; ++threads) {
            CHECK(matmul_type(type, w, N_OUT, n, x, 1, y, threads) == PYLLM_OK, "row kernels: matmul runs");
            for (int c = 0; c < N_OUT; ++c) {
                const float want = one(n, w + c * row_bytes, act);
                bad += memcmp(&want, &y[c], sizeof(float)) != 0;
                checked++;
            }
        }
        free(act);
        free(w);
    }
    CHECK((!best_is_x86_simd() || (types >= 3 && cols_types >= 2)) && bad == 0,
          "row and cols kernels: %d and %d types, %d of %d outputs differ from the single-row kernel", types, cols_types,
          bad, checked);
}

/* Q5_0 regrouped (Q5_0_G8) is Q5_0: the same values, and the same bits from every tier's vec_dot and from
 * matmul (its lone-row, 4-row and 8-row kernels) on 1..20 blocks a row: groups, plain blocks after them, both. */
static void test_grouped_q5_0_is_q5_0(void) {
    enum { N_OUT = 5, M_MAX = 11 };
    const int best = pyllm_cpu_best_tier();
    for (int blocks = 1; blocks <= 20; ++blocks) {
        const int64_t n = QK32 * blocks, row_bytes = blocks * (int64_t)sizeof(block_q5_0);
        uint8_t *plain = malloc((size_t)(N_OUT * row_bytes)), *grouped = malloc((size_t)(N_OUT * row_bytes));
        uint8_t *act = malloc((size_t)activation_row_bytes(PYLLM_TYPE_Q5_0, n));
        float *x = malloc((size_t)(M_MAX * n) * sizeof(float)), *y_plain = malloc(M_MAX * N_OUT * sizeof(float));
        float *y_grouped = malloc(M_MAX * N_OUT * sizeof(float));
        float *f_plain = malloc((size_t)n * sizeof(float)), *f_grouped = malloc((size_t)n * sizeof(float));
        random_weights(PYLLM_TYPE_Q5_0, plain, N_OUT, n, blocks % 3 == 0 ? 5 : FILL_RANDOM);
        CHECK(pyllm_repack(PYLLM_TYPE_Q5_0, PYLLM_TYPE_Q5_0_G8, plain, grouped, N_OUT, n) == PYLLM_OK, "group");
        for (int64_t i = 0; i < M_MAX * n; ++i) x[i] = rng_float(-1, 1);
        pyllm_quantize_activations(PYLLM_TYPE_Q5_0, x, act, n);
        for (int r = 0; r < N_OUT; ++r) {
            pyllm_dequantize_row(PYLLM_TYPE_Q5_0, plain + r * row_bytes, f_plain, n);
            pyllm_dequantize_row(PYLLM_TYPE_Q5_0_G8, grouped + r * row_bytes, f_grouped, n);
            CHECK(memcmp(f_plain, f_grouped, (size_t)n * sizeof(float)) == 0, "blocks=%d row %d: values differ", blocks, r);
            for (int tier = 0; tier <= best; ++tier) {
                if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
                float a, b;
                CHECK(pyllm_vec_dot(tier, PYLLM_TYPE_Q5_0, plain + r * row_bytes, act, n, &a) == PYLLM_OK &&
                      pyllm_vec_dot(tier, PYLLM_TYPE_Q5_0_G8, grouped + r * row_bytes, act, n, &b) == PYLLM_OK &&
                      memcmp(&a, &b, 4) == 0, "blocks=%d tier %s: vec_dot %.9g != Q5_0's %.9g", blocks,
                      pyllm_tier_name(tier), b, a);
            }
        }
        for (int m = 1; m <= M_MAX; m += 3) {
            for (int threads = 1; threads <= 2; ++threads) {
                CHECK(matmul_type(PYLLM_TYPE_Q5_0, plain, N_OUT, n, x, m, y_plain, threads) == PYLLM_OK &&
                      matmul_type(PYLLM_TYPE_Q5_0_G8, grouped, N_OUT, n, x, m, y_grouped, threads) == PYLLM_OK &&
                      memcmp(y_plain, y_grouped, (size_t)(m * N_OUT) * sizeof(float)) == 0,
                      "blocks=%d m=%d threads=%d: matmul differs from Q5_0's", blocks, m, threads);
            }
        }
        free(plain); free(grouped); free(act); free(x); free(y_plain); free(y_grouped); free(f_plain); free(f_grouped);
    }
}

/* Interleaved matrices (Q4_1_X16, Q8_0_X16, Q5_0_X16, Q4_K_X16, Q6_K_X16) are their plain matrices: each row
 * gathered back is the plain row's bytes (and each tile rebuilt whole), rows dequantize to the same values,
 * the tile kernels (where the CPU runs them) give generic vec_dot's bits for one to four activation rows, and matmul
 * gives the plain type's bits for every M (panels, tile passes, an odd last row) and thread count, on every tier
 * (where a tier has no tile kernel: rebuilt rows through vec_dot). 1..20 blocks a row (1..6 superblocks), every kind
 * of weight bytes, two tiles. */
static void test_interleaved_is_plain(void) {
    enum { N_OUT = 2 * X16_ROWS, M_MAX = 20 };
    const int bases[] = {PYLLM_TYPE_Q4_1, PYLLM_TYPE_Q8_0, PYLLM_TYPE_Q5_0, PYLLM_TYPE_Q4_K, PYLLM_TYPE_Q6_K};
    const int interleaved[] = {PYLLM_TYPE_Q4_1_X16, PYLLM_TYPE_Q8_0_X16, PYLLM_TYPE_Q5_0_X16, PYLLM_TYPE_Q4_K_X16,
                               PYLLM_TYPE_Q6_K_X16};
    _Static_assert(sizeof bases == sizeof interleaved, "a base for every interleaved layout");
    const int64_t ms[] = {1, 2, 3, 4, 5, 17, M_MAX};
    const int tier = pyllm_active_tier();
    int kernel_checked = 0, kernel_bad = 0;
    for (int ti = 0; ti < (int)(sizeof(bases) / sizeof(bases[0])); ++ti) {
        const int base = bases[ti], type = interleaved[ti];
        const tile_kernel_fn kernel = kernel_set(pyllm_cpu_best_tier(), type)->tile;
        const int64_t block_size = pyllm_type_block_size(base);
        for (int blocks = 1; blocks <= (block_size == QK_K ? 6 : 20); ++blocks) {
            const int mode = blocks % FILL_MODES;
            const int64_t n = block_size * blocks, row_bytes = blocks * pyllm_type_size(base);
            const int64_t act_bytes = activation_row_bytes(base, n), prepared_bytes = act_row_scratch_bytes(type, n);
            uint8_t *plain = malloc((size_t)(N_OUT * row_bytes)), *tiles = malloc((size_t)(N_OUT * row_bytes));
            uint8_t *row = malloc((size_t)row_bytes), *act = malloc((size_t)(TILE_MAX_ROWS * act_bytes));
            uint8_t *prepared = aligned_alloc(64, (size_t)(TILE_MAX_ROWS * prepared_bytes));
            float *x = malloc((size_t)(M_MAX * n) * sizeof(float)), *y_plain = malloc(M_MAX * N_OUT * sizeof(float));
            float *y_tiles = malloc(M_MAX * N_OUT * sizeof(float));
            float *f_plain = malloc((size_t)n * sizeof(float)), *f_rows = malloc((size_t)(N_OUT * n) * sizeof(float));
            random_weights(base, plain, N_OUT, n, mode);
            CHECK(pyllm_repack(base, type, plain, tiles, N_OUT, n) == PYLLM_OK, "interleave");
            int64_t all_rows[N_OUT];
            for (int r = 0; r < N_OUT; ++r) all_rows[r] = N_OUT - 1 - r;
            CHECK(pyllm_dequantize_rows(type, tiles, N_OUT, n, all_rows, N_OUT, f_rows) == PYLLM_OK, "rows");
            for (int r = 0; r < N_OUT; ++r) {
                tile_gather_row(type, tiles, r, n, row);
                CHECK(memcmp(row, plain + r * row_bytes, (size_t)row_bytes) == 0, "%s blocks=%d row %d: gathered bytes differ",
                      pyllm_type_name(type), blocks, r);
                pyllm_dequantize_row(base, plain + (N_OUT - 1 - r) * row_bytes, f_plain, n);
                CHECK(memcmp(f_plain, f_rows + r * n, (size_t)n * sizeof(float)) == 0, "%s blocks=%d row %d: values differ",
                      pyllm_type_name(type), blocks, r);
            }
            for (int tile = 0; tile < N_OUT / X16_ROWS; ++tile) {  /* whole tiles, as a prompt rebuilds them */
                uint8_t *rebuilt = malloc((size_t)(X16_ROWS * row_bytes));
                tile_gather(type, tiles + tile * X16_ROWS * row_bytes, n, rebuilt);
                CHECK(memcmp(rebuilt, plain + tile * X16_ROWS * row_bytes, (size_t)(X16_ROWS * row_bytes)) == 0,
                      "%s blocks=%d tile %d: a tile's rows rebuilt differ", pyllm_type_name(type), blocks, tile);
                free(rebuilt);
            }
            for (int64_t i = 0; i < M_MAX * n; ++i) x[i] = (blocks % 7 == 6 && i < n) ? 0.0f : rng_float(-1, 1);
            for (int n_rows = 1; kernel != NULL && n_rows <= kernel_set(pyllm_cpu_best_tier(), type)->tile_max_rows; ++n_rows) {
                act_rows rows[TILE_MAX_ROWS];
                for (int r = 0; r < n_rows; ++r) {
                    pyllm_quantize_activations(base, x + r * n, act + r * act_bytes, n);
                    act_row_prepare(&rows[r], type, act + r * act_bytes, n, prepared + r * prepared_bytes);
                }
                for (int t = 0; t < N_OUT / X16_ROWS; ++t) {
                    float out[TILE_MAX_ROWS][X16_ROWS];
                    kernel(n, tiles + t * X16_ROWS * row_bytes, rows, n_rows, out[0], X16_ROWS, tiles, t);
                    for (int r = 0; r < n_rows; ++r) {
                        for (int i = 0; i < X16_ROWS; ++i) {
                            const float want = kernel_set(PYLLM_TIER_GENERIC, base)->vec_dot(
                                n, plain + (t * X16_ROWS + i) * row_bytes, act + r * act_bytes);
                            kernel_bad += memcmp(&want, &out[r][i], sizeof(float)) != 0;
                            ++kernel_checked;
                        }
                    }
                }
            }
            for (int t = 0; t <= pyllm_cpu_best_tier(); ++t) {
                if (!tier_runs(t)) continue;
                pyllm_set_tier(t);  /* the reference path, and every tier's (their prompt plans differ) */
                for (int mi = 0; mi < (int)(sizeof(ms) / sizeof(ms[0])); ++mi) {
                    for (int threads = 1; threads <= 3; threads += 2) {
                        const int64_t m = ms[mi];
                        CHECK(matmul_type(base, plain, N_OUT, n, x, m, y_plain, threads) == PYLLM_OK &&
                              matmul_type(type, tiles, N_OUT, n, x, m, y_tiles, threads) == PYLLM_OK &&
                              memcmp(y_plain, y_tiles, (size_t)(m * N_OUT) * sizeof(float)) == 0,
                              "%s blocks=%d m=%lld threads=%d tier %s: matmul differs from %s's", pyllm_type_name(type),
                              blocks, (long long)m, threads, pyllm_tier_name(t), pyllm_type_name(base));
                    }
                }
            }
            pyllm_set_tier(tier);
            free(plain); free(tiles); free(row); free(act); free(prepared); free(x); free(y_plain); free(y_tiles);
            free(f_plain); free(f_rows);
        }
    }
    /* every tier's plans for a tiled matrix: a decode step's row goes to the tile kernel where the set has one, a
     * prompt's rows (37: two panels) to the plain type's panels where it has them (tiles gathered back into rows) */
    int bad_plans = 0;
    for (int t = 0; t <= pyllm_cpu_best_tier(); ++t) {
        for (int ti = 0; ti < (int)(sizeof(interleaved) / sizeof(interleaved[0])); ++ti) {
            const pyllm_kernel_set *ks = kernel_set(t, interleaved[ti]);
            const int64_t k = 2 * QK_K;
            const matmul_weight weight = {NULL, 2 * X16_ROWS, NULL};  /* planned, not run */
            matmul_plan decode, prompt;
            bad_plans += matmul_plan_make(&decode, ks, &weight, 1, k, NULL, 1, 1) != PYLLM_OK ||
                         decode.use_tiles != (ks->tile != NULL);
            bad_plans += matmul_plan_make(&prompt, ks, &weight, 1, k, NULL, 37, 1) != PYLLM_OK ||
                         (ks->panel != NULL && !ks->tile_prefill && (prompt.use_tiles || prompt.n_panels != 2));
        }
    }
    CHECK(bad_plans == 0, "tiled layouts: %d plans without their tiles or panels", bad_plans);
    /* avx512_vnni's own K-quant tile kernels take a prompt's rows too, 4 a call, where its panels (the same bits) are
     * slower (bench/README.md): only the set shows a prompt sent the slow way */
    const int k_quants[] = {PYLLM_TYPE_Q4_K_X16, PYLLM_TYPE_Q6_K_X16};
    for (int i = 0; i < 2; ++i) {
        const int k_quant = k_quants[i];
        const pyllm_kernel_set *vnni = kernel_set(PYLLM_TIER_AVX512_VNNI, k_quant);
        CHECK(!tier_runs(PYLLM_TIER_AVX512_VNNI) ||
                  (vnni->tile != NULL && vnni->tile != kernel_set(PYLLM_TIER_AVX2, k_quant)->tile &&
                   vnni->tile_prefill && vnni->tile_max_rows == 4),
              "avx512_vnni: %s prompts do not go to its own tile kernel, 4 rows a call", pyllm_type_name(k_quant));
    }
    CHECK(!tier_runs(PYLLM_TIER_NEON_I8MM) || (kernel_set(PYLLM_TIER_NEON_I8MM, PYLLM_TYPE_Q4_K_X16)->tile != NULL &&
                                               kernel_set(PYLLM_TIER_NEON_I8MM, PYLLM_TYPE_Q4_K_X16)->panel != NULL),
          "neon_i8mm: Q4_K_X16 without its tile kernel or the panels of Q4_K");
    CHECK(kernel_bad == 0, "tile kernels: %d of %d outputs differ from generic vec_dot", kernel_bad, kernel_checked);
    CHECK((!best_is_x86_simd() && !tier_runs(PYLLM_TIER_NEON_DOTPROD)) || kernel_checked > 0,
          "tile kernels: none checked on %s", pyllm_tier_name(pyllm_cpu_best_tier()));
    uint8_t blocks[X16_ROWS * sizeof(block_q8_0)] = {0}, out[sizeof blocks];
    float y[X16_ROWS], x1[QK32] = {0};
    const int64_t outside[1] = {X16_ROWS};
    CHECK(pyllm_repack(PYLLM_TYPE_Q4_0, PYLLM_TYPE_Q8_0_X16, blocks, out, X16_ROWS, QK32) == PYLLM_ERR_TYPE, "interleave: Q4_0");
    CHECK(pyllm_repack(PYLLM_TYPE_Q8_0, PYLLM_TYPE_Q8_0_X16, blocks, out, X16_ROWS - 1, QK32) == PYLLM_ERR_SHAPE, "interleave: 15 rows");
    CHECK(matmul_type(PYLLM_TYPE_Q8_0_X16, out, X16_ROWS - 8, QK32, x1, 1, y, 1) == PYLLM_ERR_SHAPE, "matmul: 8 rows");
    CHECK(pyllm_dequantize_row(PYLLM_TYPE_Q8_0_X16, out, y, QK32) == PYLLM_ERR_TYPE, "dequantize_row: interleaved");
    CHECK(pyllm_dequantize_rows(PYLLM_TYPE_Q8_0_X16, out, X16_ROWS, QK32, outside, 1, y) == PYLLM_ERR_SHAPE,
          "dequantize_rows: row 16 of 16");
}

int main(void) {
    printf("cpu tier: %s\n", pyllm_tier_name(pyllm_cpu_best_tier()));
    test_tiers_agree();
    test_matmul_invariance();
    test_matmul_many_is_matmul_each();
    test_panel_kernels_agree();
    test_panel_prepare_agrees();
    test_bad_arguments();
    test_rows_kernels_agree();
    test_row_kernels_agree();
    test_grouped_q5_0_is_q5_0();
    test_interleaved_is_plain();
    return check_report();
}
