/*
 * ops.c - the row-wise steps of a transformer forward pass (rms_norm, rope, the gated activations), each computing
 * every output row in one fixed order, independent of how many rows a call holds (so batching never changes a
 * result), on the active tier's op kernels. Attention is attention.c.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "backend/kernel_set.h"

/* as llama.cpp: float squares summed in double in index order, a float mean, 1 / sqrtf */
static float rms_scale(double sum, int64_t n, float eps) {
    const float mean = (float)(sum / (double)n);
    return 1.0f / sqrtf(mean + eps);
}

/* y[m, n] = x / sqrt(mean(x^2) + eps) * w  (w may be NULL); in place allowed. Four rows at a time, so
 * their sums (each one chain, in order) overlap instead of waiting on each addition. */
void pyllm_rms_norm(const float *x, const float *w, float *y, int64_t m, int64_t n, float eps) {
    void (*const scale_row)(const float *, const float *, float *, int64_t, float) =
        active_ops()->ops->scale_row;
    int64_t r = 0;
    for (; r + 4 <= m; r += 4) {
        const float *x0 = x + r * n, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            s0 += (double)(x0[i] * x0[i]);
            s1 += (double)(x1[i] * x1[i]);
            s2 += (double)(x2[i] * x2[i]);
            s3 += (double)(x3[i] * x3[i]);
        }
        const double sums[4] = {s0, s1, s2, s3};
        for (int k = 0; k < 4; ++k) scale_row(x + (r + k) * n, w, y + (r + k) * n, n, rms_scale(sums[k], n, eps));
    }
    for (; r < m; ++r) {
        const float *xr = x + r * n;
        double sum = 0.0;
        for (int64_t i = 0; i < n; ++i) sum += (double)(xr[i] * xr[i]);
        scale_row(xr, w, y + r * n, n, rms_scale(sum, n, eps));
    }
}

/* The rotation angles' cosines and sines of m rows at positions pos: cos_sin[r * n_rot + 2i] = cos(theta_i),
 * [.. + 2i + 1] = sin(theta_i), theta_i = freq_scale * pos * base^(-2i / n_rot) with pos * base^(-2/n_rot)^i
 * by repeated multiplication, as ggml does. */
void pyllm_rope_angles(const int32_t *pos, int64_t m, int64_t n_rot, float freq_base, float freq_scale, float *cos_sin) {
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    for (int64_t r = 0; r < m; ++r) {
        float theta_base = (float)pos[r];
        for (int64_t i = 0; i < n_rot / 2; ++i, theta_base *= theta_scale) {
            const float theta = freq_scale * theta_base;
            cos_sin[r * n_rot + 2 * i] = cosf(theta);
            cos_sin[r * n_rot + 2 * i + 1] = sinf(theta);
        }
    }
}

/* Rotate x[m, n_heads, head_dim] in place by the angles of pyllm_rope_angles (the first n_rot dims of
 * each head; normal style pairs (2i, 2i+1), neox style (i, i + n_rot / 2)): op_kernels' rope_head. */
void pyllm_rope_rotate(float *x, const float *cos_sin, int64_t m, int64_t n_heads, int64_t head_dim, int64_t n_rot,
                       int neox) {
    const op_kernels *kernels = active_ops()->ops;
    for (int64_t r = 0; r < m; ++r) {
        for (int64_t h = 0; h < n_heads; ++h) kernels->rope_head(x + (r * n_heads + h) * head_dim, cos_sin + r * n_rot, n_rot, neox);
    }
}

int pyllm_rope_dims_valid(int64_t n_rot, int64_t head_dim) {
    return n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim;
}

/* Rotary position embedding, in place on x[m, n_heads, head_dim] at positions pos[m]. */
int pyllm_rope(float *x, const int32_t *pos, int64_t m, int64_t n_heads, int64_t head_dim, int64_t n_rot,
               float freq_base, float freq_scale, int neox) {
    if (!pyllm_rope_dims_valid(n_rot, head_dim)) return PYLLM_ERR_SHAPE;
    float *cos_sin = malloc((size_t)n_rot * sizeof(float));  /* one row's angles at a time */
    if (cos_sin == NULL) return PYLLM_ERR_NOMEM;
    for (int64_t r = 0; r < m; ++r) {
        pyllm_rope_angles(pos + r, 1, n_rot, freq_base, freq_scale, cos_sin);
        pyllm_rope_rotate(x + r * n_heads * head_dim, cos_sin, 1, n_heads, head_dim, n_rot, neox);
    }
    free(cos_sin);
    return PYLLM_OK;
}

/* y[m, n] = silu(gate) * up, as llama.cpp: its vector silu x / (1 + exp_ggml(0 - x)) on each
 * whole group of 8 of a row, libm's expf on the rest */
void pyllm_swiglu(const float *gate, const float *up, float *y, int64_t m, int64_t n) {
    const op_kernels *kernels = active_ops()->ops;
    for (int64_t r = 0; r < m; ++r) kernels->swiglu(gate + r * n, up + r * n, y + r * n, n);
}

/* with the one fused multiply-add of llama.cpp's x86 build: 1 + (coef * x) * x */
static float gelu_tanh(float x) {
    const float sqrt_2_over_pi = 0.79788456080286535588f, coef = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * fmaf(coef * x, x, 1.0f)));
}

/* gelu_tanh of every half-precision value, rounded to half precision (llama.cpp's table, made alike);
 * one entry more, so a 4-byte load at any entry stays inside (the AVX2 kernel gathers that way) */
static fp16_t gelu_half[(1 << 16) + 1];
static pthread_once_t gelu_half_once = PTHREAD_ONCE_INIT;

static void fill_gelu_half(void) {
    for (uint32_t h = 0; h < (1u << 16); ++h) gelu_half[h] = fp32_to_fp16(gelu_tanh(fp16_to_fp32((fp16_t)h)));
}

/* y[i] = gelu_tanh(gate[i]) * up[i], with gelu evaluated as ggml's CPU backend does (so the numbers are
 * llama.cpp's): at the gate rounded to half precision, the result rounded to half precision (one table
 * lookup); gates beyond +-10 give 0 and gate * up. */
void pyllm_geglu(const float *gate, const float *up, float *y, int64_t n) {
    pthread_once(&gelu_half_once, fill_gelu_half);
    active_ops()->ops->geglu(gelu_half, gate, up, y, n);
}

void pyllm_hadamard(float *x, int64_t n_chunks, int64_t n) {
    const float scale = 1.0f / sqrtf((float)n);
    for (int64_t c = 0; c < n_chunks; ++c, x += n) {
        for (int64_t j = 0; j < n; ++j) x[j] = x[j] * scale;
        for (int64_t len = 1; len < n; len <<= 1) {
            for (int64_t i = 0; i < n; i += 2 * len) {
                for (int64_t j = i; j < i + len; ++j) {
                    const float u = x[j], v = x[j + len];
                    x[j] = u + v;
                    x[j + len] = u - v;
                }
            }
        }
    }
}
