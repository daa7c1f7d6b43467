/*
 * threadpool.c - a condition-variable thread pool: the caller publishes a
 * task under a new generation number, workers with an index below nth run
 * it, the last to finish wakes the caller.
 */
#include <pthread.h>

#include "pyllm.h"
#include "threadpool.h"

static struct {
    pthread_mutex_t run_lock;     /* one task at a time */
    pthread_mutex_t lock;         /* guards the fields below */
    pthread_cond_t start;
    pthread_cond_t done;
    int n_workers;                /* started workers, indices 1..n_workers */
    unsigned long generation;
    int nth;
    int pending;
    pool_task_fn fn;
    void *ctx;
    unsigned long born_at[PYLLM_MAX_THREADS];  /* generation when worker i started */
} pool = {
    .run_lock = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .start = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
};

static void *worker_main(void *arg) {
    const int ith = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.lock);
    /* Not pool.generation: a task published before this thread first ran is still its to run. */
    unsigned long seen = pool.born_at[ith];
    for (;;) {
        while (pool.generation == seen) pthread_cond_wait(&pool.start, &pool.lock);
        seen = pool.generation;
        if (ith >= pool.nth) continue;
        pool_task_fn fn = pool.fn;
        void *ctx = pool.ctx;
        const int nth = pool.nth;
        pthread_mutex_unlock(&pool.lock);
        fn(ctx, ith, nth);
        pthread_mutex_lock(&pool.lock);
        if (--pool.pending == 0) pthread_cond_signal(&pool.done);
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
        pool.born_at[ith] = pool.generation;
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
    pool.pending = nth - 1;
    pool.generation++;
    pthread_cond_broadcast(&pool.start);
    pthread_mutex_unlock(&pool.lock);

    fn(ctx, 0, nth);

    pthread_mutex_lock(&pool.lock);
    while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.run_lock);
    return PYLLM_OK;
}
