"""The model's decode step alone: one forward pass over R sequences' next tokens (R = 1, 2, 4, ...), no HTTP, no
sampling; the figure serving's batch scaling starts from.

    python bench/decode_steps.py [MODEL] [--rows 1,4] [--threads 2] [--rounds 6] [--prompt 25] [--steps 64]

Each round gives every row count R fresh sequences with --prompt-token prompts, then times --steps decode steps of
all R together (the order of the row counts alternating round by round); prints the median step time per R, the
aggregate tokens/s and each R's throughput against the first. Not run in CI.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from pyllm import catalogue
from pyllm.gguf import GGUFFile
from pyllm.model import Model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=catalogue.SMALL_MODEL, help="path or catalogue name")
    parser.add_argument("--rows", default="1,4", help="comma-separated sequence counts (default 1,4)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prompt", type=int, default=25, help="prompt tokens of each sequence (default 25)")
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed a round (default 64)")
    args = parser.parse_args()
    counts = [int(r) for r in args.rows.split(",")]
    model = Model(GGUFFile(catalogue.resolve(args.model)), n_threads=args.threads)
    rng = np.random.default_rng(0)
    times: dict[int, list[float]] = {r: [] for r in counts}
    for rnd in range(args.rounds):
        for rows in counts if rnd % 2 == 0 else counts[::-1]:
            caches = [model.new_cache(args.prompt + args.steps + 1, max(args.prompt, 1)) for _ in range(rows)]
            for cache in caches:
                model.prefill(rng.integers(1, 1000, args.prompt), cache)
            for _ in range(args.steps):
                steps = [(int(rng.integers(1, 1000)), cache) for cache in caches]
                started = time.perf_counter()
                model.decode(steps)
                times[rows].append(time.perf_counter() - started)
    base = statistics.median(times[counts[0]]) / counts[0]
    print(f"{model.file.path.name}, {args.threads} threads, {args.rounds} rounds of {args.steps} steps, "
          f"{args.prompt}-token prompts")
    for rows in counts:
        step = statistics.median(times[rows])
        print(f"  {rows} row{'s' if rows > 1 else ''}: step {1e3 * step:6.2f} ms, {rows / step:7.1f} tok/s, "
              f"{base * rows / step:4.2f}x the {counts[0]}-row throughput")


if __name__ == "__main__":
    main()
