/*
 * dispatch.c - type traits, CPU detection and the public entry points that
 * pick a kernel by (tier, type). The tier is detected once, at first use.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/dispatch.h"
#include "core/scratch.h"

typedef struct {
    const char *name;
    int64_t block_size;
    int64_t type_size;
    int vec_dot_type;  /* activation format, -1 for none; F32 means float32 activations */
} type_traits;

static const type_traits traits[PYLLM_TYPE_COUNT] = {
    [PYLLM_TYPE_F32] = {"F32", 1, 4, PYLLM_TYPE_F32},
    [PYLLM_TYPE_F16] = {"F16", 1, 2, PYLLM_TYPE_F16},     /* activations rounded to the weights' format, */
    [PYLLM_TYPE_BF16] = {"BF16", 1, 2, PYLLM_TYPE_BF16},  /* as llama.cpp does */
    [PYLLM_TYPE_Q4_0] = {"Q4_0", QK32, sizeof(block_q4_0), PYLLM_TYPE_Q8_0},
    [PYLLM_TYPE_Q4_0_LANES] = {"Q4_0 (lanes)", QK32, sizeof(block_q4_0), PYLLM_TYPE_Q8_0},
    [PYLLM_TYPE_Q4_1] = {"Q4_1", QK32, sizeof(block_q4_1), PYLLM_TYPE_Q8_1},
    [PYLLM_TYPE_Q5_0] = {"Q5_0", QK32, sizeof(block_q5_0), PYLLM_TYPE_Q8_0},
    [PYLLM_TYPE_Q5_0_G8] = {"Q5_0 (8-block groups)", QK32, sizeof(block_q5_0), PYLLM_TYPE_Q8_0},
    [PYLLM_TYPE_Q4_1_X16] = {"Q4_1 (16-row tiles)", QK32, sizeof(block_q4_1), PYLLM_TYPE_Q8_1},
    [PYLLM_TYPE_Q5_1] = {"Q5_1", QK32, sizeof(block_q5_1), PYLLM_TYPE_Q8_1},
    [PYLLM_TYPE_Q8_0] = {"Q8_0", QK32, sizeof(block_q8_0), PYLLM_TYPE_Q8_0},
    [PYLLM_TYPE_Q8_0_X16] = {"Q8_0 (16-row tiles)", QK32, sizeof(block_q8_0), PYLLM_TYPE_Q8_0},
    [PYLLM_TYPE_Q5_0_X16] = {"Q5_0 (16-row tiles)", QK32, sizeof(block_q5_0), PYLLM_TYPE_Q8_0},
    [PYLLM_TYPE_Q2_K] = {"Q2_K", QK_K, sizeof(block_q2_K), PYLLM_TYPE_Q8_K},
    [PYLLM_TYPE_Q3_K] = {"Q3_K", QK_K, sizeof(block_q3_K), PYLLM_TYPE_Q8_K},
    [PYLLM_TYPE_Q4_K] = {"Q4_K", QK_K, sizeof(block_q4_K), PYLLM_TYPE_Q8_K},
    [PYLLM_TYPE_Q5_K] = {"Q5_K", QK_K, sizeof(block_q5_K), PYLLM_TYPE_Q8_K},
    [PYLLM_TYPE_Q6_K] = {"Q6_K", QK_K, sizeof(block_q6_K), PYLLM_TYPE_Q8_K},
    [PYLLM_TYPE_Q8_K] = {"Q8_K", QK_K, sizeof(block_q8_K), -1},
    [PYLLM_TYPE_Q8_1] = {"Q8_1", QK32, sizeof(block_q8_1), -1},
};

static inline int type_known(int type) {
    return type >= 0 && type < PYLLM_TYPE_COUNT && traits[type].name != NULL;
}

int64_t pyllm_type_block_size(int type) { return type_known(type) ? traits[type].block_size : 0; }
int64_t pyllm_type_size(int type) { return type_known(type) ? traits[type].type_size : 0; }
const char *pyllm_type_name(int type) { return type_known(type) ? traits[type].name : "?"; }
int pyllm_vec_dot_type(int type) { return type_known(type) ? traits[type].vec_dot_type : -1; }
int pyllm_can_quantize(int type) { return type_known(type) && quantize_table[type] != NULL; }

/* ------------------------------------------------------------------------ */
/* CPU tiers                                                                 */
/* ------------------------------------------------------------------------ */

/* Where each tier finds a type's vec_dot: the first table in its list that has one. The AVX-512 VNNI tier
 * runs the AVX2 family's kernels built with VNNI dots, 256 bits wide (vec_dot_avx512.c says why). */
enum { MAX_TIER_TABLES = 3 };
static const vec_dot_fn *const tier_tables[PYLLM_TIER_COUNT][MAX_TIER_TABLES] = {
    [PYLLM_TIER_GENERIC] = {vec_dot_table_generic},
    [PYLLM_TIER_AVX2] = {vec_dot_table_avx2, vec_dot_table_generic},
    [PYLLM_TIER_AVX512] = {vec_dot_table_avx512, vec_dot_table_avx2, vec_dot_table_generic},
    [PYLLM_TIER_AVX512_VNNI] = {vec_dot_table_avx2_vnni, vec_dot_table_generic},
};

static const char *const tier_names[PYLLM_TIER_COUNT] = {"generic", "avx2", "avx512", "avx512_vnni"};

static int best_tier = -1;
static _Atomic int active_tier = -1;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>

static int has_bit(unsigned reg, int bit) { return (int)((reg >> bit) & 1u); }

/* cpuid feature bits, and the OS having enabled the YMM (and ZMM) register state. */
static int detect_best_tier(void) {
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
#else
static int detect_best_tier(void) { return PYLLM_TIER_GENERIC; }
#endif

static void init_once(void) {
    pyllm_init_tables();
    best_tier = detect_best_tier();
    int tier = best_tier;
    const char *forced = getenv("PYLLM_TIER");  /* e.g. PYLLM_TIER=generic: run the references */
    if (forced != NULL) {
        for (int t = 0; t <= best_tier; ++t) {
            if (strcmp(forced, tier_names[t]) == 0) tier = t;
        }
    }
    atomic_store(&active_tier, tier);
}

/* Called by every entry point that needs the tables or the tier. */
static void ensure_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_once);
}

int pyllm_cpu_best_tier(void) { ensure_init(); return best_tier; }
int pyllm_active_tier(void) { ensure_init(); return atomic_load(&active_tier); }

int pyllm_set_tier(int tier) {
    ensure_init();
    if (tier < 0 || tier > best_tier) return PYLLM_ERR_TIER;
    atomic_store(&active_tier, tier);
    return PYLLM_OK;
}

const char *pyllm_tier_name(int tier) {
    return tier >= 0 && tier < PYLLM_TIER_COUNT ? tier_names[tier] : "?";
}

int pyllm_physical_cores(void) {
    /* Count distinct (physical id, core id) pairs; fall back to online CPUs. */
    FILE *f = fopen("/proc/cpuinfo", "r");
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int fallback = online > 0 ? (int)online : 1;
    if (f == NULL) return fallback;
    char line[256];
    int physical = 0, seen = 0;
    int pairs[1024][2];
    while (fgets(line, sizeof(line), f) != NULL) {
        int value;
        if (sscanf(line, "physical id : %d", &value) == 1) {
            physical = value;
        } else if (sscanf(line, "core id : %d", &value) == 1) {
            int known = 0;
            for (int i = 0; i < seen; ++i) known |= pairs[i][0] == physical && pairs[i][1] == value;
            if (!known && seen < 1024) {
                pairs[seen][0] = physical;
                pairs[seen][1] = value;
                seen++;
            }
        }
    }
    fclose(f);
    return seen > 0 && seen <= fallback ? seen : fallback;
}

/* The kernel of this tier: from the first of its tables that has one. */
vec_dot_fn pyllm_vec_dot_kernel(int tier, int type) {
    for (int t = 0; t < MAX_TIER_TABLES && tier_tables[tier][t] != NULL; ++t) {
        if (tier_tables[tier][t][type] != NULL) return tier_tables[tier][t][type];
    }
    return NULL;
}

vec_dot_fn pyllm_active_vec_dot(int type) { return pyllm_vec_dot_kernel(pyllm_active_tier(), type); }

/* The multi-row and row kernels are the AVX2 family's (with VNNI dots on the VNNI tier): the tiers in
 * between run the AVX2 ones, the same bits as their own vec_dot. */
vec_dot_rows_fn pyllm_active_vec_dot_rows(int type) {
    const int tier = pyllm_active_tier();
    if (tier >= PYLLM_TIER_AVX512_VNNI) return vec_dot_rows_table_avx2_vnni[type];
    return tier >= PYLLM_TIER_AVX2 ? vec_dot_rows_table_avx2[type] : NULL;
}

vec_dot_rows_fn pyllm_active_vec_dot_rows8(int type) {
    const int tier = pyllm_active_tier();
    if (tier >= PYLLM_TIER_AVX512_VNNI) return vec_dot_rows8_table_avx2_vnni[type];
    return tier >= PYLLM_TIER_AVX2 ? vec_dot_rows8_table_avx2[type] : NULL;
}

/* The AVX2 family whose single-row kernel is the active vec_dot for type (a tier's own kernel keeps its own):
 * the row and cols kernels are taken from that family, so they give the active kernel's bits. */
enum { FAMILY_NONE, FAMILY_AVX2, FAMILY_AVX2_VNNI };

static int active_avx2_family(int type) {
    const vec_dot_fn active = pyllm_active_vec_dot(type);
    if (active == NULL) return FAMILY_NONE;
    if (active == vec_dot_table_avx2_vnni[type]) return FAMILY_AVX2_VNNI;
    return active == vec_dot_table_avx2[type] ? FAMILY_AVX2 : FAMILY_NONE;
}

vec_dot_row_fn pyllm_active_vec_dot_row(int type) {
    const int family = active_avx2_family(type);
    return family == FAMILY_AVX2_VNNI ? vec_dot_row_table_avx2_vnni[type]
           : family == FAMILY_AVX2    ? vec_dot_row_table_avx2[type] : NULL;
}

vec_dot_cols_fn pyllm_active_vec_dot_cols(int type) {
    const int family = active_avx2_family(type);
    return family == FAMILY_AVX2_VNNI ? vec_dot_cols_table_avx2_vnni[type]
           : family == FAMILY_AVX2    ? vec_dot_cols_table_avx2[type] : NULL;
}

x16_kernel_fn pyllm_active_x16_kernel(int type) {
    return pyllm_active_tier() >= PYLLM_TIER_AVX512_VNNI ? x16_kernel_table_avx512_vnni[type] : NULL;
}

panel_kernel_fn pyllm_active_panel_kernel(int type) {
    return pyllm_active_tier() >= PYLLM_TIER_AVX512_VNNI ? panel_kernel_table_avx512_vnni[type] : NULL;
}

wide_unpack_fn pyllm_active_wide_unpack(int type) {
    return pyllm_active_tier() >= PYLLM_TIER_AVX512_VNNI ? wide_unpack_table_avx512_vnni[type] : NULL;
}

panel_prepare_fn pyllm_active_panel_prepare(void) {
    return pyllm_active_tier() >= PYLLM_TIER_AVX512_VNNI ? panel_prepare_avx512_vnni : NULL;
}

const prompt_attention_kernels *pyllm_prompt_attention_kernels(int tier) {
    return tier >= PYLLM_TIER_AVX512 && prompt_attention_avx512.dots_t != NULL ? &prompt_attention_avx512 : NULL;
}

const head_group_kernels *pyllm_head_group_kernels(int tier) {
    return tier >= PYLLM_TIER_AVX512 && head_group_avx512.dots_heads != NULL ? &head_group_avx512 : NULL;
}

const op_kernels *pyllm_op_kernels(int tier) {
    if (tier >= PYLLM_TIER_AVX2 && op_kernels_avx2.dots != NULL) return &op_kernels_avx2;
    return &op_kernels_generic;
}

/* ------------------------------------------------------------------------ */
/* row conversions and vec_dot                                               */
/* ------------------------------------------------------------------------ */

static int check_row(int type, int64_t n) {
    if (!type_known(type)) return PYLLM_ERR_TYPE;
    if (n <= 0 || n % traits[type].block_size != 0) return PYLLM_ERR_SHAPE;
    return PYLLM_OK;
}

int pyllm_dequantize_row(int type, const void *src, float *dst, int64_t n) {
    ensure_init();
    int status = check_row(type, n);
    if (status != PYLLM_OK) return status;
    if (dequantize_table[type] == NULL) return PYLLM_ERR_TYPE;
    dequantize_table[type](src, dst, n);
    return PYLLM_OK;
}

int pyllm_dequantize_rows(int type, const void *w, int64_t n_rows, int64_t n, const int64_t *rows, int64_t m,
                          float *out) {
    ensure_init();
    const int base = x16_base_type(type), plain = base >= 0 ? base : type;
    int status = check_row(type, n);
    if (status != PYLLM_OK) return status;
    if (dequantize_table[plain] == NULL) return PYLLM_ERR_TYPE;
    if (n_rows < 0 || m < 0 || (base >= 0 && n_rows % X16_ROWS != 0)) return PYLLM_ERR_SHAPE;
    for (int64_t i = 0; i < m; ++i) {
        if (rows[i] < 0 || rows[i] >= n_rows) return PYLLM_ERR_SHAPE;
    }
    const int64_t row_bytes = n / traits[type].block_size * traits[type].type_size;
    uint8_t *gathered = base >= 0 ? pyllm_scratch(SCRATCH_ROW, (size_t)row_bytes) : NULL;  /* each decode step's embedding */
    if (base >= 0 && gathered == NULL) return PYLLM_ERR_NOMEM;
    for (int64_t i = 0; i < m; ++i) {
        const uint8_t *row = (const uint8_t *)w + rows[i] * row_bytes;
        if (base >= 0) {
            x16_gather_row(type, w, rows[i], n, gathered);
            row = gathered;
        }
        dequantize_table[plain](row, out + i * n, n);
    }
    return PYLLM_OK;
}

int pyllm_quantize_row(int type, const float *src, void *dst, int64_t n) {
    ensure_init();
    int status = check_row(type, n);
    if (status != PYLLM_OK) return status;
    if (quantize_table[type] == NULL) return PYLLM_ERR_TYPE;
    quantize_table[type](src, dst, n);
    return PYLLM_OK;
}

int pyllm_vec_dot(int tier, int type, const void *w, const void *act, int64_t n, float *out) {
    ensure_init();
    if (tier < 0 || tier > best_tier) return PYLLM_ERR_TIER;
    int status = check_row(type, n);
    if (status != PYLLM_OK) return status;
    vec_dot_fn kernel = pyllm_vec_dot_kernel(tier, type);
    if (kernel == NULL) return PYLLM_ERR_TYPE;
    *out = kernel(n, w, act);
    return PYLLM_OK;
}

int pyllm_quantize_activations(int weight_type, const float *x, void *dst, int64_t n) {
    ensure_init();
    const int status = check_row(weight_type, n);
    if (status != PYLLM_OK) return status;
    const int act_type = traits[weight_type].vec_dot_type;
    if (act_type < 0) return PYLLM_ERR_TYPE;
    const op_kernels *kernels = pyllm_op_kernels(pyllm_active_tier());
    if (n % traits[act_type].block_size != 0) return PYLLM_ERR_SHAPE;
    if (act_type == PYLLM_TYPE_Q8_0) {
        kernels->quantize_q8_0(x, dst, n);
    } else if (act_type == PYLLM_TYPE_Q8_1) {
        kernels->quantize_q8_1(x, dst, n);
    } else if (act_type == PYLLM_TYPE_Q8_K) {
        kernels->quantize_q8_K(x, dst, n);
    } else {
        quantize_table[act_type](x, dst, n);  /* the float formats: a copy or a rounding */
    }
    return PYLLM_OK;
}

int64_t pyllm_activation_row_bytes(int weight_type, int64_t n) {
    const int act_type = traits[weight_type].vec_dot_type;
    return n / traits[act_type].block_size * traits[act_type].type_size;
}
