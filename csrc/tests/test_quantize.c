/*
 * test_quantize.c - the file-format quantizers (pyllm_quantize_rows), run plain and under ASan/UBSan (make test-c,
 * make test-asan), on rows built to reach their edges: normal, all zero, constant, one spike, huge and tiny
 * magnitudes, many ties, with and without importance weights:
 *   1. the round trip (quantize, dequantize) stays within each format's error (RMS over the row's RMS), and is
 *      finite even where the half-precision scales underflow (tiny rows);
 *   2. the same input gives the same bytes twice, and rows quantized together give each row's bytes alone;
 *   3. bad arguments are refused.
 * Their bytes against llama.cpp's are tests/test_quantize.py's job (recorded from llama-quantize).
 * Prints "N passed, N failed" last.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_blocks.h"
#include "test_check.h"

#define N_COLS 512
#define N_KINDS 7

/* The formats a model file can be written in, with the RMS error of a round trip they keep below (relative to the
 * row's RMS; Gaussian rows: Q2_K's two bits lose about a third). */
static const struct {
    int type;
    double max_error;
} formats[] = {
    {PYLLM_TYPE_F32, 0.0},    {PYLLM_TYPE_F16, 1e-3},   {PYLLM_TYPE_BF16, 8e-3},  {PYLLM_TYPE_Q4_0, 0.16},
    {PYLLM_TYPE_Q4_1, 0.16},  {PYLLM_TYPE_Q5_0, 0.08},  {PYLLM_TYPE_Q5_1, 0.08},  {PYLLM_TYPE_Q8_0, 0.01},
    {PYLLM_TYPE_Q2_K, 0.45},  {PYLLM_TYPE_Q3_K, 0.25},  {PYLLM_TYPE_Q4_K, 0.12},  {PYLLM_TYPE_Q5_K, 0.06},
    {PYLLM_TYPE_Q6_K, 0.03},
};
#define N_FORMATS (int)(sizeof(formats) / sizeof(formats[0]))

static float gaussian(void) {
    const float u = rng_float(1e-7f, 1.0f), v = rng_float(0.0f, 1.0f);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* Row kind k: 0 normal, 1 all zero, 2 constant, 3 one spike in zeros, 4 huge (fp16's range), 5 tiny, 6 quarter
 * steps (ties after scaling). */
static void make_row(int kind, float *x) {
    for (int j = 0; j < N_COLS; ++j) {
        const float g = gaussian();
        switch (kind) {
        case 0: x[j] = g * 0.02f; break;
        case 1: x[j] = 0.0f; break;
        case 2: x[j] = 0.75f; break;
        case 3: x[j] = j == 77 ? -3.0f : 0.0f; break;
        case 4: x[j] = g * 6e3f; break;
        case 5: x[j] = g * 1e-6f; break;
        default: x[j] = roundf(g * 4.0f) / 4.0f; break;
        }
    }
}

static double relative_rms_error(const float *x, const float *y) {
    double err = 0.0, ref = 0.0;
    for (int j = 0; j < N_COLS; ++j) {
        err += ((double)x[j] - y[j]) * ((double)x[j] - y[j]);
        ref += (double)x[j] * x[j];
    }
    return ref > 0.0 ? sqrt(err / ref) : sqrt(err);
}

static void test_round_trips(void) {
    float x[N_KINDS][N_COLS], y[N_COLS], importance[N_COLS];
    for (int k = 0; k < N_KINDS; ++k) make_row(k, x[k]);
    for (int j = 0; j < N_COLS; ++j) importance[j] = rng_float(0.01f, 3.0f);
    for (int f = 0; f < N_FORMATS; ++f) {
        const int type = formats[f].type;
        const int64_t row_bytes = N_COLS / pyllm_type_block_size(type) * pyllm_type_size(type);
        uint8_t *all = malloc((size_t)(N_KINDS * row_bytes)), *one = malloc((size_t)row_bytes);
        for (int weighted = 0; weighted < 2; ++weighted) {
            const float *w = weighted ? importance : NULL;
            CHECK(pyllm_quantize_rows(type, &x[0][0], all, N_KINDS, N_COLS, w) == PYLLM_OK, "%s quantize",
                  pyllm_type_name(type));
            for (int k = 0; k < N_KINDS; ++k) {
                CHECK(pyllm_quantize_rows(type, x[k], one, 1, N_COLS, w) == PYLLM_OK, "quantize one row");
                CHECK(memcmp(one, all + k * row_bytes, (size_t)row_bytes) == 0, "%s row %d alone != together",
                      pyllm_type_name(type), k);
                pyllm_dequantize_row(type, one, y, N_COLS);
                int finite = 1;
                for (int j = 0; j < N_COLS; ++j) finite &= isfinite(y[j]) != 0;
                CHECK(finite, "%s row kind %d: a value comes back not finite", pyllm_type_name(type), k);
                if (k == 5) continue;  /* tiny rows: their half-precision scales underflow (in llama.cpp too) */
                const double limit = formats[f].max_error;
                const double error = relative_rms_error(x[k], y);
                CHECK(error <= limit, "%s%s row kind %d: error %.4g above %.4g", pyllm_type_name(type),
                      weighted ? " (importance)" : "", k, error, limit);
                if (k == 1) {
                    int zero = 1;
                    for (int j = 0; j < N_COLS; ++j) zero &= y[j] == 0.0f;
                    CHECK(zero, "%s: a zero row comes back nonzero", pyllm_type_name(type));
                }
            }
        }
        free(all);
        free(one);
    }
}

static void test_bad_arguments(void) {
    float x[N_COLS] = {0};
    uint8_t out[4 * N_COLS];
    CHECK(pyllm_quantize_rows(PYLLM_TYPE_Q4_K, x, out, 1, 128, NULL) == PYLLM_ERR_SHAPE, "Q4_K of 128");
    CHECK(pyllm_quantize_rows(PYLLM_TYPE_Q4_0, x, out, 1, 0, NULL) == PYLLM_ERR_SHAPE, "zero columns");
    CHECK(pyllm_quantize_rows(PYLLM_TYPE_Q4_0, x, out, -1, 32, NULL) == PYLLM_ERR_SHAPE, "negative rows");
    CHECK(pyllm_quantize_rows(PYLLM_TYPE_Q8_K, x, out, 1, 256, NULL) == PYLLM_ERR_TYPE, "Q8_K: no file type");
    CHECK(pyllm_quantize_rows(PYLLM_TYPE_Q4_K_X16, x, out, 16, 256, NULL) == PYLLM_ERR_TYPE, "a tiled layout");
    CHECK(pyllm_quantize_rows(-3, x, out, 1, 32, NULL) == PYLLM_ERR_TYPE, "unknown type");
}

int main(void) {
    test_round_trips();
    test_bad_arguments();
    return check_report();
}
