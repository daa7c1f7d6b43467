/*
 * registry.c - the backends, the kernel set of every (tier, type) built once from them, the tier in use, and the
 * entry points that choose by tier: pyllm_kernels, pyllm_vec_dot, pyllm_quantize_activations, pyllm_choose_layout.
 *
 * A new backend (a tier of its own: arm/, cuda/) adds its files, a PYLLM_TIER_* id in pyllm.h and its record in
 * `backends` below; nothing else chooses kernels.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/kernel_set.h"

extern const pyllm_backend backend_generic, backend_avx2, backend_avx512, backend_avx512_vnni, backend_neon,
    backend_neon_dotprod, backend_neon_i8mm;

/* Indexed by tier, in order of preference: the best tier is the last one the CPU runs. */
static const pyllm_backend *const backends[PYLLM_TIER_COUNT] = {
    [PYLLM_TIER_GENERIC] = &backend_generic,
    [PYLLM_TIER_AVX2] = &backend_avx2,
    [PYLLM_TIER_AVX512] = &backend_avx512,
    [PYLLM_TIER_AVX512_VNNI] = &backend_avx512_vnni,
    [PYLLM_TIER_NEON] = &backend_neon,
    [PYLLM_TIER_NEON_DOTPROD] = &backend_neon_dotprod,
    [PYLLM_TIER_NEON_I8MM] = &backend_neon_i8mm,
};

static struct {
    pyllm_kernel_set sets[PYLLM_TIER_COUNT][PYLLM_TYPE_COUNT];
    op_set ops[PYLLM_TIER_COUNT];
    int runs[PYLLM_TIER_COUNT];  /* whether this CPU runs the tier's kernels */
    int best_tier;
} registry;

static _Atomic int active_tier = -1;

/* A tier's op set: each kind its own, or its base's. */
static void build_ops(int tier) {
    const pyllm_backend *b = backends[tier];
    const op_set base = b->base >= 0 ? registry.ops[b->base] : (op_set){0};
    registry.ops[tier] = (op_set){b->ops ? b->ops : base.ops, b->prompt ? b->prompt : base.prompt,
                                  b->heads ? b->heads : base.heads};
}

/* The activation quantizer of a weight set: the tier's for the q8 formats, the reference conversion for the float
 * ones (a copy or a rounding). */
static quantize_row_fn act_quantizer(const op_kernels *ops, int act_type) {
    switch (act_type) {
    case PYLLM_TYPE_Q8_0: return ops->quantize_q8_0;
    case PYLLM_TYPE_Q8_1: return ops->quantize_q8_1;
    case PYLLM_TYPE_Q8_K: return ops->quantize_q8_K;
    default: return quantize_table[act_type];
    }
}

/* Set (tier, type): its base tier's, then the backend's own kernels; a tiled layout keeps its tile kernel and its
 * plain type's vec_dot, multi-row and panel kernels (for rows rebuilt from the tiles), the panel kernels go three or
 * none. */
static void build_set(int tier, int type) {
    const pyllm_type_traits *t = type_traits(type);
    pyllm_kernel_set *set = &registry.sets[tier][type];
    const pyllm_backend *b = backends[tier];
    *set = b->base >= 0 ? registry.sets[b->base][type] : (pyllm_kernel_set){0};
    if (t == NULL || t->vec_dot_type < 0) return;
    if (b->fill != NULL) b->fill(type, set);
    if (t->tile_rows > 1) {
        const pyllm_kernel_set *plain = &registry.sets[tier][t->plain_type];
        *set = (pyllm_kernel_set){.vec_dot = plain->vec_dot, .rows4 = plain->rows4, .rows8 = plain->rows8,
                                  .panel_prepare = plain->panel_prepare, .panel_unpack = plain->panel_unpack,
                                  .panel = plain->panel, .panel_layout = plain->panel_layout, .tile = set->tile,
                                  .tile_max_rows = set->tile != NULL ? set->tile_max_rows : 0,
                                  .tile_prefill = set->tile != NULL && set->tile_prefill};
    } else {
        set->tile = NULL;
        set->tile_max_rows = 0;
    }
    if (set->panel_prepare == NULL || set->panel_unpack == NULL || set->panel == NULL) {
        set->panel_prepare = NULL, set->panel_unpack = NULL, set->panel = NULL, set->panel_layout = PANEL_LAYOUT_LANES;
    }
    set->tier = tier;
    set->type = type;
    set->plain_type = t->plain_type;
    set->act_type = t->vec_dot_type;
    set->traits = t;
    set->act_traits = type_traits(t->vec_dot_type);
    set->quantize_act = act_quantizer(registry.ops[tier].ops, t->vec_dot_type);
}

static void init_once(void) {
    registry.best_tier = PYLLM_TIER_GENERIC;
    for (int tier = 0; tier < PYLLM_TIER_COUNT; ++tier) {
        build_ops(tier);
        for (int type = 0; type < PYLLM_TYPE_COUNT; ++type) {
            if (type_traits(type) == NULL || type_traits(type)->tile_rows == 1) build_set(tier, type);
        }
        for (int type = 0; type < PYLLM_TYPE_COUNT; ++type) {  /* tiled layouts after their plain types */
            if (type_traits(type) != NULL && type_traits(type)->tile_rows > 1) build_set(tier, type);
        }
        registry.runs[tier] = backends[tier]->cpu_runs == NULL || backends[tier]->cpu_runs();
        if (registry.runs[tier]) registry.best_tier = tier;
    }
    int tier = registry.best_tier;
    const char *forced = getenv("PYLLM_TIER");  /* e.g. PYLLM_TIER=generic: run the references */
    for (int t = 0; forced != NULL && t <= registry.best_tier; ++t) {
        if (strcmp(forced, backends[t]->name) == 0) tier = t;
    }
    atomic_store(&active_tier, tier);
}

/* Called by every entry point that needs the sets or the tier. */
static void ensure_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_once);
}

const pyllm_kernel_set *kernel_set(int tier, int layout) {
    ensure_init();
    if (tier < 0 || tier >= PYLLM_TIER_COUNT || type_traits(layout) == NULL) return NULL;
    const pyllm_kernel_set *set = &registry.sets[tier][layout];
    return set->vec_dot != NULL ? set : NULL;
}

const op_set *tier_ops(int tier) {
    ensure_init();
    return &registry.ops[tier];
}

const op_set *active_ops(void) {
    ensure_init();
    return &registry.ops[atomic_load_explicit(&active_tier, memory_order_relaxed)];
}

int tier_runs(int tier) {
    ensure_init();
    return tier >= 0 && tier < PYLLM_TIER_COUNT && registry.runs[tier];
}

int pyllm_cpu_best_tier(void) { ensure_init(); return registry.best_tier; }
int pyllm_active_tier(void) { ensure_init(); return atomic_load(&active_tier); }

int pyllm_set_tier(int tier) {
    ensure_init();
    if (tier < 0 || tier > registry.best_tier) return PYLLM_ERR_TIER;
    atomic_store(&active_tier, tier);
    return PYLLM_OK;
}

const char *pyllm_tier_name(int tier) {
    return tier >= 0 && tier < PYLLM_TIER_COUNT ? backends[tier]->name : "?";
}

const pyllm_kernel_set *pyllm_kernels(int layout) { return kernel_set(pyllm_active_tier(), layout); }

int pyllm_choose_layout(int type, int64_t n_rows, int for_matmul) {
    const pyllm_type_traits *t = type_traits(type);
    if (t == NULL || t->vec_dot_type < 0 || t->plain_type != type) return -1;
    if (type == PYLLM_TYPE_Q4_0 && n_rows % 8 != 0) return PYLLM_TYPE_Q4_0_LANES;
    if (!for_matmul) return type;
    int regrouped = -1;
    for (int layout = 0; layout < PYLLM_TYPE_COUNT; ++layout) {
        const pyllm_type_traits *l = type_traits(layout);
        if (l == NULL || !l->repacked || l->plain_type != type) continue;
        if (l->tile_rows == 1) regrouped = layout;
        else if (n_rows % l->tile_rows == 0 && pyllm_kernels(layout)->tile != NULL) return layout;
    }
    return regrouped >= 0 ? regrouped : type;
}

int pyllm_vec_dot(int tier, int type, const void *w, const void *act, int64_t n, float *out) {
    ensure_init();
    if (tier < 0 || tier > registry.best_tier) return PYLLM_ERR_TIER;
    const int status = type_check_row(type, n);
    if (status != PYLLM_OK) return status;
    const pyllm_kernel_set *set = kernel_set(tier, type);
    if (set == NULL || type_traits(type)->tile_rows > 1) return PYLLM_ERR_TYPE;  /* a tiled layout has no rows of its own */
    *out = set->vec_dot(n, w, act);
    return PYLLM_OK;
}

int pyllm_quantize_activations(int weight_type, const float *x, void *dst, int64_t n) {
    const int status = type_check_row(weight_type, n);
    if (status != PYLLM_OK) return status;
    const pyllm_kernel_set *set = pyllm_kernels(weight_type);
    if (set == NULL) return PYLLM_ERR_TYPE;
    if (n % type_traits(set->act_type)->block_size != 0) return PYLLM_ERR_SHAPE;
    set->quantize_act(x, dst, n);
    return PYLLM_OK;
}
