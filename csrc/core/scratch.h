/*
 * scratch.h - the working buffers of a call (a batch's activations in the blocks, a matmul's quantized rows, a
 * decode step's as each thread converts them for itself, attention's jobs and its keys and values as floats, a tiled
 * matrix's row rebuilt for the embedding), kept by the calling thread from one call to the next: each is the largest
 * one call has needed, so after the first prompt of a size no call allocates.
 *
 * Allocated and freed on every call, they went through glibc's heap once its mmap threshold had risen past them,
 * staying resident with other allocations between theirs; mapped and unmapped per call, they cost prompts page
 * faults and TLB shootdowns (bench/README.md).
 */
#ifndef PYLLM_SCRATCH_H
#define PYLLM_SCRATCH_H

#include <stddef.h>

typedef enum {
    SCRATCH_BLOCKS,          /* model/block.c: a batch's activations, rope angles, attention calls */
    SCRATCH_MATMUL,          /* matmul/run.c: a prefill's X rows, panels and unpacked weight rows */
    SCRATCH_DECODE_ROWS,     /* matmul/run.c: a decode step's X rows, each thread's own */
    SCRATCH_ATTENTION,       /* ops/attention.c: each thread's scores and converted keys and values */
    SCRATCH_ATTENTION_JOBS,  /* ops/attention.c: a call's jobs */
    SCRATCH_ROW,             /* formats/dequantize.c: a tiled matrix's row rebuilt */
    SCRATCH_SLOTS
} scratch_slot;

/* At least bytes of 64-byte-aligned memory for `slot`, the calling thread's own: valid until its next call
 * for the same slot (or until the thread ends); its contents are not kept when it grows. NULL when out of
 * memory. */
void *pyllm_scratch(scratch_slot slot, size_t bytes);

#endif /* PYLLM_SCRATCH_H */
