"""pyllm against llama.cpp's llama-bench, on the same files and thread counts, interleaved in one run.

    python bench/vs_llamacpp.py [MODEL ...] --llama-bench PATH [--threads 1,2] [-p 512] [-n 128] [-r 3]

MODEL: paths or catalogue names (default: the three catalogue models). For each model and thread
count, runs `llama-bench -p P -n N -t T -r R -o json` and then `pyllm bench` with the same settings,
each as its own process (so each one's peak RSS is its own, read from wait4), and prints a table:
tokens/s of each for pp<P> and tg<N>, the ratio pyllm / llama.cpp, and the peak RSS of both.
llama-bench comes from llama.cpp's sources, built as ../shared/LLAMACPP.md says. Not run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
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
    args = parser.parse_args()

    rows = []
    for name in args.models:
        model = catalogue.resolve(name)
        for threads in (int(t) for t in args.threads.split(",")):
            theirs, rss_theirs = llama_bench(args.llama_bench, model, args.p, args.n, threads, args.r)
            ours, rss_ours = pyllm_bench(model, args.p, args.n, threads, args.r)
            for key, test in (((args.p, 0), f"pp{args.p}"), ((0, args.n), f"tg{args.n}")):
                a, b = theirs.get(key, float("nan")), ours.get(key, float("nan"))
                rows.append((model.name, threads, test, a, b, b / a, rss_theirs, rss_ours))
                print(f"{model.name} t={threads} {test}: llama.cpp {a:.1f}, pyllm {b:.1f} tok/s ({b / a:.2f}x)",
                      flush=True)
    print("\n| model | threads | test | llama.cpp tok/s | pyllm tok/s | pyllm / llama.cpp | peak RSS llama.cpp MB "
          "| peak RSS pyllm MB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, threads, test, a, b, ratio, rss_a, rss_b in rows:
        print(f"| {name} | {threads} | {test} | {a:.1f} | {b:.1f} | {ratio:.2f} | {rss_a:.0f} | {rss_b:.0f} |")


if __name__ == "__main__":
    main()
