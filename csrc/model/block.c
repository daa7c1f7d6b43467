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
#include <stdlib.h>

#include "matmul/matmul.h"
#include "pyllm.h"
#include "core/scratch.h"
#include "core/threadpool.h"

/* The layers' rope settings (llama-style models have one, gemma3 a second for its sliding-window layers):
 * each one's angles for the batch's rows (m * n_rot), made once. */
typedef struct {
    float base, scale;
    float *angles;
} rope_setting;

typedef struct {
    float *h;                     /* a norm's output, then (the inputs used) a block's output */
    float *q, *k, *v, *attn;
    float *gate, *up;             /* over q .. attn (dead during the FFN); the activation goes into gate */
    pyllm_attention_call *calls;  /* one per segment */
    rope_setting *rope;           /* room for one per layer */
    int n_rope;
} block_scratch;

/* The batch's rotation angles for layer b's rope setting (each sequence's rows at their positions), computed
 * the first time a layer uses it; NULL when out of memory. */
static const float *rope_angles(block_scratch *s, const pyllm_block *b, const pyllm_segment *segments,
                                int n_segments, int64_t m, int64_t n_rot) {
    for (int i = 0; i < s->n_rope; ++i) {
        if (s->rope[i].base == b->rope_base && s->rope[i].scale == b->rope_scale) return s->rope[i].angles;
    }
    float *angles = malloc((size_t)(m * n_rot) * sizeof(float));
    if (angles == NULL) return NULL;
    for (int si = 0; si < n_segments; ++si) {
        pyllm_rope_angles(segments[si].positions, segments[si].n_rows, n_rot, b->rope_base, b->rope_scale,
                          angles + segments[si].row0 * n_rot);
    }
    s->rope[s->n_rope++] = (rope_setting){b->rope_base, b->rope_scale, angles};
    return angles;
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

/* Steps of fewer floats than this run on the calling thread: handing them out costs more than they do (a
 * decode row's norms, adds and rope). Four rows of SmolLM2's activation (4 x 1536) are worth splitting: steps
 * alternated at 2 threads, 4 rows -1.0-1.4% against 16384 (8192: no change; 2048, which splits the norms: +1.5%). */
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

static int matmul(const pyllm_weight *w, const float *x, int64_t m, float *y, int n_threads) {
    return pyllm_matmul(w->type, w->data, w->n_out, w->n_in, x, m, y, n_threads);
}

/* Two or three weights on one input (q, k, v; gate, up): in one call where they share a type (the input
 * converted and laid out once), one by one otherwise. */
static int matmul_shared(const pyllm_weight *const *w, float *const *y, int count, const float *x, int64_t m,
                         int n_threads) {
    int same = 1;
    for (int i = 1; i < count; ++i) same &= w[i]->type == w[0]->type;
    if (!same) {
        int status = PYLLM_OK;
        for (int i = 0; i < count && status == PYLLM_OK; ++i) status = matmul(w[i], x, m, y[i], n_threads);
        return status;
    }
    pyllm_matrix matrices[3];
    for (int i = 0; i < count; ++i) matrices[i] = (pyllm_matrix){w[i]->data, w[i]->n_out, y[i]};
    return pyllm_matmul_many(w[0]->type, matrices, count, w[0]->n_in, x, m, n_threads);
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
    const float *cos_sin = rope_angles(s, b, segments, n_segments, m, cfg->n_rot);
    if (cos_sin == NULL) return PYLLM_ERR_NOMEM;
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
        status = pyllm_kv_store(kv, seg->positions, s->k + r0 * kv_row, s->v + r0 * kv_row, n);
        if (status != PYLLM_OK) return status;
        const int64_t n_visible = kv->ring ? kv->capacity : (int64_t)seg->positions[n - 1] + 1;
        s->calls[si] = (pyllm_attention_call){s->q + r0 * q_row, kv->k, kv->v, seg->positions, kv->positions, n,
                                              n_visible, s->attn + r0 * q_row};
    }
    status = pyllm_attention_batch(s->calls, n_segments, cfg->n_head, cfg->n_head_kv, cfg->head_dim, score_scale,
                                   b->window, 0.0f, n_threads);  /* all sequences' attention in one task */
    if (status != PYLLM_OK) return status;
    status = matmul(&b->wo, s->attn, m, s->h, n_threads);  /* h is free again: the output goes there */
    if (status != PYLLM_OK) return status;
    if (b->post_attn_norm.data) status = rms_norm_rows(s->h, b->post_attn_norm.data, s->h, m, cfg->n_embd, cfg->norm_eps, n_threads);
    return status == PYLLM_OK ? add_into(x, s->h, m, cfg->n_embd, n_threads) : status;
}

/* The FFN runs over at most this many rows at a time: its two n_ff-wide intermediates are the widest
 * scratch of a prompt (SmolLM2: 6 MiB for 512 rows), and every step of it is row by row. They lie over the
 * attention's q, k, v and output, which are dead by then (SmolLM2, Gemma: no memory of their own at 256 rows).
 * Each matmul over a chunk unpacks its weights once (the panel path), so fewer chunks unpack less: Qwen's
 * prompt at two threads +17% from 64 rows to 256. */
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
        if (status == PYLLM_OK) status = matmul(&b->w_down, s->gate, rows, h, n_threads);
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

static int shapes_agree(const pyllm_block_config *cfg, const pyllm_block *b) {
    const int64_t q_row = cfg->n_head * cfg->head_dim, kv_row = cfg->n_head_kv * cfg->head_dim;
    return b->wq.n_in == cfg->n_embd && b->wq.n_out == q_row && b->wk.n_in == cfg->n_embd && b->wk.n_out == kv_row &&
           b->wv.n_in == cfg->n_embd && b->wv.n_out == kv_row && b->wo.n_in == q_row && b->wo.n_out == cfg->n_embd &&
           b->w_gate.n_in == cfg->n_embd && b->w_gate.n_out == cfg->n_ff && b->w_up.n_in == cfg->n_embd &&
           b->w_up.n_out == cfg->n_ff && b->w_down.n_in == cfg->n_ff && b->w_down.n_out == cfg->n_embd &&
           vector_fits(b->attn_norm, cfg->n_embd) && vector_fits(b->ffn_norm, cfg->n_embd) &&
           vector_fits(b->bq, q_row) && vector_fits(b->bk, kv_row) && vector_fits(b->bv, kv_row) &&
           vector_fits(b->q_norm, cfg->head_dim) && vector_fits(b->k_norm, cfg->head_dim) &&
           vector_fits(b->post_attn_norm, cfg->n_embd) && vector_fits(b->post_ffw_norm, cfg->n_embd);
}

int pyllm_blocks_forward(const pyllm_block_config *cfg, const pyllm_block *blocks, int n_layer, float *x, int64_t m,
                         const pyllm_segment *segments, int n_segments, int n_threads) {
    if (m <= 0 || n_layer < 0 || n_segments <= 0 || !config_valid(cfg)) return PYLLM_ERR_SHAPE;
    const int64_t kv_row = cfg->n_head_kv * cfg->head_dim;
    int64_t rows = 0;
    for (int si = 0; si < n_segments; ++si) {  /* nothing runs unless every sequence fits its caches */
        const pyllm_segment *seg = &segments[si];
        if (seg->row0 != rows || seg->n_rows <= 0 || rows + seg->n_rows > m) return PYLLM_ERR_SHAPE;
        for (int64_t r = 0; r < seg->n_rows; ++r) {  /* ascending from 0 or more */
            if (seg->positions[r] < 0 || (r > 0 && seg->positions[r] <= seg->positions[r - 1])) return PYLLM_ERR_SHAPE;
        }
        for (int i = 0; i < n_layer; ++i) {
            const pyllm_kv_layer *kv = seg->kv[i];
            if (kv == NULL || kv->k_row != kv_row || kv->v_row != kv_row) return PYLLM_ERR_SHAPE;
            if (!kv->ring && seg->positions[seg->n_rows - 1] >= kv->capacity) return PYLLM_ERR_SHAPE;
        }
        rows += seg->n_rows;
    }
    if (rows != m) return PYLLM_ERR_SHAPE;
    if (n_threads <= 0) n_threads = pyllm_physical_cores();
    if (n_threads > PYLLM_MAX_THREADS) return PYLLM_ERR_THREADS;
    for (int i = 0; i < n_layer; ++i) {
        if (!shapes_agree(cfg, &blocks[i])) return PYLLM_ERR_SHAPE;
    }
    const int64_t q_row = cfg->n_head * cfg->head_dim;
    const int64_t ffn_rows = m < FFN_CHUNK_ROWS ? m : FFN_CHUNK_ROWS;
    /* h (m, n_embd), then either q, k, v, attn (m, q_row + 2 kv_row + q_row) or gate and up (ffn_rows, n_ff each) */
    const int64_t attention_floats = m * (2 * q_row + 2 * kv_row), ffn_floats = 2 * ffn_rows * cfg->n_ff;
    const size_t buffer_bytes = (size_t)(m * cfg->n_embd + (attention_floats > ffn_floats ? attention_floats : ffn_floats))
                                * sizeof(float);
    float *buffer = pyllm_scratch(SCRATCH_BLOCKS, buffer_bytes);
    if (buffer == NULL) return PYLLM_ERR_NOMEM;
    block_scratch s;
    s.h = buffer;
    s.q = s.h + m * cfg->n_embd;
    s.k = s.q + m * q_row;
    s.v = s.k + m * kv_row;
    s.attn = s.v + m * kv_row;
    s.gate = s.q;
    s.up = s.gate + ffn_rows * cfg->n_ff;
    s.calls = malloc((size_t)n_segments * sizeof(pyllm_attention_call));
    s.rope = malloc((size_t)(n_layer > 0 ? n_layer : 1) * sizeof(rope_setting));
    s.n_rope = 0;
    int status = s.calls == NULL || s.rope == NULL ? PYLLM_ERR_NOMEM : PYLLM_OK;
    for (int i = 0; i < n_layer && status == PYLLM_OK; ++i) {
        status = attention_block(cfg, &blocks[i], i, &s, x, m, segments, n_segments, n_threads);
        if (status == PYLLM_OK) status = ffn_block(cfg, &blocks[i], &s, x, m, n_threads);
    }
    for (int i = 0; i < s.n_rope; ++i) free(s.rope[i].angles);
    free(s.rope);
    free(s.calls);
    return status;
}
