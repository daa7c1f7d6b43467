/*
 * kvcache.c - one layer of a sequence's KV cache: keys and values in half
 * precision (as llama.cpp keeps them), one slot per cached token.
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

int pyllm_kv_store(const pyllm_kv_layer *layer, const int32_t *pos, const float *k, const float *v, int64_t m) {
    for (int64_t r = 0; r < m; ++r) {
        if (pos[r] < 0 || (!layer->ring && pos[r] >= layer->capacity)) return PYLLM_ERR_SHAPE;
    }
    const op_kernels *kernels = active_ops()->ops;
    for (int64_t r = 0; r < m; ++r) {
        const int64_t slot = slot_of(layer, pos[r]);
        kernels->to_half(k + r * layer->k_row, layer->k + slot * layer->k_row, layer->k_row);
        kernels->to_half(v + r * layer->v_row, layer->v + slot * layer->v_row, layer->v_row);
        layer->positions[slot] = pos[r];
    }
    return PYLLM_OK;
}

int pyllm_kv_shift(const pyllm_kv_layer *layer, int32_t n_keep, int32_t n_discard, int64_t n_heads_kv,
                   int64_t head_dim, int64_t n_rot, float freq_base, float freq_scale, int neox) {
    if (n_keep < 0 || n_discard <= 0 || n_heads_kv * head_dim != layer->k_row || !pyllm_rope_dims_valid(n_rot, head_dim)) {
        return PYLLM_ERR_SHAPE;
    }
    const int64_t cap = layer->capacity;
    float *k = malloc((size_t)(cap * layer->k_row) * sizeof(float));
    uint16_t *v = malloc((size_t)(cap * layer->v_row) * sizeof(uint16_t));
    int32_t *new_pos = malloc((size_t)cap * sizeof(int32_t));
    float *cos_sin = malloc((size_t)n_rot * sizeof(float));
    if (k == NULL || v == NULL || new_pos == NULL || cos_sin == NULL) {
        free(k);
        free(v);
        free(new_pos);
        free(cos_sin);
        return PYLLM_ERR_NOMEM;
    }
    /* the kept tokens, in slot order: their keys as floats, re-rotated by -n_discard where they move */
    int64_t n = 0;
    const int32_t back = -n_discard;
    pyllm_rope_angles(&back, 1, n_rot, freq_base, freq_scale, cos_sin);
    for (int64_t s = 0; s < cap; ++s) {
        const int32_t p = layer->positions[s];
        if (p < 0 || (p >= n_keep && p < n_keep + n_discard)) continue;
        float *kr = k + n * layer->k_row;
        for (int64_t i = 0; i < layer->k_row; ++i) kr[i] = fp16_to_fp32(layer->k[s * layer->k_row + i]);
        if (p >= n_keep) pyllm_rope_rotate(kr, cos_sin, 1, n_heads_kv, head_dim, n_rot, neox);
        memcpy(v + n * layer->v_row, layer->v + s * layer->v_row, (size_t)layer->v_row * sizeof(uint16_t));
        new_pos[n++] = p >= n_keep ? p - n_discard : p;
    }
    for (int64_t s = 0; s < cap; ++s) layer->positions[s] = -1;
    for (int64_t j = 0; j < n; ++j) {
        const int64_t slot = slot_of(layer, new_pos[j]);
        for (int64_t i = 0; i < layer->k_row; ++i) layer->k[slot * layer->k_row + i] = fp32_to_fp16(k[j * layer->k_row + i]);
        memcpy(layer->v + slot * layer->v_row, v + j * layer->v_row, (size_t)layer->v_row * sizeof(uint16_t));
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
