"""Decode-shaped (M = 1) matmul throughput on a real model's largest tensors.

    python bench/matmul_bandwidth.py [MODEL] [--types Q4_K,Q6_K,Q8_0] [--threads 1] [--repeats 9]

For each tensor type, takes the file's largest tensor of that type, runs
Y[1, N] = x[1, K] · W[N, K]ᵀ reading W in place from the mmap, and prints the
median time and weight bytes read per second. Memory-bound: compare with the
machine's read bandwidth (about 13.5 GB/s on one core of the reference machine).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from pyllm import catalogue, kernels
from pyllm.gguf import GGUFFile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="gemma3-270m")
    parser.add_argument("--types", default="Q4_K,Q6_K,Q8_0")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    path = catalogue.resolve(args.model)
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
            x = np.random.default_rng(0).standard_normal((1, info.shape[0])).astype(np.float32)
            out = np.empty((1, w.shape[0]), np.float32)
            kernels.matmul(w, info.type, x, n_threads=args.threads, out=out)  # warm-up, page-in
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                kernels.matmul(w, info.type, x, n_threads=args.threads, out=out)
                times.append(time.perf_counter() - start)
            t = statistics.median(times)
            shape = f"{w.shape[0]} x {info.shape[0]}"
            print(f"{type_name:<6} {info.name:<28} {shape:>14} {info.n_bytes / 1e6:8.1f} {t * 1e3:8.2f} "
                  f"{info.n_bytes / t / 1e9:7.2f}")


if __name__ == "__main__":
    main()
