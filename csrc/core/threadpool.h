/*
 * threadpool.h - one persistent pool of worker threads for the whole process.
 * Workers are started on first need and reused by every later call. A call's
 * n_threads <= 0 means pyllm_physical_cores() (pyllm.h), counted once.
 */
#ifndef PYLLM_THREADPOOL_H
#define PYLLM_THREADPOOL_H

#include <stdatomic.h>
#include <stdint.h>

/* fn(ctx, ith, nth) for ith in 0..nth-1, concurrently; ith 0 runs on the caller. */
typedef void (*pool_task_fn)(void *ctx, int ith, int nth);

#define PYLLM_MAX_THREADS 256

/* Runs the task on nth threads and returns when all are done; callers from
 * several threads are served one at a time. PYLLM_ERR_THREADS if nth is out of
 * range or workers cannot be started. */
int pyllm_pool_run(int nth, pool_task_fn fn, void *ctx);

/* Thread ith's part [*begin, *end) of [0, total) split evenly across nth threads. */
static inline void pyllm_split_range(int64_t total, int ith, int nth, int64_t *begin, int64_t *end) {
    *begin = total * ith / nth;
    *end = total * (ith + 1) / nth;
}

/* Work items [0, total) in nth contiguous ranges, one a thread, each packed as (first << 32) | end in one atomic:
 * a thread takes its own range from the front and, done with it, the others' items from the back, so one the
 * system holds up is helped rather than waited for, and each thread mostly touches the data of its own range. */
static inline void pyllm_ranges_init(atomic_ullong *ranges, int64_t total, int nth) {
    for (int t = 0; t < nth; ++t) {
        int64_t first, end;
        pyllm_split_range(total, t, nth, &first, &end);
        atomic_init(&ranges[t], ((unsigned long long)first << 32) | (unsigned long long)end);
    }
}

/* Claims up to `want` items from the front of a range (or, stealing, from its back); how many (0: it is empty),
 * the first in *first. */
static inline int64_t pyllm_range_claim(atomic_ullong *range, int64_t want, int from_back, int64_t *first) {
    unsigned long long seen = atomic_load_explicit(range, memory_order_relaxed);
    for (;;) {
        const int64_t front = (int64_t)(seen >> 32), back = (int64_t)(seen & 0xFFFFFFFFu);
        const int64_t n = back - front < want ? back - front : want;
        if (n <= 0) return 0;
        const unsigned long long next = from_back ? ((unsigned long long)front << 32) | (unsigned long long)(back - n)
                                                  : ((unsigned long long)(front + n) << 32) | (unsigned long long)back;
        if (atomic_compare_exchange_weak_explicit(range, &seen, next, memory_order_relaxed, memory_order_relaxed)) {
            *first = from_back ? back - n : front;
            return n;
        }
    }
}

#endif /* PYLLM_THREADPOOL_H */
