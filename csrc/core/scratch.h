/*
 * scratch.h - the per-call buffers (a prompt's activations in the blocks, a matmul's quantized rows, a
 * decode step's as each thread converts them for itself, attention's keys and values as floats, an
 * interleaved matrix's row rebuilt for the embedding), kept by the calling thread from one call to the next.
 *
 * Allocated and freed on every call, they went through glibc's heap once its mmap threshold had risen past
 * them (it does after the first large free), and the heap stayed resident between calls with other
 * allocations between theirs: SmolLM2's pp512 peak RSS 165 MiB against 158 with the threshold pinned. Kept
 * instead, each buffer is the largest one call has needed; mapping and unmapping them per call cost prompts
 * 10-20% (page faults, and at two threads the unmaps' TLB shootdowns).
 */
#ifndef PYLLM_SCRATCH_H
#define PYLLM_SCRATCH_H

#include <stddef.h>

typedef enum { SCRATCH_BLOCKS, SCRATCH_MATMUL, SCRATCH_DECODE_ROWS, SCRATCH_ATTENTION, SCRATCH_ROW, SCRATCH_SLOTS } scratch_slot;

/* At least bytes of 64-byte-aligned memory for `slot`, the calling thread's own: valid until its next call
 * for the same slot (or until the thread ends); its contents are not kept when it grows. NULL when out of
 * memory. */
void *pyllm_scratch(scratch_slot slot, size_t bytes);

#endif /* PYLLM_SCRATCH_H */
