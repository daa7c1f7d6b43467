/*
 * strings.c - a hash index over a packed list of strings (a tokenizer's vocabulary, a BPE merge
 * list): text -> the first element equal to it.
 *
 * Element i is blob[offsets[i], offsets[i + 1]). The index keeps one int32 slot per table entry,
 * open addressing with linear probing at a load of at most one half, and compares candidates
 * against the caller's blob: a 262,144-token vocabulary costs 2 MiB here instead of a Python str
 * and dict entry per token.
 */
#include <stdlib.h>
#include <string.h>

#include "pyllm.h"

struct pyllm_string_index {
    const char *blob;
    const int64_t *offsets;
    int64_t n;
    uint64_t mask;   /* table size - 1, the size a power of two */
    int32_t *slots;  /* element index, or -1 for an empty slot */
};

/* FNV-1a, 64-bit. */
static uint64_t hash_bytes(const char *text, int64_t len) {
    uint64_t h = 0xcbf29ce484222325u;
    for (int64_t i = 0; i < len; ++i) {
        h ^= (unsigned char)text[i];
        h *= 0x100000001b3u;
    }
    return h;
}

static int element_equals(const pyllm_string_index *index, int32_t element, const char *text, int64_t len) {
    const int64_t start = index->offsets[element];
    return index->offsets[element + 1] - start == len && memcmp(index->blob + start, text, (size_t)len) == 0;
}

/* The slot holding an element equal to text, or the empty slot where it would go. */
static uint64_t probe(const pyllm_string_index *index, const char *text, int64_t len) {
    uint64_t slot = hash_bytes(text, len) & index->mask;
    while (index->slots[slot] >= 0 && !element_equals(index, index->slots[slot], text, len)) {
        slot = (slot + 1) & index->mask;
    }
    return slot;
}

pyllm_string_index *pyllm_string_index_new(const char *blob, const int64_t *offsets, int64_t n,
                                           int64_t *first_repeat) {
    *first_repeat = -1;
    if (n < 0 || n > INT32_MAX || offsets[0] < 0) return NULL;
    for (int64_t i = 0; i < n; ++i) {
        if (offsets[i + 1] < offsets[i]) return NULL;
    }
    uint64_t size = 8;
    while (size < 2 * (uint64_t)n) size *= 2;
    pyllm_string_index *index = malloc(sizeof(*index));
    int32_t *slots = malloc(size * sizeof(int32_t));
    if (index == NULL || slots == NULL) {
        free(index);
        free(slots);
        return NULL;
    }
    memset(slots, 0xff, size * sizeof(int32_t));  /* every slot -1 */
    *index = (pyllm_string_index){blob, offsets, n, size - 1, slots};
    for (int64_t i = 0; i < n; ++i) {
        const uint64_t slot = probe(index, blob + offsets[i], offsets[i + 1] - offsets[i]);
        if (slots[slot] < 0) {
            slots[slot] = (int32_t)i;
        } else if (*first_repeat < 0) {
            *first_repeat = i;  /* the earlier element keeps the slot */
        }
    }
    return index;
}

int64_t pyllm_string_index_find(const pyllm_string_index *index, const char *text, int64_t len) {
    if (len < 0) return -1;
    return index->slots[probe(index, text, len)];
}

void pyllm_string_index_free(pyllm_string_index *index) {
    if (index == NULL) return;
    free(index->slots);
    free(index);
}
