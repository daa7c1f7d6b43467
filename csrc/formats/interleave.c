/*
 * interleave.c - matrices interleaved 16 rows at a time (PYLLM_TYPE_Q4_1_X16, PYLLM_TYPE_Q8_0_X16,
 * PYLLM_TYPE_Q5_0_X16; quants.h):
 * building them, reading a row back, and which tier has their kernels.
 *
 * The layout serves the decode kernels (interleave_avx512_vnni.c), where lane r of a vector is weight row r:
 * a 64-byte load brings the same 4 elements of 16 rows, and one dot, one conversion and one FMA then advance
 * 16 outputs by one lane of their reduction order, against an activation's 4 bytes broadcast. The rows'
 * values, and so every product and sum, are those of the plain matrix.
 */
#include "backend/dispatch.h"

int x16_base_type(int type) {
    switch (type) {
    case PYLLM_TYPE_Q4_1_X16: return PYLLM_TYPE_Q4_1;
    case PYLLM_TYPE_Q8_0_X16: return PYLLM_TYPE_Q8_0;
    case PYLLM_TYPE_Q5_0_X16: return PYLLM_TYPE_Q5_0;
    default: return -1;
    }
}

static int interleaved_of(int type) {
    switch (type) {
    case PYLLM_TYPE_Q4_1: return PYLLM_TYPE_Q4_1_X16;
    case PYLLM_TYPE_Q8_0: return PYLLM_TYPE_Q8_0_X16;
    case PYLLM_TYPE_Q5_0: return PYLLM_TYPE_Q5_0_X16;
    default: return -1;
    }
}

int pyllm_interleaved_type(int type) {
    const int interleaved = interleaved_of(type);
    return interleaved >= 0 && pyllm_active_x16_kernel(interleaved) != NULL ? interleaved : -1;
}

/* Block b of row r (0..15) of a tile block <-> the plain block. */
static void q4_1_to_tile(const block_q4_1 *x, tile_q4_1 *t, int r) {
    t->d[r] = x->d;
    t->m[r] = x->m;
    for (int c = 0; c < 4; ++c) memcpy(t->qs[c][r], x->qs + 4 * c, 4);
}

static void q4_1_from_tile(const tile_q4_1 *t, int r, block_q4_1 *x) {
    x->d = t->d[r];
    x->m = t->m[r];
    for (int c = 0; c < 4; ++c) memcpy(x->qs + 4 * c, t->qs[c][r], 4);
}

static void q8_0_to_tile(const block_q8_0 *x, tile_q8_0 *t, int r) {
    t->d[r] = x->d;
    for (int l = 0; l < 8; ++l) {
        for (int j = 0; j < 4; ++j) t->qs[l][r][j] = (uint8_t)(x->qs[4 * l + j] + 128);
    }
}

static void q8_0_from_tile(const tile_q8_0 *t, int r, block_q8_0 *x) {
    x->d = t->d[r];
    for (int l = 0; l < 8; ++l) {
        for (int j = 0; j < 4; ++j) x->qs[4 * l + j] = (int8_t)(t->qs[l][r][j] - 128);
    }
}

/* The lane of a Q5_0 tile whose mask holds element e's fifth bit (at bit 4 r + e % 4): e % 16 / 4 for the low
 * nibbles' elements, 4 more for the high ones'. */
static inline int q5_0_tile_lane(int e) { return e / 16 * 4 + e % 16 / 4; }

/* Row 0 comes first (pyllm_interleave's order) and clears the masks the rows then set their bits in. */
static void q5_0_to_tile(const block_q5_0 *x, tile_q5_0 *t, int r) {
    t->d[r] = x->d;
    for (int c = 0; c < 4; ++c) memcpy(t->qs[c][r], x->qs + 4 * c, 4);
    if (r == 0) memset(t->qh, 0, sizeof t->qh);
    const uint32_t high = q5_high_bits(x->qh);
    for (int e = 0; e < QK32; ++e) {
        t->qh[q5_0_tile_lane(e)] |= (uint64_t)(high >> e & 1) << (4 * r + e % 4);
    }
}

static void q5_0_from_tile(const tile_q5_0 *t, int r, block_q5_0 *x) {
    x->d = t->d[r];
    for (int c = 0; c < 4; ++c) memcpy(x->qs + 4 * c, t->qs[c][r], 4);
    memset(x->qh, 0, sizeof x->qh);
    for (int e = 0; e < QK32; ++e) {
        x->qh[e / 8] |= (uint8_t)((t->qh[q5_0_tile_lane(e)] >> (4 * r + e % 4) & 1) << (e % 8));
    }
}

int pyllm_interleave(int type, const void *src, void *dst, int64_t n_rows, int64_t n) {
    if (interleaved_of(type) < 0) return PYLLM_ERR_TYPE;
    if (n_rows < 0 || n_rows % X16_ROWS != 0 || n <= 0 || n % QK32 != 0) return PYLLM_ERR_SHAPE;
    const int64_t nb = n / QK32, block_bytes = pyllm_type_size(type);
    for (int64_t row = 0; row < n_rows; ++row) {
        const uint8_t *blocks = (const uint8_t *)src + row * nb * block_bytes;
        const int64_t tile = row / X16_ROWS;
        const int r = (int)(row % X16_ROWS);
        for (int64_t b = 0; b < nb; ++b) {
            if (type == PYLLM_TYPE_Q4_1) {
                q4_1_to_tile((const block_q4_1 *)blocks + b, (tile_q4_1 *)dst + tile * nb + b, r);
            } else if (type == PYLLM_TYPE_Q5_0) {
                q5_0_to_tile((const block_q5_0 *)blocks + b, (tile_q5_0 *)dst + tile * nb + b, r);
            } else {
                q8_0_to_tile((const block_q8_0 *)blocks + b, (tile_q8_0 *)dst + tile * nb + b, r);
            }
        }
    }
    return PYLLM_OK;
}

void x16_gather_row(int type, const void *w, int64_t row, int64_t n, void *dst) {
    const int64_t nb = n / QK32, tile = row / X16_ROWS;
    const int r = (int)(row % X16_ROWS);
    for (int64_t b = 0; b < nb; ++b) {
        if (type == PYLLM_TYPE_Q4_1_X16) {
            q4_1_from_tile((const tile_q4_1 *)w + tile * nb + b, r, (block_q4_1 *)dst + b);
        } else if (type == PYLLM_TYPE_Q5_0_X16) {
            q5_0_from_tile((const tile_q5_0 *)w + tile * nb + b, r, (block_q5_0 *)dst + b);
        } else {
            q8_0_from_tile((const tile_q8_0 *)w + tile * nb + b, r, (block_q8_0 *)dst + b);
        }
    }
}
