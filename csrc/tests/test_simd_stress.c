/*
 * test_simd_stress.c - every SIMD tier's vec_dot kernels against generic, bit
 * for bit, on stress inputs: every block count up to several 8-block groups
 * (all tails), extreme weight bytes (0x80, 0x7F, 0xFF, 0x00), zero rows.
 *   test_simd_stress [ITERS]        check (default 24 iterations)
 *   test_simd_stress 0 bench        ns per 4096-element row, per tier
 * Tiers the CPU cannot run are skipped; prints "N passed, N failed" last.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_blocks.h"

/* Every tier (generic first: the reference); each one's vec_dot of a weight type comes from its kernel set. */
enum { N_TABLES = PYLLM_TIER_COUNT };

static vec_dot_fn tier_vec_dot(int tier, int type) { return kernel_set(tier, type)->vec_dot; }
/* Activations always come from the quantizers: q8 values in [-127, 127],
 * bsums the sums of their groups. That is the kernels' contract. */
static void make_activations(int type, uint8_t *act, const float *x, int64_t n) {
    pyllm_quantize_activations(type, x, act, n);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bench(int best) {
    const int64_t n = 4096, rows = 512;
    printf("\n== timing: ns per %lld-element row (one thread, %lld rows, best of 5)\n", (long long)n, (long long)rows);
    printf("%-6s", "type");
    for (int t = 0; t < N_TABLES; ++t) {
        if (t <= best && tier_runs(t)) printf(" %12s", pyllm_tier_name(t));
    }
    printf("\n");
    volatile float sink = 0;
    for (int ti = 0; ti < N_WEIGHT_TYPES; ++ti) {
        const int type = weight_types[ti];
        const int64_t row_bytes = n / pyllm_type_block_size(type) * pyllm_type_size(type);
        uint8_t *w = malloc((size_t)(row_bytes * rows));
        float *x = malloc((size_t)n * sizeof(float));
        uint8_t *act = malloc((size_t)activation_row_bytes(type, n));
        random_weights(type, w, rows, n, FILL_RANDOM);
        for (int64_t i = 0; i < n; ++i) x[i] = rng_float(-1, 1);
        make_activations(type, act, x, n);
        printf("%-6s", pyllm_type_name(type));
        for (int t = 0; t < N_TABLES; ++t) {
            if (t > best || !tier_runs(t)) continue;
            const vec_dot_fn k = tier_vec_dot(t, type);
            if (k == NULL) { printf(" %12s", "-"); continue; }
            double best_s = 1e30;
            for (int rep = 0; rep < 5; ++rep) {
                const double t0 = now_s();
                for (int64_t r = 0; r < rows; ++r) sink += k(n, w + r * row_bytes, act);
                const double dt = now_s() - t0;
                if (dt < best_s) best_s = dt;
            }
            printf(" %12.1f", 1e9 * best_s / (double)rows);
        }
        printf("\n");
        free(w); free(x); free(act);
    }
    (void)sink;
}

int main(int argc, char **argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 24;
    const int do_bench = argc > 2 && strcmp(argv[2], "bench") == 0;
    const int best = pyllm_cpu_best_tier();
    if (iters > 0) printf("cpu tier: %s\n", pyllm_tier_name(best));
    long checks[N_TABLES] = {0}, fails[N_TABLES] = {0};
    long type_fails[N_TABLES][N_WEIGHT_TYPES] = {{0}};
    for (int t = 1; t < N_TABLES && iters > 0; ++t) {
        if (t > best || !tier_runs(t)) continue;
        int own = 0;
        for (int ti = 0; ti < N_WEIGHT_TYPES; ++ti) own += tier_vec_dot(t, weight_types[ti]) != tier_vec_dot(0, weight_types[ti]);
        printf("tier %s: kernels of its own for %d of %d weight types\n", pyllm_tier_name(t), own, N_WEIGHT_TYPES);
    }
    for (int it = 0; it < iters; ++it) {
        const int wmode = it % FILL_MODES;
        for (int ti = 0; ti < N_WEIGHT_TYPES; ++ti) {
            const int type = weight_types[ti];
            const int64_t bs = pyllm_type_block_size(type);
            const int max_len = bs == 1 ? 100 : bs == QK32 ? 41 : 6;
            for (int len = 1; len <= max_len; ++len) {
                const int64_t n = bs * len;
                uint8_t *w = malloc((size_t)(len * pyllm_type_size(type)));
                float *x = malloc((size_t)n * sizeof(float));
                uint8_t *act = malloc((size_t)activation_row_bytes(type, n));
                random_weights(type, w, 1, n, wmode);
                for (int64_t i = 0; i < n; ++i) x[i] = (it % 7 == 6) ? 0.0f : rng_float(-1, 1);
                make_activations(type, act, x, n);
                const float ref = tier_vec_dot(PYLLM_TIER_GENERIC, type)(n, w, act);
                for (int t = 1; t < N_TABLES; ++t) {
                    if (t > best || !tier_runs(t)) continue;
                    const float got = tier_vec_dot(t, type)(n, w, act);
                    checks[t]++;
                    if (memcmp(&got, &ref, 4) != 0) {
                        if (type_fails[t][ti]++ < 3) {
                            printf("FAIL %s tier %s n=%lld weights mode %d: %.9g != generic %.9g\n",
                                   pyllm_type_name(type), pyllm_tier_name(t), (long long)n, wmode, got, ref);
                        }
                        fails[t]++;
                    }
                }
                free(w); free(x); free(act);
            }
        }
    }
    long total_checks = 0, total_fails = 0;
    for (int t = 1; t < N_TABLES && iters > 0; ++t) {
        if (t > best || !tier_runs(t)) continue;
        printf("stress tier %s: %ld checks, %ld failed\n", pyllm_tier_name(t), checks[t], fails[t]);
        total_checks += checks[t];
        total_fails += fails[t];
        for (int ti = 0; ti < N_WEIGHT_TYPES; ++ti) {
            if (type_fails[t][ti] > 0) {
                printf("  %s: %ld failed\n", pyllm_type_name(weight_types[ti]), type_fails[t][ti]);
            }
        }
    }
    if (do_bench) bench(best);
    if (iters > 0) printf("%ld passed, %ld failed\n", total_checks - total_fails, total_fails);
    return total_fails != 0;
}
