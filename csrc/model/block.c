/*
 * block.c - transformer blocks in one call: the steps of pyllm/model.py's
 * reference block (Model._block_reference), on the same C ops in the same
 * order, so the results are the same bits with no Python between steps.
 *
 *   h = rms_norm(x); q, k, v = h Wq, h Wk, h Wv (+ biases); q/k norms; rope
 *   per sequence: store k, v in its cache; attention over its visible slots
 *   x += post_attn_norm(attn Wo)
 *   h = rms_norm(x); x += post_ffw_norm(act(h Wgate, h Wup) Wdown)
 */
#include "core/scratch.h"
#include "core/threadpool.h"
#include "matmul/matmul.h"

/* The layers' rope settings (llama-style models have one, gemma3 a second for its sliding-window layers): each
 * one's angles for the batch's rows (m * n_rot), made once a call (block_scratch_make). */
typedef struct {
    float base, scale;
    float *angles;
} rope_setting;

typedef struct {
    float *h;                     /* a norm's output, then (the inputs used) a block's output */
    float *q, *k, *v, *attn;
    float *gate, *up;             /* over q .. attn (dead during the FFN); the activation goes into gate */
    pyllm_attention_call *calls;  /* one per segment */
    rope_setting *rope;           /* the distinct settings of the layers, n_rope of them */
    int n_rope;
} block_scratch;

/* Whether layer i is the first with its rope setting. */
static int first_of_setting(const pyllm_block *blocks, int i) {
    for (int j = 0; j < i; ++j) {
        if (blocks[j].rope_base == blocks[i].rope_base && blocks[j].rope_scale == blocks[i].rope_scale) return 0;
    }
    return 1;
}

/* The layers' distinct rope settings into rope (NULL: only count them), their angles not yet placed; how many. */
static int rope_settings(const pyllm_block *blocks, int n_layer, rope_setting *rope) {
    int n = 0;
    for (int i = 0; i < n_layer; ++i) {
        if (!first_of_setting(blocks, i)) continue;
        if (rope != NULL) rope[n] = (rope_setting){blocks[i].rope_base, blocks[i].rope_scale, NULL};
        n++;
    }
    return n;
}

/* Layer b's rope angles (rope_settings made them all). */
static const float *rope_angles(const block_scratch *s, const pyllm_block *b) {
    for (int i = 0; i < s->n_rope - 1; ++i) {
        if (s->rope[i].base == b->rope_base && s->rope[i].scale == b->rope_scale) return s->rope[i].angles;
    }
    return s->rope[s->n_rope - 1].angles;
}

/* The row-wise steps, split by rows across the pool's threads (each row's arithmetic is the op's own). */
typedef enum { STEP_NORM, STEP_ROPE, STEP_SWIGLU, STEP_GEGLU, STEP_ADD } step_kind;

typedef struct {
    step_kind kind;
    int64_t rows, width;          /* the rows split across threads, of width floats each */
    const float *a, *b;           /* NORM: x, weight; SWIGLU / GEGLU: gate, up; ADD: the addend; ROPE: angles */
    float *y;                     /* the output (ROPE and ADD: in place) */
    float eps;                    /* NORM */
    const pyllm_block_config *cfg; /* ROPE: n_heads = width / head_dim */
} row_step;

static void row_step_task(void *arg, int ith, int nth) {
    const row_step *s = arg;
    const int64_t begin = s->rows * ith / nth, end = s->rows * (ith + 1) / nth, n = end - begin;
    const int64_t offset = begin * s->width;
    switch (s->kind) {
    case STEP_NORM:
        pyllm_rms_norm(s->a + offset, s->b, s->y + offset, n, s->width, s->eps);
        break;
    case STEP_ROPE:
        pyllm_rope_rotate(s->y + offset, s->a + begin * s->cfg->n_rot, n, s->width / s->cfg->head_dim,
                          s->cfg->head_dim, s->cfg->n_rot, s->cfg->rope_neox);
        break;
    case STEP_SWIGLU:
        pyllm_swiglu(s->a + offset, s->b + offset, s->y + offset, n, s->width);
        break;
    case STEP_GEGLU:
        pyllm_geglu(s->a + offset, s->b + offset, s->y + offset, n * s->width);
        break;
    case STEP_ADD:
        for (int64_t i = 0; i < n * s->width; ++i) s->y[offset + i] += s->a[offset + i];
        break;
    }
}

/* Steps of fewer floats than this run on the calling thread: handing them out costs more than they do (a decode
 * row's norms, adds and rope; bench/README.md). */
#define ROWS_ALONE_FLOATS 4096

static int run_rows(row_step step, int n_threads) {
    const int threads = step.rows * step.width < ROWS_ALONE_FLOATS ? 1 : (step.rows < n_threads ? (int)step.rows : n_threads);
    return pyllm_pool_run(threads, row_step_task, &step);
}

static int rms_norm_rows(const float *x, const float *w, float *y, int64_t rows, int64_t width, float eps,
                         int n_threads) {
    return run_rows((row_step){.kind = STEP_NORM, .rows = rows, .width = width, .a = x, .b = w, .y = y, .eps = eps},
                    n_threads);
}

static int add_into(float *x, const float *addend, int64_t rows, int64_t width, int n_threads) {
    return run_rows((row_step){.kind = STEP_ADD, .rows = rows, .width = width, .a = addend, .y = x}, n_threads);
}

static int rope_rows(const pyllm_block_config *cfg, const float *cos_sin, float *x, int64_t m, int64_t n_heads,
                     int n_threads) {
    return run_rows((row_step){.kind = STEP_ROPE, .rows = m, .width = n_heads * cfg->head_dim, .y = x, .a = cos_sin,
                               .cfg = cfg}, n_threads);
}

/* Two or three weights on one input (q, k, v; gate, up): in one call where they share a kernel set (the input
 * converted and laid out once), one by one otherwise. */
static int matmul_shared(const pyllm_weight *const *w, float *const *y, int count, const float *x, int64_t m,
                         int n_threads) {
    int same = 1;
    for (int i = 1; i < count; ++i) same &= w[i]->kernels == w[0]->kernels;
    if (!same) {
        int status = PYLLM_OK;
        for (int i = 0; i < count && status == PYLLM_OK; ++i) status = pyllm_matmul(w[i], x, m, y[i], n_threads);
        return status;
    }
    matmul_weight weights[3];
    for (int i = 0; i < count; ++i) weights[i] = (matmul_weight){w[i]->data, w[i]->n_out, y[i]};
    return matmul_many(w[0]->kernels, weights, count, w[0]->n_in, x, m, n_threads);
}

static void add_rows(float *x, const float *bias, int64_t m, int64_t n) {
    for (int64_t r = 0; r < m; ++r) {
        for (int64_t i = 0; i < n; ++i) x[r * n + i] += bias[i];
    }
}

static void scale_all(float *x, int64_t count, float scale) {
    for (int64_t i = 0; i < count; ++i) x[i] *= scale;
}

static int attention_block(const pyllm_block_config *cfg, const pyllm_block *b, int layer, block_scratch *s, float *x,
                           int64_t m, const pyllm_segment *segments, int n_segments,
                           int n_threads) {
    const int64_t q_row = cfg->n_head * cfg->head_dim, kv_row = cfg->n_head_kv * cfg->head_dim;
    int status = rms_norm_rows(x, b->attn_norm.data, s->h, m, cfg->n_embd, cfg->norm_eps, n_threads);
    const pyllm_weight *qkv[3] = {&b->wq, &b->wk, &b->wv};
    float *qkv_out[3] = {s->q, s->k, s->v};
    if (status == PYLLM_OK) status = matmul_shared(qkv, qkv_out, 3, s->h, m, n_threads);
    if (status != PYLLM_OK) return status;
    if (b->bq.data) add_rows(s->q, b->bq.data, m, q_row);
    if (b->bk.data) add_rows(s->k, b->bk.data, m, kv_row);
    if (b->bv.data) add_rows(s->v, b->bv.data, m, kv_row);
    if (b->q_norm.data) status = rms_norm_rows(s->q, b->q_norm.data, s->q, m * cfg->n_head, cfg->head_dim, cfg->norm_eps, n_threads);
    if (b->k_norm.data && status == PYLLM_OK) {
        status = rms_norm_rows(s->k, b->k_norm.data, s->k, m * cfg->n_head_kv, cfg->head_dim, cfg->norm_eps, n_threads);
    }
    const float *cos_sin = rope_angles(s, b);
    if (status == PYLLM_OK) status = rope_rows(cfg, cos_sin, s->q, m, cfg->n_head, n_threads);
    if (status == PYLLM_OK) status = rope_rows(cfg, cos_sin, s->k, m, cfg->n_head_kv, n_threads);
    if (status != PYLLM_OK) return status;
    float score_scale = cfg->attn_scale;
    if (cfg->scale_query) {
        scale_all(s->q, m * q_row, score_scale);
        score_scale = 1.0f;
    }
    for (int si = 0; si < n_segments; ++si) {  /* each sequence's keys and values into its cache, then */
        const pyllm_segment *seg = &segments[si];
        const pyllm_kv_layer *kv = seg->kv[layer];
        const int64_t r0 = seg->row0, n = seg->n_rows;
        if (kv->k_rot) {  /* a quantized cache's rotations (pyllm_kv_rotation): q.k is unchanged by them */
            pyllm_hadamard(s->q + r0 * q_row, n * q_row / kv->k_rot, kv->k_rot);
            pyllm_hadamard(s->k + r0 * kv_row, n * kv_row / kv->k_rot, kv->k_rot);
        }
        if (kv->v_rot) pyllm_hadamard(s->v + r0 * kv_row, n * kv_row / kv->v_rot, kv->v_rot);
        status = pyllm_kv_store(kv, seg->positions, s->k + r0 * kv_row, s->v + r0 * kv_row, n);
        if (status != PYLLM_OK) return status;
        const int64_t n_visible = kv->ring ? kv->capacity : (int64_t)seg->positions[n - 1] + 1;
        s->calls[si] = (pyllm_attention_call){s->q + r0 * q_row, kv->k, kv->v, seg->positions, kv->positions, n,
                                              n_visible, s->attn + r0 * q_row, kv->k_type, kv->v_type};
    }
    status = pyllm_attention_batch(s->calls, n_segments, cfg->n_head, cfg->n_head_kv, cfg->head_dim, score_scale,
                                   b->window, 0.0f, n_threads);  /* all sequences' attention in one task */
    if (status != PYLLM_OK) return status;
    for (int si = 0; si < n_segments; ++si) {  /* rotated values give a rotated output: rotated back */
        const pyllm_kv_layer *kv = segments[si].kv[layer];
        if (kv->v_rot) pyllm_hadamard(s->attn + segments[si].row0 * q_row, segments[si].n_rows * q_row / kv->v_rot, kv->v_rot);
    }
    status = pyllm_matmul(&b->wo, s->attn, m, s->h, n_threads);  /* h is free again: the output goes there */
    if (status != PYLLM_OK) return status;
    if (b->post_attn_norm.data) status = rms_norm_rows(s->h, b->post_attn_norm.data, s->h, m, cfg->n_embd, cfg->norm_eps, n_threads);
    return status == PYLLM_OK ? add_into(x, s->h, m, cfg->n_embd, n_threads) : status;
}

/* A prefill's FFN runs over at most this many rows at a time: its two n_ff-wide intermediates are the widest scratch
 * of a prompt, and every step of it is row by row; they lie over the attention's q, k, v and output, dead by then.
 * Each matmul over a chunk unpacks its weights once (the panel path), so fewer, larger chunks unpack less
 * (bench/README.md). */
#define FFN_CHUNK_ROWS 256

static int ffn_block(const pyllm_block_config *cfg, const pyllm_block *b, block_scratch *s, float *x, int64_t m,
                     int n_threads) {
    int status = rms_norm_rows(x, b->ffn_norm.data, s->h, m, cfg->n_embd, cfg->norm_eps, n_threads);
    for (int64_t r0 = 0; r0 < m && status == PYLLM_OK; r0 += FFN_CHUNK_ROWS) {
        const int64_t rows = m - r0 < FFN_CHUNK_ROWS ? m - r0 : FFN_CHUNK_ROWS;
        float *h = s->h + r0 * cfg->n_embd;  /* these rows' input, then (once gate and up have read it) output */
        const pyllm_weight *gate_up[2] = {&b->w_gate, &b->w_up};
        float *gate_up_out[2] = {s->gate, s->up};
        status = matmul_shared(gate_up, gate_up_out, 2, h, rows, n_threads);
        if (status == PYLLM_OK) {  /* in place: elementwise */
            status = run_rows((row_step){.kind = cfg->activation == 0 ? STEP_SWIGLU : STEP_GEGLU, .rows = rows,
                                         .width = cfg->n_ff, .a = s->gate, .b = s->up, .y = s->gate}, n_threads);
        }
        if (status == PYLLM_OK) status = pyllm_matmul(&b->w_down, s->gate, rows, h, n_threads);
    }
    if (status == PYLLM_OK && b->post_ffw_norm.data) {
        status = rms_norm_rows(s->h, b->post_ffw_norm.data, s->h, m, cfg->n_embd, cfg->norm_eps, n_threads);
    }
    return status == PYLLM_OK ? add_into(x, s->h, m, cfg->n_embd, n_threads) : status;
}

static int config_valid(const pyllm_block_config *cfg) {
    return cfg->n_embd > 0 && cfg->n_head > 0 && cfg->n_head_kv > 0 && cfg->n_head % cfg->n_head_kv == 0 &&
           cfg->head_dim > 0 && pyllm_rope_dims_valid(cfg->n_rot, cfg->head_dim) && cfg->n_ff > 0 &&
           (cfg->activation == 0 || cfg->activation == 1);
}

/* An absent vector (NULL) or one of exactly n floats. */
static int vector_fits(pyllm_vector v, int64_t n) {
    return v.data == NULL || v.n == n;
}

static int weight_fits(pyllm_weight w, int64_t n_out, int64_t n_in) {
    return w.kernels != NULL && w.n_out == n_out && w.n_in == n_in;
}

static int shapes_agree(const pyllm_block_config *cfg, const pyllm_block *b) {
    const int64_t q_row = cfg->n_head * cfg->head_dim, kv_row = cfg->n_head_kv * cfg->head_dim;
    return weight_fits(b->wq, q_row, cfg->n_embd) && weight_fits(b->wk, kv_row, cfg->n_embd) &&
           weight_fits(b->wv, kv_row, cfg->n_embd) && weight_fits(b->wo, cfg->n_embd, q_row) &&
           weight_fits(b->w_gate, cfg->n_ff, cfg->n_embd) && weight_fits(b->w_up, cfg->n_ff, cfg->n_embd) &&
           weight_fits(b->w_down, cfg->n_embd, cfg->n_ff) &&
           vector_fits(b->attn_norm, cfg->n_embd) && vector_fits(b->ffn_norm, cfg->n_embd) &&
           vector_fits(b->bq, q_row) && vector_fits(b->bk, kv_row) && vector_fits(b->bv, kv_row) &&
           vector_fits(b->q_norm, cfg->head_dim) && vector_fits(b->k_norm, cfg->head_dim) &&
           vector_fits(b->post_attn_norm, cfg->n_embd) && vector_fits(b->post_ffw_norm, cfg->n_embd);
}

/* The segments cover the batch's m rows in order, their positions ascend from 0 or more, and each sequence fits its
 * caches: nothing runs otherwise. */
static int segments_fit(const pyllm_block_config *cfg, int n_layer, int64_t m, const pyllm_segment *segments,
                        int n_segments) {
    const int64_t kv_row = cfg->n_head_kv * cfg->head_dim;
    int64_t rows = 0;
    for (int si = 0; si < n_segments; ++si) {
        const pyllm_segment *seg = &segments[si];
        if (seg->row0 != rows || seg->n_rows <= 0 || rows + seg->n_rows > m) return 0;
        for (int64_t r = 0; r < seg->n_rows; ++r) {
            if (seg->positions[r] < 0 || (r > 0 && seg->positions[r] <= seg->positions[r - 1])) return 0;
        }
        for (int i = 0; i < n_layer; ++i) {
            const pyllm_kv_layer *kv = seg->kv[i];
            if (kv == NULL || kv->k_row != kv_row || kv->v_row != kv_row) return 0;
            if ((kv->k_rot && cfg->head_dim % kv->k_rot) || (kv->v_rot && cfg->head_dim % kv->v_rot)) return 0;
            if (!kv->ring && seg->positions[seg->n_rows - 1] >= kv->capacity) return 0;
        }
        rows += seg->n_rows;
    }
    return rows == m;
}

/* One buffer for a call (the calling thread's, kept: core/scratch.h): h (m, n_embd); then either q, k, v, attn
 * (m, q_row + 2 kv_row + q_row) or gate and up (ffn_rows, n_ff each); the rope angles (n_rope, m, n_rot); the
 * attention calls (n_segments) and the rope settings (n_rope). The angles are computed here, each setting's once. */
static int block_scratch_make(block_scratch *s, const pyllm_block_config *cfg, const pyllm_block *blocks, int n_layer,
                              int64_t m, const pyllm_segment *segments, int n_segments) {
    const int64_t q_row = cfg->n_head * cfg->head_dim, kv_row = cfg->n_head_kv * cfg->head_dim;
    const int64_t ffn_rows = m < FFN_CHUNK_ROWS ? m : FFN_CHUNK_ROWS;
    const int64_t attention_floats = m * (2 * q_row + 2 * kv_row), ffn_floats = 2 * ffn_rows * cfg->n_ff;
    const int64_t work_floats = m * cfg->n_embd + (attention_floats > ffn_floats ? attention_floats : ffn_floats);
    const int n_rope = rope_settings(blocks, n_layer, NULL);
    const size_t float_bytes = (size_t)(work_floats + n_rope * m * cfg->n_rot) * sizeof(float);
    const size_t bytes = (float_bytes + 63) / 64 * 64 + (size_t)n_segments * sizeof(pyllm_attention_call) +
                         (size_t)n_rope * sizeof(rope_setting);
    float *buffer = pyllm_scratch(SCRATCH_BLOCKS, bytes);
    if (buffer == NULL) return PYLLM_ERR_NOMEM;
    s->h = buffer;
    s->q = s->h + m * cfg->n_embd;
    s->k = s->q + m * q_row;
    s->v = s->k + m * kv_row;
    s->attn = s->v + m * kv_row;
    s->gate = s->q;
    s->up = s->gate + ffn_rows * cfg->n_ff;
    s->calls = (pyllm_attention_call *)((uint8_t *)buffer + (float_bytes + 63) / 64 * 64);
    s->rope = (rope_setting *)(s->calls + n_segments);
    s->n_rope = rope_settings(blocks, n_layer, s->rope);
    for (int i = 0; i < s->n_rope; ++i) {
        s->rope[i].angles = buffer + work_floats + i * m * cfg->n_rot;
        for (int si = 0; si < n_segments; ++si) {
            pyllm_rope_angles(segments[si].positions, segments[si].n_rows, cfg->n_rot, s->rope[i].base,
                              s->rope[i].scale, s->rope[i].angles + segments[si].row0 * cfg->n_rot);
        }
    }
    return PYLLM_OK;
}

int pyllm_blocks_forward(const pyllm_block_config *cfg, const pyllm_block *blocks, int n_layer, float *x, int64_t m,
                         const pyllm_segment *segments, int n_segments, int n_threads) {
    if (m <= 0 || n_layer < 0 || n_segments <= 0 || !config_valid(cfg)) return PYLLM_ERR_SHAPE;
    if (!segments_fit(cfg, n_layer, m, segments, n_segments)) return PYLLM_ERR_SHAPE;
    if (n_threads <= 0) n_threads = pyllm_physical_cores();
    if (n_threads > PYLLM_MAX_THREADS) return PYLLM_ERR_THREADS;
    for (int i = 0; i < n_layer; ++i) {
        if (!shapes_agree(cfg, &blocks[i])) return PYLLM_ERR_SHAPE;
    }
    block_scratch s;
    int status = block_scratch_make(&s, cfg, blocks, n_layer, m, segments, n_segments);
    for (int i = 0; i < n_layer && status == PYLLM_OK; ++i) {
        status = attention_block(cfg, &blocks[i], i, &s, x, m, segments, n_segments, n_threads);
        if (status == PYLLM_OK) status = ffn_block(cfg, &blocks[i], &s, x, m, n_threads);
    }
    return status;
}
