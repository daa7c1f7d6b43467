/*
 * matmul.h - several matmuls over one input in one call (the C core's own; pyllm_matmul is one of them).
 */
#ifndef PYLLM_MATMUL_H
#define PYLLM_MATMUL_H

#include "pyllm.h"

/* A weight W (n rows, as pyllm_matmul takes it) and its output y (m, n). */
typedef struct {
    const void *data;
    int64_t n;
    float *y;
} pyllm_matrix;

/* For each of n_weights (1..4) weights of one matmul type and row length k: y = X . W^T, the bits pyllm_matmul
 * gives each alone; X (m, k) is converted once and the weights' rows handed out together. */
int pyllm_matmul_many(int type, const pyllm_matrix *weights, int n_weights, int64_t k, const float *x, int64_t m,
                      int n_threads);

#endif /* PYLLM_MATMUL_H */
