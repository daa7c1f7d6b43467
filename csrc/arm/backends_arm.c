/*
 * backends_arm.c - the aarch64 tiers as backends (backend/kernel_set.h), each building on the one below:
 *   neon          every weight type's vec_dot by 128-bit Advanced SIMD, int8 dots by smull + pairwise adds
 *                 (vec_dot_neon.c): every aarch64 CPU;
 *   neon_dotprod  the same kernels with int8 dots by sdot (vec_dot_neon_dotprod.c), and Q4_K_X16's tile kernel by
 *                 sdot by lane (tile_neon_dotprod.c), where the CPU has FEAT_DotProd;
 *   neon_i8mm     neon_dotprod's, and a prompt's rows in panels of 16 by smmla (panel_neon_i8mm.c), where the CPU has
 *                 FEAT_I8MM as well.
 * A decode step goes through their vec_dot kernels row by row, or through the tile kernel where the matrix is tiled
 * (pyllm_choose_layout tiles Q4_K matrices once the active tier has the kernel); the ops are ops_neon.c's. The dotprod and
 * i8mm kernels take their target by pragma, so one build runs on any aarch64: a tier is used only where the OS says
 * the CPU runs it (Linux: getauxval(AT_HWCAP) and AT_HWCAP2; macOS: sysctl hw.optional.arm.FEAT_DotProd, FEAT_I8MM).
 */
#include "arm/arm.h"

#if defined(__aarch64__)

#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif

#ifndef AT_HWCAP2
#define AT_HWCAP2 26
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif

static int runs_neon(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0; }
static int runs_neon_dotprod(void) { return runs_neon() && (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
static int runs_neon_i8mm(void) { return runs_neon_dotprod() && (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0; }

#elif defined(__APPLE__)
#include <sys/sysctl.h>

static int runs_neon(void) { return 1; }  /* every Apple arm64 CPU */
static int has_feature(const char *name) {
    int has = 0;
    size_t len = sizeof has;
    return sysctlbyname(name, &has, &len, NULL, 0) == 0 && has != 0;
}
static int runs_neon_dotprod(void) { return has_feature("hw.optional.arm.FEAT_DotProd"); }
static int runs_neon_i8mm(void) { return runs_neon_dotprod() && has_feature("hw.optional.arm.FEAT_I8MM"); }

#else /* no way to ask here: Advanced SIMD is part of the aarch64 ABI, dotprod only if the build assumed it */

static int runs_neon(void) { return 1; }
#if defined(__ARM_FEATURE_DOTPROD)
static int runs_neon_dotprod(void) { return 1; }
#else
static int runs_neon_dotprod(void) { return 0; }
#endif
#if defined(__ARM_FEATURE_DOTPROD) && defined(__ARM_FEATURE_MATMUL_INT8)
static int runs_neon_i8mm(void) { return 1; }
#else
static int runs_neon_i8mm(void) { return 0; }
#endif

#endif

/* A table's kernel of a type, in place of the set's, where it has one. */
static void take_vec_dot(pyllm_kernel_set *set, int type, const vec_dot_fn *table) {
    if (table[type] != NULL) set->vec_dot = table[type];
}

static void fill_neon(int type, pyllm_kernel_set *set) { take_vec_dot(set, type, vec_dot_table_neon); }
/* sdot's vec_dot, and the tile kernels: a decode step's rows and a prompt's, four at a time (the tier has no
 * multi-row kernels: a prompt's rows gathered back would go one by one through vec_dot) */
static void fill_neon_dotprod(int type, pyllm_kernel_set *set) {
    take_vec_dot(set, type, vec_dot_table_neon_dotprod);
    if (tile_kernel_table_neon_dotprod[type] != NULL) {
        set->tile = tile_kernel_table_neon_dotprod[type];
        set->tile_max_rows = 4;
        set->tile_prefill = 1;
    }
}

/* neon_dotprod's vec_dot (from the base set) and the panel kernels of the types that have them */
static void fill_neon_i8mm(int type, pyllm_kernel_set *set) {
    set->tile_prefill = 0;  /* a prompt's rows go to the panels, from the tiles gathered back */
    if (panel_prepare_neon_i8mm == NULL || panel_kernel_table_neon_i8mm[type] == NULL) return;
    set->panel_prepare = panel_prepare_neon_i8mm;
    set->panel_unpack = panel_unpack_table_neon_i8mm[type];
    set->panel = panel_kernel_table_neon_i8mm[type];
    set->panel_layout = PANEL_LAYOUT_PAIRS;
}

const pyllm_backend backend_neon = {
    .name = "neon", .base = PYLLM_TIER_GENERIC, .cpu_runs = runs_neon, .fill = fill_neon, .ops = &op_kernels_neon,
};
/* A tier runs where the CPU has its feature and the compiler built its kernels (a clang older than 16 builds them only
 * under -march=...+dotprod / +i8mm: without, the tier would be its base's kernels under its name). */
static int runs_dotprod_kernels(void) {
    return runs_neon_dotprod() && vec_dot_table_neon_dotprod[PYLLM_TYPE_Q8_0] != NULL &&
           tile_kernel_table_neon_dotprod[PYLLM_TYPE_Q4_K_X16] != NULL;
}
static int runs_i8mm_kernels(void) { return runs_neon_i8mm() && panel_prepare_neon_i8mm != NULL; }

const pyllm_backend backend_neon_dotprod = {
    .name = "neon_dotprod", .base = PYLLM_TIER_NEON, .cpu_runs = runs_dotprod_kernels, .fill = fill_neon_dotprod,
};
const pyllm_backend backend_neon_i8mm = {
    .name = "neon_i8mm", .base = PYLLM_TIER_NEON_DOTPROD, .cpu_runs = runs_i8mm_kernels, .fill = fill_neon_i8mm,
};

#else /* not aarch64: the tiers exist by name, and no CPU runs them */

static int runs_none(void) { return 0; }

const pyllm_backend backend_neon = {.name = "neon", .base = PYLLM_TIER_GENERIC, .cpu_runs = runs_none};
const pyllm_backend backend_neon_dotprod = {.name = "neon_dotprod", .base = PYLLM_TIER_NEON, .cpu_runs = runs_none};
const pyllm_backend backend_neon_i8mm = {.name = "neon_i8mm", .base = PYLLM_TIER_NEON_DOTPROD, .cpu_runs = runs_none};

#endif
