/*
 * run.c - running a matmul plan (matmul.h): X's rows converted to the activation format and laid out for their
 * kernels, then the weight rows dealt out to the threads, each tile of weight rows met by every X row.
 *
 * A decode step (run_decode): each thread converts X for itself, into its own scratch, then streams one contiguous
 * range of tiles. A prefill (run_prefill): the threads convert X together into one buffer and lay out the panels,
 * then take chunks of weight rows as they free up.
 */
#include <stdatomic.h>

#include "core/scratch.h"
#include "core/threadpool.h"
#include "matmul/matmul.h"

/* A tile kernel's first pass over a tile that only one pass reads asks for its weights this many blocks ahead
 * (bench/README.md). */
#define TILE_PREFETCH_BLOCKS 8

/* Tiles a decode thread takes from the front of its own range at a time. */
#define OWN_TILES 4

/* X's rows in the forms the kernels take: every row in the activation format, the groups' and the prepared single
 * rows' layouts, and the scratch those lie in. One for a prefill, made by the threads together; one per thread for a
 * decode step, each thread's own. */
typedef struct {
    uint8_t *act;             /* (m, act_row_bytes) */
    act_rows *groups;         /* (n_groups) */
    uint8_t *group_scratch;   /* (n_groups, group_bytes): their layouts */
    act_rows *prepared;       /* (n_prepared): X rows first_single.. laid out alone; NULL: none */
    uint8_t *prepared_scratch;  /* (n_prepared, prepared_bytes) */
} x_rows;

/* A running plan: its scratch and the threads' shared counters. */
typedef struct {
    const matmul_plan *plan;
    x_rows shared;            /* a prefill's X rows */
    act_panel *panels;        /* (n_panels): X rows 0 .. n_panels * PANEL_ROWS - 1, PANEL_ROWS a panel */
    uint8_t *panel_scratch;   /* (n_panels, panel_bytes): their layouts */
    uint8_t *unpacked;        /* (n_threads, ROW_TILE, unpacked_bytes): each thread's unpacked weight rows */
    uint8_t *gathered;        /* a prefill's (n_threads, gathered_bytes): each thread's rebuilt tile */
    atomic_llong next_chunk;  /* a prefill: the next chunk of weight rows */
    atomic_int out_of_memory; /* a decode thread found no scratch for its rows */
    atomic_ullong ranges[PYLLM_MAX_THREADS];  /* a decode step: each thread's tiles still to do (pyllm_range_claim) */
} matmul_run_state;

static int64_t round_line(int64_t bytes) { return (bytes + 63) / 64 * 64; }

/* Bytes of an x_rows' act_rows headers, whole 64-byte lines like each of its parts (so no quants load splits one). */
static int64_t x_rows_header_bytes(const matmul_plan *plan) {
    return round_line((plan->n_groups + plan->n_prepared) * (int64_t)sizeof(act_rows));
}

static int64_t x_rows_bytes(const matmul_plan *plan) {
    return plan->n_groups * plan->group_bytes + plan->n_prepared * plan->prepared_bytes + x_rows_header_bytes(plan)
           + round_line(plan->m * plan->act_row_bytes);
}

/* An x_rows over buffer (64-byte aligned, x_rows_bytes of it). */
static x_rows x_rows_at(const matmul_plan *plan, uint8_t *buffer) {
    x_rows rows;
    rows.group_scratch = buffer;
    rows.prepared_scratch = rows.group_scratch + plan->n_groups * plan->group_bytes;
    uint8_t *headers = rows.prepared_scratch + plan->n_prepared * plan->prepared_bytes;
    rows.groups = (act_rows *)headers;
    rows.prepared = plan->n_prepared > 0 ? rows.groups + plan->n_groups : NULL;
    rows.act = headers + x_rows_header_bytes(plan);
    return rows;
}

/* X rows [begin, end) into rows: each converted to the activation format and, if a prepared single row, laid out
 * for its kernel. */
static void convert_rows(const matmul_plan *plan, const x_rows *rows, int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
        uint8_t *act = rows->act + r * plan->act_row_bytes;
        plan->ks->quantize_act(plan->x + r * plan->k, act, plan->k);
        if (rows->prepared != NULL && r >= plan->first_single) {
            act_row_prepare(&rows->prepared[r - plan->first_single], plan->ks->type, act, plan->k,
                            rows->prepared_scratch + (r - plan->first_single) * plan->prepared_bytes);
        }
    }
}

/* The groups' layouts, from their converted rows. */
static void prepare_groups(const matmul_plan *plan, const x_rows *rows) {
    for (int64_t gi = 0; gi < plan->n_groups; ++gi) {
        const int64_t r0 = plan->n_panels * PANEL_ROWS + gi * VEC_DOT_MAX_ROWS;
        const int n_rows = plan->m - r0 < VEC_DOT_MAX_ROWS ? (int)(plan->m - r0) : VEC_DOT_MAX_ROWS;
        const void *act[VEC_DOT_MAX_ROWS];
        for (int i = 0; i < n_rows; ++i) act[i] = rows->act + (r0 + i) * plan->act_row_bytes;
        act_rows_prepare(&rows->groups[gi], plan->group_type, act, n_rows, plan->k,
                         rows->group_scratch + gi * plan->group_bytes);
    }
}

/* W's output columns [tile, tile_end) (at most ROW_TILE) for the panels' X rows: the weight rows unpacked once into
 * unpacked (the thread's), then each panel against them two at a time (an odd last one paired with itself). Weight
 * row c (plain) is at data + (c - first) * w_row_bytes. */
static void dot_panels(const matmul_run_state *run, const matmul_weight *w, const uint8_t *data, int64_t first,
                       int64_t tile, int64_t tile_end, uint8_t *unpacked) {
    const matmul_plan *plan = run->plan;
    unpacked_row rows[ROW_TILE];
    for (int64_t c = tile; c < tile_end; ++c) {
        plan->ks->panel_unpack(data + (c - first) * plan->w_row_bytes, plan->k,
                               unpacked + (c - tile) * plan->unpacked_bytes, &rows[c - tile]);
    }
    for (int64_t p = 0; p < plan->n_panels; ++p) {
        for (int64_t c = tile; c < tile_end; c += 2) {
            const int pair = c + 1 < tile_end;
            const unpacked_row two[2] = {rows[c - tile], rows[c - tile + pair]};
            float out[2][PANEL_ROWS];
            plan->ks->panel(plan->k, two, &run->panels[p], out);
            float *y = w->y + p * PANEL_ROWS * w->n + c;
            for (int r = 0; r < PANEL_ROWS; ++r) {
                y[r * w->n] = out[0][r];
                if (pair) y[r * w->n + 1] = out[1][r];
            }
        }
    }
}

/* The X rows from first_single on against a tile (weight rows tile..tile + 15), tile_max_rows at a time. The first pass reads
 * the tile from memory: alone, it asks for it a few blocks ahead (the Q4_1 kernel does; Q8_0 and Q4_K stream better
 * without); followed by others, it asks for nothing, and the second pass, which finds the tile in cache, asks for
 * the next one into L2 (the matrix's last tile: itself), so fetching overlaps the arithmetic. */
static void dot_tile(const matmul_plan *plan, const x_rows *x, const matmul_weight *w, int64_t tile) {
    const int64_t tile_bytes = ROW_TILE * plan->w_row_bytes, block_bytes = ROW_TILE * plan->ks->traits->type_size;
    const uint8_t *rows = (const uint8_t *)w->data + tile * plan->w_row_bytes;
    const uint8_t *next = tile + ROW_TILE < w->n ? rows + tile_bytes : rows;
    const int per_pass = plan->ks->tile_max_rows;
    const int64_t passes = (plan->m - plan->first_single + per_pass - 1) / per_pass;
    for (int64_t pass = 0; pass < passes; ++pass) {
        const int64_t r = plan->first_single + per_pass * pass;
        const int n_rows = plan->m - r >= per_pass ? per_pass : (int)(plan->m - r);
        const int ahead = pass == 0 && passes == 1 && TILE_PREFETCH_BLOCKS * block_bytes <= tile_bytes;  /* in the tile */
        const uint8_t *prefetch = pass == 1 ? next : ahead ? rows + TILE_PREFETCH_BLOCKS * block_bytes : NULL;
        plan->ks->tile(plan->k, rows, &x->prepared[r - plan->first_single], n_rows, w->y + r * w->n + tile, w->n,
                       prefetch, pass == 1);
    }
}

/* W's output columns [tile, tile_end) for the groups' X rows: each weight row unpacked once per group or pair of
 * groups. Weight row c (plain) is at data + (c - first) * w_row_bytes. */
static void dot_groups(const matmul_plan *plan, const x_rows *x, const matmul_weight *w, const uint8_t *data,
                       int64_t first, int64_t tile, int64_t tile_end) {
    const pyllm_kernel_set *ks = plan->ks;
    int64_t r = plan->n_panels * PANEL_ROWS;
    for (int64_t gi = 0; gi < plan->n_groups;) {
        const act_rows *group = &x->groups[gi];
        const int pair = ks->rows8 != NULL && gi + 1 < plan->n_groups;
        const vec_dot_rows_fn kernel = pair ? ks->rows8 : ks->rows4;
        const int n_rows = pair ? VEC_DOT_MAX_ROWS + group[1].n_rows : group->n_rows;
        for (int64_t c = tile; c < tile_end; ++c) {
            float out[2 * VEC_DOT_MAX_ROWS];
            kernel(plan->k, data + (c - first) * plan->w_row_bytes, group, out);
            for (int i = 0; i < n_rows; ++i) w->y[(r + i) * w->n + c] = out[i];
        }
        gi += pair ? 2 : 1;
        r += n_rows;
    }
}

/* W's output columns [tile, tile_end) for the single X rows: the prepared kernel, or cols4 then vec_dot. Weight row
 * c (plain) is at data + (c - first) * w_row_bytes. */
static void dot_single_rows(const matmul_plan *plan, const x_rows *x, const matmul_weight *w, const uint8_t *data,
                            int64_t first, int64_t tile, int64_t tile_end) {
    const pyllm_kernel_set *ks = plan->ks;
    for (int64_t r = plan->first_single; r < plan->m; ++r) {
        float *y = w->y + r * w->n;
        if (x->prepared != NULL) {
            const act_rows *row = &x->prepared[r - plan->first_single];
            for (int64_t c = tile; c < tile_end; ++c) {
                y[c] = ks->prepared(plan->k, data + (c - first) * plan->w_row_bytes, row);
            }
            continue;
        }
        const uint8_t *act = x->act + r * plan->act_row_bytes;
        int64_t c = tile;
        if (ks->cols4 != NULL) {
            for (; c + VEC_DOT_COLS <= tile_end; c += VEC_DOT_COLS) {
                ks->cols4(plan->k, data + (c - first) * plan->w_row_bytes, plan->w_row_bytes, act, y + c);
            }
        }
        for (; c < tile_end; ++c) y[c] = ks->vec_dot(plan->k, data + (c - first) * plan->w_row_bytes, act);
    }
}

/* W's output columns [begin, end) for every X row, a tile of ROW_TILE weight rows at a time; unpacked and gathered:
 * the thread's scratch for dot_panels and a tiled W's tile rebuilt into plain rows. */
static void dot_weight(const matmul_run_state *run, const x_rows *x, const matmul_weight *w, int64_t begin,
                       int64_t end, uint8_t *unpacked, uint8_t *gathered) {
    const matmul_plan *plan = run->plan;
    const int panels = plan->n_panels > 0, groups = plan->n_groups > 0;
    for (int64_t tile = begin; tile < end; tile += ROW_TILE) {
        const int64_t tile_end = tile + ROW_TILE < end ? tile + ROW_TILE : end;
        if (plan->use_tiles) {
            dot_tile(plan, x, w, tile);
            continue;
        }
        const uint8_t *data = w->data;
        int64_t first = 0;
        if (plan->tiled) {  /* a whole tile (tiled rows are a multiple of it), rebuilt once for every X row */
            const uint8_t *first_block = (const uint8_t *)w->data + tile * plan->w_row_bytes;
            tile_gather(plan->ks->type, first_block, plan->k, gathered);
            data = gathered, first = tile;
        }
        if (panels) dot_panels(run, w, data, first, tile, tile_end, unpacked);
        if (groups) dot_groups(plan, x, w, data, first, tile, tile_end);
        dot_single_rows(plan, x, w, data, first, tile, tile_end);
    }
}

/* Rows [begin, end) of those dealt out: each weight's part of them. */
static void dot_dealt(const matmul_run_state *run, const x_rows *x, int64_t begin, int64_t end, uint8_t *unpacked,
                      uint8_t *gathered) {
    const matmul_plan *plan = run->plan;
    for (int i = 0; i < plan->n_weights; ++i) {
        const matmul_weight *w = &plan->weights[i];
        const int64_t first = begin > plan->first[i] ? begin - plan->first[i] : 0;
        const int64_t last = end - plan->first[i] < w->n ? end - plan->first[i] : w->n;
        if (first < last) dot_weight(run, x, w, first, last, unpacked, gathered);
    }
}

/* ---- decode ---- */

/* A decode step's thread: X converted into its own scratch (rows the caller converted alone kept the others waiting,
 * and its layouts were lines the others had read, written back across cores), then its own range of tiles streamed
 * a few at a time from the front (the prefetchers' longest run); done with it, the others' last tiles one by one from
 * the back, so a thread the system holds up (a server's HTTP work on the same cores) is helped, not waited for. */
static void decode_task(void *arg, int ith, int nth) {
    matmul_run_state *run = arg;
    const matmul_plan *plan = run->plan;
    uint8_t *own = pyllm_scratch(SCRATCH_DECODE_ROWS, (size_t)(plan->gathered_bytes + x_rows_bytes(plan)));
    if (own == NULL) {  /* the others take this thread's range from its back */
        atomic_store_explicit(&run->out_of_memory, 1, memory_order_relaxed);
        return;
    }
    uint8_t *gathered = own;
    const x_rows x = x_rows_at(plan, own + plan->gathered_bytes);
    convert_rows(plan, &x, 0, plan->m);
    prepare_groups(plan, &x);
    int64_t first, n;
    while ((n = pyllm_range_claim(&run->ranges[ith], OWN_TILES, 0, &first)) > 0) {
        dot_dealt(run, &x, first * ROW_TILE, (first + n) * ROW_TILE, NULL, gathered);
    }
    for (int other = (ith + 1) % nth; other != ith; other = (other + 1) % nth) {
        while (pyllm_range_claim(&run->ranges[other], 1, 1, &first) > 0) {
            dot_dealt(run, &x, first * ROW_TILE, (first + 1) * ROW_TILE, NULL, gathered);
        }
    }
}

static int run_decode(matmul_run_state *run) {
    const matmul_plan *plan = run->plan;
    pyllm_ranges_init(run->ranges, plan->n_dealt / ROW_TILE, plan->n_threads);
    atomic_init(&run->out_of_memory, 0);
    const int status = pyllm_pool_run(plan->n_threads, decode_task, run);
    return status == PYLLM_OK && atomic_load(&run->out_of_memory) ? PYLLM_ERR_NOMEM : status;
}

/* ---- prefill ---- */

/* A prefill's X rows split across threads, converted into the shared x_rows. */
static void convert_task(void *arg, int ith, int nth) {
    const matmul_run_state *run = arg;
    int64_t begin, end;
    pyllm_split_range(run->plan->m, ith, nth, &begin, &end);
    convert_rows(run->plan, &run->shared, begin, end);
}

static void panel_task(void *arg, int ith, int nth) {
    const matmul_run_state *run = arg;
    const matmul_plan *plan = run->plan;
    int64_t begin, end;
    pyllm_split_range(plan->n_panels, ith, nth, &begin, &end);
    for (int64_t p = begin; p < end; ++p) {
        plan->ks->panel_prepare(&run->panels[p], plan->group_type,
                                run->shared.act + p * PANEL_ROWS * plan->act_row_bytes, plan->act_row_bytes, PANEL_ROWS,
                                plan->k, run->panel_scratch + p * plan->panel_bytes);
    }
}

/* The weight rows (every weight's, one after another) go out in chunks of whole tiles, each to whichever thread asks
 * next, so a thread the system holds up (another process, a busy server) costs its chunk, not half the matmul. */
static void dot_task(void *arg, int ith, int nth) {
    (void)nth;
    matmul_run_state *run = arg;
    const matmul_plan *plan = run->plan;
    uint8_t *unpacked = plan->n_panels > 0 ? run->unpacked + ith * ROW_TILE * plan->unpacked_bytes : NULL;
    uint8_t *gathered = run->gathered + ith * plan->gathered_bytes;
    for (;;) {
        const int64_t begin = atomic_fetch_add_explicit(&run->next_chunk, 1, memory_order_relaxed) * plan->chunk_rows;
        if (begin >= plan->n_dealt) break;
        dot_dealt(run, &run->shared, begin, begin + plan->chunk_rows, unpacked, gathered);
    }
}

/* One buffer for all a prefill lays out, each part whole 64-byte lines: the panels' layouts and their act_panel
 * headers, the threads' unpacked weight rows and rebuilt tiled rows, then the x_rows. */
static int lay_out_prefill(matmul_run_state *run) {
    const matmul_plan *plan = run->plan;
    const int64_t panels_bytes = plan->n_panels * plan->panel_bytes;
    const int64_t panel_header_bytes = round_line(plan->n_panels * (int64_t)sizeof(act_panel));
    const int64_t unpacked_bytes = plan->n_threads * ROW_TILE * plan->unpacked_bytes;
    const int64_t before_rows = panels_bytes + panel_header_bytes + unpacked_bytes + plan->n_threads * plan->gathered_bytes;
    uint8_t *buffer = pyllm_scratch(SCRATCH_MATMUL, (size_t)(before_rows + x_rows_bytes(plan)));
    if (buffer == NULL) return PYLLM_ERR_NOMEM;
    run->panel_scratch = buffer;
    run->panels = (act_panel *)(buffer + panels_bytes);
    run->unpacked = buffer + panels_bytes + panel_header_bytes;
    run->gathered = run->unpacked + unpacked_bytes;
    run->shared = x_rows_at(plan, buffer + before_rows);
    return PYLLM_OK;
}

static int run_prefill(matmul_run_state *run) {
    const matmul_plan *plan = run->plan;
    int status = lay_out_prefill(run);
    const int n_threads = plan->n_threads;
    if (status == PYLLM_OK) status = pyllm_pool_run(plan->m < n_threads ? (int)plan->m : n_threads, convert_task, run);
    if (status == PYLLM_OK && plan->n_panels > 0) {
        status = pyllm_pool_run(plan->n_panels < n_threads ? (int)plan->n_panels : n_threads, panel_task, run);
    }
    if (status != PYLLM_OK) return status;
    prepare_groups(plan, &run->shared);
    atomic_init(&run->next_chunk, 0);
    return pyllm_pool_run(n_threads, dot_task, run);
}

int matmul_run(const matmul_plan *plan) {
    matmul_run_state run;  /* each phase sets what it uses: not the whole ranges array a call */
    run.plan = plan;
    return plan->phase == PYLLM_PHASE_DECODE ? run_decode(&run) : run_prefill(&run);
}
