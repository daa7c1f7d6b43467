/*
 * types.c - the type table: for every type id its name, block shape, activation format and layout, the one copy
 * (pyllm/gguf.py and pyllm/kernels.py read it through pyllm_traits).
 */
#include "formats/formats.h"

/* name, block_size, type_size, vec_dot_type, plain_type, tile_rows, repacked, file_type */
#define FILE_FORMAT(t, name, bs, ts, act) [t] = {name, bs, ts, act, t, 1, 0, 1}
#define ACTIVATIONS(t, name, bs, ts) [t] = {name, bs, ts, -1, t, 1, 0, 0}
static const pyllm_type_traits traits[PYLLM_TYPE_COUNT] = {
    /* float weights meet activations rounded to their own format, as llama.cpp does */
    FILE_FORMAT(PYLLM_TYPE_F32, "F32", 1, 4, PYLLM_TYPE_F32),
    FILE_FORMAT(PYLLM_TYPE_F16, "F16", 1, 2, PYLLM_TYPE_F16),
    FILE_FORMAT(PYLLM_TYPE_BF16, "BF16", 1, 2, PYLLM_TYPE_BF16),
    FILE_FORMAT(PYLLM_TYPE_Q4_0, "Q4_0", QK32, sizeof(block_q4_0), PYLLM_TYPE_Q8_0),
    FILE_FORMAT(PYLLM_TYPE_Q4_1, "Q4_1", QK32, sizeof(block_q4_1), PYLLM_TYPE_Q8_1),
    FILE_FORMAT(PYLLM_TYPE_Q5_0, "Q5_0", QK32, sizeof(block_q5_0), PYLLM_TYPE_Q8_0),
    FILE_FORMAT(PYLLM_TYPE_Q5_1, "Q5_1", QK32, sizeof(block_q5_1), PYLLM_TYPE_Q8_1),
    FILE_FORMAT(PYLLM_TYPE_Q8_0, "Q8_0", QK32, sizeof(block_q8_0), PYLLM_TYPE_Q8_0),
    FILE_FORMAT(PYLLM_TYPE_Q2_K, "Q2_K", QK_K, sizeof(block_q2_K), PYLLM_TYPE_Q8_K),
    FILE_FORMAT(PYLLM_TYPE_Q3_K, "Q3_K", QK_K, sizeof(block_q3_K), PYLLM_TYPE_Q8_K),
    FILE_FORMAT(PYLLM_TYPE_Q4_K, "Q4_K", QK_K, sizeof(block_q4_K), PYLLM_TYPE_Q8_K),
    FILE_FORMAT(PYLLM_TYPE_Q5_K, "Q5_K", QK_K, sizeof(block_q5_K), PYLLM_TYPE_Q8_K),
    FILE_FORMAT(PYLLM_TYPE_Q6_K, "Q6_K", QK_K, sizeof(block_q6_K), PYLLM_TYPE_Q8_K),
    ACTIVATIONS(PYLLM_TYPE_Q8_K, "Q8_K", QK_K, sizeof(block_q8_K)),
    ACTIVATIONS(PYLLM_TYPE_Q8_1, "Q8_1", QK32, sizeof(block_q8_1)),
    [PYLLM_TYPE_Q4_0_LANES] = {"Q4_0 (lanes)", QK32, sizeof(block_q4_0), PYLLM_TYPE_Q8_0, PYLLM_TYPE_Q4_0, 1, 0, 0},
    [PYLLM_TYPE_Q5_0_G8] = {"Q5_0 (8-block groups)", QK32, sizeof(block_q5_0), PYLLM_TYPE_Q8_0, PYLLM_TYPE_Q5_0, 1, 1, 0},
    [PYLLM_TYPE_Q4_1_X16] = {"Q4_1 (16-row tiles)", QK32, sizeof(block_q4_1), PYLLM_TYPE_Q8_1, PYLLM_TYPE_Q4_1, X16_ROWS, 1, 0},
    [PYLLM_TYPE_Q8_0_X16] = {"Q8_0 (16-row tiles)", QK32, sizeof(block_q8_0), PYLLM_TYPE_Q8_0, PYLLM_TYPE_Q8_0, X16_ROWS, 1, 0},
    [PYLLM_TYPE_Q5_0_X16] = {"Q5_0 (16-row tiles)", QK32, sizeof(block_q5_0), PYLLM_TYPE_Q8_0, PYLLM_TYPE_Q5_0, X16_ROWS, 1, 0},
    [PYLLM_TYPE_Q4_K_X16] = {"Q4_K (16-row tiles)", QK_K, sizeof(block_q4_K), PYLLM_TYPE_Q8_K, PYLLM_TYPE_Q4_K, X16_ROWS, 1, 0},
    [PYLLM_TYPE_Q6_K_X16] = {"Q6_K (16-row tiles)", QK_K, sizeof(block_q6_K), PYLLM_TYPE_Q8_K, PYLLM_TYPE_Q6_K, X16_ROWS, 1, 0},
};

const pyllm_type_traits *type_traits(int type) {
    return type >= 0 && type < PYLLM_TYPE_COUNT && traits[type].name != NULL ? &traits[type] : NULL;
}

int type_check_row(int type, int64_t n) {
    const pyllm_type_traits *t = type_traits(type);
    if (t == NULL) return PYLLM_ERR_TYPE;
    return n > 0 && n % t->block_size == 0 ? PYLLM_OK : PYLLM_ERR_SHAPE;
}

const pyllm_type_traits *pyllm_traits(int type) { return type_traits(type); }
int64_t pyllm_type_block_size(int type) { return type_traits(type) ? traits[type].block_size : 0; }
int64_t pyllm_type_size(int type) { return type_traits(type) ? traits[type].type_size : 0; }
const char *pyllm_type_name(int type) { return type_traits(type) ? traits[type].name : "?"; }
int pyllm_vec_dot_type(int type) { return type_traits(type) ? traits[type].vec_dot_type : -1; }
