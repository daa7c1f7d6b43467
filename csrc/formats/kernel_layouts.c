/*
 * kernel_layouts.c - the layouts of kernel_layouts.h: activation rows in groups, alone and in panels (the
 * references), and the scratch each takes.
 */
#include "formats/formats.h"
#include "formats/kernel_layouts.h"

/* The 32-element blocks a row has in act_rows' copies (q8_K keeps its own float scales: none). */
static int64_t act_rows_blocks(int weight_type, int64_t n) {
    return pyllm_vec_dot_type(weight_type) == PYLLM_TYPE_Q8_K ? 0 : n / QK32;
}

/* Q5_0's kernels take the unsigned q (0..31) and each lane's share of the offset 16 apart, the interleaved
 * Q8_0's q + 128 and the share of 128: the offset, or 0 for weights without one. */
static int lane_offset(int weight_type) {
    if (weight_type == PYLLM_TYPE_Q5_0 || weight_type == PYLLM_TYPE_Q5_0_G8 || weight_type == PYLLM_TYPE_Q5_0_X16) {
        return 16;
    }
    return weight_type == PYLLM_TYPE_Q8_0_X16 ? 128 : 0;
}

/* Scratch for a layout of `slots` rows a block (VEC_DOT_MAX_ROWS for a group, 1 for a single row). */
static int64_t layout_scratch_bytes(int weight_type, int64_t n, int slots) {
    const int64_t nb = act_rows_blocks(weight_type, n) * slots;
    const int64_t offset_ints = lane_offset(weight_type) ? nb * 8 : weight_type == PYLLM_TYPE_Q4_0 ? nb : 0;
    const int64_t bytes = nb * QK32 + nb * 2 * (int64_t)sizeof(float) + offset_ints * (int64_t)sizeof(int32_t);
    return bytes > 0 ? (bytes + 63) / 64 * 64 : 64;  /* at least a line, so a group's scratch always exists */
}

int64_t act_rows_scratch_bytes(int weight_type, int64_t n) { return layout_scratch_bytes(weight_type, n, VEC_DOT_MAX_ROWS); }
int64_t act_row_scratch_bytes(int weight_type, int64_t n) { return layout_scratch_bytes(weight_type, n, 1); }

/* Rows 0..n_rows-1 into a layout of `slots` rows a block: entry (b, r) at index b * slots + r. */
static void prepare_layout(act_rows *group, int weight_type, const void *const *rows, int n_rows, int64_t n,
                           void *scratch, int slots) {
    const int act_type = pyllm_vec_dot_type(weight_type);
    const int64_t nb = act_rows_blocks(weight_type, n);
    int8_t *quants = scratch;
    float *scale = (float *)(quants + nb * slots * QK32), *sum = scale + nb * slots;
    int32_t *offsets = (int32_t *)(sum + nb * slots);
    group->n_rows = n_rows;
    group->quants = nb ? quants : NULL;
    group->scale = nb ? scale : NULL;
    group->sum = act_type == PYLLM_TYPE_Q8_1 ? sum : NULL;
    const int offset = lane_offset(weight_type);
    group->offsets = offset ? offsets : NULL;
    group->block_offsets = weight_type == PYLLM_TYPE_Q4_0 ? offsets : NULL;
    for (int r = 0; r < VEC_DOT_MAX_ROWS; ++r) group->rows[r] = rows[r < n_rows ? r : 0];
    for (int r = 0; r < slots; ++r) {
        const int real = r < n_rows;
        for (int64_t b = 0; b < nb; ++b) {
            float d = 0.0f, s = 0.0f;
            if (real && act_type == PYLLM_TYPE_Q8_1) {
                const block_q8_1 *y = rows[r];
                d = fp16_to_fp32(y[b].d);
                s = fp16_to_fp32(y[b].s);
            } else if (real) {
                d = fp16_to_fp32(((const block_q8_0 *)rows[r])[b].d);
            }
            const int8_t *qs = act_type == PYLLM_TYPE_Q8_1 ? ((const block_q8_1 *)group->rows[r])[b].qs
                                                           : ((const block_q8_0 *)group->rows[r])[b].qs;
            const int64_t at = b * slots + r;
            memcpy(quants + at * QK32, qs, QK32);
            scale[at] = d;
            if (group->sum != NULL) sum[at] = s;
            if (group->block_offsets != NULL) {
                int32_t total = 0;
                for (int j = 0; j < QK32; ++j) total += qs[j];
                offsets[at] = 8 * total;
            }
            if (group->offsets != NULL) {
                for (int l = 0; l < 8; ++l) {
                    offsets[at * 8 + l] = -offset * (qs[4 * l] + qs[4 * l + 1] + qs[4 * l + 2] + qs[4 * l + 3]);
                }
            }
        }
    }
}

void act_rows_prepare(act_rows *group, int weight_type, const void *const *rows, int n_rows, int64_t n,
                      void *scratch) {
    prepare_layout(group, weight_type, rows, n_rows, n, scratch, VEC_DOT_MAX_ROWS);
}

void act_row_prepare(act_rows *row, int weight_type, const void *act, int64_t n, void *scratch) {
    const void *rows[1] = {act};
    prepare_layout(row, weight_type, rows, 1, n, scratch, 1);
}

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
int64_t unpacked_row_bytes(int weight_type, int64_t n) {
    const int k_quant = pyllm_vec_dot_type(weight_type) == PYLLM_TYPE_Q8_K;
    const int64_t nb = k_quant ? n / QK_K : n / QK32, floats = (nb * (int64_t)sizeof(float) + 63) / 64 * 64;
    return nb * (k_quant ? (int64_t)sizeof(unpacked_q4_K) : (int64_t)sizeof(unpacked_block)) + 2 * floats;
}
