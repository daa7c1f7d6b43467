/*
 * topk.c - the sampler's top-k: the ids of a row of logits' k largest values, by value descending,
 * equal values by id ascending (llama.cpp's order; pyllm/sampling.py's _top_k_ids is the numpy
 * reference this is tested against).
 *
 * One pass with a binary heap of the k best so far, its worst entry at the root: an entry a new id
 * cannot beat on value (a tie goes to the earlier id, which the heap already holds) costs one
 * comparison, so a vocabulary-sized row costs about n comparisons where a partition costs several
 * passes and copies. Then the heap sorts the k survivors in place.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/kernel_set.h"

/* (value, id) a worse than b: lower value, or the same value and a later id. */
static inline int worse(const float *x, int32_t a, int32_t b) {
    return x[a] < x[b] || (x[a] == x[b] && a > b);
}

static void sift_down(const float *x, int32_t *heap, int64_t k, int64_t i) {
    for (;;) {
        const int64_t left = 2 * i + 1, right = left + 1;
        int64_t worst = i;
        if (left < k && worse(x, heap[left], heap[worst])) worst = left;
        if (right < k && worse(x, heap[right], heap[worst])) worst = right;
        if (worst == i) return;
        const int32_t t = heap[i];
        heap[i] = heap[worst];
        heap[worst] = t;
        i = worst;
    }
}

/* A value no top-k entry is below: the k-th largest of the maxima of SLICES slices of x (those are k
 * different entries at least that large). Rows sorted ascending would otherwise insert every entry. */
enum { SLICES = 1024 };

static float top_k_floor(const float *x, int64_t n, int64_t k) {
    float maxima[SLICES];
    int32_t best[SLICES];
    for (int64_t s = 0; s < SLICES; ++s) {
        const int64_t begin = s * n / SLICES, end = (s + 1) * n / SLICES;
        float m[4] = {x[begin], x[begin], x[begin], x[begin]};  /* four chains, not one waiting on each max */
        int64_t i = begin;
        for (; i + 4 <= end; i += 4) {
            for (int j = 0; j < 4; ++j) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
        }
        for (; i < end; ++i) m[0] = x[i] > m[0] ? x[i] : m[0];
        const float m01 = m[1] > m[0] ? m[1] : m[0], m23 = m[3] > m[2] ? m[3] : m[2];
        maxima[s] = m23 > m01 ? m23 : m01;
    }
    pyllm_top_k(maxima, SLICES, k, best);
    return maxima[best[k - 1]];
}

int pyllm_top_k(const float *x, int64_t n, int64_t k, int32_t *ids) {
    if (n <= 0 || n > INT32_MAX || k <= 0 || k > n) return PYLLM_ERR_SHAPE;
    const float floor = n >= 4 * SLICES && k <= SLICES / 4 ? top_k_floor(x, n, k) : -INFINITY;
    for (int64_t i = 0; i < k; ++i) ids[i] = (int32_t)i;
    for (int64_t i = k / 2; i-- > 0;) sift_down(x, ids, k, i);
    float worst = x[ids[0]];
    for (int64_t i = k; i < n;) {
        /* a run of 16 with no entry at or above the floor and better than the worst kept (a tie: the kept
         * id is earlier) is skipped whole, by comparisons the compiler can do 8 at a time */
        if (i + 16 <= n) {
            int any = 0;
            for (int j = 0; j < 16; ++j) any |= (x[i + j] >= floor) & (x[i + j] > worst);
            if (!any) {
                i += 16;
                continue;
            }
        }
        const int64_t end = i + 16 <= n ? i + 16 : n;
        for (; i < end; ++i) {
            if (x[i] < floor || !(x[i] > worst)) continue;
            ids[0] = (int32_t)i;
            sift_down(x, ids, k, 0);
            worst = x[ids[0]];
        }
    }
    for (int64_t end = k - 1; end > 0; --end) {  /* heapsort: the worst left goes to the back each time */
        const int32_t t = ids[0];
        ids[0] = ids[end];
        ids[end] = t;
        sift_down(x, ids, end, 0);
    }
    return PYLLM_OK;
}

int pyllm_argmax(const float *x, int64_t n, const int64_t *bias_ids, const float *bias_vals, int64_t n_bias,
                 float *scratch, int64_t *index, float *top, int *nan) {
    if (n <= 0 || n_bias < 0) return PYLLM_ERR_SHAPE;
    for (int64_t i = 0; i < n_bias; ++i) {
        if (bias_ids[i] < 0 || bias_ids[i] >= n) return PYLLM_ERR_SHAPE;
    }
    int64_t (*const argmax)(const float *, int64_t, int *) = active_ops()->ops->argmax;
    const int64_t first = argmax(x, n, nan);
    int leader_biased = 0;
    for (int64_t i = 0; i < n_bias; ++i) leader_biased |= bias_ids[i] == first;
    if (!leader_biased) {
        /* every unbiased entry is at most x[first] (and past it where equal): the answer is first or a biased
         * entry, the first of equal values */
        int64_t best = first;
        float best_value = x[first];
        for (int64_t i = 0; i < n_bias; ++i) {
            const float value = x[bias_ids[i]] + bias_vals[i];
            *nan |= value != value;
            if (value > best_value || (value == best_value && bias_ids[i] < best)) {
                best = bias_ids[i];
                best_value = value;
            }
        }
        *index = best;
        *top = best_value;
        return PYLLM_OK;
    }
    /* the unbiased leader is biased: the whole biased row, in scratch */
    memcpy(scratch, x, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n_bias; ++i) scratch[bias_ids[i]] += bias_vals[i];
    *index = argmax(scratch, n, nan);
    *top = scratch[*index];
    return PYLLM_OK;
}
