/*
 * scratch.c - per-thread buffers that grow to the largest size asked for (scratch.h says why), freed when
 * their thread ends.
 */
#include "core/scratch.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    void *p[SCRATCH_SLOTS];
    size_t bytes[SCRATCH_SLOTS];
} thread_scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;

static void free_thread_scratch(void *arg) {
    thread_scratch *t = arg;
    for (int i = 0; i < SCRATCH_SLOTS; ++i) free(t->p[i]);
    free(t);
}

static void make_key(void) { scratch_key_ok = pthread_key_create(&scratch_key, free_thread_scratch) == 0; }

void *pyllm_scratch(scratch_slot slot, size_t bytes) {
    pthread_once(&scratch_once, make_key);
    if (!scratch_key_ok || slot < 0 || slot >= SCRATCH_SLOTS) return NULL;
    thread_scratch *t = pthread_getspecific(scratch_key);
    if (t == NULL) {
        t = calloc(1, sizeof(*t));
        if (t == NULL || pthread_setspecific(scratch_key, t) != 0) {
            free(t);
            return NULL;
        }
    }
    if (bytes > t->bytes[slot]) {
        free(t->p[slot]);
        const size_t rounded = (bytes + 63) / 64 * 64;
        t->p[slot] = aligned_alloc(64, rounded);
        t->bytes[slot] = t->p[slot] != NULL ? rounded : 0;
    }
    return t->p[slot];
}
