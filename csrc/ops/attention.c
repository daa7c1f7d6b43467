/*
 * attention.c - causal attention with GQA and sliding windows over each sequence's KV cache, in the arithmetic of
 * llama.cpp's CPU attention for a prompt (so a prompt's numbers are llama.cpp's), every output row computed alone in
 * one fixed order whatever else shares its call:
 *   - a decode row (a sequence with fewer than PREFILL_QUERY_BLOCK query rows), its heads of each kv head taken
 *     together where the tier has head-group kernels (attend_heads);
 *   - a prefill's queries PREFILL_QUERY_BLOCK at a time against one kv head's keys and values converted to float once,
 *     where the tier has prompt kernels (attend_block).
 */
#include <math.h>
#include <stdatomic.h>

#include "backend/kernel_set.h"
#include "core/scratch.h"
#include "core/threadpool.h"

typedef struct {
    const float *q;            /* (m, n_head, d) */
    const void *k, *v;         /* (n_kv, n_head_kv, d): half precision like llama.cpp's cache, or quantized rows */
    const int32_t *qpos;       /* (m,) */
    const int32_t *kpos;       /* (n_kv,) */
    int64_t m, n_kv, n_head, n_head_kv, d;
    float scale, softcap;
    int32_t window;            /* 0: no sliding window */
    float *out;                /* (m, n_head, d) */
    const op_kernels *kernels;
    const prompt_attention_kernels *prompt;  /* non-NULL: the rows go in blocks (attend_block) */
    const head_group_kernels *group;         /* non-NULL: a row's heads of a kv head together (attend_heads) */
    int64_t heads_per_item;                  /* rows alone: the heads of a kv head one item takes */
    int blocks;                              /* the rows go PREFILL_QUERY_BLOCK at a time (attend_block or
                                                attend_quantized) */
    const pyllm_kernel_set *k_set;           /* a quantized cache's (attend_quantized): its keys' vec_dot */
    dequantize_row_fn v_to_float;            /* and its values' conversion (NULL: half precision) */
    int64_t k_slot_bytes, v_slot_bytes, k_head_bytes, v_head_bytes;
} attention_job;

static int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

static inline int key_visible(const attention_job *job, int64_t t, int32_t qp) {
    const int32_t kp = job->kpos[t];
    return kp >= 0 && kp <= qp && (job->window <= 0 || qp - kp < job->window);
}

/* Bytes of a decode row's keys (and as many of its values) the threads read through before its heads' items: the
 * slots a full-attention row sees, all kv heads (one contiguous run); 0 for a windowed row or a prompt's blocks. */
static int64_t read_ahead_bytes(const attention_job *job) {
    return job->k_set == NULL && !job->blocks && job->window <= 0 ? job->n_kv * job->k_slot_bytes : 0;
}

/* Bytes of keys (and as many of values) a decode row asks for ahead: a quarter of a 1 MiB L2 together. */
#define PREFETCH_KV_BYTES (128 << 10)

/* Asks for the first rows of `bytes` at base + t * stride (t < n, up to PREFETCH_KV_BYTES) into L2, all at once:
 * a windowed decode row's keys, then its values, are each a strided run of lines (one kv head's of every slot)
 * that the prefetchers do not follow, and a step's other weights have long since pushed them out of cache. (A
 * full-attention row's were read through first, read_ahead below: asking again gained nothing, bench/README.md.) */
static void prefetch_rows(const fp16_t *base, int64_t stride, int64_t n, int64_t bytes) {
#if defined(__GNUC__) || defined(__clang__)
    if (n * bytes > PREFETCH_KV_BYTES) n = PREFETCH_KV_BYTES / bytes;
    for (int64_t t = 0; t < n; ++t) {
        const char *row = (const char *)(base + t * stride);
        for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(row + line, 0, 2);
    }
#else
    (void)base, (void)stride, (void)n, (void)bytes;
#endif
}

/*
 * Query row r's heads h0 .. h0 + n_heads - 1, all of one kv head, in the arithmetic of llama.cpp's CPU attention
 * for a prompt batch (so a prompt's numbers are llama.cpp's), each head on its own: the query rounded to half
 * precision; q.k in 8 lanes (slot mod 8); scaled; softmax with exp_ggml, the exponentials summed in double by
 * groups of 8 slots, 1 / sum in double; the weights rounded to half precision; the weighted sum of the values in
 * 8 lanes by slot mod 8 (see op_kernels in backend/kernel_set.h). With head_group_kernels the heads read each key and value
 * once. scratch: attend_heads_floats.
 */
static void attend_heads(const attention_job *job, int64_t r, int64_t h0, int64_t n_heads, float *scratch) {
    const int64_t d = job->d, n_kv = job->n_kv, hk = h0 / (job->n_head / job->n_head_kv);
    float *scores = scratch, *max = scores + n_heads * n_kv, *q = max + n_heads;  /* (n_heads, n_kv), (n_heads,), (n_heads, d) */
    float *out = job->out + (r * job->n_head + h0) * d;  /* (n_heads, d) */
    job->kernels->round_half(job->q + (r * job->n_head + h0) * d, q, n_heads * d);
    for (int64_t h = 0; h < n_heads; ++h) max[h] = -INFINITY;
    const int32_t qp = job->qpos[r];
    const int64_t stride = job->n_head_kv * d;
    const fp16_t *k = (const fp16_t *)job->k + hk * d, *v = (const fp16_t *)job->v + hk * d;
    const head_group_kernels *group = job->group;
    if (read_ahead_bytes(job) == 0) {
        prefetch_rows(k, stride, n_kv, d * (int64_t)sizeof(fp16_t));
        prefetch_rows(v, stride, n_kv, d * (int64_t)sizeof(fp16_t));
    }
    int64_t first = n_kv, last = -1;  /* the visible slots' span */
    for (int64_t t = 0; t < n_kv;) {
        if (!key_visible(job, t, qp)) {
            for (int64_t h = 0; h < n_heads; ++h) scores[h * n_kv + t] = -INFINITY;
            ++t;
            continue;
        }
        int64_t end = t + 1;  /* a run of visible slots: their dot products in one call */
        while (end < n_kv && key_visible(job, end, qp)) ++end;
        first = t < first ? t : first;
        last = end - 1;
        if (group != NULL) {
            group->dots_heads(q, n_heads, k + t * stride, stride, end - t, d, scores + t, n_kv);
        } else {
            for (int64_t h = 0; h < n_heads; ++h) job->kernels->dots(q + h * d, k + t * stride, stride, end - t, d, scores + h * n_kv + t);
        }
        const float scale = job->scale, softcap = job->softcap;
        for (int64_t h = 0; h < n_heads; ++h) {
            float *s = scores + h * n_kv, largest = max[h];
            if (softcap > 0.0f) {
                for (int64_t j = t; j < end; ++j) {
                    s[j] = softcap * tanhf(s[j] * scale / softcap);
                    largest = s[j] > largest ? s[j] : largest;
                }
            } else {
                const float run_max = job->kernels->scale_max(s + t, end - t, scale);
                largest = run_max > largest ? run_max : largest;
            }
            max[h] = largest;
        }
        t = end;
    }
    /* whole groups of 8 slots with no visible key add nothing (exp of a masked score is 0): the span from
     * the group of the first visible slot to the last visible slot gives the same bits */
    const int64_t begin = first / 8 * 8, span = last + 1 - begin;
    int all_seen = 1;  /* every head has a largest score above -inf */
    for (int64_t h = 0; h < n_heads; ++h) {
        if (max[h] == -INFINITY) {  /* no visible key */
            for (int64_t i = 0; i < d; ++i) out[h * d + i] = 0.0f;
            all_seen = 0;
            continue;
        }
        job->kernels->softmax_half(scores + h * n_kv + begin, span, max[h]);
    }
    if (group != NULL && all_seen) {
        group->weighted_sum_heads(scores + begin, n_kv, n_heads, v + begin * stride, stride, span, d, out);
        return;
    }
    for (int64_t h = 0; h < n_heads; ++h) {
        if (max[h] == -INFINITY) continue;  /* zeroed above */
        job->kernels->weighted_sum(scores + h * n_kv + begin, v + begin * stride, stride, span, d, out + h * d);
    }
}

/* Floats of attend_heads' scratch for n_heads heads of a row: scores, maxima, the queries. */
static int64_t attend_heads_floats(int64_t n_heads, int64_t n_kv, int64_t d) {
    return round16(n_heads * (n_kv + 1 + d));
}

/* A prefill's queries go this many rows at a time against one kv head's keys and values, converted to float once for
 * the block (attend_block), where the tier has prompt kernels, the head size suits them and the converted keys and
 * values stay under BLOCK_KV_FLOATS each; a sequence with fewer query rows (a decode step's one) goes row by row. */
#define PREFILL_QUERY_BLOCK 16
#define BLOCK_KV_FLOATS (1 << 21)
/* A quantized cache's prefill rows go in blocks while the block's scores (rows x heads x slots) stay under this. */
#define QUANTIZED_BLOCK_SCORES (1 << 22)

/* One query row's visible slots among [t0, t1): the first and the last (last < first: none), searched from
 * both ends. */
static void visible_span(const attention_job *job, int64_t r, int64_t t0, int64_t t1, int64_t *first, int64_t *last) {
    const int32_t qp = job->qpos[r];
    int64_t f = t0, l = t1 - 1;
    while (f < t1 && !key_visible(job, f, qp)) ++f;
    while (l >= f && !key_visible(job, l, qp)) --l;
    *first = f, *last = l;
}

/* One (query row, head) of a block: its first and last visible slots (then the weighted sum's span). */
typedef struct {
    int64_t first, last;
} pair_span;

/* Floats of a block's spans, whole 64-byte lines (so kt after them stays aligned). */
static int64_t span_floats(int64_t group) {
    return round16(PREFILL_QUERY_BLOCK * group * (int64_t)(sizeof(pair_span) / sizeof(float)));
}

/* Query rows r0..r1 - 1 of every head of kv head hk, attend_heads' arithmetic step for step: the keys and values
 * of the slots any of the rows sees converted to float once (kt, vf); the dot products a 16-key block at a time
 * for every (row, head) pair, then each pair's scaling and softmax, then the weighted sums a 16-dimension chunk
 * at a time for every pair (so the block or chunk stays in L1 while the pairs read it). scratch: 64-byte
 * aligned, block_scratch_floats. */
static void attend_block(const attention_job *job, int64_t hk, int64_t r0, int64_t r1, float *scratch) {
    const int64_t d = job->d, stride = job->n_head_kv * d, group = job->n_head / job->n_head_kv;
    const int64_t pairs = (r1 - r0) * group;  /* pair p: row r0 + p % rows, head hk * group + p / rows */
    pair_span *spans = (pair_span *)scratch;  /* each row's, for every head */
    int64_t first = job->n_kv, last = -1;
    for (int64_t r = r0; r < r1; ++r) {
        pair_span *span = &spans[r - r0];
        visible_span(job, r, 0, job->n_kv, &span->first, &span->last);
        if (span->last >= span->first) {
            first = span->first < first ? span->first : first;
            last = span->last > last ? span->last : last;
        }
    }
    if (last < first) {  /* no row sees a key */
        for (int64_t p = 0; p < pairs; ++p) {
            float *out = job->out + ((r0 + p % (r1 - r0)) * job->n_head + hk * group + p / (r1 - r0)) * d;
            for (int64_t i = 0; i < d; ++i) out[i] = 0.0f;
        }
        return;
    }
    const int64_t t0 = first / 16 * 16, n = last + 1 - t0, n16 = round16(n);
    float *kt = scratch + span_floats(group), *vf = kt + d * n16, *qs = vf + round16(n * d), *scores = qs + pairs * d;
    job->prompt->kv_to_float((const fp16_t *)job->k + t0 * stride + hk * d, (const fp16_t *)job->v + t0 * stride + hk * d,
                             stride, n, d, kt, vf);
    for (int64_t p = 0; p < pairs; ++p) {
        const int64_t r = r0 + p % (r1 - r0), h = hk * group + p / (r1 - r0);
        if (p >= r1 - r0) spans[p] = spans[p % (r1 - r0)];  /* the row's, for every head */
        job->kernels->round_half(job->q + (r * job->n_head + h) * d, qs + p * d, d);
    }
    for (int64_t b = 0; b < n16 / 16; ++b) {
        for (int64_t p = 0; p < pairs; ++p) {
            if (spans[p].last < spans[p].first || 16 * b > spans[p].last - t0 || 16 * b + 15 < spans[p].first - t0) continue;
            job->prompt->dots_t(qs + p * d, kt + 16 * b * d, d, scores + p * n16 + 16 * b);
        }
    }
    for (int64_t p = 0; p < pairs; ++p) {
        const int64_t r = r0 + p % (r1 - r0), h = hk * group + p / (r1 - r0);
        float *out = job->out + (r * job->n_head + h) * d, *s = scores + p * n16;
        if (spans[p].last < spans[p].first) {  /* no visible key */
            for (int64_t i = 0; i < d; ++i) out[i] = 0.0f;
            continue;
        }
        const int64_t begin = spans[p].first / 8 * 8;  /* as attend_heads: from the group of the first visible slot */
        float max = -INFINITY;
        for (int64_t t = begin; t <= spans[p].last; ++t) {
            float score = -INFINITY;
            if (key_visible(job, t, job->qpos[r])) {
                score = s[t - t0] * job->scale;
                if (job->softcap > 0.0f) score = job->softcap * tanhf(score / job->softcap);
                max = score > max ? score : max;
            }
            s[t - t0] = score;
        }
        job->kernels->softmax_half(s + (begin - t0), spans[p].last + 1 - begin, max);
        spans[p].first = begin;  /* from here: the span the weighted sum runs over */
    }
    for (int64_t c = 0; c < d / 16; ++c) {
        for (int64_t p = 0; p < pairs; ++p) {
            if (spans[p].last < spans[p].first) continue;
            const int64_t r = r0 + p % (r1 - r0), h = hk * group + p / (r1 - r0), begin = spans[p].first;
            job->prompt->weighted_sum_f(scores + p * n16 + (begin - t0), vf + (c * n + begin - t0) * 16,
                                        spans[p].last + 1 - begin, job->out + (r * job->n_head + h) * d + 16 * c);
        }
    }
}

/* Floats of attend_block's scratch for n_kv slots of d and group heads a kv head: the pairs' spans, kt, vf, the
 * pairs' queries and scores. */
static int64_t block_scratch_floats(int64_t n_kv, int64_t d, int64_t group) {
    const int64_t pairs = PREFILL_QUERY_BLOCK * group;
    return span_floats(group) + d * round16(n_kv) + round16(n_kv * d) + pairs * d + pairs * round16(n_kv);
}

/*
 * A quantized cache (pyllm_attention_call): query rows r0..r1 - 1, heads h0 .. h0 + n_heads - 1 of one kv head,
 * every (row, head) pair computed alone, so any grouping of rows and heads gives the same bits: its query in the
 * key type's activation format; each visible key's score the key type's vec_dot, scaled (and capped); the softmax
 * of attend_heads from the group of 8 of the row's first visible slot. Half-precision values then go as in
 * attend_heads (so quantized keys beside them are llama.cpp's arithmetic without flash attention); quantized
 * values take the weights unrounded, each slot's value dequantized once and added into every pair's output,
 * weight times value then the add, in slot order. The keys and values are read in place, each once for all the
 * pairs. scratch: 64-byte aligned, quantized_scratch_floats.
 */
static void attend_quantized(const attention_job *job, int64_t r0, int64_t r1, int64_t h0, int64_t n_heads,
                             float *scratch) {
    const int64_t d = job->d, rows = r1 - r0, pairs = rows * n_heads, hk = h0 / (job->n_head / job->n_head_kv);
    const int64_t stride = job->n_head_kv * d;  /* half-precision values' */
    const pyllm_kernel_set *kset = job->k_set;
    pair_span *spans = (pair_span *)scratch;  /* each row's visible slots, then (first rounded down) its softmax's */
    int64_t first = job->n_kv, last = -1;
    for (int64_t i = 0; i < rows; ++i) {
        visible_span(job, r0 + i, 0, job->n_kv, &spans[i].first, &spans[i].last);
        if (spans[i].last >= spans[i].first) {
            first = spans[i].first < first ? spans[i].first : first;
            last = spans[i].last > last ? spans[i].last : last;
        }
    }
    for (int64_t p = 0; p < pairs; ++p) {
        float *out = job->out + ((r0 + p / n_heads) * job->n_head + h0 + p % n_heads) * d;
        for (int64_t i = 0; i < d; ++i) out[i] = 0.0f;
    }
    if (last < first) return;  /* no row sees a key */
    const int64_t t0 = first / 8 * 8, n = last + 1 - t0, n16 = round16(n);
    const int64_t act_bytes = type_row_bytes(kset->act_type, d);
    float *scores = scratch + span_floats(1), *value = scores + pairs * n16;  /* (pairs, n16), (d,) */
    char *queries = (char *)(value + round16(d));                              /* (pairs, act_bytes) */
    void *prepared = queries + (pairs * act_bytes + 63) / 64 * 64;             /* a group of queries, act_rows_prepare'd */
    for (int64_t p = 0; p < pairs; ++p) {
        kset->quantize_act(job->q + ((r0 + p / n_heads) * job->n_head + h0 + p % n_heads) * d, queries + p * act_bytes, d);
    }
    const char *keys = (const char *)job->k + hk * job->k_head_bytes;
    /* every pair's score of every key of the span (each vec_dot's bits, however many a call takes), then the keys a
     * pair's row does not see masked */
    if (kset->rows4 != NULL) {  /* a key against up to VEC_DOT_MAX_ROWS queries a call, unpacked once */
        for (int64_t g0 = 0; g0 < pairs; g0 += VEC_DOT_MAX_ROWS) {
            const int n = pairs - g0 < VEC_DOT_MAX_ROWS ? (int)(pairs - g0) : VEC_DOT_MAX_ROWS;
            const void *group_rows[VEC_DOT_MAX_ROWS];
            for (int j = 0; j < n; ++j) group_rows[j] = queries + (g0 + j) * act_bytes;
            act_rows group;
            act_rows_prepare(&group, job->k_set->type, group_rows, n, d, prepared);
            for (int64_t t = t0; t <= last; ++t) {
                float out[VEC_DOT_MAX_ROWS];
                kset->rows4(d, keys + t * job->k_slot_bytes, &group, out);
                for (int j = 0; j < n; ++j) scores[(g0 + j) * n16 + t - t0] = out[j];
            }
        }
    } else {
        int64_t t = t0;
        for (; kset->cols4 != NULL && t + VEC_DOT_COLS - 1 <= last; t += VEC_DOT_COLS) {  /* 4 keys a call */
            for (int64_t p = 0; p < pairs; ++p) {
                kset->cols4(d, keys + t * job->k_slot_bytes, job->k_slot_bytes, queries + p * act_bytes,
                            scores + p * n16 + t - t0);
            }
        }
        for (; t <= last; ++t) {
            for (int64_t p = 0; p < pairs; ++p) {
                scores[p * n16 + t - t0] = kset->vec_dot(d, keys + t * job->k_slot_bytes, queries + p * act_bytes);
            }
        }
    }
    for (int64_t t = t0; t <= last; ++t) {
        for (int64_t i = 0; i < rows; ++i) {
            if (t >= spans[i].first && t <= spans[i].last && key_visible(job, t, job->qpos[r0 + i])) continue;
            for (int64_t h = 0; h < n_heads; ++h) scores[(i * n_heads + h) * n16 + t - t0] = -INFINITY;
        }
    }
    for (int64_t p = 0; p < pairs; ++p) {
        pair_span *span = &spans[p / n_heads];
        if (span->last < span->first) continue;
        float *s = scores + p * n16, max = -INFINITY;
        const int64_t begin = span->first / 8 * 8;
        for (int64_t t = begin; t <= span->last; ++t) {
            float score = s[t - t0];
            if (score != -INFINITY) {
                score *= job->scale;
                if (job->softcap > 0.0f) score = job->softcap * tanhf(score / job->softcap);
                max = score > max ? score : max;
            }
            s[t - t0] = score;
        }
        if (job->v_to_float == NULL) job->kernels->softmax_half(s + (begin - t0), span->last + 1 - begin, max);
        else job->kernels->softmax(s + (begin - t0), span->last + 1 - begin, max);
    }
    if (job->v_to_float == NULL) {  /* half-precision values: attend_heads' weighted sum */
        for (int64_t p = 0; p < pairs; ++p) {
            const pair_span *span = &spans[p / n_heads];
            if (span->last < span->first) continue;
            const int64_t begin = span->first / 8 * 8;
            job->kernels->weighted_sum(scores + p * n16 + begin - t0, (const fp16_t *)job->v + begin * stride + hk * d,
                                       stride, span->last + 1 - begin, d,
                                       job->out + ((r0 + p / n_heads) * job->n_head + h0 + p % n_heads) * d);
        }
        return;
    }
    const char *values = (const char *)job->v + hk * job->v_head_bytes;
    for (int64_t t = t0; t <= last; ++t) {
        int needed = 0;
        for (int64_t i = 0; i < rows && !needed; ++i) {
            if (t < spans[i].first / 8 * 8 || t > spans[i].last) continue;
            for (int64_t h = 0; h < n_heads && !needed; ++h) needed = scores[(i * n_heads + h) * n16 + t - t0] != 0.0f;
        }
        if (!needed) continue;
        job->v_to_float(values + t * job->v_slot_bytes, value, d);
        for (int64_t i = 0; i < rows; ++i) {
            if (t < spans[i].first / 8 * 8 || t > spans[i].last) continue;
            float *out = job->out + ((r0 + i) * job->n_head + h0) * d;
            for (int64_t h = 0; h < n_heads; ++h) {
                const float w = scores[(i * n_heads + h) * n16 + t - t0];
                if (w != 0.0f) job->kernels->add_scaled(out + h * d, w, value, d);
            }
        }
    }
}

/* Floats of attend_quantized's scratch for `rows` rows of n_heads heads: the rows' spans, the pairs' scores, a
 * value, the pairs' queries (act_bytes each). */
static int64_t quantized_scratch_floats(int64_t rows, int64_t n_heads, int64_t n_kv, int64_t d, int64_t act_bytes,
                                        int64_t prepared_bytes) {
    const int64_t pairs = rows * n_heads;
    return span_floats(1) + pairs * round16(n_kv + 8) + round16(d) + round16((pairs * act_bytes + 63) / 64 * 16) +
           round16((prepared_bytes + 3) / 4);
}

/* A row's items a kv head: its heads in runs of heads_per_item (the last run may be shorter). */
static int64_t head_runs(const attention_job *job) {
    return (job->n_head / job->n_head_kv + job->heads_per_item - 1) / job->heads_per_item;
}

/* A job's items: its (row, kv head, run of heads) triples, or with prompt kernels its (query block, kv head)
 * pairs. */
static int64_t job_items(const attention_job *job) {
    return job->blocks ? (job->m + PREFILL_QUERY_BLOCK - 1) / PREFILL_QUERY_BLOCK * job->n_head_kv
                       : job->m * job->n_head_kv * head_runs(job);
}

/* Several attention calls (a batch's sequences) in one task: their items numbered in order, a contiguous range of
 * them a thread (taken from the front; then the others' from the back, one by one). */
typedef struct {
    const attention_job *jobs;
    int n_jobs;
    float *scratch;            /* per thread: scratch_floats (attend_heads' or attend_block's) */
    int64_t scratch_floats;
    int64_t read_ahead;        /* bytes of the decode rows' keys and values each thread reads first (read_ahead) */
    atomic_ullong ranges[PYLLM_MAX_THREADS];  /* each thread's items still to do (pyllm_range_claim) */
} attention_batch;

/* The most bytes of the decode rows' keys and values one thread reads ahead (half of a 1 MiB L2). */
#define READ_AHEAD_BYTES (512 << 10)

/*
 * Thread ith's part of the batch's decode keys and values, read one load a line before its items: the runs of
 * every job in order, split evenly (as the items are), the first read_ahead bytes of its part. A row's items
 * read one kv head's lines of every slot, a strided run the prefetchers do not follow, computing as they go; the
 * step's weights have long pushed them out of cache. Read here, contiguous and with nothing else to do, they come
 * in at the memory's full rate, and the items find them in their own L2 (bench/README.md).
 */
static unsigned read_ahead(const attention_batch *batch, int ith, int nth) {
    int64_t total = 0;
    for (int j = 0; j < batch->n_jobs; ++j) total += 2 * read_ahead_bytes(&batch->jobs[j]);
    int64_t from, to;
    pyllm_split_range(total, ith, nth, &from, &to);
    if (to - from > batch->read_ahead) to = from + batch->read_ahead;
    unsigned sum = 0;
    int64_t start = 0;  /* the current run's first byte in the concatenation */
    for (int j = 0; j < batch->n_jobs && from < to; ++j) {
        const attention_job *job = &batch->jobs[j];
        const int64_t bytes = read_ahead_bytes(job);
        for (int kv = 0; kv < 2 && from < to; ++kv, start += bytes) {
            const unsigned char *run = (const unsigned char *)(kv == 0 ? job->k : job->v);
            for (; from < to && from < start + bytes; from += 64) sum += run[from - start];
        }
    }
    return sum;
}

/* Item `item` of the batch (numbered over its jobs in order). */
static void attend_item(const attention_batch *batch, int64_t item, float *scratch) {
    int j = 0;
    while (item >= job_items(&batch->jobs[j])) item -= job_items(&batch->jobs[j++]);
    const attention_job *job = &batch->jobs[j];
    const int64_t group = job->n_head / job->n_head_kv;
    if (!job->blocks) {
        const int64_t runs = head_runs(job), per_row = job->n_head_kv * runs;
        const int64_t hk = item % per_row / runs, run = item % runs, r = item / per_row;
        const int64_t h0 = hk * group + run * job->heads_per_item;
        const int64_t n_heads = group - h0 % group < job->heads_per_item ? group - h0 % group : job->heads_per_item;
        if (job->k_set != NULL) attend_quantized(job, r, r + 1, h0, n_heads, scratch);
        else attend_heads(job, r, h0, n_heads, scratch);
        return;
    }
    /* numbered from the last query block (the most keys, under a causal mask) down: the first thread's range holds
     * the heaviest, and the others, done with their lighter ones, take its items from the back one by one */
    const int64_t n_blocks = (job->m + PREFILL_QUERY_BLOCK - 1) / PREFILL_QUERY_BLOCK;
    const int64_t block = n_blocks - 1 - item / job->n_head_kv, r0 = block * PREFILL_QUERY_BLOCK;
    const int64_t hk = item % job->n_head_kv, r1 = r0 + PREFILL_QUERY_BLOCK < job->m ? r0 + PREFILL_QUERY_BLOCK : job->m;
    if (job->k_set != NULL) attend_quantized(job, r0, r1, hk * group, group, scratch);
    else attend_block(job, hk, r0, r1, scratch);
}

static void attention_task(void *arg, int ith, int nth) {
    attention_batch *batch = arg;
    float *scratch = batch->scratch + ith * batch->scratch_floats;
    if (batch->read_ahead > 0) {
        volatile unsigned sink = read_ahead(batch, ith, nth);
        (void)sink;
    }
    int64_t item;
    for (int k = 0; k < nth; ++k) {  /* its own items from the front, then the others' from the back */
        while (pyllm_range_claim(&batch->ranges[(ith + k) % nth], 1, k > 0, &item) > 0) attend_item(batch, item, scratch);
    }
}

/* The batch's jobs, one a call (into jobs: n_calls of them), each taking its prefill blocks where it can; what the
 * work is worth: the multiply-adds, and the rows that go alone. PYLLM_ERR_SHAPE for an empty call. */
static int make_jobs(const pyllm_attention_call *calls, int n_calls, int64_t n_head, int64_t n_head_kv, int64_t d,
                     float scale, int32_t window, float softcap, attention_job *jobs, int64_t *work, int64_t *rows_alone) {
    const op_set *ops = active_ops();
    const head_group_kernels *group = d % 8 == 0 ? ops->heads : NULL;
    *work = 0, *rows_alone = 0;
    for (int j = 0; j < n_calls; ++j) {
        const pyllm_attention_call *c = &calls[j];
        if (c->m <= 0 || c->n_kv <= 0) return PYLLM_ERR_SHAPE;
        if (!pyllm_kv_type_valid(c->k_type, d) || !pyllm_kv_type_valid(c->v_type, d)) return PYLLM_ERR_TYPE;
        const int quantized = c->k_type != PYLLM_TYPE_F16 || c->v_type != PYLLM_TYPE_F16;
        const int blocks = c->m >= PREFILL_QUERY_BLOCK &&
                           (quantized ? PREFILL_QUERY_BLOCK * (n_head / n_head_kv) * c->n_kv <= QUANTIZED_BLOCK_SCORES
                                      : ops->prompt != NULL && d % 16 == 0 && c->n_kv * d <= BLOCK_KV_FLOATS);
        jobs[j] = (attention_job){c->q, c->k, c->v, c->qpos, c->kpos, c->m, c->n_kv, n_head, n_head_kv, d, scale,
                                  softcap, window, c->out, ops->ops, blocks && !quantized ? ops->prompt : NULL,
                                  quantized ? NULL : group, 1, blocks, quantized ? pyllm_kernels(c->k_type) : NULL,
                                  c->v_type == PYLLM_TYPE_F16    ? NULL
                                  : c->v_type == PYLLM_TYPE_Q8_0 ? ops->ops->dequantize_q8_0
                                  : c->v_type == PYLLM_TYPE_Q4_0 ? ops->ops->dequantize_q4_0
                                                                 : dequantize_table[c->v_type],
                                  type_row_bytes(c->k_type, n_head_kv * d),
                                  type_row_bytes(c->v_type, n_head_kv * d), type_row_bytes(c->k_type, d),
                                  type_row_bytes(c->v_type, d)};
        if (quantized && jobs[j].k_set == NULL) return PYLLM_ERR_TYPE;
        *work += c->m * n_head * c->n_kv * d;
        *rows_alone += blocks ? 0 : c->m;
    }
    return PYLLM_OK;
}

/* With group kernels a row's heads of a kv head go together as one item, in halves (and so on) while that leaves a
 * thread without an item; each job's scratch floats for that (the largest of them is a thread's). */
static int64_t share_heads(attention_job *jobs, int n_calls, int64_t rows_alone, int n_threads) {
    const int64_t n_head_kv = jobs[0].n_head_kv, group_size = jobs[0].n_head / n_head_kv, d = jobs[0].d;
    int64_t heads_per_item = jobs[0].group != NULL || jobs[0].k_set != NULL ? group_size : 1;
    while (heads_per_item > 1 && rows_alone * n_head_kv * ((group_size + heads_per_item - 1) / heads_per_item) < n_threads) {
        heads_per_item = (heads_per_item + 1) / 2;
    }
    int64_t scratch_floats = 0;
    for (int j = 0; j < n_calls; ++j) {
        attention_job *job = &jobs[j];
        job->heads_per_item = heads_per_item;
        int64_t floats;
        if (job->k_set != NULL) {
            const int64_t act_bytes = type_row_bytes(job->k_set->act_type, d);
            const int64_t prepared = job->k_set->rows4 != NULL ? act_rows_scratch_bytes(job->k_set->type, d) : 0;
            floats = job->blocks ? quantized_scratch_floats(PREFILL_QUERY_BLOCK, group_size, job->n_kv, d, act_bytes,
                                                            prepared)
                                 : quantized_scratch_floats(1, heads_per_item, job->n_kv, d, act_bytes, prepared);
        } else {
            floats = job->blocks ? block_scratch_floats(job->n_kv, d, group_size)
                                 : attend_heads_floats(heads_per_item, job->n_kv, d);
        }
        scratch_floats = floats > scratch_floats ? floats : scratch_floats;
    }
    return scratch_floats;
}

int pyllm_attention_batch(const pyllm_attention_call *calls, int n_calls, int64_t n_head, int64_t n_head_kv,
                          int64_t d, float scale, int32_t window, float softcap, int n_threads) {
    if (n_calls <= 0 || d <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0) return PYLLM_ERR_SHAPE;
    if (n_threads <= 0) n_threads = pyllm_physical_cores();
    if (n_threads > PYLLM_MAX_THREADS) return PYLLM_ERR_THREADS;
    attention_job *jobs = pyllm_scratch(SCRATCH_ATTENTION_JOBS, (size_t)n_calls * sizeof(attention_job));
    if (jobs == NULL) return PYLLM_ERR_NOMEM;
    int64_t work, rows_alone;
    int status = make_jobs(calls, n_calls, n_head, n_head_kv, d, scale, window, softcap, jobs, &work, &rows_alone);
    if (status != PYLLM_OK) return status;
    /* a small step is quicker on fewer threads than handed out (results do not depend on it) */
    if (work < (int64_t)n_threads << 15) n_threads = (int)(work >> 15) + 1;
    attention_batch batch = {.jobs = jobs, .n_jobs = n_calls, .scratch_floats = share_heads(jobs, n_calls, rows_alone, n_threads),
                             .read_ahead = READ_AHEAD_BYTES};
    int64_t n_items = 0;
    for (int j = 0; j < n_calls; ++j) n_items += job_items(&jobs[j]);
    pyllm_ranges_init(batch.ranges, n_items, n_threads);
    batch.scratch = pyllm_scratch(SCRATCH_ATTENTION, (size_t)(n_threads * batch.scratch_floats) * sizeof(float));
    return batch.scratch == NULL ? PYLLM_ERR_NOMEM : pyllm_pool_run(n_threads, attention_task, &batch);
}

int pyllm_attention(const float *q, const uint16_t *k, const uint16_t *v, const int32_t *qpos,
                    const int32_t *kpos, int64_t m, int64_t n_kv, int64_t n_head, int64_t n_head_kv, int64_t d,
                    float scale, int32_t window, float softcap, float *out, int n_threads) {
    const pyllm_attention_call call = {q, k, v, qpos, kpos, m, n_kv, out, PYLLM_TYPE_F16, PYLLM_TYPE_F16};
    return pyllm_attention_batch(&call, 1, n_head, n_head_kv, d, scale, window, softcap, n_threads);
}
