/*
 * formats.h - what the formats layer does with the blocks of blocks.h: the type table (types.c), half and bfloat
 * conversions (half.c), the reference dequantizers and quantizers (dequantize.c, quantize.c) and the layouts a
 * matrix is rebuilt into at load (repack.c). Nothing here calls a kernel tier or a thread.
 */
#ifndef PYLLM_FORMATS_H
#define PYLLM_FORMATS_H

#include "formats/blocks.h"

/* ---- the type table (types.c) ---- */

/* The traits of a type id; NULL for an unknown one. */
const pyllm_type_traits *type_traits(int type);

/* PYLLM_OK if `type` is known and n (> 0) a multiple of its block size, else PYLLM_ERR_TYPE / PYLLM_ERR_SHAPE. */
int type_check_row(int type, int64_t n);

/* Bytes of a row of n elements of a known type (n a multiple of its block size). */
static inline int64_t type_row_bytes(int type, int64_t n) {
    const pyllm_type_traits *t = type_traits(type);
    return n / t->block_size * t->type_size;
}

/* Bytes of an activation row of n elements for weights of a known weight type (its vec_dot_type's row). */
static inline int64_t activation_row_bytes(int weight_type, int64_t n) {
    return type_row_bytes(type_traits(weight_type)->vec_dot_type, n);
}

/* ---- reference conversions (dequantize.c, quantize.c): the definitions every tier's kernels reproduce ---- */

typedef void (*dequantize_row_fn)(const void *blocks, float *y, int64_t n);
typedef void (*quantize_row_fn)(const float *x, void *blocks, int64_t n);

/* Indexed by type id; NULL where a type has none (a tiled layout's rows are not one after another). */
extern const dequantize_row_fn dequantize_table[PYLLM_TYPE_COUNT];
extern const quantize_row_fn quantize_table[PYLLM_TYPE_COUNT];

/* The activation quantizers of the 32-element formats (llama.cpp's x86 rounding). */
void quantize_row_q8_0_act(const float *x, void *blocks, int64_t n);
void quantize_row_q8_1_act(const float *x, void *blocks, int64_t n);
/* q8_K as llama.cpp quantizes it: the first element of largest |x| maps to -127. */
void quantize_row_q8_K_ref(const float *x, void *blocks, int64_t n);

/* The K-quants as llama.cpp writes model files, with its scale searches (quantize_k.c). */
void quantize_row_q2_K_ref(const float *x, void *blocks, int64_t n);
void quantize_row_q3_K_ref(const float *x, void *blocks, int64_t n);
void quantize_row_q4_K_ref(const float *x, void *blocks, int64_t n);
void quantize_row_q5_K_ref(const float *x, void *blocks, int64_t n);
void quantize_row_q6_K_ref(const float *x, void *blocks, int64_t n);

/* One row of a weight format other than Q8_0 quantized with importance[n] (a weight per column, llama.cpp's
 * imatrix) steering its searches; PYLLM_ERR_TYPE for a format without a weighted quantizer (quantize_k.c). */
int quantize_row_weighted(int type, const float *x, void *dst, int64_t n, const float *importance);

/* 32 levels (0..15, or 0..31) of a 32-element block into its nibbles, and the fifth bits into qh (quantize.c). */
void pack_nibbles_32(const uint8_t q[QK32], uint8_t qs[QK32 / 2]);
void pack_fifth_bits_32(const uint8_t q[QK32], uint8_t qh[4]);

/* Round to nearest, ties to even, for |v| < 2^22 (ggml's nearest_int, the rounding its quantizers use). */
static inline int nearest_int(float v) {
    const float shifted = v + 12582912.0f;  /* 1.5 * 2^23 */
    return (int)(fp32_to_bits(shifted) & 0x007FFFFF) - 0x00400000;
}

/* ---- rebuilt layouts (repack.c) ---- */

/* Row `row` of a matrix w in a tiled layout (traits tile_rows > 1) of n-element rows, as the plain blocks it was,
 * into dst. */
void tile_gather_row(int layout, const void *w, int64_t row, int64_t n, void *dst);

/* Every row of one tile (its first block at tile), the same, into dst one after another (a prompt on a tier whose tile
 * kernel takes only decode steps). */
void tile_gather(int layout, const void *tile, int64_t n, void *dst);

#endif /* PYLLM_FORMATS_H */
