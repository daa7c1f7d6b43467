"""Counters, gauges and histograms, rendered in the Prometheus text format (for GET /metrics).

Thread-safe: the engine thread and the server's threads update them concurrently.
"""

from __future__ import annotations

import bisect
import threading

# seconds: TTFT spans milliseconds (cached prompts) to minutes (long prompts on a busy CPU)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)


class Counter:
    def __init__(self, name: str, help_text: str, label: str | None = None) -> None:
        self.name, self.help, self.label = name, help_text, label
        self._values: dict[str, float] = {}
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0, label: str = "") -> None:
        with self._lock:
            self._values[label] = self._values.get(label, 0.0) + amount

    def value(self, label: str = "") -> float:
        return self._values.get(label, 0.0)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        values = dict(self._values) or {"": 0.0}
        for label_value, v in sorted(values.items()):
            labels = f'{{{self.label}="{label_value}"}}' if self.label and label_value else ""
            lines.append(f"{self.name}{labels} {v:g}")
        return lines


class Gauge:
    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        self._value = 0.0

    def set(self, value: float) -> None:
        self._value = float(value)

    def value(self) -> float:
        return self._value

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge", f"{self.name} {self._value:g}"]


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help, self.buckets = name, help_text, buckets
        self._counts = [0] * (len(buckets) + 1)  # the last one: above every bound
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.buckets, value)] += 1
            self._sum += value

    @property
    def count(self) -> int:
        return sum(self._counts)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        with self._lock:
            counts, total = list(self._counts), self._sum
        running = 0
        for bound, n in zip(self.buckets, counts, strict=False):
            running += n
            lines.append(f'{self.name}_bucket{{le="{bound:g}"}} {running}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {sum(counts)}')
        lines.append(f"{self.name}_sum {total:g}")
        lines.append(f"{self.name}_count {sum(counts)}")
        return lines


class Metrics:
    """What the engine and the server count."""

    def __init__(self) -> None:
        self.http_requests = Counter("pyllm_http_requests_total", "HTTP requests answered, by status code",
                                     label="code")
        self.requests_finished = Counter("pyllm_requests_finished_total",
                                         "Generations finished, by reason (stop, length, cancelled)", label="reason")
        self.prompt_tokens = Counter("pyllm_prompt_tokens_total", "Prompt tokens of admitted requests")
        self.cached_prompt_tokens = Counter("pyllm_prompt_tokens_cached_total",
                                            "Prompt tokens taken from the prefix cache instead of computed")
        self.prefix_cache_hits = Counter("pyllm_prefix_cache_hits_total",
                                         "Requests that reused at least one cached prompt token")
        self.generation_tokens = Counter("pyllm_generation_tokens_total", "Tokens generated")
        self.requests_queued = Gauge("pyllm_requests_queued", "Requests waiting for a free sequence slot")
        self.sequences_active = Gauge("pyllm_sequences_active", "Sequences being processed")
        self.ttft = Histogram("pyllm_time_to_first_token_seconds", "Time from submission to the first token",
                              TTFT_BUCKETS)
        self.tpot = Histogram("pyllm_time_per_output_token_seconds", "Time between consecutive output tokens",
                              TPOT_BUCKETS)

    def render(self) -> str:
        parts = [self.http_requests, self.requests_finished, self.prompt_tokens, self.cached_prompt_tokens,
                 self.prefix_cache_hits, self.generation_tokens, self.requests_queued, self.sequences_active,
                 self.ttft, self.tpot]
        return "\n".join(line for metric in parts for line in metric.render()) + "\n"
