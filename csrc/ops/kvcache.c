/*
 * kvcache.c - one layer of a sequence's KV cache: keys and values in half
 * precision (as llama.cpp keeps them) or quantized, one slot per cached token.
 *
 * A full-attention layer keeps position p in slot p. A sliding-window layer is
 * a ring: position p lives in slot p % capacity, so it holds the last
 * `capacity` tokens and never more. Slots are a function of positions only,
 * and attention reads them in slot order, so a token's result does not depend
 * on how its sequence was split into batches.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/kernel_set.h"

static int64_t slot_of(const pyllm_kv_layer *layer, int32_t pos) {
    return layer->ring ? pos % layer->capacity : pos;
}

int pyllm_kv_type_valid(int type, int64_t d) {
    switch (type) {
    case PYLLM_TYPE_F16: return d > 0;
    case PYLLM_TYPE_Q8_0: case PYLLM_TYPE_Q4_0: case PYLLM_TYPE_Q4_1: case PYLLM_TYPE_Q5_0: case PYLLM_TYPE_Q5_1:
        return d > 0 && d % QK32 == 0;
    default: return 0;
    }
}

int pyllm_kv_rotation(int type, int64_t d, int for_values) {
    if (type == PYLLM_TYPE_F16 || !pyllm_kv_type_valid(type, d) || d % 64 != 0) return 0;
    if (for_values) return 64;
    int64_t n = 64;
    while (d % (2 * n) == 0) n *= 2;
    return (int)n;
}

/* A row of n floats into a cache row of `type`: half precision, or llama.cpp's conversion of a cache row (q8_0
 * through the activation quantizer, as its x86 build's from_float; the others their reference quantizers). */
static void row_to_cache(int type, const float *x, void *row, int64_t n) {
    const op_kernels *kernels = active_ops()->ops;
    if (type == PYLLM_TYPE_F16) kernels->to_half(x, row, n);
    else if (type == PYLLM_TYPE_Q8_0) kernels->quantize_q8_0(x, row, n);
    else quantize_table[type](x, row, n);
}

static int rotation_valid(int rot, int64_t row) {
    return rot == 0 || (rot >= 2 && (rot & (rot - 1)) == 0 && row % rot == 0);
}

static int layer_valid(const pyllm_kv_layer *layer) {
    return layer->capacity > 0 && pyllm_kv_type_valid(layer->k_type, layer->k_row) &&
           pyllm_kv_type_valid(layer->v_type, layer->v_row) && rotation_valid(layer->k_rot, layer->k_row) &&
           rotation_valid(layer->v_rot, layer->v_row);
}

int pyllm_kv_store(const pyllm_kv_layer *layer, const int32_t *pos, const float *k, const float *v, int64_t m) {
    if (!layer_valid(layer)) return PYLLM_ERR_TYPE;
    for (int64_t r = 0; r < m; ++r) {
        if (pos[r] < 0 || (!layer->ring && pos[r] >= layer->capacity)) return PYLLM_ERR_SHAPE;
    }
    const int64_t k_bytes = type_row_bytes(layer->k_type, layer->k_row), v_bytes = type_row_bytes(layer->v_type, layer->v_row);
    for (int64_t r = 0; r < m; ++r) {
        const int64_t slot = slot_of(layer, pos[r]);
        row_to_cache(layer->k_type, k + r * layer->k_row, (char *)layer->k + slot * k_bytes, layer->k_row);
        row_to_cache(layer->v_type, v + r * layer->v_row, (char *)layer->v + slot * v_bytes, layer->v_row);
        layer->positions[slot] = pos[r];
    }
    return PYLLM_OK;
}

int pyllm_kv_shift(const pyllm_kv_layer *layer, int32_t n_keep, int32_t n_discard, int64_t n_heads_kv,
                   int64_t head_dim, int64_t n_rot, float freq_base, float freq_scale, int neox) {
    if (!layer_valid(layer)) return PYLLM_ERR_TYPE;
    if (n_keep < 0 || n_discard <= 0 || n_heads_kv * head_dim != layer->k_row || !pyllm_rope_dims_valid(n_rot, head_dim) ||
        (layer->k_rot && head_dim % layer->k_rot)) {
        return PYLLM_ERR_SHAPE;
    }
    const int64_t cap = layer->capacity;
    const int64_t k_bytes = type_row_bytes(layer->k_type, layer->k_row), v_bytes = type_row_bytes(layer->v_type, layer->v_row);
    float *k = malloc((size_t)(cap * layer->k_row) * sizeof(float));
    char *v = malloc((size_t)(cap * v_bytes));
    int32_t *new_pos = malloc((size_t)cap * sizeof(int32_t));
    float *cos_sin = malloc((size_t)n_rot * sizeof(float));
    if (k == NULL || v == NULL || new_pos == NULL || cos_sin == NULL) {
        free(k);
        free(v);
        free(new_pos);
        free(cos_sin);
        return PYLLM_ERR_NOMEM;
    }
    /* the kept tokens, in slot order: their keys as floats, re-rotated by -n_discard where they move (a quantized
     * key quantized again after, as llama.cpp shifts such a cache), their values as they are */
    int64_t n = 0;
    const int32_t back = -n_discard;
    pyllm_rope_angles(&back, 1, n_rot, freq_base, freq_scale, cos_sin);
    for (int64_t s = 0; s < cap; ++s) {
        const int32_t p = layer->positions[s];
        if (p < 0 || (p >= n_keep && p < n_keep + n_discard)) continue;
        float *kr = k + n * layer->k_row;
        dequantize_table[layer->k_type]((const char *)layer->k + s * k_bytes, kr, layer->k_row);
        if (p >= n_keep) {  /* a rotated key: back, rope, and rotated again */
            if (layer->k_rot) pyllm_hadamard(kr, layer->k_row / layer->k_rot, layer->k_rot);
            pyllm_rope_rotate(kr, cos_sin, 1, n_heads_kv, head_dim, n_rot, neox);
            if (layer->k_rot) pyllm_hadamard(kr, layer->k_row / layer->k_rot, layer->k_rot);
        }
        memcpy(v + n * v_bytes, (const char *)layer->v + s * v_bytes, (size_t)v_bytes);
        new_pos[n++] = p >= n_keep ? p - n_discard : p;
    }
    for (int64_t s = 0; s < cap; ++s) layer->positions[s] = -1;
    for (int64_t j = 0; j < n; ++j) {
        const int64_t slot = slot_of(layer, new_pos[j]);
        row_to_cache(layer->k_type, k + j * layer->k_row, (char *)layer->k + slot * k_bytes, layer->k_row);
        memcpy((char *)layer->v + slot * v_bytes, v + j * v_bytes, (size_t)v_bytes);
        layer->positions[slot] = new_pos[j];
    }
    free(k);
    free(v);
    free(new_pos);
    free(cos_sin);
    return PYLLM_OK;
}

void pyllm_kv_truncate(const pyllm_kv_layer *layer, int32_t n_tokens) {
    for (int64_t s = 0; s < layer->capacity; ++s) {
        if (layer->positions[s] >= n_tokens) layer->positions[s] = -1;
    }
}
