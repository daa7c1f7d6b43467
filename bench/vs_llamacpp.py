"""pyllm against llama.cpp's llama-bench, on the same files and thread counts, interleaved in one run.

    python bench/vs_llamacpp.py [MODEL ...] --llama-bench PATH [--threads 1,2] [-p 512] [-n 128] [-r 3]
                                [-d 0,512,1024] [--rounds 1] [--json OUT.json] [--plot OUT.png]
    python bench/vs_llamacpp.py --replot OUT.json --plot OUT.png

MODEL: paths or catalogue names (default: the three catalogue models). For each model and thread
count, runs `llama-bench -p P -n N -d D -t T -r R -o json` and `pyllm bench` with the same settings,
each as its own process (so each one's peak RSS is its own, read from wait4), and prints a table:
tokens/s of each for pp<P> and tg<N> (at each depth D), the ratio pyllm / llama.cpp, the peak RSS of both, and
for decode each one's weight bytes read per second as a share of the machine's read bandwidth at that thread count
(matmul_bandwidth.py's read_bandwidth and decode_bytes, measured at the start).
With --rounds K the pair runs K times, which one goes first alternating, and the table gives the
median of each one's tok/s, the median of the K ratios and their range: on a shared machine one
pair's ratio can be 10-30% off the next one's. llama-bench comes from llama.cpp's sources, built as
../shared/LLAMACPP.md says. --json writes every run's records ({"pyllm": [...], "llama.cpp": [...]}, llama-bench's
keys); --plot draws them, one PNG per model (OUT-<model>.png when there are several): decode tok/s and TPOT
against depth, TTFT against prompt length, prompt tok/s against depth, both engines on the same axes (several
rounds pooled); --replot draws a saved --json again without measuring. P, N and D take comma-separated lists, as
llama-bench's do. Not run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from functools import partial
from pathlib import Path

from matmul_bandwidth import decode_bytes

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


def read_bandwidth_apart(n_threads: int) -> float:
    """matmul_bandwidth.read_bandwidth in a process of its own: its 1 GiB buffer would raise this one's peak RSS, and
    Linux hands a parent's peak to every child it starts (across fork and exec, into the child's ru_maxrss)."""
    code = f"from matmul_bandwidth import read_bandwidth; print(read_bandwidth({n_threads}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent, check=True,
                          capture_output=True, text=True)
    return float(done.stdout)


def llama_bench(binary: str, model: Path, p: str, n: str, d: str, threads: int, reps: int,
                cache_type: str = "f16") -> tuple[list, float]:
    """llama-bench's JSON records and peak RSS (a quantized cache with flash attention, which its values need)."""
    cache = [] if cache_type == "f16" else ["-ctk", cache_type, "-ctv", cache_type, "-fa", "1"]
    out, rss = run_measured([binary, "-m", str(model), "-p", p, "-n", n, "-d", d, "-t", str(threads),
                             "-r", str(reps), "-o", "json", *cache])
    return json.loads(out), rss


def pyllm_bench(model: Path, p: str, n: str, d: str, threads: int, reps: int,
                cache_type: str = "f16") -> tuple[list, float]:
    """`pyllm bench --json`'s records and peak RSS."""
    out, rss = run_measured([sys.executable, "-m", "pyllm.cli", "bench", str(model), "-p", p, "-n", n, "-d", d,
                             "-t", str(threads), "-r", str(reps), "--json", "-ctk", cache_type, "-ctv", cache_type])
    return json.loads(out), rss


def rates(records: list) -> dict:
    """(n_prompt, n_gen, n_depth) -> tokens/s of each test."""
    return {(r["n_prompt"], r["n_gen"], r.get("n_depth", 0)): r["avg_ts"] for r in records}


def plot_path(base: Path, model: Path, n_models: int) -> Path:
    return base if n_models == 1 else base.with_name(f"{base.stem}-{model.stem}{base.suffix}")


def draw(records: dict[str, list], out: Path, threads: list[int], rounds: int, note: str = "") -> None:
    """One model's records ({"pyllm": [...], "llama.cpp": [...]}) drawn into out."""
    from pyllm import plot
    name = Path(next(r for rs in records.values() for r in rs)["model_filename"]).name
    title = f"{name} \u00b7 {plot.cpu_description()} \u00b7 {plot.threads_phrase(threads)}"
    notes = [f"Each engine's repetitions pooled over {rounds} round(s), llama-bench and pyllm bench alternating."]
    notes += [note] if note else []
    plot.save_figure(plot.benchmark_figure(records, title=title, notes=notes), out)
    print(f"wrote {out}", flush=True)


def replot(saved: Path, base: Path, note: str) -> None:
    """Draw a saved --json's records, one picture per model, as the run that measured them would have."""
    records = json.loads(saved.read_text())
    models = list(dict.fromkeys(r["model_filename"] for rs in records.values() for r in rs))
    for model in models:
        mine = {who: [r for r in rs if r["model_filename"] == model] for who, rs in records.items()}
        threads = sorted({r["n_threads"] for rs in mine.values() for r in rs})
        rounds = max(Counter(record_key(r) for r in mine["pyllm"]).values(), default=1)
        draw(mine, plot_path(base, Path(model), len(models)), threads, rounds, note)


def record_key(record: dict) -> tuple:
    return record["n_prompt"], record["n_gen"], record.get("n_depth", 0), record["n_threads"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--llama-bench", help="path of llama.cpp's llama-bench (needed unless --replot)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("-p", default="512", help="prompt lengths of the pp tests (comma-separated)")
    parser.add_argument("-n", default="128", help="token counts of the tg tests (comma-separated)")
    parser.add_argument("-d", default="0", help="context depths (comma-separated; llama-bench's -d)")
    parser.add_argument("-r", type=int, default=3)
    parser.add_argument("--cache-type", default="f16", choices=["f16", "q8_0", "q4_0"],
                        help="both engines' KV cache type (-ctk/-ctv; llama-bench with -fa 1, which its quantized "
                             "values need)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of the pair per model and thread count")
    parser.add_argument("--json", dest="json_path", type=Path, help="write every run's records here")
    parser.add_argument("--plot", dest="plot_path", type=Path, help="draw the records into this PNG (needs matplotlib)")
    parser.add_argument("--replot", type=Path, help="a saved --json to draw (with --plot) instead of measuring")
    parser.add_argument("--note", default="", help="a line for the picture's foot, e.g. how busy the machine was")
    args = parser.parse_args()
    if args.replot is None and args.llama_bench is None:
        parser.error("--llama-bench PATH is needed to measure (or --replot OUT.json --plot OUT.png to draw)")
    if args.replot is not None and args.plot_path is None:
        parser.error("--replot draws into --plot OUT.png")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        sizes = {flag: [int(v) for v in getattr(args, flag).split(",")] for flag in ("p", "n", "d")}
    except ValueError:
        parser.error("-p, -n and -d take comma-separated integers")
    for written in (args.json_path, args.plot_path):
        if written is not None and not written.parent.is_dir():
            parser.error(f"directory {written.parent} does not exist")
    if args.plot_path is not None:
        from pyllm.plot import PlotUnavailable, require_matplotlib
        try:
            require_matplotlib()
        except PlotUnavailable as exc:
            parser.error(str(exc))
    if args.replot is not None:
        replot(args.replot, args.plot_path, args.note)
        return
    tests = [((p, 0, d), f"pp{p}" + (f" @ d{d}" if d else "")) for d in sizes["d"] for p in sizes["p"] if p > 0]
    tests += [((0, n, d), f"tg{n}" + (f" @ d{d}" if d else "")) for d in sizes["d"] for n in sizes["n"] if n > 0]
    models = [catalogue.resolve(name) for name in args.models]
    bandwidth = {t: read_bandwidth_apart(t) for t in (int(t) for t in args.threads.split(","))}
    print("read bandwidth: " + ", ".join(f"{t} thread(s) {gb:.1f} GB/s" for t, gb in bandwidth.items()), flush=True)
    every_record: dict[str, list] = {"pyllm": [], "llama.cpp": []}

    rows = []
    for model in models:
        model_records: dict[str, list] = {"pyllm": [], "llama.cpp": []}
        step_gb = decode_bytes(model) / 1e9
        for threads in (int(t) for t in args.threads.split(",")):
            runs: dict[str, list[tuple[dict, float]]] = {"llama.cpp": [], "pyllm": []}
            for round_ in range(args.rounds):
                order = ("llama.cpp", "pyllm") if round_ % 2 == 0 else ("pyllm", "llama.cpp")
                for who in order:
                    measure = (partial(llama_bench, args.llama_bench) if who == "llama.cpp" else pyllm_bench)
                    records, rss = measure(model, args.p, args.n, args.d, threads, args.r, args.cache_type)
                    model_records[who] += records
                    runs[who].append((rates(records), rss))
            rss_theirs = max(rss for _, rss in runs["llama.cpp"])
            rss_ours = max(rss for _, rss in runs["pyllm"])
            for key, test in tests:
                theirs = [r.get(key, float("nan")) for r, _ in runs["llama.cpp"]]
                ours = [r.get(key, float("nan")) for r, _ in runs["pyllm"]]
                ratios = [b / a for a, b in zip(theirs, ours, strict=True)]
                a, b, ratio = statistics.median(theirs), statistics.median(ours), statistics.median(ratios)
                shares = (a * step_gb / bandwidth[threads], b * step_gb / bandwidth[threads]) if key[0] == 0 else None
                rows.append((model.name, threads, test, a, b, ratio, min(ratios), max(ratios), rss_theirs, rss_ours,
                             shares))
                spread = f", rounds {min(ratios):.2f}-{max(ratios):.2f}" if args.rounds > 1 else ""
                print(f"{model.name} t={threads} {test}: llama.cpp {a:.1f}, pyllm {b:.1f} tok/s ({ratio:.2f}x{spread})",
                      flush=True)
        for who, records in model_records.items():
            every_record[who] += records
        if args.plot_path is not None:
            out = plot_path(args.plot_path, model, len(models))
            draw(model_records, out, [int(t) for t in args.threads.split(",")], args.rounds, args.note)
    if args.json_path is not None:
        args.json_path.write_text(json.dumps(every_record, indent=2) + "\n")
        print(f"wrote {args.json_path}")
    ranged = args.rounds > 1
    print("\n| model | threads | test | llama.cpp tok/s | pyllm tok/s | pyllm / llama.cpp "
          + ("| range over rounds " if ranged else "")
          + "| share of read bandwidth llama.cpp / pyllm | peak RSS llama.cpp MB | peak RSS pyllm MB |")
    print("|---|---|---|---|---|---|" + ("---|" if ranged else "") + "---|---|---|")
    for name, threads, test, a, b, ratio, low, high, rss_a, rss_b, shares in rows:
        spread = f" {low:.2f}-{high:.2f} |" if ranged else ""
        share = f"{shares[0]:.0%} / {shares[1]:.0%}" if shares else ""
        print(f"| {name} | {threads} | {test} | {a:.1f} | {b:.1f} | {ratio:.2f} |{spread} {share} | {rss_a:.0f} | "
              f"{rss_b:.0f} |")


if __name__ == "__main__":
    main()
