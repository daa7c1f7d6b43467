"""pyllm against llama.cpp's llama-bench, on the same files and thread counts, interleaved in one run.

    python bench/vs_llamacpp.py [MODEL ...] --llama-bench PATH [--threads 1,2] [-p 512] [-n 128] [-r 3]
                                [--rounds 1]

MODEL: paths or catalogue names (default: the three catalogue models). For each model and thread
count, runs `llama-bench -p P -n N -t T -r R -o json` and `pyllm bench` with the same settings,
each as its own process (so each one's peak RSS is its own, read from wait4), and prints a table:
tokens/s of each for pp<P> and tg<N>, the ratio pyllm / llama.cpp, and the peak RSS of both.
With --rounds K the pair runs K times, which one goes first alternating, and the table gives the
median of each one's tok/s, the median of the K ratios and their range: on a shared machine one
pair's ratio can be 10-30% off the next one's. llama-bench comes from llama.cpp's sources, built as
../shared/LLAMACPP.md says. Not run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pyllm import catalogue

DEFAULT_MODELS = ["gemma3-270m", "smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]


def run_measured(cmd: list[str]) -> tuple[str, float]:
    """(stdout, peak RSS in MB) of one process, reaped here with wait4 for its own resource usage."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {err.read().strip()[-300:]}")
        return out.read(), usage.ru_maxrss / 1024  # Linux reports KiB


def llama_bench(binary: str, model: Path, p: int, n: int, threads: int, reps: int) -> tuple[dict, float]:
    out, rss = run_measured([binary, "-m", str(model), "-p", str(p), "-n", str(n), "-t", str(threads),
                             "-r", str(reps), "-o", "json"])
    return {(r["n_prompt"], r["n_gen"]): r["avg_ts"] for r in json.loads(out)}, rss


def pyllm_bench(model: Path, p: int, n: int, threads: int, reps: int) -> tuple[dict, float]:
    out, rss = run_measured([sys.executable, "-m", "pyllm.cli", "bench", str(model), "-p", str(p), "-n", str(n),
                             "-t", str(threads), "-r", str(reps), "--json"])
    return {(r["n_prompt"], r["n_gen"]): r["avg_ts"] for r in json.loads(out)}, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--llama-bench", required=True, help="path of llama.cpp's llama-bench")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("-p", type=int, default=512)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("-r", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="runs of the pair per model and thread count")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    rows = []
    for name in args.models:
        model = catalogue.resolve(name)
        for threads in (int(t) for t in args.threads.split(",")):
            runs: dict[str, list[tuple[dict, float]]] = {"llama.cpp": [], "pyllm": []}
            for round_ in range(args.rounds):
                order = ("llama.cpp", "pyllm") if round_ % 2 == 0 else ("pyllm", "llama.cpp")
                for who in order:
                    if who == "llama.cpp":
                        runs[who].append(llama_bench(args.llama_bench, model, args.p, args.n, threads, args.r))
                    else:
                        runs[who].append(pyllm_bench(model, args.p, args.n, threads, args.r))
            rss_theirs = max(rss for _, rss in runs["llama.cpp"])
            rss_ours = max(rss for _, rss in runs["pyllm"])
            for key, test in (((args.p, 0), f"pp{args.p}"), ((0, args.n), f"tg{args.n}")):
                theirs = [r.get(key, float("nan")) for r, _ in runs["llama.cpp"]]
                ours = [r.get(key, float("nan")) for r, _ in runs["pyllm"]]
                ratios = [b / a for a, b in zip(theirs, ours, strict=True)]
                a, b, ratio = statistics.median(theirs), statistics.median(ours), statistics.median(ratios)
                rows.append((model.name, threads, test, a, b, ratio, min(ratios), max(ratios), rss_theirs, rss_ours))
                spread = f", rounds {min(ratios):.2f}-{max(ratios):.2f}" if args.rounds > 1 else ""
                print(f"{model.name} t={threads} {test}: llama.cpp {a:.1f}, pyllm {b:.1f} tok/s ({ratio:.2f}x{spread})",
                      flush=True)
    ranged = args.rounds > 1
    print("\n| model | threads | test | llama.cpp tok/s | pyllm tok/s | pyllm / llama.cpp "
          + ("| range over rounds " if ranged else "") + "| peak RSS llama.cpp MB | peak RSS pyllm MB |")
    print("|---|---|---|---|---|---|" + ("---|" if ranged else "") + "---|---|")
    for name, threads, test, a, b, ratio, low, high, rss_a, rss_b in rows:
        spread = f" {low:.2f}-{high:.2f} |" if ranged else ""
        print(f"| {name} | {threads} | {test} | {a:.1f} | {b:.1f} | {ratio:.2f} |{spread} {rss_a:.0f} | {rss_b:.0f} |")


if __name__ == "__main__":
    main()
