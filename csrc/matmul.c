/*
 * matmul.c - Y[M,N] = X[M,K] . W[N,K]^T over quantized weight rows.
 *
 * X rows are first converted to the activation format of W's type (q8_0,
 * q8_K or float32), split across threads by row. Then the threads take chunks
 * of output columns (weight rows) as they free up, computing each for every X
 * row with the same kernels whatever M and the thread count: an output element
 * depends only on its weight row and its X row, never on how work was split.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "dispatch.h"
#include "scratch.h"
#include "threadpool.h"

/* Weight rows handled together, so a tile of W stays in cache across X rows. */
#define ROW_TILE 16

/* Fewer X rows than this are a decode step: quantized on the calling thread (quicker than handing them out),
 * and W streamed from memory in one contiguous range per thread. */
#define DECODE_ROWS 8

typedef struct {
    vec_dot_fn kernel;
    vec_dot_rows_fn rows_kernel;  /* NULL: the type has none in this tier */
    vec_dot_rows_fn rows8_kernel; /* two groups at once; NULL: none */
    vec_dot_row_fn row_kernel;    /* a lone row, prepared (act_row_prepare); NULL: kernel on the q8 row */
    int type;
    const uint8_t *w;      /* (n, w_row_bytes) */
    int64_t w_row_bytes;
    int64_t n, k, m;
    const float *x;        /* (m, k) */
    uint8_t *act;          /* (m, act_row_bytes), in the call's one buffer */
    int64_t act_row_bytes;
    float *y;              /* (m, n) */
    act_rows *groups;      /* with a rows kernel: the X rows in groups of VEC_DOT_MAX_ROWS */
    int64_t n_groups;
    act_rows *lone;        /* with a row kernel: X rows first_lone.. (those no group holds), prepared */
    int64_t first_lone;
    int64_t chunk_rows;    /* weight rows handed out at a time (whole tiles) */
    atomic_llong next_chunk;
} matmul_job;

static inline void split_range(int64_t total, int ith, int nth, int64_t *begin, int64_t *end) {
    *begin = total * ith / nth;
    *end = total * (ith + 1) / nth;
}

static void quantize_task(void *arg, int ith, int nth) {
    const matmul_job *job = arg;
    int64_t begin, end;
    split_range(job->m, ith, nth, &begin, &end);
    for (int64_t r = begin; r < end; ++r) {
        /* cannot fail: pyllm_matmul checked the type and the row length first */
        pyllm_quantize_activations(job->type, job->x + r * job->k, job->act + r * job->act_row_bytes, job->k);
    }
}

/* Output columns [begin, end) for every X row, a tile of ROW_TILE weight rows at a time. */
static void dot_rows(const matmul_job *job, int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; tile += ROW_TILE) {
        const int64_t tile_end = tile + ROW_TILE < end ? tile + ROW_TILE : end;
        int64_t r = 0;
        for (int64_t gi = 0; gi < job->n_groups;) {  /* weight rows unpacked once per group or pair of groups */
            const act_rows *group = &job->groups[gi];
            const int pair = job->rows8_kernel != NULL && gi + 1 < job->n_groups;
            const vec_dot_rows_fn kernel = pair ? job->rows8_kernel : job->rows_kernel;
            const int n_rows = pair ? VEC_DOT_MAX_ROWS + group[1].n_rows : group->n_rows;
            for (int64_t c = tile; c < tile_end; ++c) {
                float out[2 * VEC_DOT_MAX_ROWS];
                kernel(job->k, job->w + c * job->w_row_bytes, group, out);
                for (int i = 0; i < n_rows; ++i) job->y[(r + i) * job->n + c] = out[i];
            }
            gi += pair ? 2 : 1;
            r += n_rows;
        }
        for (; r < job->m; ++r) {
            float *y = job->y + r * job->n;
            if (job->lone != NULL) {
                const act_rows *row = &job->lone[r - job->first_lone];
                for (int64_t c = tile; c < tile_end; ++c) y[c] = job->row_kernel(job->k, job->w + c * job->w_row_bytes, row);
                continue;
            }
            const uint8_t *act = job->act + r * job->act_row_bytes;
            for (int64_t c = tile; c < tile_end; ++c) y[c] = job->kernel(job->k, job->w + c * job->w_row_bytes, act);
        }
    }
}

/* The weight rows go out in chunks of whole tiles, each to whichever thread asks next: in a prompt, a
 * thread the system holds up (another process, a busy server) costs its chunk, not half the matmul. */
static void dot_task(void *arg, int ith, int nth) {
    (void)ith, (void)nth;
    matmul_job *job = arg;
    for (;;) {
        const int64_t begin = atomic_fetch_add_explicit(&job->next_chunk, 1, memory_order_relaxed) * job->chunk_rows;
        if (begin >= job->n) break;
        const int64_t end = begin + job->chunk_rows < job->n ? begin + job->chunk_rows : job->n;
        dot_rows(job, begin, end);
    }
}

int pyllm_matmul(int type, const void *w, int64_t n, int64_t k, const float *x, int64_t m,
                 float *y, int n_threads) {
    const int64_t block_size = pyllm_type_block_size(type);
    if (block_size == 0 || pyllm_vec_dot_type(type) < 0) return PYLLM_ERR_TYPE;
    if (n <= 0 || k <= 0 || m <= 0 || k % block_size != 0) return PYLLM_ERR_SHAPE;
    if (pyllm_vec_dot_type(type) == PYLLM_TYPE_Q8_K && k % QK_K != 0) return PYLLM_ERR_SHAPE;
    if (n_threads <= 0) n_threads = pyllm_physical_cores();
    if (n_threads > PYLLM_MAX_THREADS) return PYLLM_ERR_THREADS;

    matmul_job job = {
        .kernel = pyllm_active_vec_dot(type),
        .rows_kernel = pyllm_active_vec_dot_rows(type),
        .rows8_kernel = pyllm_active_vec_dot_rows8(type),
        .row_kernel = pyllm_active_vec_dot_row(type),
        .type = type,
        .w = w,
        .w_row_bytes = k / block_size * pyllm_type_size(type),
        .n = n, .k = k, .m = m,
        .x = x,
        .act_row_bytes = pyllm_activation_row_bytes(type, k),
        .y = y,
    };
    if (job.kernel == NULL) return PYLLM_ERR_TYPE;

    /* X rows in groups for the multi-row kernel (a last lone row goes to the single-row kernel); the rows no
     * group holds (a decode step's one row) prepared for the row kernel where there is one */
    if (job.rows_kernel != NULL && m > 1) {
        job.n_groups = (m + VEC_DOT_MAX_ROWS - 1) / VEC_DOT_MAX_ROWS;
        if ((m - 1) % VEC_DOT_MAX_ROWS == 0) job.n_groups--;
    }
    job.first_lone = job.n_groups * VEC_DOT_MAX_ROWS < m ? job.n_groups * VEC_DOT_MAX_ROWS : m;
    const int64_t n_lone = job.row_kernel != NULL ? m - job.first_lone : 0;
    /* One allocation for all a call prepares: the groups' and the lone rows' layouts (whole 64-byte lines, so
     * no quants load splits one), their act_rows, then the X rows in the activation format */
    const int64_t group_bytes = act_rows_scratch_bytes(type, k), row_bytes = act_row_scratch_bytes(type, k);
    const int64_t layout_bytes = job.n_groups * group_bytes + n_lone * row_bytes;
    const int64_t header_bytes = ((job.n_groups + n_lone) * (int64_t)sizeof(act_rows) + 63) / 64 * 64;
    const size_t buffer_bytes = (size_t)(layout_bytes + header_bytes + (m * job.act_row_bytes + 63) / 64 * 64);
    uint8_t *buffer = pyllm_scratch(SCRATCH_MATMUL, buffer_bytes);
    if (buffer == NULL) return PYLLM_ERR_NOMEM;
    job.groups = (act_rows *)(buffer + layout_bytes);
    job.lone = n_lone > 0 ? job.groups + job.n_groups : NULL;
    job.act = buffer + layout_bytes + header_bytes;

    const int quantize_threads = m < DECODE_ROWS ? 1 : (m < n_threads ? (int)m : n_threads);
    int status = pyllm_pool_run(quantize_threads, quantize_task, &job);
    for (int64_t gi = 0; status == PYLLM_OK && gi < job.n_groups; ++gi) {
        const int64_t r0 = gi * VEC_DOT_MAX_ROWS;
        const int n_rows = m - r0 < VEC_DOT_MAX_ROWS ? (int)(m - r0) : VEC_DOT_MAX_ROWS;
        const void *rows[VEC_DOT_MAX_ROWS];
        for (int i = 0; i < n_rows; ++i) rows[i] = job.act + (r0 + i) * job.act_row_bytes;
        act_rows_prepare(&job.groups[gi], type, rows, n_rows, k, buffer + gi * group_bytes);
    }
    for (int64_t i = 0; status == PYLLM_OK && i < n_lone; ++i) {
        act_row_prepare(&job.lone[i], type, job.act + (job.first_lone + i) * job.act_row_bytes, k,
                        buffer + job.n_groups * group_bytes + i * row_bytes);
    }
    /* A prompt: about 8 chunks per thread, so the threads finish together even when one is held up. A decode
     * step (a few rows) streams W from memory: one contiguous range per thread, so each thread's stream is
     * as long as it can be for the prefetchers (SmolLM2's decode at 2 threads: +15%, its 4-row step +6%). */
    const int64_t chunks_per_thread = m < DECODE_ROWS ? 1 : 8;
    const int64_t tiles = (n + ROW_TILE - 1) / ROW_TILE, tiles_per_chunk = tiles / (chunks_per_thread * n_threads);
    job.chunk_rows = ROW_TILE * (tiles_per_chunk > 1 ? tiles_per_chunk : 1);
    atomic_init(&job.next_chunk, 0);
    if (status == PYLLM_OK) status = pyllm_pool_run(n_threads, dot_task, &job);
    return status;
}
