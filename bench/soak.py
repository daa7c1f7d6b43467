"""Soak test of `pyllm serve`: streaming clients that hang up at random, slow-header sockets, for minutes.

    python bench/soak.py [MODEL] [--minutes 10] [--clients 8] [--slow-sockets 16] [--threads 2] [--json]

Starts `pyllm serve MODEL --cache-ram 0 --parallel 4` on a free loopback port, records the greedy answers to a
few prompts, then for --minutes runs at once:
- --clients threads, each sending streaming completions and chat completions with random sampling settings and
  hanging up after a random number of chunks (or reading to the end);
- --slow-sockets connections that send a request's headers a byte at a time, a byte every few seconds (each is
  cut off by the server's header timeout and opens again);
- a prober that times GET /health every 0.25 s;
- the server's resident memory (VmRSS) read every 2 s.
Then it asks the greedy prompts again. It reports: requests finished, hung up, refused (503, counted apart), any
other error (the bar: none); /health latency (median, p99, max); RSS after the warm-up, at the end, its peak and
its slope over the run (MiB per minute); whether the greedy answers before and after are byte-identical; and
whether the server is still up. Not run in CI (minutes long); the figures go into the closing note.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from pyllm import catalogue

GREEDY_PROMPTS = ["The capital of France is", "def fibonacci(n):", "List three colours:", "Water boils at"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def greedy_answers(url: str) -> list[str]:
    out = []
    for prompt in GREEDY_PROMPTS:
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
        out.append(httpx.post(url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"])
    return out


class Soak:
    def __init__(self, url: str, port: int, seconds: float) -> None:
        self.url, self.port = url, port
        self.deadline = time.monotonic() + seconds
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []
        self.health: list[float] = []
        self.lock = threading.Lock()

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    def count(self, what: str, error: str | None = None) -> None:
        with self.lock:
            self.counts[what] += 1
            if error is not None and len(self.errors) < 20:
                self.errors.append(error)

    def client(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=120) as http:
            while self.running():
                chat = rng.random() < 0.5
                body: dict = {"max_tokens": rng.choice([1, 8, 32, 96]), "stream": True,
                              "temperature": rng.choice([0, 0.7, 1.2]), "seed": rng.randrange(1000)}
                if chat:
                    body["messages"] = [{"role": "user", "content": f"Tell me about topic {rng.randrange(50)}."}]
                else:
                    body["prompt"] = f"Story {rng.randrange(50)}: once upon a time"
                path = "/v1/chat/completions" if chat else "/v1/completions"
                hang_up_after = rng.choice([None, 0, 1, 3, 10])
                try:
                    with http.stream("POST", self.url + path, json=body) as response:
                        if response.status_code == 503:
                            self.count("refused (503)")
                            time.sleep(0.2)
                            continue
                        if response.status_code != 200:
                            self.count("error", f"{response.status_code}: {response.read()[:200]!r}")
                            continue
                        for i, line in enumerate(response.iter_lines()):
                            if hang_up_after is not None and i >= hang_up_after:
                                break
                            if line.startswith("data: {") and '"error"' in line[:20]:
                                self.count("error", line[:200])
                        self.count("hung up" if hang_up_after is not None else "finished")
                except httpx.HTTPError as exc:
                    self.count("error", f"{type(exc).__name__}: {exc}")

    def slow_socket(self, seed: int) -> None:
        rng = random.Random(seed)
        request = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        while self.running():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
                    for byte in request:
                        if not self.running():
                            return
                        sock.sendall(bytes([byte]))
                        time.sleep(rng.uniform(1, 4))
                self.count("slow socket sent all")  # should not happen: the server cuts it off first
            except OSError:
                self.count("slow socket cut off")

    def prober(self) -> None:
        with httpx.Client(timeout=30) as http:
            while self.running():
                start = time.perf_counter()
                try:
                    ok = http.get(self.url + "/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                elapsed = time.perf_counter() - start
                with self.lock:
                    self.health.append(elapsed if ok else float("inf"))
                time.sleep(0.25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="smollm2-135m-instruct", help="path or catalogue name")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--slow-sockets", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args()

    model = catalogue.resolve(args.model)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "pyllm.cli", "serve", str(model), "--port", str(port),
                               "--cache-ram", "0", "--parallel", "4", "-c", "1024", "-t", str(args.threads),
                               "--log-level", "warning"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start: {server.stderr.read() if server.stderr else ''}")
            time.sleep(0.2)
        before = greedy_answers(url)
        soak = Soak(url, port, args.minutes * 60)
        workers = [threading.Thread(target=soak.client, args=(i,), daemon=True) for i in range(args.clients)]
        workers += [threading.Thread(target=soak.slow_socket, args=(100 + i,), daemon=True)
                    for i in range(args.slow_sockets)]
        workers.append(threading.Thread(target=soak.prober, daemon=True))
        for w in workers:
            w.start()
        rss: list[tuple[float, float]] = []
        start = time.monotonic()
        while soak.running():
            rss.append((time.monotonic() - start, rss_mib(server.pid)))
            time.sleep(2)
        for w in workers:
            w.join(timeout=180)
        after = greedy_answers(url)
        alive = server.poll() is None and httpx.get(url + "/health", timeout=10).status_code == 200
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            stopped = server.wait(timeout=30) is not None
        except subprocess.TimeoutExpired:
            server.kill()
            stopped = False

    warm = [m for t, m in rss if t >= min(60.0, args.minutes * 60 / 4)] or [m for _, m in rss]
    times = [t for t, _ in rss if t >= min(60.0, args.minutes * 60 / 4)] or [t for t, _ in rss]
    slope = statistics.linear_regression(times, warm).slope * 60 if len(warm) > 2 else 0.0
    health = sorted(soak.health)
    summary = {
        "model": Path(model).name, "minutes": args.minutes, "clients": args.clients,
        "slow_sockets": args.slow_sockets, "requests": dict(soak.counts), "errors": soak.errors,
        "health_ms": {"n": len(health), "median": 1e3 * health[len(health) // 2],
                      "p99": 1e3 * health[int(len(health) * 0.99)], "max": 1e3 * health[-1]},
        "rss_mib": {"after_warmup": warm[0], "end": warm[-1], "peak": max(m for _, m in rss),
                    "slope_mib_per_min": slope},
        "greedy_identical": before == after, "alive_at_end": alive, "stopped_by_sigterm": stopped,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"soak of {summary['model']}: {args.minutes:g} min, {args.clients} clients, {args.slow_sockets} slow sockets")
    for what, n in sorted(soak.counts.items()):
        print(f"  {what:<24} {n}")
    for error in soak.errors:
        print(f"  error: {error}")
    h = summary["health_ms"]
    print(f"  /health: {h['n']} probes, median {h['median']:.1f} ms, p99 {h['p99']:.1f} ms, max {h['max']:.1f} ms")
    r = summary["rss_mib"]
    print(f"  RSS: {r['after_warmup']:.0f} MiB after warm-up, {r['end']:.0f} at the end, peak {r['peak']:.0f}, "
          f"slope {r['slope_mib_per_min']:+.2f} MiB/min")
    print(f"  greedy answers identical before/after: {summary['greedy_identical']}; alive at the end: {alive}; "
          f"stopped by SIGTERM: {stopped}")


if __name__ == "__main__":
    main()
