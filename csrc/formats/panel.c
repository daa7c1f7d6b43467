/*
 * panel.c - the panel layout of activation rows (panel.h) and the scratch sizes of the panel matmul.
 */
#include "formats/panel.h"

/* quants (nb * 512 bytes), then scale and sum (q8_1) or group_sums (q8_K), nb * 64 bytes each (q8_K's scale:
 * per superblock), so every part is whole 64-byte lines */
int64_t act_panel_scratch_bytes(int weight_type, int64_t n) {
    const int64_t nb = n / QK32, line = PANEL_ROWS * (int64_t)sizeof(float);
    const int act_type = pyllm_vec_dot_type(weight_type);
    const int64_t scales = act_type == PYLLM_TYPE_Q8_K ? n / QK_K : nb;
    return nb * (8 * PANEL_ROWS * 4) + scales * line + (act_type == PYLLM_TYPE_Q8_0 ? 0 : nb * line);
}

/* Row r's 32 quants of block b and its d (and s, or group sum) there; a row past n_rows is zeros. */
static const int8_t *row_block(int act_type, const void *row, int64_t b, float *d, float *s, float *group_sum) {
    if (act_type == PYLLM_TYPE_Q8_1) {
        const block_q8_1 *y = (const block_q8_1 *)row + b;
        *d = fp16_to_fp32(y->d), *s = fp16_to_fp32(y->s);
        return y->qs;
    }
    if (act_type == PYLLM_TYPE_Q8_K) {
        const block_q8_K *y = (const block_q8_K *)row + b / 8;
        const int g = (int)(b % 8);
        *d = y->d, *group_sum = (float)(y->bsums[2 * g] + y->bsums[2 * g + 1]);
        return y->qs + QK32 * g;
    }
    const block_q8_0 *y = (const block_q8_0 *)row + b;
    *d = fp16_to_fp32(y->d);
    return y->qs;
}

/* The parts of a panel's scratch (act_panel_scratch_bytes). */
void act_panel_layout(act_panel *panel, int weight_type, int n_rows, int64_t n, void *scratch) {
    const int64_t nb = n / QK32;
    const int act_type = pyllm_vec_dot_type(weight_type);
    float *scale = (float *)((uint8_t *)scratch + nb * 8 * PANEL_ROWS * 4);
    float *extra = scale + (act_type == PYLLM_TYPE_Q8_K ? n / QK_K : nb) * PANEL_ROWS;
    panel->quants = scratch;
    panel->scale = scale;
    panel->sum = act_type == PYLLM_TYPE_Q8_1 ? extra : NULL;
    panel->group_sums = act_type == PYLLM_TYPE_Q8_K ? extra : NULL;
    panel->n_rows = n_rows;
}

void act_panel_prepare(act_panel *panel, int weight_type, const void *first, int64_t row_bytes, int n_rows,
                       int64_t n, void *scratch) {
    const int64_t nb = n / QK32;
    const int act_type = pyllm_vec_dot_type(weight_type), q8_K = act_type == PYLLM_TYPE_Q8_K;
    act_panel_layout(panel, weight_type, n_rows, n, scratch);
    uint8_t *quants = scratch;
    float *scale = (float *)panel->scale, *extra = (float *)(q8_K ? panel->group_sums : panel->sum);
    for (int r = 0; r < PANEL_ROWS; ++r) {
        const uint8_t *row = (const uint8_t *)first + r * row_bytes;
        for (int64_t b = 0; b < nb; ++b) {
            float d = 0.0f, s = 0.0f, group_sum = 0.0f;
            const int8_t *qs = r < n_rows ? row_block(act_type, row, b, &d, &s, &group_sum) : NULL;
            for (int l = 0; l < 8; ++l) {
                uint8_t *unit = quants + ((b * 8 + l) * PANEL_ROWS + r) * 4;
                for (int j = 0; j < 4; ++j) unit[j] = (uint8_t)((qs != NULL ? qs[4 * l + j] : 0) + 128);
            }
            if (!q8_K) scale[b * PANEL_ROWS + r] = d;
            else if (b % 8 == 0) scale[b / 8 * PANEL_ROWS + r] = d;
            if (panel->sum != NULL) extra[b * PANEL_ROWS + r] = s;
            if (panel->group_sums != NULL) extra[b * PANEL_ROWS + r] = group_sum;
        }
    }
}

/* blocks (64 bytes a block, 384 a superblock), then d and m (a float a block or superblock, each part rounded
 * up to whole lines) */
int64_t wide_row_scratch_bytes(int weight_type, int64_t n) {
    const int k_quant = pyllm_vec_dot_type(weight_type) == PYLLM_TYPE_Q8_K;
    const int64_t nb = k_quant ? n / QK_K : n / QK32, floats = (nb * (int64_t)sizeof(float) + 63) / 64 * 64;
    return nb * (k_quant ? (int64_t)sizeof(wide_q4_K) : (int64_t)sizeof(wide_block)) + 2 * floats;
}
