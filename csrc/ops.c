/*
 * ops.c - the non-matmul steps of a transformer forward pass, each computing
 * every output row in one fixed order, independent of how many rows a call
 * holds (so batching never changes a result).
 */
#include <math.h>
#include <stdlib.h>

#include "dispatch.h"
#include "quants.h"
#include "threadpool.h"

/* y[m, n] = x / sqrt(mean(x^2) + eps) * w  (w may be NULL); in place allowed */
void pyllm_rms_norm(const float *x, const float *w, float *y, int64_t m, int64_t n, float eps) {
    for (int64_t r = 0; r < m; ++r) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        /* as llama.cpp: float squares summed in double, a float mean, 1 / sqrtf */
        double sum = 0.0;
        for (int64_t i = 0; i < n; ++i) sum += (double)(xr[i] * xr[i]);
        const float mean = (float)(sum / (double)n);
        const float scale = 1.0f / sqrtf(mean + eps);
        for (int64_t i = 0; i < n; ++i) yr[i] = w ? (xr[i] * scale) * w[i] : xr[i] * scale;
    }
}

/* Rotary position embedding, in place on x[m, n_heads, head_dim] at positions pos[m].
 * The first n_rot dims of each head rotate: theta_i = freq_scale * pos * base^(-2i / n_rot).
 * Normal style pairs (2i, 2i+1); neox style pairs (i, i + n_rot / 2). */
void pyllm_rope(float *x, const int32_t *pos, int64_t m, int64_t n_heads, int64_t head_dim, int64_t n_rot,
                float freq_base, float freq_scale, int neox) {
    const int64_t half = n_rot / 2;
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    for (int64_t r = 0; r < m; ++r) {
        float theta_base = (float)pos[r];  /* pos * theta_scale^i, by repeated multiplication as ggml does */
        for (int64_t i = 0; i < half; ++i, theta_base *= theta_scale) {
            const float theta = freq_scale * theta_base;
            const float c = cosf(theta), s = sinf(theta);
            for (int64_t h = 0; h < n_heads; ++h) {
                float *head = x + (r * n_heads + h) * head_dim;
                const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
                const float x0 = head[a], x1 = head[b];
                /* the fused multiply-adds of llama.cpp's x86 build (its compiler contracts the rotation) */
                head[a] = fmaf(x0, c, -(x1 * s));
                head[b] = fmaf(x0, s, x1 * c);
            }
        }
    }
}

/*
 * exp(x) as llama.cpp's x86 vector code computes it (what its softmax and silu use on an AVX2 build):
 * x = n ln2 + b with n = round(x / ln2) (by the 1.5 * 2^23 shifter), exp(b) by a degree-5 polynomial,
 * the power of two 2^n put into the exponent bits; |n| > 126 scaled in two steps, |n| > 192 to 0 or inf.
 * Every step is one IEEE operation on one lane, so this scalar form gives the vector code's bits.
 */
static float exp_ggml(float x) {
    const float shifter = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, shifter);
    const float n = z - shifter;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const uint32_t e = fp32_to_bits(z) << 23;
    const float k = fp32_from_bits(e + fp32_to_bits(1.0f));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, 0x1.ffffecp-1f * b);
    if (!(fabsf(n) > 126.0f)) return fmaf(k, j, k);
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = fp32_from_bits(g + 0x7f000000u);
    const float s2 = fp32_from_bits(e - g);
    if (fabsf(n) > 192.0f) return s1 * s1;
    return fmaf(s2, j, s2) * s1;
}

/* y[m, n] = silu(gate) * up, as llama.cpp: its vector silu x / (1 + exp_ggml(0 - x)) on each
 * whole group of 8 of a row, libm's expf on the rest */
void pyllm_swiglu(const float *gate, const float *up, float *y, int64_t m, int64_t n) {
    for (int64_t r = 0; r < m; ++r) {
        const float *g = gate + r * n, *u = up + r * n;
        float *yr = y + r * n;
        const int64_t vectorized = n - n % 8;
        for (int64_t i = 0; i < vectorized; ++i) yr[i] = g[i] / (1.0f + exp_ggml(0.0f - g[i])) * u[i];
        for (int64_t i = vectorized; i < n; ++i) yr[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* with the one fused multiply-add of llama.cpp's x86 build: 1 + (coef * x) * x */
static float gelu_tanh(float x) {
    const float sqrt_2_over_pi = 0.79788456080286535588f, coef = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * fmaf(coef * x, x, 1.0f)));
}

/* y[i] = gelu_tanh(gate[i]) * up[i], with gelu evaluated as ggml's CPU backend does (so the numbers are
 * llama.cpp's): at the gate rounded to half precision, the result rounded to half precision; gates
 * beyond +-10 take the asymptotes 0 and x. */
void pyllm_geglu(const float *gate, const float *up, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        float act;
        if (g <= -10.0f) act = 0.0f;
        else if (g >= 10.0f) act = g;
        else act = fp16_to_fp32(fp32_to_fp16(gelu_tanh(fp16_to_fp32(fp32_to_fp16(g)))));
        y[i] = act * up[i];
    }
}

typedef struct {
    const float *q;            /* (m, n_head, d) */
    const fp16_t *k, *v;       /* (n_kv, n_head_kv, d), half precision like llama.cpp's cache */
    const int32_t *qpos;       /* (m,) */
    const int32_t *kpos;       /* (n_kv,) */
    int64_t m, n_kv, n_head, n_head_kv, d;
    float scale, softcap;
    int32_t window;            /* 0: no sliding window */
    float *out;                /* (m, n_head, d) */
    float *scratch;            /* per thread: n_kv scores, d query halves, 8 * d value lanes */
    const attention_kernels *kernels;
} attention_job;

static inline int key_visible(const attention_job *job, int64_t t, int32_t qp) {
    const int32_t kp = job->kpos[t];
    return kp >= 0 && kp <= qp && (job->window <= 0 || qp - kp < job->window);
}

static inline float round_to_half(float x) { return fp16_to_fp32(fp32_to_fp16(x)); }

/*
 * One (query row, head), in the arithmetic of llama.cpp's CPU attention for a prompt batch (so a prompt's
 * numbers are llama.cpp's): the query rounded to half precision; q.k in 8 lanes (slot mod 8); scaled;
 * softmax with exp_ggml, the exponentials summed in double by groups of 8 slots (each group's 8 added as
 * reduce_lanes8 does), 1 / sum in double; the weights rounded to half precision; the weighted sum of the
 * values in 8 lanes by slot mod 8, each lane a chain of fmaf in slot order, then reduce_lanes8.
 */
static void attend_one(const attention_job *job, int64_t r, int64_t h, float *scratch) {
    const int64_t d = job->d, n_kv = job->n_kv, group = job->n_head / job->n_head_kv, hk = h / group;
    float *scores = scratch, *q = scratch + n_kv, *lanes = q + d;
    const float *q32 = job->q + (r * job->n_head + h) * d;
    float *out = job->out + (r * job->n_head + h) * d;
    for (int64_t i = 0; i < d; ++i) q[i] = round_to_half(q32[i]);
    const int32_t qp = job->qpos[r];
    float max = -INFINITY;
    const int64_t stride = job->n_head_kv * d;
    for (int64_t t = 0; t < n_kv;) {
        if (!key_visible(job, t, qp)) {
            scores[t++] = -INFINITY;
            continue;
        }
        int64_t end = t + 1;  /* a run of visible slots: their dot products in one call */
        while (end < n_kv && key_visible(job, end, qp)) ++end;
        job->kernels->dots(q, job->k + t * stride + hk * d, stride, end - t, d, scores + t);
        for (; t < end; ++t) {
            float s = scores[t] * job->scale;
            if (job->softcap > 0.0f) s = job->softcap * tanhf(s / job->softcap);
            scores[t] = s;
            max = s > max ? s : max;
        }
    }
    for (int64_t i = 0; i < d; ++i) out[i] = 0.0f;
    if (max == -INFINITY) return;  /* no visible key */
    double sum = 0.0;
    for (int64_t g = 0; g < n_kv; g += 8) {
        float e[8] = {0};
        for (int64_t l = 0; l < 8 && g + l < n_kv; ++l) {
            if (scores[g + l] != -INFINITY) e[l] = exp_ggml(scores[g + l] - max);
            scores[g + l] = e[l];
        }
        sum += (double)reduce_lanes8(e);
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < 8 * d; ++i) lanes[i] = 0.0f;
    for (int64_t t = 0; t < n_kv; ++t) {
        const float p = round_to_half(scores[t] * inv);
        if (p == 0.0f) continue;  /* a masked slot, or a weight below half precision's range: adds nothing */
        job->kernels->axpy(lanes + (t & 7) * d, p, job->v + (t * job->n_head_kv + hk) * d, d);
    }
    for (int64_t i = 0; i < d; ++i) {
        float acc[8];
        for (int l = 0; l < 8; ++l) acc[l] = lanes[l * d + i];
        out[i] = reduce_lanes8(acc);
    }
}

static void attention_task(void *arg, int ith, int nth) {
    const attention_job *job = arg;
    float *scratch = job->scratch + ith * (job->n_kv + 9 * job->d);
    const int64_t total = job->m * job->n_head;
    for (int64_t idx = ith; idx < total; idx += nth) attend_one(job, idx / job->n_head, idx % job->n_head, scratch);
}

int pyllm_attention(const float *q, const uint16_t *k, const uint16_t *v, const int32_t *qpos,
                    const int32_t *kpos, int64_t m, int64_t n_kv, int64_t n_head, int64_t n_head_kv, int64_t d,
                    float scale, int32_t window, float softcap, float *out, int n_threads) {
    pyllm_cpu_best_tier();  /* the fp16 table is filled on first use of the core */
    if (m <= 0 || n_kv <= 0 || d <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0) return PYLLM_ERR_SHAPE;
    if (n_threads <= 0) n_threads = pyllm_physical_cores();
    if (n_threads > PYLLM_MAX_THREADS) return PYLLM_ERR_THREADS;
    /* a decode step's attention is quicker alone than handed out (results do not depend on it) */
    const int64_t work = m * n_head * n_kv * d;
    if (work < (int64_t)n_threads << 18) n_threads = (int)(work >> 18) + 1;
    float *scratch = malloc((size_t)(n_threads * (n_kv + 9 * d)) * sizeof(float));
    if (scratch == NULL) return PYLLM_ERR_NOMEM;
    attention_job job = {q, k, v, qpos, kpos, m, n_kv, n_head, n_head_kv, d, scale, softcap, window, out, scratch,
                         pyllm_attention_kernels(pyllm_active_tier())};
    const int status = pyllm_pool_run(n_threads, attention_task, &job);
    free(scratch);
    return status;
}
