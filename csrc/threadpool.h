/*
 * threadpool.h - one persistent pool of worker threads for the whole process.
 * Workers are started on first need and reused by every later call.
 */
#ifndef PYLLM_THREADPOOL_H
#define PYLLM_THREADPOOL_H

/* fn(ctx, ith, nth) for ith in 0..nth-1, concurrently; ith 0 runs on the caller. */
typedef void (*pool_task_fn)(void *ctx, int ith, int nth);

#define PYLLM_MAX_THREADS 256

/* Runs the task on nth threads and returns when all are done; callers from
 * several threads are served one at a time. PYLLM_ERR_THREADS if nth is out of
 * range or workers cannot be started. */
int pyllm_pool_run(int nth, pool_task_fn fn, void *ctx);

#endif /* PYLLM_THREADPOOL_H */
