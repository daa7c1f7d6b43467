/*
 * test_blocks.h - random weight blocks for the C tests: random quant bytes (or
 * bytes of one extreme value), with every fp16 scale field set to a finite value.
 */
#ifndef PYLLM_TEST_BLOCKS_H
#define PYLLM_TEST_BLOCKS_H

#include <stdlib.h>

#include "backend/kernel_set.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static inline uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

static inline float rng_float(float lo, float hi) {
    return lo + (hi - lo) * (float)(rng_u32() & 0xFFFFFF) / 16777216.0f;
}

static inline void set_fp16(uint8_t *p, float v) {
    const fp16_t h = fp32_to_fp16(v);
    memcpy(p, &h, 2);
}

/* The quant bytes: 0 random, 1 all 0xFF, 2 all 0x80, 3 all 0x7F, 4 all 0x00, 5 a random extreme byte */
enum { FILL_RANDOM = 0, FILL_MODES = 6 };

static inline uint8_t fill_byte(int mode) {
    static const uint8_t extreme[5] = {0x80, 0x7F, 0xFF, 0x00, 0x01};
    switch (mode) {
    case 1: return 0xFF;
    case 2: return 0x80;
    case 3: return 0x7F;
    case 4: return 0x00;
    case 5: return extreme[rng_u32() % 5];
    default: return (uint8_t)rng_u32();
    }
}

/* n elements of weight `type` in dst, quant bytes by `mode`, then finite scales. */
static inline void random_blocks(int type, uint8_t *dst, int64_t n, int mode) {
    const int64_t bs = pyllm_type_block_size(type), ts = pyllm_type_size(type), nb = n / bs;
    for (int64_t i = 0; i < nb * ts; ++i) dst[i] = fill_byte(mode);
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t *p = dst + b * ts;
        switch (type) {
        case PYLLM_TYPE_F32: { float v = rng_float(-2, 2); memcpy(p, &v, 4); break; }
        case PYLLM_TYPE_F16: set_fp16(p, rng_float(-2, 2)); break;
        case PYLLM_TYPE_BF16: { bf16_t h = fp32_to_bf16(rng_float(-2, 2)); memcpy(p, &h, 2); break; }
        case PYLLM_TYPE_Q4_0: case PYLLM_TYPE_Q4_0_LANES: case PYLLM_TYPE_Q5_0: case PYLLM_TYPE_Q8_0:
            set_fp16(p, rng_float(-0.1f, 0.1f)); break;
        case PYLLM_TYPE_Q4_1: case PYLLM_TYPE_Q5_1:
            set_fp16(p, rng_float(0, 0.1f)); set_fp16(p + 2, rng_float(-1, 1)); break;
        case PYLLM_TYPE_Q2_K: set_fp16(p + 80, rng_float(0, 0.1f)); set_fp16(p + 82, rng_float(0, 0.1f)); break;
        case PYLLM_TYPE_Q3_K: set_fp16(p + 108, rng_float(-0.1f, 0.1f)); break;
        case PYLLM_TYPE_Q4_K: case PYLLM_TYPE_Q5_K:
            set_fp16(p, rng_float(0, 0.1f)); set_fp16(p + 2, rng_float(0, 0.1f)); break;
        case PYLLM_TYPE_Q6_K: set_fp16(p + 208, rng_float(-0.1f, 0.1f)); break;
        default: break;
        }
    }
}

/* n_rows rows of n elements of weight `type` (Q5_0_G8: random Q5_0 rows, regrouped). */
static inline void random_weights(int type, uint8_t *dst, int64_t n_rows, int64_t n, int mode) {
    if (type != PYLLM_TYPE_Q5_0_G8) {
        random_blocks(type, dst, n_rows * n, mode);
        return;
    }
    const size_t bytes = (size_t)(n_rows * n / QK32) * sizeof(block_q5_0);
    uint8_t *plain = malloc(bytes);
    random_blocks(PYLLM_TYPE_Q5_0, plain, n_rows * n, mode);
    pyllm_repack(PYLLM_TYPE_Q5_0, PYLLM_TYPE_Q5_0_G8, plain, dst, n_rows, n);
    free(plain);
}

/* y = x . W^T for a matrix w of `type` (its active kernel set), as the model multiplies. */
static inline int matmul_type(int type, const void *w, int64_t n, int64_t k, const float *x, int64_t m, float *y,
                              int n_threads) {
    const pyllm_weight weight = {pyllm_kernels(type), w, n, k};
    return pyllm_matmul(&weight, x, m, y, n_threads);
}

/* The plain type of a tiled layout (its traits' plain_type), or -1 for any other type. */
static inline int tiled_base(int type) {
    return pyllm_traits(type)->tile_rows > 1 ? pyllm_traits(type)->plain_type : -1;
}

static const int weight_types[] = {
    PYLLM_TYPE_F32, PYLLM_TYPE_F16, PYLLM_TYPE_BF16, PYLLM_TYPE_Q4_0, PYLLM_TYPE_Q4_0_LANES, PYLLM_TYPE_Q4_1,
    PYLLM_TYPE_Q5_0, PYLLM_TYPE_Q5_0_G8, PYLLM_TYPE_Q5_1, PYLLM_TYPE_Q8_0, PYLLM_TYPE_Q2_K, PYLLM_TYPE_Q3_K,
    PYLLM_TYPE_Q4_K, PYLLM_TYPE_Q5_K, PYLLM_TYPE_Q6_K,
};
#define N_WEIGHT_TYPES (int)(sizeof(weight_types) / sizeof(weight_types[0]))

#endif /* PYLLM_TEST_BLOCKS_H */
