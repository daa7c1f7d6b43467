/*
 * matmul.c - Y[M,N] = X[M,K] . W[N,K]^T over quantized weight rows.
 *
 * X rows are first converted to the activation format of W's type (q8_0,
 * q8_K or float32): a prompt's split across threads by row, a decode step's
 * by every thread for itself (decode_task). Then the threads take chunks
 * of output columns (weight rows) as they free up, computing each for every X
 * row with kernels that all give the same bits: an output element depends only
 * on its weight row and its X row, never on how work was split or on M.
 *
 * pyllm_matmul_many multiplies X by several weights of one type and row length
 * at once (a layer's q, k and v, its gate and up): X is converted and laid
 * out once, and the weights' rows go out together, as one W's would.
 *
 * X rows go, in this order, to panels of PANEL_ROWS (where the tier has panel
 * kernels: panel.h), to groups of VEC_DOT_MAX_ROWS for the multi-row kernels,
 * and one at a time to the row kernel, the cols kernel (VEC_DOT_COLS weight
 * rows at once, where the format has no row kernel) or vec_dot. An interleaved W (quants.h:
 * 16 rows a tile) takes every X row, two at a time, to its tile kernel, a
 * prompt's as well: with its weights already in lanes it beats unpacking them
 * for the panels (SmolLM2's prompts at 2 threads, tiles vs plain panels: 20
 * tokens 22 vs 32 ms, 128: 161 vs 165, 512: 597 vs 703); where the tier has no
 * tile kernel, each of its rows is rebuilt and goes to the plain type's vec_dot.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "backend/dispatch.h"
#include "matmul/matmul.h"
#include "core/scratch.h"
#include "core/threadpool.h"

/* Weight rows handled together, so a tile of W stays in cache across X rows (an interleaved W's tile). */
#define ROW_TILE X16_ROWS

/* A tile kernel's first pass over an interleaved tile asks for the weights this many blocks ahead (SmolLM2's
 * layers at 2 threads, 4 -> 8 with the next tile into L2: 1 row -10%, 4 rows -27%). */
#define TILE_PREFETCH_BLOCKS 8

/* Fewer X rows than this are a decode step: converted by every thread for itself (decode_task), and W streamed
 * from memory in one contiguous range per thread. */
#define DECODE_ROWS 8
_Static_assert(DECODE_ROWS <= PANEL_ROWS, "a decode step has no panels");

/* X's rows in the forms the kernels take: every row in the activation format, the groups' and the lone rows'
 * layouts, and the scratch those lie in. One for a prompt's call, made by the threads together; one per thread
 * for a decode step, each thread's own (decode_task). */
typedef struct {
    uint8_t *act;           /* (m, act_row_bytes) */
    act_rows *groups;       /* (n_groups): with a rows kernel, the X rows after the panels in groups of VEC_DOT_MAX_ROWS */
    uint8_t *group_scratch; /* (n_groups, group_bytes): their layouts */
    act_rows *lone;         /* (n_lone): with a row or tile kernel, X rows first_lone.. (those no group holds); NULL: none */
    uint8_t *lone_scratch;  /* (n_lone, lone_bytes): their layouts (for W's own type: an interleaved Q8_0's offsets) */
} x_rows;

typedef struct {
    vec_dot_fn kernel;
    vec_dot_rows_fn rows_kernel;  /* NULL: the type has none in this tier */
    vec_dot_rows_fn rows8_kernel; /* two groups at once; NULL: none */
    vec_dot_row_fn row_kernel;    /* a lone row, prepared (act_row_prepare); NULL: kernel on the q8 row */
    vec_dot_cols_fn cols_kernel;  /* without a row kernel, a lone row against VEC_DOT_COLS weight rows at once; NULL: none */
    panel_kernel_fn panel_kernel; /* with n_panels > 0 */
    wide_unpack_fn wide_unpack;
    panel_prepare_fn panel_prepare;
    x16_kernel_fn tile_kernel;    /* an interleaved W's, where the tier has one; NULL otherwise */
    int type;              /* the weights' plain type: its activation format, its vec_dot, its panels */
    int w_type;            /* their own: type, or its interleaved form */
    const pyllm_matrix *weights;  /* each (n, w_row_bytes), its output (m, n) */
    int n_weights;
    const int64_t *first;  /* weight i's rows are rows first[i].. of those handed out (each from a whole tile) */
    int64_t n_handed;      /* the rows handed out: every weight's, each rounded up to whole tiles */
    int64_t w_row_bytes;
    int64_t k, m;
    const float *x;        /* (m, k) */
    int64_t act_row_bytes;
    act_panel *panels;     /* X rows 0..n_panels * PANEL_ROWS - 1, PANEL_ROWS a panel */
    int64_t n_panels;
    uint8_t *panel_scratch; /* (n_panels, panel_bytes): their layouts */
    int64_t panel_bytes;
    uint8_t *wide;         /* (n_threads, ROW_TILE, wide_row_bytes): each thread's unpacked weight rows */
    int64_t wide_row_bytes;
    uint8_t *gathered;     /* a prompt's, interleaved W, no tile kernel: (n_threads, gathered_bytes), each thread's rebuilt row */
    int64_t gathered_bytes; /* one thread's rebuilt row (a decode thread's lies in its own scratch) */
    int64_t n_groups, group_bytes;
    int64_t first_lone, n_lone, lone_bytes;
    x_rows shared;         /* a prompt's X rows, in the call's one buffer */
    atomic_int out_of_memory; /* a decode thread found no scratch for its rows */
    int64_t chunk_rows;    /* a prompt: weight rows handed out at a time (whole tiles) */
    atomic_llong next_chunk;
    atomic_ullong *ranges; /* a decode step: each thread's tiles still to do, (first << 32) | end (decode_task) */
} matmul_job;

/* Bytes of an x_rows' act_rows headers, whole 64-byte lines like each of its parts (so no quants load splits one). */
static int64_t x_rows_header_bytes(const matmul_job *job) {
    return ((job->n_groups + job->n_lone) * (int64_t)sizeof(act_rows) + 63) / 64 * 64;
}

/* Bytes of an x_rows for the job. */
static int64_t x_rows_bytes(const matmul_job *job) {
    return job->n_groups * job->group_bytes + job->n_lone * job->lone_bytes + x_rows_header_bytes(job)
           + (job->m * job->act_row_bytes + 63) / 64 * 64;
}

/* An x_rows over buffer (64-byte aligned, x_rows_bytes of it). */
static x_rows x_rows_at(const matmul_job *job, uint8_t *buffer) {
    x_rows rows;
    rows.group_scratch = buffer;
    rows.lone_scratch = rows.group_scratch + job->n_groups * job->group_bytes;
    uint8_t *headers = rows.lone_scratch + job->n_lone * job->lone_bytes;
    rows.groups = (act_rows *)headers;
    rows.lone = job->n_lone > 0 ? rows.groups + job->n_groups : NULL;
    rows.act = headers + x_rows_header_bytes(job);
    return rows;
}

/* X rows [begin, end) into rows: each converted to the activation format and, if a lone row, laid out for its
 * kernel. */
static void convert_rows(const matmul_job *job, const x_rows *rows, int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
        uint8_t *act = rows->act + r * job->act_row_bytes;
        /* cannot fail: pyllm_matmul checked the type and the row length first */
        pyllm_quantize_activations(job->type, job->x + r * job->k, act, job->k);
        if (rows->lone != NULL && r >= job->first_lone) {
            act_row_prepare(&rows->lone[r - job->first_lone], job->w_type, act, job->k,
                            rows->lone_scratch + (r - job->first_lone) * job->lone_bytes);
        }
    }
}

/* The groups' layouts, from their converted rows. */
static void prepare_groups(const matmul_job *job, const x_rows *rows) {
    for (int64_t gi = 0; gi < job->n_groups; ++gi) {
        const int64_t r0 = job->n_panels * PANEL_ROWS + gi * VEC_DOT_MAX_ROWS;
        const int n_rows = job->m - r0 < VEC_DOT_MAX_ROWS ? (int)(job->m - r0) : VEC_DOT_MAX_ROWS;
        const void *act[VEC_DOT_MAX_ROWS];
        for (int i = 0; i < n_rows; ++i) act[i] = rows->act + (r0 + i) * job->act_row_bytes;
        act_rows_prepare(&rows->groups[gi], job->type, act, n_rows, job->k, rows->group_scratch + gi * job->group_bytes);
    }
}

/* A prompt's X rows split across threads, converted into the shared x_rows. */
static void convert_task(void *arg, int ith, int nth) {
    const matmul_job *job = arg;
    int64_t begin, end;
    pyllm_split_range(job->m, ith, nth, &begin, &end);
    convert_rows(job, &job->shared, begin, end);
}

/* Row c of W in its plain format: in place, or an interleaved W's rebuilt in gathered (the thread's). */
static const uint8_t *weight_row(const matmul_job *job, const pyllm_matrix *w, int64_t c, uint8_t *gathered) {
    if (job->w_type == job->type) return (const uint8_t *)w->data + c * job->w_row_bytes;
    x16_gather_row(job->w_type, w->data, c, job->k, gathered);
    return gathered;
}

/* W's output columns [tile, tile_end) (at most ROW_TILE) for the panels' X rows (a plain W: an interleaved one
 * goes to its tile kernel): the weight rows unpacked once into wide (the thread's), then each panel against them two
 * at a time (an odd last one paired with itself). */
static void dot_panels(const matmul_job *job, const pyllm_matrix *w, int64_t tile, int64_t tile_end, uint8_t *wide) {
    wide_row rows[ROW_TILE];
    for (int64_t c = tile; c < tile_end; ++c) {
        job->wide_unpack((const uint8_t *)w->data + c * job->w_row_bytes, job->k, wide + (c - tile) * job->wide_row_bytes,
                         &rows[c - tile]);
    }
    for (int64_t p = 0; p < job->n_panels; ++p) {
        for (int64_t c = tile; c < tile_end; c += 2) {
            const int pair = c + 1 < tile_end;
            const wide_row two[2] = {rows[c - tile], rows[c - tile + pair]};
            float out[2][PANEL_ROWS];
            job->panel_kernel(job->k, two, &job->panels[p], out);
            float *y = w->y + p * PANEL_ROWS * w->n + c;
            for (int r = 0; r < PANEL_ROWS; ++r) {
                y[r * w->n] = out[0][r];
                if (pair) y[r * w->n + 1] = out[1][r];
            }
        }
    }
}

/* The X rows from first_lone on against an interleaved tile (weight rows tile..tile + 15), two at a time. The
 * first pass reads the tile from memory: alone, it asks for it a few blocks ahead (the Q4_1 kernel does; Q8_0's
 * stream did better without); followed by others, it asks for nothing, and the second pass, which finds the tile
 * in cache, asks for the next one into L2 (the matrix's last tile: itself), so fetching overlaps the arithmetic
 * (SmolLM2's layers at 2 threads, alternated: 1 row 2.83 -> 2.77 ms, 4 rows 4.50 -> 4.20; Gemma's Q8_0 output
 * matrix, 1 row 6.9-7.7 -> 5.7-6.0 ms, where the plain Q8_0 kernels take 6.3). */
static void dot_tile(const matmul_job *job, const x_rows *x, const pyllm_matrix *w, int64_t tile) {
    const int64_t tile_bytes = ROW_TILE * job->w_row_bytes, block_bytes = ROW_TILE * pyllm_type_size(job->type);
    const uint8_t *rows = (const uint8_t *)w->data + tile * job->w_row_bytes;
    const uint8_t *next = tile + ROW_TILE < w->n ? rows + tile_bytes : rows;
    const int64_t passes = (job->m - job->first_lone + 1) / 2;
    for (int64_t pass = 0; pass < passes; ++pass) {
        const int64_t r = job->first_lone + 2 * pass;
        const int n_rows = job->m - r >= 2 ? 2 : 1;
        const uint8_t *prefetch = pass == 1 ? next : pass == 0 && passes == 1 ? rows + TILE_PREFETCH_BLOCKS * block_bytes : NULL;
        job->tile_kernel(job->k, rows, &x->lone[r - job->first_lone], n_rows, w->y + r * w->n + tile, w->n, prefetch,
                         pass == 1);
    }
}

/* W's output columns [begin, end) for every X row (x), a tile of ROW_TILE weight rows at a time; wide and
 * gathered: the thread's scratch for dot_panels and weight_row. */
static void dot_rows(const matmul_job *job, const x_rows *x, const pyllm_matrix *w, int64_t begin, int64_t end,
                     uint8_t *wide, uint8_t *gathered) {
    const uint8_t *data = w->data;
    for (int64_t tile = begin; tile < end; tile += ROW_TILE) {
        const int64_t tile_end = tile + ROW_TILE < end ? tile + ROW_TILE : end;
        if (job->n_panels > 0) dot_panels(job, w, tile, tile_end, wide);
        if (job->tile_kernel != NULL) {
            dot_tile(job, x, w, tile);
            continue;
        }
        int64_t r = job->n_panels * PANEL_ROWS;
        for (int64_t gi = 0; gi < job->n_groups;) {  /* weight rows unpacked once per group or pair of groups */
            const act_rows *group = &x->groups[gi];
            const int pair = job->rows8_kernel != NULL && gi + 1 < job->n_groups;
            const vec_dot_rows_fn kernel = pair ? job->rows8_kernel : job->rows_kernel;
            const int n_rows = pair ? VEC_DOT_MAX_ROWS + group[1].n_rows : group->n_rows;
            for (int64_t c = tile; c < tile_end; ++c) {
                float out[2 * VEC_DOT_MAX_ROWS];
                kernel(job->k, data + c * job->w_row_bytes, group, out);
                for (int i = 0; i < n_rows; ++i) w->y[(r + i) * w->n + c] = out[i];
            }
            gi += pair ? 2 : 1;
            r += n_rows;
        }
        for (; r < job->m; ++r) {
            float *y = w->y + r * w->n;
            if (x->lone != NULL) {
                const act_rows *row = &x->lone[r - job->first_lone];
                for (int64_t c = tile; c < tile_end; ++c) y[c] = job->row_kernel(job->k, data + c * job->w_row_bytes, row);
                continue;
            }
            const uint8_t *act = x->act + r * job->act_row_bytes;
            int64_t c = tile;
            if (job->cols_kernel != NULL) {
                for (; c + VEC_DOT_COLS <= tile_end; c += VEC_DOT_COLS) {
                    job->cols_kernel(job->k, data + c * job->w_row_bytes, job->w_row_bytes, act, y + c);
                }
            }
            for (; c < tile_end; ++c) y[c] = job->kernel(job->k, weight_row(job, w, c, gathered), act);
        }
    }
}

/* Rows [begin, end) of those handed out: each weight's part of them. */
static void dot_handed(const matmul_job *job, const x_rows *x, int64_t begin, int64_t end, uint8_t *wide,
                       uint8_t *gathered) {
    for (int i = 0; i < job->n_weights; ++i) {
        const pyllm_matrix *w = &job->weights[i];
        const int64_t first = begin > job->first[i] ? begin - job->first[i] : 0;
        const int64_t last = end - job->first[i] < w->n ? end - job->first[i] : w->n;
        if (first < last) dot_rows(job, x, w, first, last, wide, gathered);
    }
}

/* A prompt: the weight rows (every weight's, one after another) go out in chunks of whole tiles, each to
 * whichever thread asks next, so a thread the system holds up (another process, a busy server) costs its
 * chunk, not half the matmul. */
static void dot_task(void *arg, int ith, int nth) {
    (void)nth;
    matmul_job *job = arg;
    uint8_t *wide = job->n_panels > 0 ? job->wide + ith * ROW_TILE * job->wide_row_bytes : NULL;
    uint8_t *gathered = job->gathered + ith * job->gathered_bytes;
    for (;;) {
        const int64_t begin = atomic_fetch_add_explicit(&job->next_chunk, 1, memory_order_relaxed) * job->chunk_rows;
        if (begin >= job->n_handed) break;
        dot_handed(job, &job->shared, begin, begin + job->chunk_rows, wide, gathered);
    }
}

/* Tiles a decode thread takes from the front of its own range at a time. */
#define OWN_TILES 4

/* A decode step: each thread first converts X for itself, into its own scratch (rows the caller converted
 * alone kept the other thread waiting, and the layouts it wrote were lines the other had read, written back
 * across cores: SmolLM2 at 4 rows, 4.5 us a matmul of ~0.5 MB, 0.55 ms a step), then streams one contiguous
 * range of tiles (the prefetchers' longest run), taking it a few tiles at a time from the front; a thread done
 * with its own takes the others' last tiles one by one from the back, so one the system holds up (a server's
 * HTTP work on the same cores) is helped, not waited for. Every thread's rows are the same bits. */
static void decode_task(void *arg, int ith, int nth) {
    matmul_job *job = arg;
    uint8_t *own = pyllm_scratch(SCRATCH_DECODE_ROWS, (size_t)(job->gathered_bytes + x_rows_bytes(job)));
    if (own == NULL) {  /* the others take this thread's range from its back */
        atomic_store_explicit(&job->out_of_memory, 1, memory_order_relaxed);
        return;
    }
    uint8_t *gathered = own;
    const x_rows x = x_rows_at(job, own + job->gathered_bytes);
    convert_rows(job, &x, 0, job->m);
    prepare_groups(job, &x);
    int64_t first, n;
    while ((n = pyllm_range_claim(&job->ranges[ith], OWN_TILES, 0, &first)) > 0) {
        dot_handed(job, &x, first * ROW_TILE, (first + n) * ROW_TILE, NULL, gathered);
    }
    for (int other = (ith + 1) % nth; other != ith; other = (other + 1) % nth) {
        while (pyllm_range_claim(&job->ranges[other], 1, 1, &first) > 0) {
            dot_handed(job, &x, first * ROW_TILE, (first + 1) * ROW_TILE, NULL, gathered);
        }
    }
}

static void panel_task(void *arg, int ith, int nth) {
    const matmul_job *job = arg;
    int64_t begin, end;
    pyllm_split_range(job->n_panels, ith, nth, &begin, &end);
    for (int64_t p = begin; p < end; ++p) {
        job->panel_prepare(&job->panels[p], job->type, job->shared.act + p * PANEL_ROWS * job->act_row_bytes, job->act_row_bytes,
                           PANEL_ROWS, job->k, job->panel_scratch + p * job->panel_bytes);
    }
}

int pyllm_matmul(int type, const void *w, int64_t n, int64_t k, const float *x, int64_t m,
                 float *y, int n_threads) {
    const pyllm_matrix weight = {w, n, y};
    return pyllm_matmul_many(type, &weight, 1, k, x, m, n_threads);
}

/* The most weights one call takes. */
#define MAX_WEIGHTS 4

int pyllm_matmul_many(int w_type, const pyllm_matrix *weights, int n_weights, int64_t k, const float *x, int64_t m,
                      int n_threads) {
    const int64_t block_size = pyllm_type_block_size(w_type);
    if (block_size == 0 || pyllm_vec_dot_type(w_type) < 0) return PYLLM_ERR_TYPE;
    if (n_weights < 1 || n_weights > MAX_WEIGHTS || k <= 0 || m <= 0 || k % block_size != 0) return PYLLM_ERR_SHAPE;
    if (pyllm_vec_dot_type(w_type) == PYLLM_TYPE_Q8_K && k % QK_K != 0) return PYLLM_ERR_SHAPE;
    const int interleaved = x16_base_type(w_type) >= 0, type = interleaved ? x16_base_type(w_type) : w_type;
    int64_t first[MAX_WEIGHTS], n_handed = 0;
    for (int i = 0; i < n_weights; ++i) {
        if (weights[i].n <= 0 || (interleaved && weights[i].n % X16_ROWS != 0)) return PYLLM_ERR_SHAPE;
        first[i] = n_handed;
        n_handed += (weights[i].n + ROW_TILE - 1) / ROW_TILE * ROW_TILE;
    }
    if (n_threads <= 0) n_threads = pyllm_physical_cores();
    if (n_threads > PYLLM_MAX_THREADS) return PYLLM_ERR_THREADS;

    /* an interleaved W: no multi-row or row kernels (its tile kernel, or vec_dot on rebuilt rows) */
    matmul_job job = {
        .kernel = pyllm_active_vec_dot(type),
        .rows_kernel = interleaved ? NULL : pyllm_active_vec_dot_rows(type),
        .rows8_kernel = interleaved ? NULL : pyllm_active_vec_dot_rows8(type),
        .row_kernel = interleaved ? NULL : pyllm_active_vec_dot_row(type),
        .cols_kernel = interleaved ? NULL : pyllm_active_vec_dot_cols(type),
        .panel_kernel = pyllm_active_panel_kernel(type),
        .wide_unpack = pyllm_active_wide_unpack(type),
        .panel_prepare = pyllm_active_panel_prepare(),
        .tile_kernel = interleaved ? pyllm_active_x16_kernel(w_type) : NULL,
        .type = type,
        .w_type = w_type,
        .weights = weights,
        .n_weights = n_weights,
        .first = first,
        .n_handed = n_handed,
        .w_row_bytes = k / block_size * pyllm_type_size(type),
        .k = k, .m = m,
        .x = x,
        .act_row_bytes = pyllm_activation_row_bytes(type, k),
    };
    if (job.kernel == NULL) return PYLLM_ERR_TYPE;

    /* X rows in panels where the tier has panel kernels; the rest in groups for the multi-row kernel (a last
     * lone row goes to the single-row kernel); the rows no group holds (a decode step's one row) prepared
     * for the row kernel where there is one */
    if (job.panel_kernel != NULL && job.wide_unpack != NULL && job.panel_prepare != NULL && job.tile_kernel == NULL) {
        job.n_panels = m / PANEL_ROWS;
    }
    const int64_t first_group_row = job.n_panels * PANEL_ROWS, rest = m - first_group_row;
    if (job.rows_kernel != NULL && rest > 1) {
        job.n_groups = (rest + VEC_DOT_MAX_ROWS - 1) / VEC_DOT_MAX_ROWS;
        if ((rest - 1) % VEC_DOT_MAX_ROWS == 0) job.n_groups--;
    }
    job.first_lone = first_group_row + (job.n_groups * VEC_DOT_MAX_ROWS < rest ? job.n_groups * VEC_DOT_MAX_ROWS : rest);
    job.n_lone = job.row_kernel != NULL || job.tile_kernel != NULL ? m - job.first_lone : 0;
    job.group_bytes = act_rows_scratch_bytes(type, k);
    job.lone_bytes = act_row_scratch_bytes(w_type, k);
    job.gathered_bytes = interleaved && job.tile_kernel == NULL ? (job.w_row_bytes + 63) / 64 * 64 : 0;
    const int64_t tiles = n_handed / ROW_TILE;
    if (m < DECODE_ROWS) {  /* a decode step: each thread converts X itself (decode_task) and streams its tiles */
        atomic_ullong ranges[PYLLM_MAX_THREADS];
        pyllm_ranges_init(ranges, tiles, n_threads);
        job.ranges = ranges;
        atomic_init(&job.out_of_memory, 0);
        const int status = pyllm_pool_run(n_threads, decode_task, &job);
        return status == PYLLM_OK && atomic_load(&job.out_of_memory) ? PYLLM_ERR_NOMEM : status;
    }
    /* A prompt: one allocation for all the call prepares, each part whole 64-byte lines: the panels' layouts and
     * their act_panel headers, the threads' unpacked weight rows and rebuilt interleaved rows, then the x_rows */
    const int64_t panel_bytes = job.n_panels > 0 ? act_panel_scratch_bytes(type, k) : 0;
    job.wide_row_bytes = job.n_panels > 0 ? wide_row_scratch_bytes(type, k) : 0;
    const int64_t panels_bytes = job.n_panels * panel_bytes;
    const int64_t panel_header_bytes = (job.n_panels * (int64_t)sizeof(act_panel) + 63) / 64 * 64;
    const int64_t wide_bytes = n_threads * ROW_TILE * job.wide_row_bytes, gathered_bytes = n_threads * job.gathered_bytes;
    const int64_t before_rows = panels_bytes + panel_header_bytes + wide_bytes + gathered_bytes;
    uint8_t *buffer = pyllm_scratch(SCRATCH_MATMUL, (size_t)(before_rows + x_rows_bytes(&job)));
    if (buffer == NULL) return PYLLM_ERR_NOMEM;
    job.panel_scratch = buffer;
    job.panel_bytes = panel_bytes;
    job.panels = (act_panel *)(buffer + panels_bytes);
    job.wide = buffer + panels_bytes + panel_header_bytes;
    job.gathered = job.wide + wide_bytes;
    job.shared = x_rows_at(&job, buffer + before_rows);

    int status = pyllm_pool_run(m < n_threads ? (int)m : n_threads, convert_task, &job);
    if (status == PYLLM_OK && job.n_panels > 0) {
        status = pyllm_pool_run(job.n_panels < n_threads ? (int)job.n_panels : n_threads, panel_task, &job);
    }
    if (status != PYLLM_OK) return status;
    prepare_groups(&job, &job.shared);
    /* about 8 chunks per thread, so the threads finish together even when one is held up */
    const int64_t tiles_per_chunk = tiles / (8 * n_threads);
    job.chunk_rows = ROW_TILE * (tiles_per_chunk > 1 ? tiles_per_chunk : 1);
    atomic_init(&job.next_chunk, 0);
    return pyllm_pool_run(n_threads, dot_task, &job);
}
