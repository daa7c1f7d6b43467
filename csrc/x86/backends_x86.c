/*
 * backends_x86.c - the x86 tiers as backends (backend/kernel_set.h), each building on the one below:
 *   avx2         the 256-bit kernels of vec_dot_avx2_*.inc (int8 dots by vpmaddubsw), every shape but panels, the
 *                Q4_K tile kernel (tile_avx2.c), and the AVX2 ops;
 *   avx512       its own Q2_K, Q3_K, Q5_K and Q6_K vec_dot (vec_dot_avx512.c) over avx2's, and the AVX-512
 *                attention kernels;
 *   avx512_vnni  the same 256-bit kernels built with VNNI dots (vec_dot_avx2_vnni.c), in place of all the others
 *                (faster than vec_dot_avx512.c's four where both run: bench/README.md), and the panel (a prompt's
 *                rows 16 at a time) and tile (a tiled matrix's 16 rows a vector) kernels, the K-quants' taking a
 *                decode step's single row to avx2's.
 * The tiers' kernels take their target by pragma, so one build runs on any x86-64: a tier is used only where
 * cpuid (and the OS's saved register state) says the CPU runs it.
 */
#include "x86/x86.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>

static int has_bit(unsigned reg, int bit) { return (int)((reg >> bit) & 1u); }

/* The best of PYLLM_TIER_GENERIC .. PYLLM_TIER_AVX512_VNNI the CPU runs: cpuid feature bits, and the OS having
 * enabled the YMM (and ZMM) register state. */
static int x86_level(void) {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return PYLLM_TIER_GENERIC;
    const int fma = has_bit(ecx, 12), osxsave = has_bit(ecx, 27), avx = has_bit(ecx, 28), f16c = has_bit(ecx, 29);
    if (!(osxsave && avx && fma && f16c)) return PYLLM_TIER_GENERIC;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & 0x6) != 0x6) return PYLLM_TIER_GENERIC;  /* XMM and YMM state */
    if (__get_cpuid_max(0, NULL) < 7) return PYLLM_TIER_GENERIC;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    if (!(has_bit(ebx, 5) && has_bit(ebx, 8))) return PYLLM_TIER_GENERIC;  /* AVX2, BMI2 */
    const int avx512 = has_bit(ebx, 16) && has_bit(ebx, 17) && has_bit(ebx, 30) && has_bit(ebx, 31);  /* F DQ BW VL */
    if (!avx512 || (xcr0_lo & 0xE0) != 0xE0) return PYLLM_TIER_AVX2;  /* opmask, ZMM state */
    return has_bit(ecx, 11) ? PYLLM_TIER_AVX512_VNNI : PYLLM_TIER_AVX512;
}

static int runs_avx2(void) { return x86_level() >= PYLLM_TIER_AVX2; }
static int runs_avx512(void) { return x86_level() >= PYLLM_TIER_AVX512; }
static int runs_avx512_vnni(void) { return x86_level() >= PYLLM_TIER_AVX512_VNNI; }

/* A family's kernels of a type, in place of the set's: vec_dot where it has one, the other shapes all (its own or
 * none: a shape must give the bits of the family's vec_dot). */
static void take_family(pyllm_kernel_set *set, int type, const avx2_family *family) {
    if (family->vec_dot[type] != NULL) set->vec_dot = family->vec_dot[type];
    set->rows4 = family->rows4[type];
    set->rows8 = family->rows8[type];
    set->prepared = family->prepared[type];
    set->cols4 = family->cols4[type];
}

static void fill_avx2(int type, pyllm_kernel_set *set) {
    take_family(set, type, &family_avx2);
    set->tile = tile_kernel_table_avx2[type];
    set->tile_max_rows = 4;
    set->tile_prefill = 1;  /* a prompt's rows too, 4 at a time: faster than the tiles rebuilt for the 8-row kernels */
}

/* Its own vec_dot of a type drops avx2's single-row variants (prepared, cols4: avx2's vec_dot in another shape);
 * the multi-row ones stay (the same bits, and no 512-bit ones of its own). */
static void fill_avx512(int type, pyllm_kernel_set *set) {
    if (vec_dot_table_avx512[type] == NULL) return;
    set->vec_dot = vec_dot_table_avx512[type];
    set->prepared = NULL;
    set->cols4 = NULL;
}

static void fill_avx512_vnni(int type, pyllm_kernel_set *set) {
    take_family(set, type, &family_avx2_vnni);
    set->panel_prepare = panel_prepare_avx512_vnni;
    set->panel_unpack = panel_unpack_table_avx512_vnni[type];
    set->panel = panel_kernel_table_avx512_vnni[type];
    if (tile_kernel_table_avx512_vnni[type] != NULL) {
        set->tile = tile_kernel_table_avx512_vnni[type];
        /* as many rows as a kernel's registers hold */
        set->tile_max_rows = type == PYLLM_TYPE_Q4_K_X16 || type == PYLLM_TYPE_Q6_K_X16 ? 4 : 2;
        set->tile_prefill = 1;  /* the weights already in lanes beat unpacking them for panels (bench/README.md) */
    }
}

const pyllm_backend backend_avx2 = {
    .name = "avx2", .base = PYLLM_TIER_GENERIC, .cpu_runs = runs_avx2, .fill = fill_avx2, .ops = &op_kernels_avx2,
};
const pyllm_backend backend_avx512 = {
    .name = "avx512", .base = PYLLM_TIER_AVX2, .cpu_runs = runs_avx512, .fill = fill_avx512,
    .prompt = &prompt_attention_avx512, .heads = &head_group_avx512,
};
const pyllm_backend backend_avx512_vnni = {
    .name = "avx512_vnni", .base = PYLLM_TIER_AVX512, .cpu_runs = runs_avx512_vnni, .fill = fill_avx512_vnni,
};

#else /* not x86-64 with GCC or clang: the tiers exist by name, and no CPU runs them */

static int runs_none(void) { return 0; }

const pyllm_backend backend_avx2 = {.name = "avx2", .base = PYLLM_TIER_GENERIC, .cpu_runs = runs_none};
const pyllm_backend backend_avx512 = {.name = "avx512", .base = PYLLM_TIER_AVX2, .cpu_runs = runs_none};
const pyllm_backend backend_avx512_vnni = {.name = "avx512_vnni", .base = PYLLM_TIER_AVX512, .cpu_runs = runs_none};

#endif
