/*
 * threadpool.c - a thread pool that spins briefly, then sleeps; and the default team size, the machine's physical
 * cores, counted once.
 *
 * The caller publishes a task under a new generation number; workers watch
 * the generation, spinning for a short while after each task (decode runs
 * hundreds of small matmuls per token, so the next task is usually close)
 * and falling back to a condition variable. Each share ith of a task is taken
 * once, by its worker or, if that worker has not come for it by the time the
 * caller is done with its own share, by the caller: a worker the system has
 * not scheduled (another process on the core) delays nothing. The last worker
 * to finish wakes the caller if it went to sleep.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "pyllm.h"
#include "core/threadpool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* About 1.4 ms of pause instructions: longer than the Python between a decode step's tasks (sampling, building the
 * next batch: 0.2-0.5 ms), so a worker is awake for the next step instead of sleeping through every gap
 * (bench/README.md). */
#define SPIN_LIMIT 50000

enum { SHARE_OPEN = 0, SHARE_WORKER = 1, SHARE_CALLER = 2 };

static struct {
    pthread_mutex_t run_lock;     /* one task at a time */
    pthread_mutex_t lock;         /* guards sleeping and waking */
    pthread_cond_t start;
    pthread_cond_t done;
    int n_workers;                /* started workers, indices 1..n_workers (under lock) */
    _Atomic unsigned long generation;
    atomic_int pending;           /* shares of the current task taken by workers and not yet done */
    /* share i of the task of generation g: (g << 2) | SHARE_*; the one who moves it from SHARE_OPEN runs it */
    _Atomic unsigned long long share[PYLLM_MAX_THREADS];
    pool_task_fn fn;              /* the task: written before generation is bumped */
    void *ctx;
    int nth;
    unsigned long born_at[PYLLM_MAX_THREADS];  /* generation when worker i started */
} pool = {
    .run_lock = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .start = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
};

/* Every YIELD_EVERY pauses a spinning thread offers its core to any other thread that can run there (a worker
 * another process has held off it): where none waits, the call returns at once. */
#define YIELD_EVERY 256

static inline void spin_pause(int spin) {
    if (spin % YIELD_EVERY == YIELD_EVERY - 1) sched_yield();
    else cpu_relax();
}

/* Wait until the generation differs from seen. */
static void wait_for_task(unsigned long seen) {
    for (int spin = 0; spin < SPIN_LIMIT; ++spin) {
        if (atomic_load_explicit(&pool.generation, memory_order_acquire) != seen) return;
        spin_pause(spin);
    }
    pthread_mutex_lock(&pool.lock);
    while (atomic_load_explicit(&pool.generation, memory_order_acquire) == seen) {
        pthread_cond_wait(&pool.start, &pool.lock);
    }
    pthread_mutex_unlock(&pool.lock);
}

/* Whether share ith of generation g's task was still open and is now `who`'s to run. */
static int take_share(int ith, unsigned long g, int who) {
    unsigned long long open = (unsigned long long)g << 2 | SHARE_OPEN;
    return atomic_compare_exchange_strong_explicit(&pool.share[ith], &open, (unsigned long long)g << 2 | (unsigned)who,
                                                   memory_order_acq_rel, memory_order_relaxed);
}

static void *worker_main(void *arg) {
    const int ith = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.lock);
    /* Not the current generation: a task published before this thread first ran is still its to run. */
    unsigned long seen = pool.born_at[ith];
    pthread_mutex_unlock(&pool.lock);
    for (;;) {
        wait_for_task(seen);
        /* Read the task and its generation together: a worker that sat out one task (ith >= nth) may
         * wake only after the next was published, and must run that one once, as that generation's. */
        pthread_mutex_lock(&pool.lock);
        seen = atomic_load_explicit(&pool.generation, memory_order_relaxed);
        const pool_task_fn fn = pool.fn;
        void *const ctx = pool.ctx;
        const int nth = pool.nth;
        pthread_mutex_unlock(&pool.lock);
        if (ith >= nth || !take_share(ith, seen, SHARE_WORKER)) continue;
        fn(ctx, ith, nth);
        if (atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool.lock);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.lock);
        }
    }
    return NULL;
}

/* Start workers up to index want - 1. Called with pool.lock held. */
static int grow(int want) {
    while (pool.n_workers < want - 1) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int ith = pool.n_workers + 1;
        pool.born_at[ith] = atomic_load(&pool.generation);
        const int err = pthread_create(&thread, &attr, worker_main, (void *)(intptr_t)ith);
        pthread_attr_destroy(&attr);
        if (err != 0) return PYLLM_ERR_THREADS;
        pool.n_workers++;
    }
    return PYLLM_OK;
}

int pyllm_pool_run(int nth, pool_task_fn fn, void *ctx) {
    if (nth < 1 || nth > PYLLM_MAX_THREADS) return PYLLM_ERR_THREADS;
    if (nth == 1) {
        fn(ctx, 0, 1);
        return PYLLM_OK;
    }
    pthread_mutex_lock(&pool.run_lock);
    pthread_mutex_lock(&pool.lock);
    if (grow(nth) != PYLLM_OK) {
        pthread_mutex_unlock(&pool.lock);
        pthread_mutex_unlock(&pool.run_lock);
        return PYLLM_ERR_THREADS;
    }
    pool.fn = fn;
    pool.ctx = ctx;
    pool.nth = nth;
    atomic_store_explicit(&pool.pending, nth - 1, memory_order_relaxed);
    const unsigned long g = atomic_load_explicit(&pool.generation, memory_order_relaxed) + 1;
    for (int i = 1; i < nth; ++i) {
        atomic_store_explicit(&pool.share[i], (unsigned long long)g << 2 | SHARE_OPEN, memory_order_relaxed);
    }
    atomic_store_explicit(&pool.generation, g, memory_order_release);
    pthread_cond_broadcast(&pool.start);
    pthread_mutex_unlock(&pool.lock);

    fn(ctx, 0, nth);
    for (int i = 1; i < nth; ++i) {  /* the shares no worker has come for */
        if (take_share(i, g, SHARE_CALLER)) {
            fn(ctx, i, nth);
            atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel);
        }
    }

    for (int spin = 0; spin < SPIN_LIMIT && atomic_load_explicit(&pool.pending, memory_order_acquire) > 0; ++spin) {
        spin_pause(spin);
    }
    if (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&pool.lock);
        while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) {
            pthread_cond_wait(&pool.done, &pool.lock);
        }
        pthread_mutex_unlock(&pool.lock);
    }
    pthread_mutex_unlock(&pool.run_lock);
    return PYLLM_OK;
}

/* Distinct (physical id, core id) pairs of /proc/cpuinfo; the online CPUs where it cannot say. */
static int count_physical_cores(void) {
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

static int physical_cores;
static pthread_once_t physical_cores_once = PTHREAD_ONCE_INIT;

static void count_once(void) { physical_cores = count_physical_cores(); }

int pyllm_physical_cores(void) {
    pthread_once(&physical_cores_once, count_once);
    return physical_cores;
}
