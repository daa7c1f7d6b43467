/*
 * test_forward.c - a tiny two-layer model through pyllm_blocks_forward (a prompt of 5 rows, then a decode step) on
 * every tier the CPU runs, each tier's weights in the layouts it chooses: every tier's output the generic tier's, bit
 * for bit. Its last line but one ("forward: ...; digest <hex>") hashes the output's bits: make test-arm compares the
 * digest of the aarch64 build under emulation with the native x86 one's (the same model, so the same bits).
 * The weights are deterministic (test_blocks.h's random blocks from a fixed seed), every weight format among them.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_blocks.h"
#include "test_check.h"

enum { N_EMBD = 256, N_HEAD = 4, N_HEAD_KV = 2, HEAD_DIM = 64, N_FF = 512, N_LAYER = 2, PROMPT = 5, CAPACITY = 8 };

/* A matrix of n_out x n_in random blocks of `type` (test_blocks.h: finite scales) laid out as the active tier chooses. */
static pyllm_weight make_weight(int type, int64_t n_out, int64_t n_in, void **owned) {
    const int64_t row_bytes = n_in / pyllm_type_block_size(type) * pyllm_type_size(type);
    uint8_t *plain = malloc((size_t)(n_out * row_bytes)), *data = malloc((size_t)(n_out * row_bytes));
    random_weights(type, plain, n_out, n_in, FILL_RANDOM);
    const int layout = pyllm_choose_layout(type, n_out, 1);
    if (layout == type) {
        memcpy(data, plain, (size_t)(n_out * row_bytes));
    } else {
        CHECK(pyllm_repack(type, layout, plain, data, n_out, n_in) == PYLLM_OK, "repack %s", pyllm_type_name(type));
    }
    free(plain);
    *owned = data;
    return (pyllm_weight){pyllm_kernels(layout), data, n_out, n_in};
}

/* The model on the active tier: out <- the prompt's rows then one decode row, through both layers. */
static void run_model(float out[(PROMPT + 1) * N_EMBD]) {
    static const int types[N_LAYER][7] = {
        /* wq, wk, wv, wo, gate, up, down */
        {PYLLM_TYPE_Q4_K, PYLLM_TYPE_Q6_K, PYLLM_TYPE_Q8_0, PYLLM_TYPE_Q4_0, PYLLM_TYPE_Q4_K, PYLLM_TYPE_Q5_0,
         PYLLM_TYPE_Q6_K},
        {PYLLM_TYPE_Q5_K, PYLLM_TYPE_Q4_1, PYLLM_TYPE_Q5_1, PYLLM_TYPE_Q3_K, PYLLM_TYPE_Q2_K, PYLLM_TYPE_F16,
         PYLLM_TYPE_BF16},
    };
    rng_state = 0x9E3779B97F4A7C15ull;
    void *owned[N_LAYER][7];
    static float norms[N_LAYER][2][N_EMBD];
    pyllm_block blocks[N_LAYER];
    for (int l = 0; l < N_LAYER; ++l) {
        const int *t = types[l];
        blocks[l] = (pyllm_block){
            .wq = make_weight(t[0], N_HEAD * HEAD_DIM, N_EMBD, &owned[l][0]),
            .wk = make_weight(t[1], N_HEAD_KV * HEAD_DIM, N_EMBD, &owned[l][1]),
            .wv = make_weight(t[2], N_HEAD_KV * HEAD_DIM, N_EMBD, &owned[l][2]),
            .wo = make_weight(t[3], N_EMBD, N_HEAD * HEAD_DIM, &owned[l][3]),
            .w_gate = make_weight(t[4], N_FF, N_EMBD, &owned[l][4]),
            .w_up = make_weight(t[5], N_FF, N_EMBD, &owned[l][5]),
            .w_down = make_weight(t[6], N_EMBD, N_FF, &owned[l][6]),
            .attn_norm = {norms[l][0], N_EMBD}, .ffn_norm = {norms[l][1], N_EMBD},
            .rope_base = 10000.0f, .rope_scale = 1.0f,
        };
        for (int i = 0; i < N_EMBD; ++i) norms[l][0][i] = 0.01f + 0.002f * rng_float(-1, 1);
        for (int i = 0; i < N_EMBD; ++i) norms[l][1][i] = 0.01f + 0.002f * rng_float(-1, 1);
    }
    const pyllm_block_config cfg = {.n_embd = N_EMBD, .n_head = N_HEAD, .n_head_kv = N_HEAD_KV, .head_dim = HEAD_DIM,
                                    .n_rot = HEAD_DIM, .n_ff = N_FF, .norm_eps = 1e-6f,
                                    .attn_scale = 1.0f / sqrtf((float)HEAD_DIM)};
    static uint16_t cache_k[N_LAYER][CAPACITY * N_HEAD_KV * HEAD_DIM], cache_v[N_LAYER][CAPACITY * N_HEAD_KV * HEAD_DIM];
    int32_t cache_pos[N_LAYER][CAPACITY];
    pyllm_kv_layer kv[N_LAYER];
    pyllm_kv_layer *kv_layers[N_LAYER];
    for (int l = 0; l < N_LAYER; ++l) {
        for (int s = 0; s < CAPACITY; ++s) cache_pos[l][s] = -1;
        kv[l] = (pyllm_kv_layer){.k = cache_k[l], .v = cache_v[l], .positions = cache_pos[l], .capacity = CAPACITY,
                                 .k_row = N_HEAD_KV * HEAD_DIM, .v_row = N_HEAD_KV * HEAD_DIM,
                                 .k_type = PYLLM_TYPE_F16, .v_type = PYLLM_TYPE_F16};
        kv_layers[l] = &kv[l];
    }
    for (int i = 0; i < (PROMPT + 1) * N_EMBD; ++i) out[i] = rng_float(-1, 1);
    const int32_t positions[PROMPT + 1] = {0, 1, 2, 3, 4, 5};
    const pyllm_segment prompt = {.row0 = 0, .n_rows = PROMPT, .positions = positions, .kv = kv_layers};
    const pyllm_segment step = {.row0 = 0, .n_rows = 1, .positions = positions + PROMPT, .kv = kv_layers};
    CHECK(pyllm_blocks_forward(&cfg, blocks, N_LAYER, out, PROMPT, &prompt, 1, 2) == PYLLM_OK, "prompt");
    CHECK(pyllm_blocks_forward(&cfg, blocks, N_LAYER, out + PROMPT * N_EMBD, 1, &step, 1, 2) == PYLLM_OK, "decode");
    for (int l = 0; l < N_LAYER; ++l) {
        for (int k = 0; k < 7; ++k) free(owned[l][k]);
    }
}

int main(void) {
    printf("cpu tier: %s\n", pyllm_tier_name(pyllm_cpu_best_tier()));
    static float ref[(PROMPT + 1) * N_EMBD], got[(PROMPT + 1) * N_EMBD];
    const int saved = pyllm_active_tier();
    pyllm_set_tier(PYLLM_TIER_GENERIC);
    run_model(ref);
    int finite = 1;
    for (int i = 0; i < (PROMPT + 1) * N_EMBD; ++i) finite &= isfinite(ref[i]) != 0;
    CHECK(finite, "the generic forward pass is finite");
    for (int tier = 1; tier <= pyllm_cpu_best_tier(); ++tier) {
        if (!tier_runs(tier)) continue;  /* an x86 tier on aarch64: generic's kernels */
        pyllm_set_tier(tier);
        run_model(got);
        CHECK(memcmp(ref, got, sizeof ref) == 0, "tier %s: the forward pass differs from generic's",
              pyllm_tier_name(tier));
    }
    pyllm_set_tier(saved);
    uint64_t digest = 0xcbf29ce484222325ull;  /* FNV-1a of the output's bytes */
    const unsigned char *bytes = (const unsigned char *)ref;
    for (size_t i = 0; i < sizeof ref; ++i) digest = (digest ^ bytes[i]) * 0x100000001b3ull;
    printf("forward: last row %.6g %.6g %.6g %.6g ...; digest %016llx\n", ref[PROMPT * N_EMBD], ref[PROMPT * N_EMBD + 1],
           ref[PROMPT * N_EMBD + 2], ref[PROMPT * N_EMBD + 3], (unsigned long long)digest);
    return check_report();
}
