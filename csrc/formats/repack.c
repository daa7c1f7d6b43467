/*
 * repack.c - the layouts a weight matrix is rebuilt into at load (pyllm_choose_layout says which), the same values
 * and the same matmul bits, fewer instructions a block for their kernels:
 *   - PYLLM_TYPE_Q5_0_G8: each row's Q5_0 blocks eight at a time, their scales together and their fifth bits
 *     transposed (blocks.h: group_q5_0);
 *   - PYLLM_TYPE_*_X16: Q4_1, Q8_0 or Q5_0 rows interleaved 16 at a time (blocks.h: tile_q4_1, ...), for the decode
 *     kernels where lane r of a vector is weight row r: a 64-byte load brings the same 4 elements of 16 rows, and one
 *     dot, one conversion and one FMA then advance 16 outputs by one lane of their reduction order, against an
 *     activation's 4 bytes broadcast; Q4_K and Q6_K the same in two halves of 8 rows (tile_q4_K, tile_q6_K), for
 *     256-bit vectors.
 * And reading a tiled matrix's row back as the plain blocks it was (the embedding's lookups, a tier without the tile
 * kernels).
 */
#include "formats/formats.h"

/* A Q5_0 matrix with each row's blocks regrouped eight at a time (group_q5_0); a row's last n_blocks % 8 stay
 * plain. */
static void regroup_q5_0(const void *src, void *dst, int64_t n_rows, int64_t n) {
    const int64_t nb = n / QK32, row_bytes = nb * (int64_t)sizeof(block_q5_0);
    for (int64_t r = 0; r < n_rows; ++r) {
        const block_q5_0 *blocks = (const block_q5_0 *)((const uint8_t *)src + r * row_bytes);
        uint8_t *row = (uint8_t *)dst + r * row_bytes;
        group_q5_0 *groups = (group_q5_0 *)row;
        for (int64_t gi = 0; gi < nb / 8; ++gi) {
            group_q5_0 *g = &groups[gi];
            memset(g->qh, 0, sizeof g->qh);
            for (int k = 0; k < 8; ++k) {
                const block_q5_0 *b = &blocks[8 * gi + k];
                const uint32_t bits = q5_high_bits(b->qh);
                g->d[k] = b->d;
                memcpy(g->qs[k], b->qs, sizeof g->qs[k]);
                for (int j = 0; j < QK32; ++j) g->qh[j] |= (uint8_t)(((bits >> j) & 1) << k);
            }
        }
        memcpy(row + nb / 8 * (int64_t)sizeof(group_q5_0), blocks + nb / 8 * 8,
               (size_t)(nb % 8) * sizeof(block_q5_0));
    }
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

/* Row 0 comes first (interleave's order) and clears the masks the rows then set their bits in. */
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

static void q4_K_to_tile(const block_q4_K *x, tile_q4_K *t, int row) {
    const int h = row / 8, r = row % 8;
    t->d[h][r] = x->d;
    t->dmin[h][r] = x->dmin;
    for (int w = 0; w < 3; ++w) memcpy(&t->scales[h][w][r], x->scales + 4 * w, 4);
    for (int u = 0; u < 32; ++u) memcpy(t->qs[u / 8][h][u % 8][r], x->qs + 4 * u, 4);
}

static void q4_K_from_tile(const tile_q4_K *t, int row, block_q4_K *x) {
    const int h = row / 8, r = row % 8;
    x->d = t->d[h][r];
    x->dmin = t->dmin[h][r];
    for (int w = 0; w < 3; ++w) memcpy(x->scales + 4 * w, &t->scales[h][w][r], 4);
    for (int u = 0; u < 32; ++u) memcpy(x->qs + 4 * u, t->qs[u / 8][h][u % 8][r], 4);
}

/* Row `row` of a tile superblock <-> the plain superblock. A group's units 0, 1, 2 (4 elements, a 32-bit word each)
 * carry unit 3's bits 4-5, 2-3, 0-1 in bits 6-7 of their bytes (blocks.h: tile_q6_K). */
static void q6_K_to_tile(const block_q6_K *x, tile_q6_K *t, int row) {
    const int h = row / 8, r = row % 8;
    uint8_t q[QK_K];
    q6_K_quants(x, q);
    t->d[h][r] = x->d;
    for (int g = 0; g < 16; ++g) {
        t->scales[g / 2][h][r][g % 2] = x->scales[g];
        uint32_t unit3;
        memcpy(&unit3, q + 16 * g + 12, 4);
        for (int u = 0; u < 3; ++u) {
            uint32_t unit;
            memcpy(&unit, q + 16 * g + 4 * u, 4);
            unit |= (unit3 >> (4 - 2 * u) & 0x03030303u) << 6;
            memcpy(t->qs[g / 2][h][g % 2][u][r], &unit, 4);
        }
    }
}

static void q6_K_from_tile(const tile_q6_K *t, int row, block_q6_K *x) {
    const int h = row / 8, r = row % 8;
    const uint32_t low6 = 0x3F3F3F3Fu, low2 = 0x03030303u;
    uint8_t q[QK_K];
    x->d = t->d[h][r];
    for (int g = 0; g < 16; ++g) {
        const uint8_t(*units)[8][4] = t->qs[g / 2][h][g % 2];
        x->scales[g] = t->scales[g / 2][h][r][g % 2];
        uint32_t u0, u1, u2;
        memcpy(&u0, units[0][r], 4);
        memcpy(&u1, units[1][r], 4);
        memcpy(&u2, units[2][r], 4);
        const uint32_t u3 = (u0 >> 6 & low2) << 4 | (u1 >> 6 & low2) << 2 | (u2 >> 6 & low2);
        u0 &= low6, u1 &= low6, u2 &= low6;
        memcpy(q + 16 * g, &u0, 4);
        memcpy(q + 16 * g + 4, &u1, 4);
        memcpy(q + 16 * g + 8, &u2, 4);
        memcpy(q + 16 * g + 12, &u3, 4);
    }
    q6_K_put_quants(q, x);
}

/* A whole Q4_K tile block back into its 16 rows' blocks (row i's at out[i]), reading the tile in memory order: a
 * prompt gathers every tile of a matrix it has not yet read, and this keeps that stream sequential. */
static void q4_K_tile_to_rows(const tile_q4_K *t, block_q4_K *const out[X16_ROWS]) {
    for (int h = 0; h < 2; ++h) {
        for (int r = 0; r < 8; ++r) out[8 * h + r]->d = t->d[h][r], out[8 * h + r]->dmin = t->dmin[h][r];
    }
    for (int h = 0; h < 2; ++h) {
        for (int w = 0; w < 3; ++w) {
            for (int r = 0; r < 8; ++r) memcpy(out[8 * h + r]->scales + 4 * w, &t->scales[h][w][r], 4);
        }
    }
    for (int c = 0; c < 4; ++c) {
        for (int h = 0; h < 2; ++h) {
            for (int k = 0; k < 8; ++k) {
                for (int r = 0; r < 8; ++r) memcpy(out[8 * h + r]->qs + 32 * c + 4 * k, t->qs[c][h][k][r], 4);
            }
        }
    }
}

/* A matrix of Q4_1, Q8_0, Q5_0, Q4_K or Q6_K rows (type) in 16-row tiles. */
static void interleave(int type, const void *src, void *dst, int64_t n_rows, int64_t n) {
    const pyllm_type_traits *t = type_traits(type);
    const int64_t nb = n / t->block_size, block_bytes = t->type_size;
    for (int64_t row = 0; row < n_rows; ++row) {
        const uint8_t *blocks = (const uint8_t *)src + row * nb * block_bytes;
        const int64_t tile = row / X16_ROWS;
        const int r = (int)(row % X16_ROWS);
        for (int64_t b = 0; b < nb; ++b) {
            if (type == PYLLM_TYPE_Q4_1) {
                q4_1_to_tile((const block_q4_1 *)blocks + b, (tile_q4_1 *)dst + tile * nb + b, r);
            } else if (type == PYLLM_TYPE_Q5_0) {
                q5_0_to_tile((const block_q5_0 *)blocks + b, (tile_q5_0 *)dst + tile * nb + b, r);
            } else if (type == PYLLM_TYPE_Q4_K) {
                q4_K_to_tile((const block_q4_K *)blocks + b, (tile_q4_K *)dst + tile * nb + b, r);
            } else if (type == PYLLM_TYPE_Q6_K) {
                q6_K_to_tile((const block_q6_K *)blocks + b, (tile_q6_K *)dst + tile * nb + b, r);
            } else {
                q8_0_to_tile((const block_q8_0 *)blocks + b, (tile_q8_0 *)dst + tile * nb + b, r);
            }
        }
    }
}

/* Rows first..first + n_rows - 1 of a tile (each within it) into dst, one plain row after another: block by block,
 * so each tile block is read while it is in cache. */
static void gather_rows(int layout, const void *w, int64_t tile, int first, int n_rows, int64_t n, void *dst) {
    const int64_t nb = n / type_traits(layout)->block_size;
    const int64_t row_bytes = nb * type_traits(type_traits(layout)->plain_type)->type_size;
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t at = tile * nb + b;
        if (layout == PYLLM_TYPE_Q4_K_X16 && n_rows == X16_ROWS) {
            block_q4_K *out[X16_ROWS];
            for (int i = 0; i < X16_ROWS; ++i) out[i] = (block_q4_K *)((uint8_t *)dst + i * row_bytes) + b;
            q4_K_tile_to_rows((const tile_q4_K *)w + at, out);
            continue;
        }
        for (int i = 0; i < n_rows; ++i) {
            void *block = (uint8_t *)dst + i * row_bytes;
            const int r = first + i;
            if (layout == PYLLM_TYPE_Q4_1_X16) {
                q4_1_from_tile((const tile_q4_1 *)w + at, r, (block_q4_1 *)block + b);
            } else if (layout == PYLLM_TYPE_Q5_0_X16) {
                q5_0_from_tile((const tile_q5_0 *)w + at, r, (block_q5_0 *)block + b);
            } else if (layout == PYLLM_TYPE_Q4_K_X16) {
                q4_K_from_tile((const tile_q4_K *)w + at, r, (block_q4_K *)block + b);
            } else if (layout == PYLLM_TYPE_Q6_K_X16) {
                q6_K_from_tile((const tile_q6_K *)w + at, r, (block_q6_K *)block + b);
            } else {
                q8_0_from_tile((const tile_q8_0 *)w + at, r, (block_q8_0 *)block + b);
            }
        }
    }
}

void tile_gather_row(int layout, const void *w, int64_t row, int64_t n, void *dst) {
    gather_rows(layout, w, row / X16_ROWS, (int)(row % X16_ROWS), 1, n, dst);
}

void tile_gather(int layout, const void *tile, int64_t n, void *dst) {
    gather_rows(layout, tile, 0, 0, X16_ROWS, n, dst);
}

int pyllm_repack(int type, int layout, const void *src, void *dst, int64_t n_rows, int64_t n) {
    const pyllm_type_traits *t = type_traits(layout);
    if (t == NULL || !t->repacked || t->plain_type != type) return PYLLM_ERR_TYPE;
    if (n_rows < 0 || n_rows % t->tile_rows != 0 || n <= 0 || n % t->block_size != 0) return PYLLM_ERR_SHAPE;
    if (layout == PYLLM_TYPE_Q5_0_G8) regroup_q5_0(src, dst, n_rows, n);
    else interleave(type, src, dst, n_rows, n);
    return PYLLM_OK;
}
