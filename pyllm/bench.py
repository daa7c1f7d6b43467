"""`pyllm bench`: prompt processing and generation speed, measured as llama-bench does.

pp<p>: one prompt of p tokens from an empty cache; tg<n>: n tokens generated one
at a time after an empty cache. Tokenization and sampling are excluded: the
tokens are fixed ids, the forward pass is what is timed. Each test runs once to
warm up, then r times; the result is the mean and standard deviation of the
per-repetition tokens/s. The records use llama-bench's JSON keys.
"""

from __future__ import annotations

import platform
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from . import kernels
from .model import Model


@dataclass
class BenchRecord:
    """One test, with llama-bench's field names."""
    model_filename: str
    model_type: str
    n_threads: int
    n_prompt: int
    n_gen: int
    avg_ts: float
    stddev_ts: float
    samples_ts: list[float] = field(default_factory=list)
    samples_ns: list[int] = field(default_factory=list)
    avg_ns: int = 0
    stddev_ns: int = 0
    cpu_info: str = field(default_factory=platform.processor)
    backends: str = "CPU"
    build_commit: str = "pyllm"

    def to_json(self) -> dict:
        return asdict(self)


def _prompt_tokens(model: Model, n: int, seed: int = 42) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, model.n_vocab, n)]


def _time_runs(run: Callable[[], None], repetitions: int, on_run: Callable[[], None] | None = None) -> list[int]:
    """Nanoseconds of each of `repetitions` runs after a warm-up; on_run() after every run (warm-up included)."""
    run()  # warm-up: page in the weights, start the threads
    if on_run is not None:
        on_run()
    samples = []
    for _ in range(repetitions):
        start = time.perf_counter_ns()
        run()
        samples.append(time.perf_counter_ns() - start)
        if on_run is not None:
            on_run()
    return samples


def _record(model: Model, path: str, n_threads: int, n_prompt: int, n_gen: int, samples_ns: list[int]) -> BenchRecord:
    n_tokens = n_prompt + n_gen
    rates = [n_tokens / (ns / 1e9) for ns in samples_ns]
    return BenchRecord(
        model_filename=path,
        model_type=f"{model.config.arch} {kernels.active_tier()}",
        n_threads=n_threads,
        n_prompt=n_prompt,
        n_gen=n_gen,
        avg_ts=statistics.fmean(rates),
        stddev_ts=statistics.stdev(rates) if len(rates) > 1 else 0.0,
        samples_ts=rates,
        samples_ns=samples_ns,
        avg_ns=int(statistics.fmean(samples_ns)),
        stddev_ns=int(statistics.stdev(samples_ns)) if len(samples_ns) > 1 else 0,
    )


def bench_prompt(model: Model, path: str, n_prompt: int, n_threads: int, repetitions: int,
                 on_run: Callable[[], None] | None = None) -> BenchRecord:
    tokens = _prompt_tokens(model, n_prompt)
    cache = model.new_cache(n_prompt)  # one, emptied before each run, as llama-bench clears its context's

    def run() -> None:
        cache.clear()
        model.prefill(tokens, cache)

    return _record(model, path, n_threads, n_prompt, 0, _time_runs(run, repetitions, on_run))


def bench_generation(model: Model, path: str, n_gen: int, n_threads: int, repetitions: int,
                     on_run: Callable[[], None] | None = None) -> BenchRecord:
    tokens = _prompt_tokens(model, n_gen)
    cache = model.new_cache(n_gen)

    def run() -> None:
        cache.clear()
        for token in tokens:
            model.decode([(token, cache)])

    return _record(model, path, n_threads, 0, n_gen, _time_runs(run, repetitions, on_run))


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
