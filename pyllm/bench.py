"""`pyllm bench`: prompt processing and generation speed, measured as llama-bench does.

pp<p>: one prompt of p tokens; tg<n>: n tokens generated one at a time. Both
start from a cache holding d tokens (the depth, llama-bench's -d; 0: an empty
cache), put there before each run and not timed. Tokenization and sampling are
excluded: the tokens are fixed ids, the forward pass is what is timed. Each test
runs once to warm up, then r times; the result is the mean and standard deviation
of the per-repetition tokens/s. The records use llama-bench's JSON keys.
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


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo, as llama-bench's cpu_info), else what the platform module says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def test_title(n_prompt: int, n_gen: int, n_depth: int) -> str:
    """llama-bench's name of a test: pp512, tg128, pp512 @ d1024."""
    name = f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"
    return f"{name} @ d{n_depth}" if n_depth else name


@dataclass
class BenchRecord:
    """One test, with llama-bench's field names."""
    model_filename: str
    model_type: str
    n_threads: int
    n_prompt: int
    n_gen: int
    n_depth: int
    avg_ts: float
    stddev_ts: float
    samples_ts: list[float] = field(default_factory=list)
    samples_ns: list[int] = field(default_factory=list)
    avg_ns: int = 0
    stddev_ns: int = 0
    cpu_info: str = field(default_factory=cpu_name)
    backends: str = "CPU"
    build_commit: str = "pyllm"
    type_k: str = "f16"   # the KV cache's (llama-bench's -ctk / -ctv)
    type_v: str = "f16"

    def to_json(self) -> dict:
        return asdict(self)


def _prompt_tokens(model: Model, n: int, seed: int = 42) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, model.n_vocab, n)]


def _time_runs(run: Callable[[], None], repetitions: int, on_run: Callable[[], None] | None = None,
               prepare: Callable[[], None] = lambda: None) -> list[int]:
    """Nanoseconds of each of `repetitions` runs after a warm-up; prepare() before every run and on_run() after it
    (warm-up included), neither timed."""
    prepare()
    run()  # warm-up: page in the weights, start the threads
    if on_run is not None:
        on_run()
    samples = []
    for _ in range(repetitions):
        prepare()
        start = time.perf_counter_ns()
        run()
        samples.append(time.perf_counter_ns() - start)
        if on_run is not None:
            on_run()
    return samples


def _record(model: Model, path: str, n_threads: int, n_prompt: int, n_gen: int, n_depth: int,
            samples_ns: list[int]) -> BenchRecord:
    n_tokens = n_prompt + n_gen
    rates = [n_tokens / (ns / 1e9) for ns in samples_ns]
    return BenchRecord(
        model_filename=path,
        model_type=f"{model.config.arch} {kernels.active_tier()}",
        n_threads=n_threads,
        n_prompt=n_prompt,
        n_gen=n_gen,
        n_depth=n_depth,
        avg_ts=statistics.fmean(rates),
        stddev_ts=statistics.stdev(rates) if len(rates) > 1 else 0.0,
        samples_ts=rates,
        samples_ns=samples_ns,
        avg_ns=int(statistics.fmean(samples_ns)),
        stddev_ns=int(statistics.stdev(samples_ns)) if len(samples_ns) > 1 else 0,
        type_k=model.cache_types[0].name.lower(),
        type_v=model.cache_types[1].name.lower(),
    )


class _DepthCache:
    """A cache that holds n_depth tokens before each run: prefilled once, then cut back to them (truncate) after a
    run; filled again only where a sliding-window layer's ring has overwritten part of the depth's window."""

    def __init__(self, model: Model, n_depth: int, n_test: int) -> None:
        self.model, self.n_depth = model, n_depth
        self.tokens = _prompt_tokens(model, n_depth, seed=7)
        self.cache = model.new_cache(n_depth + n_test)  # the context covers the depth and the test

    def reset(self) -> None:
        if self.cache.truncate(self.n_depth) == self.n_depth:
            return
        self.cache.clear()
        if self.n_depth:
            self.model.prefill(self.tokens, self.cache, logits="none")


def bench_prompt(model: Model, path: str, n_prompt: int, n_threads: int, repetitions: int,
                 on_run: Callable[[], None] | None = None, n_depth: int = 0) -> BenchRecord:
    tokens = _prompt_tokens(model, n_prompt)
    depth = _DepthCache(model, n_depth, n_prompt)  # one cache, back to its depth before each run

    def run() -> None:
        model.prefill(tokens, depth.cache)

    samples = _time_runs(run, repetitions, on_run, prepare=depth.reset)
    return _record(model, path, n_threads, n_prompt, 0, n_depth, samples)


def bench_generation(model: Model, path: str, n_gen: int, n_threads: int, repetitions: int,
                     on_run: Callable[[], None] | None = None, n_depth: int = 0) -> BenchRecord:
    tokens = _prompt_tokens(model, n_gen)
    depth = _DepthCache(model, n_depth, n_gen)

    def run() -> None:
        for token in tokens:
            model.decode([(token, depth.cache)])

    samples = _time_runs(run, repetitions, on_run, prepare=depth.reset)
    return _record(model, path, n_threads, 0, n_gen, n_depth, samples)


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
