/*
 * pyllm.h - the C core's public interface, the one header cffi binds.
 *
 * Everything between the cffi-begin and cffi-end markers is read by
 * pyllm/_build.py as the cffi cdef, so it holds plain declarations only.
 *
 * Tensor type ids are ggml's (GGUF stores them). Rows are ne0 elements long,
 * stored as ne0 / block_size blocks of type_size bytes.
 */
#ifndef PYLLM_H
#define PYLLM_H

#include <stddef.h>
#include <stdint.h>

/* cffi-begin */
enum pyllm_type {
    PYLLM_TYPE_F32  = 0,
    PYLLM_TYPE_F16  = 1,
    PYLLM_TYPE_Q4_0 = 2,
    PYLLM_TYPE_Q4_1 = 3,
    PYLLM_TYPE_Q5_0 = 6,
    PYLLM_TYPE_Q5_1 = 7,
    PYLLM_TYPE_Q8_0 = 8,
    PYLLM_TYPE_Q8_1 = 9,
    PYLLM_TYPE_Q2_K = 10,
    PYLLM_TYPE_Q3_K = 11,
    PYLLM_TYPE_Q4_K = 12,
    PYLLM_TYPE_Q5_K = 13,
    PYLLM_TYPE_Q6_K = 14,
    PYLLM_TYPE_Q8_K = 15,
    PYLLM_TYPE_BF16 = 30,
    /* Not a GGUF type: Q4_0 blocks reduced in the 8-lane order of the other 32-element formats, which
     * is llama.cpp's for a Q4_0 matrix it does not interleave (formats/blocks.h). */
    PYLLM_TYPE_Q4_0_LANES = 31,
    /* Not a GGUF type: a Q5_0 matrix with each row's blocks regrouped eight at a time
     * (pyllm_repack; formats/blocks.h), the same values, sums and bits, fewer instructions a block. */
    PYLLM_TYPE_Q5_0_G8 = 32,
    /* Not GGUF types: a Q4_1 / Q8_0 / Q5_0 matrix interleaved 16 rows at a time (pyllm_repack; formats/blocks.h),
     * the same values and the same matmul bits, for the decode kernels that hold 16 weight rows in a vector. */
    PYLLM_TYPE_Q4_1_X16 = 33,
    PYLLM_TYPE_Q8_0_X16 = 34,
    PYLLM_TYPE_Q5_0_X16 = 35,
    /* Not a GGUF type: a Q4_K matrix interleaved 16 rows at a time, 8 rows a vector (formats/blocks.h: tile_q4_K),
     * for the AVX2 decode kernels. */
    PYLLM_TYPE_Q4_K_X16 = 36,
    /* Not a GGUF type: a Q6_K matrix interleaved 16 rows at a time, 8 rows a vector, its quants regrouped to unpack in
     * fewer instructions (formats/blocks.h: tile_q6_K), for the AVX2 decode kernels. */
    PYLLM_TYPE_Q6_K_X16 = 37,
    PYLLM_TYPE_COUNT = 38
};

/* Kernel tiers, one backend each (backend/registry.c), in order of preference: the best is the last the CPU runs.
 * On x86-64 a CPU that runs a tier runs every lower one; on aarch64 it runs neither x86 tier, whose kernel sets
 * there are generic's (no kernels of their own are built), so every tier up to the best still gives the references'
 * bits. */
enum pyllm_tier {
    PYLLM_TIER_GENERIC = 0,       /* portable scalar C: the reference */
    PYLLM_TIER_AVX2 = 1,          /* AVX2 + FMA + F16C */
    PYLLM_TIER_AVX512 = 2,        /* AVX-512 F/BW/VL/DQ */
    PYLLM_TIER_AVX512_VNNI = 3,   /* the above + AVX-512 VNNI */
    PYLLM_TIER_NEON = 4,          /* aarch64 Advanced SIMD */
    PYLLM_TIER_NEON_DOTPROD = 5,  /* the above + FEAT_DotProd (sdot) */
    PYLLM_TIER_NEON_I8MM = 6,     /* the above + FEAT_I8MM (smmla): a prompt's matmuls in panels */
    PYLLM_TIER_COUNT = 7
};

/* Error codes returned by the int-valued functions below. */
enum pyllm_status {
    PYLLM_OK = 0,
    PYLLM_ERR_TYPE = -1,      /* type id unknown or unsupported for this operation */
    PYLLM_ERR_SHAPE = -2,     /* length not a multiple of the block size, or <= 0 */
    PYLLM_ERR_TIER = -3,      /* SIMD tier not available on this CPU */
    PYLLM_ERR_NOMEM = -4,     /* allocation failed */
    PYLLM_ERR_THREADS = -5    /* bad thread count, or threads could not start */
};

/* The type table: one entry a type id, the one every part of pyllm reads (pyllm/gguf.py and pyllm/kernels.py
 * through pyllm_traits). A pyllm layout is a matrix of a weight type rebuilt at load (pyllm_repack) or read in
 * another order; it holds the same values as its plain type. */
typedef struct {
    const char *name;      /* ggml's name ("Q4_K"); a pyllm layout's says what it is ("Q4_1 (16-row tiles)") */
    int64_t block_size;    /* elements a block */
    int64_t type_size;     /* bytes a block */
    int vec_dot_type;      /* the activation format a weight of this type is multiplied with; -1: not a weight type */
    int plain_type;        /* the format whose values a layout holds (itself, for a format a file stores) */
    int tile_rows;         /* rows a layout interleaves (a matrix's row count is a multiple of it); 1: one after another */
    int repacked;          /* 1: a layout whose bytes are its plain type's moved (pyllm_repack builds it) */
    int file_type;         /* 1: a tensor type pyllm reads from GGUF files */
} pyllm_type_traits;

const pyllm_type_traits *pyllm_traits(int type);        /* NULL for an unknown id */
int64_t pyllm_type_block_size(int type);        /* 0 for an unknown id */
int64_t pyllm_type_size(int type);              /* 0 for an unknown id */
const char *pyllm_type_name(int type);          /* "?" when unknown */
int pyllm_vec_dot_type(int type);               /* activation format paired with a weight type, -1 if none */
int pyllm_can_quantize(int type);               /* 1 if pyllm_quantize_row supports the type */

/* CPU: the best tier this CPU runs (detected once), and the tier in use. */
int pyllm_cpu_best_tier(void);
int pyllm_active_tier(void);
int pyllm_set_tier(int tier);                   /* PYLLM_ERR_TIER if the CPU lacks it */
const char *pyllm_tier_name(int tier);
int pyllm_physical_cores(void);                 /* the default thread count: counted once, at the first call */

/* src: n elements of `type` (n a multiple of its block size) -> dst[n] float32; PYLLM_ERR_TYPE for a type
 * whose rows are not stored one after another (the interleaved ones: pyllm_dequantize_rows) */
int pyllm_dequantize_row(int type, const void *src, float *dst, int64_t n);

/* The layout the active tier's matmuls read a matrix of weight `type` with n_rows rows in (for_matmul 0: a matrix
 * only looked up by rows, an embedding): Q4_0 whose rows are not a multiple of 8 as PYLLM_TYPE_Q4_0_LANES (llama.cpp
 * reduces such a matrix in that order), Q4_1, Q8_0, Q5_0 and Q4_K in 16-row tiles where the tier has their tile kernels,
 * Q5_0 otherwise regrouped (Q5_0_G8), the others as they are. -1 for a type that is not a weight type. */
int pyllm_choose_layout(int type, int64_t n_rows, int for_matmul);

/* A matrix of n_rows rows of n elements of `type` into dst in `layout` (a layout of type with traits repacked = 1:
 * the same values, their bytes moved), as many bytes. */
int pyllm_repack(int type, int layout, const void *src, void *dst, int64_t n_rows, int64_t n);

/* Rows rows[0..m) of a matrix w of n_rows rows of n elements of any matmul type (interleaved or not)
 * -> out[m, n] float32. PYLLM_ERR_SHAPE for a row outside the matrix. */
int pyllm_dequantize_rows(int type, const void *w, int64_t n_rows, int64_t n, const int64_t *rows, int64_t m,
                          float *out);

/* src[n] float32 -> dst: n elements of `type` (reference quantizers) */
int pyllm_quantize_row(int type, const float *src, void *dst, int64_t n);

/* src[n_rows, n] float32 -> n_rows rows of file `type`, the bytes llama.cpp's quantizer writes: importance NULL, its
 * reference quantizers (the K-quants' scale searches included); else importance[n] (an imatrix row: a weight per
 * column) steers the searches as llama.cpp's imatrix quantization does (ignored by F32/F16/BF16/Q8_0, as there). */
int pyllm_quantize_rows(int type, const float *src, void *dst, int64_t n_rows, int64_t n, const float *importance);

/* x[n] float32 -> one row of the activation format that pairs with weight `type` (what
 * matmul feeds its vec_dot kernels: q8_0 or q8_1 with llama.cpp's x86 rounding, q8_K, or float32). */
int pyllm_quantize_activations(int type, const float *x, void *dst, int64_t n);

/* w: n elements of weight `type`; act: n elements of pyllm_vec_dot_type(type)
 * (float32 for F32/F16/BF16 weights) -> *out = their dot product, computed by
 * the kernel of the given tier. */
int pyllm_vec_dot(int tier, int type, const void *w, const void *act, int64_t n, float *out);

/* The kernels the active tier multiplies weights in `layout` (a weight type or a pyllm layout of one) with, every
 * shape of matmul chosen once (backend/kernel_set.h); NULL when layout is not a weight type. A weight keeps the set
 * it was given when it loaded. */
typedef struct pyllm_kernel_set pyllm_kernel_set;
const pyllm_kernel_set *pyllm_kernels(int layout);

/* A weight matrix in place: n_out rows of n_in elements, multiplied by `kernels` (which say its layout). */
typedef struct {
    const pyllm_kernel_set *kernels;
    const void *data;
    int64_t n_out, n_in;
} pyllm_weight;

/* The two phases of a forward pass, told apart by the rows a batch holds (pyllm_phase_of): a decode step (each
 * sequence's next token) is memory-bound, its weights read once from memory, and each thread converts X for itself
 * and streams a range of W of its own; a prefill (a prompt's rows) is compute-bound, X converted and laid out once for
 * the kernels that take many rows. */
typedef enum { PYLLM_PHASE_DECODE = 0, PYLLM_PHASE_PREFILL = 1 } pyllm_phase;
/* Fewer rows than this are a decode step: few enough that reading W, not converting X, is its cost. */
enum { PYLLM_PREFILL_MIN_ROWS = 8 };
pyllm_phase pyllm_phase_of(int64_t m);

/* Y[M,N] = X[M,K] . W[N,K]^T, W a weight (N = n_out, K = n_in), X and Y float32 row-major. Each Y row is
 * bit-identical whatever M and n_threads. n_threads <= 0 means pyllm_physical_cores(). */
int pyllm_matmul(const pyllm_weight *w, const float *x, int64_t m, float *y, int n_threads);

/* ---- forward-pass ops (ops/); each output row is computed alone, in a fixed order ---- */

/* y[m, n] = x / sqrt(mean(x^2) + eps) * w (w may be NULL; y may be x) */
void pyllm_rms_norm(const float *x, const float *w, float *y, int64_t m, int64_t n, float eps);

/* In place on x[m, n_heads, head_dim] at positions pos[m]: rotate the first n_rot dims of each
 * head by theta_i = freq_scale * pos * freq_base^(-2i / n_rot); neox pairs (i, i + n_rot/2),
 * otherwise (2i, 2i + 1). The same in two steps: the angles' cosines and sines of each row
 * (cos_sin[m, n_rot], interleaved cos, sin), then the rotation, so rows at the same positions
 * (every layer of a batch) share the first. */
int pyllm_rope(float *x, const int32_t *pos, int64_t m, int64_t n_heads, int64_t head_dim, int64_t n_rot,
               float freq_base, float freq_scale, int neox);
void pyllm_rope_angles(const int32_t *pos, int64_t m, int64_t n_rot, float freq_base, float freq_scale, float *cos_sin);
void pyllm_rope_rotate(float *x, const float *cos_sin, int64_t m, int64_t n_heads, int64_t head_dim, int64_t n_rot,
                       int neox);
/* 1 if the rope ops take n_rot for heads of head_dim: even, 2..head_dim. */
int pyllm_rope_dims_valid(int64_t n_rot, int64_t head_dim);

/* y[m, n] = silu(gate) * up, and y[n] = gelu(tanh approximation)(gate) * up */
void pyllm_swiglu(const float *gate, const float *up, float *y, int64_t m, int64_t n);
void pyllm_geglu(const float *gate, const float *up, float *y, int64_t n);

/* Causal attention of m queries q[m, n_head, d] at positions qpos[m] over n_kv cached keys and
 * values k, v[n_kv, n_head_kv, d] (IEEE half bits) at positions kpos[n_kv] (-1: empty slot): key t is visible
 * to query r when kpos[t] <= qpos[r] and, with window > 0, qpos[r] - kpos[t] < window.
 * scores = q.k * scale (then softcap * tanh(s / softcap) when softcap > 0); softmax over the
 * visible keys in cache order; out[m, n_head, d]. The arithmetic is llama.cpp's for a prompt
 * (query and weights rounded to half precision, sums in 8 lanes by slot mod 8: see attend_heads in
 * ops/attention.c), the same in every tier. Grouped-query: head h reads kv head h / (n_head / n_head_kv). */
int pyllm_attention(const float *q, const uint16_t *k, const uint16_t *v, const int32_t *qpos,
                    const int32_t *kpos, int64_t m, int64_t n_kv, int64_t n_head, int64_t n_head_kv, int64_t d,
                    float scale, int32_t window, float softcap, float *out, int n_threads);
/* One sequence's part of a batched attention: its m queries and its cache (as pyllm_attention takes them, but
 * keys and values rows of type k_type / v_type: PYLLM_TYPE_F16 both, or a quantized cache, see
 * pyllm_kv_type_valid; a row holds n_head_kv * d elements). A quantized cache has its own arithmetic, the same
 * in every tier and for every batching: each score is the key type's vec_dot of the key and the query in that
 * type's activation format (llama.cpp's for a quantized cache), the softmax as above; half-precision values
 * summed as above, quantized ones with the weights not rounded, dequantized to float, one element a chain of
 * multiply-then-add in slot order (a zero weight skipped). */
typedef struct {
    const float *q;
    const void *k, *v;
    const int32_t *qpos, *kpos;
    int64_t m, n_kv;
    float *out;
    int k_type, v_type;
} pyllm_attention_call;

/* Whether a cache of this type can hold keys or values of heads of d elements: F16, or Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1 with d a multiple of their 32-element blocks (as llama.cpp's --cache-type-k/v). */
int pyllm_kv_type_valid(int type, int64_t d);

/* pyllm_attention for several sequences at once (one task over all their rows and heads); each call's
 * output is the bits pyllm_attention gives it alone. */
int pyllm_attention_batch(const pyllm_attention_call *calls, int n_calls, int64_t n_head, int64_t n_head_kv,
                          int64_t d, float scale, int32_t window, float softcap, int n_threads);

/* One layer of a sequence's KV cache (ops/kvcache.c): slot s holds the key and value of the token at
 * positions[s] (-1: empty), a row of k_row (v_row) elements of type k_type (v_type): IEEE half bits, as
 * llama.cpp keeps them, or blocks of a quantized type (pyllm_kv_type_valid). A ring (sliding-window layer)
 * keeps position p in slot p % capacity, a full layer in slot p. The arrays belong to the caller. */
typedef struct {
    void *k;              /* (capacity, k_row elements) */
    void *v;              /* (capacity, v_row elements) */
    int32_t *positions;   /* (capacity,) */
    int64_t capacity, k_row, v_row;
    int ring;
    int k_type, v_type;
    int k_rot, v_rot;     /* 0, or the keys (values) are kept rotated by pyllm_hadamard in chunks of this size */
} pyllm_kv_layer;

/* The chunk of the Walsh-Hadamard rotation llama.cpp applies to a quantized cache's keys (and the queries) or
 * values (and the attention's output) of heads of d elements before they are quantized, which spreads an outlier
 * over the chunk: 0 (none) for a half-precision cache or d not a multiple of 64; else keys: the largest power of
 * two >= 64 dividing d, values: 64. */
int pyllm_kv_rotation(int type, int64_t d, int for_values);

/* x[n_chunks][n] <- each chunk times the orthonormal Walsh-Hadamard matrix of size n (a power of two), as
 * llama.cpp's CPU backend computes it: scaled by 1 / sqrtf(n) first, then butterflies (u + v, u - v) over strides
 * 1, 2, 4, ... The matrix is its own inverse. */
void pyllm_hadamard(float *x, int64_t n_chunks, int64_t n);

/* Write m tokens' keys k[m, k_row] and values v[m, v_row] at positions pos[m], converted to the cache's types
 * (rounded to half precision; quantized as llama.cpp quantizes a cache row). PYLLM_ERR_TYPE: a type the cache
 * cannot have. */
int pyllm_kv_store(const pyllm_kv_layer *layer, const int32_t *pos, const float *k, const float *v, int64_t m);

/* Context shift: drop the tokens at positions [n_keep, n_keep + n_discard), move the later ones down by
 * n_discard and re-rotate their keys (rope at -n_discard, the layer's own rope settings). */
int pyllm_kv_shift(const pyllm_kv_layer *layer, int32_t n_keep, int32_t n_discard, int64_t n_heads_kv,
                   int64_t head_dim, int64_t n_rot, float freq_base, float freq_scale, int neox);

/* Forget every token at position >= n_tokens. */
void pyllm_kv_truncate(const pyllm_kv_layer *layer, int32_t n_tokens);

/* ---- transformer blocks (model/block.c): every step of a layer in one call ---- */

/* A norm weight or bias: n floats. Its length travels with it so that pyllm_blocks_forward can refuse a short
 * one instead of reading past it. */
typedef struct {
    const float *data;
    int64_t n;
} pyllm_vector;

/* One layer's weights; a vector with NULL data is a step the layer does not have (biases, q/k norms, post norms). */
typedef struct {
    pyllm_weight wq, wk, wv, wo, w_gate, w_up, w_down;
    pyllm_vector attn_norm, ffn_norm;            /* (n_embd,) */
    pyllm_vector bq, bk, bv;                     /* (n_head * head_dim,), (n_head_kv * head_dim,) x 2 */
    pyllm_vector q_norm, k_norm;                 /* (head_dim,) */
    pyllm_vector post_attn_norm, post_ffw_norm;  /* (n_embd,) */
    float rope_base, rope_scale;
    int32_t window;                             /* sliding window in tokens; 0: full attention */
} pyllm_block;

/* The hyperparameters every layer shares. scale_query: multiply q by attn_scale before attention
 * (whose scores then take scale 1); activation: 0 SwiGLU, 1 GeGLU. */
typedef struct {
    int64_t n_embd, n_head, n_head_kv, head_dim, n_rot, n_ff;
    float norm_eps, attn_scale;
    int rope_neox, scale_query, activation;
} pyllm_block_config;

/* The rows [row0, row0 + n_rows) of a batch that continue one sequence: their positions and the
 * sequence's cache (one pyllm_kv_layer per layer). */
typedef struct {
    int64_t row0, n_rows;
    const int32_t *positions;
    pyllm_kv_layer *const *kv;
} pyllm_segment;

/* x[m, n_embd] <- the n_layer blocks applied in turn (in place), each sequence's keys and values stored
 * in its cache and attention run per sequence; the same arithmetic, step by step, as pyllm/model.py's
 * reference. The segments cover the rows in order. */
int pyllm_blocks_forward(const pyllm_block_config *cfg, const pyllm_block *blocks, int n_layer, float *x, int64_t m,
                         const pyllm_segment *segments, int n_segments, int n_threads);
/* A hash index over a packed list of n strings, element i being blob[offsets[i], offsets[i + 1]) (bytes,
 * compared exactly): text -> the first element equal to it. The blob and offsets stay the caller's and
 * must outlive the index. NULL if out of memory, n is out of range or the offsets descend;
 * *first_repeat <- the first element equal to an earlier one, or -1 if all differ. */
typedef struct pyllm_string_index pyllm_string_index;
pyllm_string_index *pyllm_string_index_new(const char *blob, const int64_t *offsets, int64_t n,
                                           int64_t *first_repeat);
int64_t pyllm_string_index_find(const pyllm_string_index *index, const char *text, int64_t len);  /* -1: absent */
void pyllm_string_index_free(pyllm_string_index *index);
/* The ids of the k largest of x[0..n), by value descending, equal values by id ascending: the sampler's
 * top-k (a row with NaN gives k valid ids in an unspecified order). PYLLM_ERR_SHAPE unless 0 < k <= n <= INT32_MAX. */
int pyllm_top_k(const float *x, int64_t n, int64_t k, int32_t *ids);
/* Greedy sampling: *index <- the id of the largest of x[0..n) (the first among equal values) once bias_vals[i] is
 * added to x[bias_ids[i]] (distinct ids; x is left alone; scratch[n] may receive the biased row), *top <- that
 * largest (biased) value, *nan <- whether the biased row holds a NaN (then *index and *top are any entry's).
 * PYLLM_ERR_SHAPE unless n > 0 and every id is in [0, n). */
int pyllm_argmax(const float *x, int64_t n, const int64_t *bias_ids, const float *bias_vals, int64_t n_bias,
                 float *scratch, int64_t *index, float *top, int *nan);
/* cffi-end */

#endif /* PYLLM_H */
