"""Decode-shaped (M = 1) matmul throughput on a real model's largest tensors, and the machine's read bandwidth.

    python bench/matmul_bandwidth.py [MODEL] [--types Q4_K,Q6_K,Q8_0] [--threads 1] [--repeats 9]

For each tensor type, takes the file's largest tensor of that type, runs
Y[1, N] = x[1, K] · W[N, K]ᵀ with W in the layout the model loads it in, and prints the
median time and weight bytes read per second. Memory-bound: compare with the
machine's read bandwidth, printed first (read_bandwidth: a streaming reduction over
1 GiB, far larger than the caches, split over the threads), and the bytes a decode
step reads (decode_bytes). bench/vs_llamacpp.py uses both for its bandwidth columns.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from pyllm import catalogue, kernels
from pyllm.gguf import GGUFFile


def read_bandwidth(n_threads: int, repeats: int = 5) -> float:
    """GB/s of a streaming read by n_threads threads: numpy's max over 1 GiB of bytes (vectorized, so the memory sets
    its pace), a slice a thread; the best of `repeats` passes."""
    data = np.ones(1 << 30, dtype=np.uint8)
    slices = np.array_split(data, n_threads)
    best = 0.0
    for _ in range(repeats):
        threads = [threading.Thread(target=np.max, args=(part,)) for part in slices]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        best = max(best, data.nbytes / (time.perf_counter() - start) / 1e9)
    return best


def decode_bytes(path: Path) -> int:
    """Bytes of weights a decode step reads: every tensor but the token embedding (a lookup of one row), which is
    read whole when the output reuses it (a tied embedding)."""
    with GGUFFile(path) as f:
        tied = "output.weight" not in f.tensors
        return sum(t.n_bytes for name, t in f.tensors.items() if tied or name != "token_embd.weight")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="gemma3-270m")
    parser.add_argument("--types", default="Q4_K,Q6_K,Q8_0")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    path = catalogue.resolve(args.model)
    print(f"read bandwidth {read_bandwidth(args.threads):.1f} GB/s ({args.threads} thread(s)); a decode step reads "
          f"{decode_bytes(path) / 1e9:.3f} GB of {path.name}")
    print(f"model {path.name}, tier {kernels.active_tier()}, {args.threads} thread(s), "
          f"median of {args.repeats}")
    print(f"{'type':<6} {'tensor':<28} {'N x K':>14} {'MB':>8} {'ms':>8} {'GB/s':>7}")
    with GGUFFile(path) as f:
        for type_name in args.types.split(","):
            infos = [t for t in f.tensors.values() if t.type_name == type_name]
            if not infos:
                print(f"{type_name:<6} (no tensor of this type)")
                continue
            info = max(infos, key=lambda t: t.n_bytes)
            w = f.raw(info.name)
            layout = kernels.matrix_layout(info.type, w.shape[0])  # as the model loads it (16-row tiles, ...)
            if layout != info.type:
                w = kernels.repack(w, info.type, layout)
            x = np.random.default_rng(0).standard_normal((1, info.shape[0])).astype(np.float32)
            out = np.empty((1, w.shape[0]), np.float32)
            kernels.matmul(w, layout, x, n_threads=args.threads, out=out)  # warm-up, page-in
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                kernels.matmul(w, layout, x, n_threads=args.threads, out=out)
                times.append(time.perf_counter() - start)
            t = statistics.median(times)
            shape = f"{w.shape[0]} x {info.shape[0]}"
            print(f"{type_name:<6} {info.name:<28} {shape:>14} {info.n_bytes / 1e6:8.1f} {t * 1e3:8.2f} "
                  f"{info.n_bytes / t / 1e9:7.2f}")


if __name__ == "__main__":
    main()
