/*
 * plan.c - deciding how a matmul goes (matmul.h: matmul_plan) before run.c runs it: the arguments checked, the
 * phase, which kernel shape takes which of X's rows, the scratch each needs, how the weight rows are dealt out.
 */
#include "core/threadpool.h"
#include "matmul/matmul.h"

_Static_assert(PYLLM_PREFILL_MIN_ROWS <= PANEL_ROWS, "a decode step has no panels");

pyllm_phase pyllm_phase_of(int64_t m) { return m < PYLLM_PREFILL_MIN_ROWS ? PYLLM_PHASE_DECODE : PYLLM_PHASE_PREFILL; }

/* The weights, each rounded up to whole tiles, one after another: where each one's rows start among those dealt out. */
static int deal_rows(matmul_plan *plan, const matmul_weight *weights, int n_weights, int tile_rows) {
    plan->n_dealt = 0;
    for (int i = 0; i < n_weights; ++i) {
        if (weights[i].n <= 0 || weights[i].n % tile_rows != 0) return PYLLM_ERR_SHAPE;
        plan->first[i] = plan->n_dealt;
        plan->n_dealt += (weights[i].n + ROW_TILE - 1) / ROW_TILE * ROW_TILE;
    }
    return PYLLM_OK;
}

/* X's rows among the shapes: panels where the set has panel kernels (a tiled W's rebuilt into plain rows, unless its
 * tile kernel takes every row); otherwise the rest in groups for the multi-row kernels, a last single row left to the
 * single-row kernels; the rows no group holds (a decode step's one row) laid out for the prepared or tile kernel
 * where the set has one. */
static void split_rows(matmul_plan *plan) {
    const pyllm_kernel_set *ks = plan->ks;
    const int64_t m = plan->m;
    plan->n_panels = ks->panel != NULL && !plan->use_tiles ? m / PANEL_ROWS : 0;
    const int64_t first_group_row = plan->n_panels * PANEL_ROWS, rest = m - first_group_row;
    plan->n_groups = 0;
    if (ks->rows4 != NULL && rest > 1 && !plan->use_tiles) {
        plan->n_groups = (rest + VEC_DOT_MAX_ROWS - 1) / VEC_DOT_MAX_ROWS;
        if ((rest - 1) % VEC_DOT_MAX_ROWS == 0) plan->n_groups--;
    }
    const int64_t grouped = plan->n_groups * VEC_DOT_MAX_ROWS;
    plan->first_single = first_group_row + (grouped < rest ? grouped : rest);
    plan->n_prepared = plan->use_tiles || (ks->prepared != NULL && !plan->tiled) ? m - plan->first_single : 0;
}

/* The scratch each part of the plan needs: a panel's layout, a thread's unpacked weight row, a group's layout, a
 * prepared row's layout, a thread's rebuilt tile of a tiled W; and a prefill's chunks of weight rows. */
static void size_scratch(matmul_plan *plan) {
    const int type = plan->ks->type;
    const int64_t k = plan->k;
    plan->panel_bytes = plan->n_panels > 0 ? act_panel_scratch_bytes(plan->group_type, k) : 0;
    plan->unpacked_bytes = plan->n_panels > 0 ? unpacked_row_bytes(plan->group_type, k) : 0;
    plan->group_bytes = act_rows_scratch_bytes(plan->group_type, k);
    plan->prepared_bytes = act_row_scratch_bytes(type, k);
    plan->gathered_bytes = plan->tiled && !plan->use_tiles ? (ROW_TILE * plan->w_row_bytes + 63) / 64 * 64 : 0;
    /* about 8 chunks a thread, so the threads finish together even when one is held up */
    const int64_t tiles_per_chunk = plan->n_dealt / ROW_TILE / (8 * plan->n_threads);
    plan->chunk_rows = ROW_TILE * (tiles_per_chunk > 1 ? tiles_per_chunk : 1);
}

int matmul_plan_make(matmul_plan *plan, const pyllm_kernel_set *ks, const matmul_weight *weights, int n_weights,
                     int64_t k, const float *x, int64_t m, int n_threads) {
    if (ks == NULL) return PYLLM_ERR_TYPE;
    const pyllm_type_traits *t = ks->traits, *act = ks->act_traits;
    if (n_weights < 1 || n_weights > MATMUL_MAX_WEIGHTS || k <= 0 || m <= 0) return PYLLM_ERR_SHAPE;
    if (k % t->block_size != 0 || k % act->block_size != 0) return PYLLM_ERR_SHAPE;
    *plan = (matmul_plan){.ks = ks, .phase = pyllm_phase_of(m), .tiled = t->tile_rows > 1, .x = x, .m = m, .k = k,
                          .weights = weights, .n_weights = n_weights, .w_row_bytes = k / t->block_size * t->type_size,
                          .act_row_bytes = k / act->block_size * act->type_size};
    plan->use_tiles = plan->tiled && ks->tile != NULL && (plan->phase == PYLLM_PHASE_DECODE || ks->tile_prefill);
    plan->group_type = plan->tiled ? ks->plain_type : ks->type;
    const int status = deal_rows(plan, weights, n_weights, t->tile_rows);
    if (status != PYLLM_OK) return status;
    plan->n_threads = n_threads > 0 ? n_threads : pyllm_physical_cores();
    if (plan->n_threads > PYLLM_MAX_THREADS) return PYLLM_ERR_THREADS;
    split_rows(plan);
    size_scratch(plan);
    return PYLLM_OK;
}

int matmul_many(const pyllm_kernel_set *ks, const matmul_weight *weights, int n_weights, int64_t k, const float *x,
                int64_t m, int n_threads) {
    matmul_plan plan;
    const int status = matmul_plan_make(&plan, ks, weights, n_weights, k, x, m, n_threads);
    return status == PYLLM_OK ? matmul_run(&plan) : status;
}

int pyllm_matmul(const pyllm_weight *w, const float *x, int64_t m, float *y, int n_threads) {
    const matmul_weight weight = {w->data, w->n_out, y};
    return matmul_many(w->kernels, &weight, 1, w->n_in, x, m, n_threads);
}
