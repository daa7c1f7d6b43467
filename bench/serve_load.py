"""Load benchmark for an OpenAI-compatible server: concurrent streaming clients on loopback.

    python bench/serve_load.py [MODEL] [--clients 1,4] [--requests 8] [--max-tokens 64] [--threads 2]
                               [--rounds 3] [--llama-server PATH] [--url URL] [--prefix-tokens 400]
                               [--json OUT.json] [--plot OUT.png]
    python bench/serve_load.py --replot OUT.json --plot OUT.png

Starts `pyllm serve MODEL --parallel C` (and, with --llama-server, llama.cpp's `llama-server -np C`
on the same file and threads), C the largest client count, and sends --requests streaming completions
from each number of concurrent clients in turn: prompts of mixed lengths (short, medium, long), greedy,
a fixed number of output tokens (end-of-generation tokens are biased away). Or, with --url, measures a
server that is already running. --rounds repeats the client counts, the order alternating, so that a
shared machine's slow minutes fall on all of them; the summary gives medians, and each count's ratio
to the single client of the same round (median and range). Reports in vLLM's vocabulary:

    request throughput (req/s), output token throughput (tok/s), TTFT, TPOT (time per output token
    after the first) and end-to-end latency: mean, median (p50) and p99, in milliseconds; and the
    decode rate, clients / median TPOT (tok/s: the streams' aggregate once they are generating, without
    their prompts' time; it assumes every client's stream runs at once, so against a --url server with
    fewer slots than clients it overstates: read the output throughput there);

and a prefix-cache probe: TTFT of a prompt with a --prefix-tokens shared prefix, cold and then warm (a
second request sharing the prefix). Also checks that every answer equals the single-client answer to the
same prompt. --json writes the summary (per server and client count, the medians over rounds) as JSON, which
--plot (or `pyllm bench --plot OUT.png --serve-load OUT.json`) draws: output throughput and TTFT p99 against
concurrent clients, one line per server; --replot draws a saved --json again. Not run in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from pyllm import catalogue
from pyllm.gguf import GGUFFile
from pyllm.text.tokenizer import Tokenizer

TOPICS = ["the history of the printing press", "how bread rises", "why the sky is blue", "the life of honeybees",
          "how a bicycle stays upright", "the water cycle", "the first steam engines", "how vaccines work"]
FILLER = ("Background: this note collects observations from a long afternoon in the library, written down in no "
          "particular order, about books, weather, trains, gardens and the people who look after them. ")


def prompts(n: int, mix: str) -> list[str]:
    """n prompts: "mixed" lengths (short, medium ~150 tokens, long ~500 tokens, in turn) or all "short"."""
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        context = FILLER * ((0, 4, 14)[i % 3] if mix == "mixed" else 0)
        out.append(f"{context}Question {i}: write a short explanation of {topic}.\nAnswer:")
    return out


@dataclass
class Result:
    ttft: float
    e2e: float
    n_tokens: int
    text: str
    cached_tokens: int | None = None

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.n_tokens - 1) if self.n_tokens > 1 else None


@dataclass
class Run:
    label: str
    clients: int
    wall: float
    results: list[Result] = field(default_factory=list)

    @property
    def output_tokens(self) -> int:
        return sum(r.n_tokens for r in self.results)


def http_request(url: str, method: str, path: str, body: dict | None = None,
                 timeout: float = 600) -> http.client.HTTPResponse:
    """One request on a new connection (the caller reads the response). The standard library's client: the
    load generator shares the server's cores, and httpx's streaming cost ~1.2 ms of CPU a token (eight times
    this), which slowed whatever server was measured."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    payload = None if body is None else json.dumps(body)
    connection.request(method, path, payload, {"Content-Type": "application/json"} if payload else {})
    return connection.getresponse()


def _run(coroutine):
    """asyncio.run on uvloop's event loop where installed (pyllm's serving extra brings it): the client's CPU a
    token is the cores' the measured server runs on."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


class _EventStreamClient(asyncio.Protocol):
    """One streamed completion on its own connection, parsed as its bytes arrive: HTTP/1.1 by hand (a chunked
    or close-delimited body), the server-sent events' `data:` lines decoded as soon as they are whole. A
    protocol, not a stream reader: the data is handled in the transport's callback, with no coroutine to
    resume a token (the load generator shares the server's cores: what it spends, the server loses)."""

    def __init__(self, request: bytes, done: asyncio.Future) -> None:
        self.request, self.done = request, done
        self.started = time.perf_counter()
        self.first: float | None = None
        self.pieces: list[str] = []
        self.usage: dict | None = None
        self.raw = bytearray()        # bytes not yet parsed: the head, or the chunked framing
        self.chunked: bool | None = None  # None until the head has been read
        self.lines = b""              # the event text not yet split into whole lines

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        try:
            self.raw += data
            if self.chunked is None and not self._read_head():
                return
            if not self.chunked:
                body, self.raw = bytes(self.raw), bytearray()
                self._events(body)
                return
            while (eol := self.raw.find(b"\r\n")) >= 0:
                size = int(self.raw[:eol].split(b";")[0], 16)
                if size == 0:
                    self._finish()
                    return
                if len(self.raw) < eol + 2 + size + 2:
                    return
                body = bytes(self.raw[eol + 2:eol + 2 + size])
                del self.raw[:eol + 2 + size + 2]
                self._events(body)
        except Exception as exc:  # noqa: BLE001 - the request fails with it
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self._fail(exc)
        elif self.chunked is False:  # a close-delimited body ends here
            self._finish()
        else:  # after a chunked body's last chunk the request is done already, and this changes nothing
            self._fail(RuntimeError("the connection closed before the response ended"))

    def _read_head(self) -> bool:
        end = self.raw.find(b"\r\n\r\n")
        if end < 0:
            return False
        status_line, _, header_block = bytes(self.raw[:end]).partition(b"\r\n")
        status = int(status_line.split()[1])
        if status != 200:  # an error's JSON body, once it is all here (or what came of it by the close)
            length = re.search(rb"(?im)^content-length:\s*(\d+)", header_block)
            if length is not None and len(self.raw) - end - 4 < int(length[1]):
                return False
            raise RuntimeError(f"HTTP {status}: {bytes(self.raw[end + 4:end + 304])!r}")
        self.chunked = b"transfer-encoding: chunked" in header_block.lower()
        del self.raw[:end + 4]
        return True

    def _events(self, body: bytes) -> None:
        *lines, self.lines = (self.lines + body).split(b"\n")
        for line in lines:
            if not line.startswith(b"data: ") or line.rstrip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                self.usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    self.first = self.first or time.perf_counter()
                    self.pieces.append(choice["text"])

    def _finish(self) -> None:
        if self.done.done():
            return
        end = time.perf_counter()
        n_tokens = self.usage["completion_tokens"] if self.usage else len(self.pieces)
        cached = ((self.usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        self.done.set_result(Result((self.first or end) - self.started, end - self.started, n_tokens,
                                    "".join(self.pieces), cached))
        self.transport.close()

    def _fail(self, exc: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
        self.transport.close()


async def _stream_completion(host: str, port: int, body: dict) -> Result:
    """One streamed completion (a _EventStreamClient connection) and its timings."""
    payload = json.dumps(body).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
               b"Accept: text/event-stream\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
               % (host.encode(), port, len(payload)) + payload)
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    await loop.create_connection(lambda: _EventStreamClient(request, done), host, port)
    return await done


def stream_completion(url: str, body: dict) -> Result:
    parts = urlsplit(url)
    return _run(_stream_completion(parts.hostname, parts.port, body))


def run_load(url: str, label: str, clients: int, texts: list[str], max_tokens: int, bias: dict, model: str) -> Run:
    """`clients` streaming clients on one event loop (one thread: the load generator shares the server's cores,
    and a thread a client costs a wake-up a token), each sending its next request when the last one ends."""
    parts = urlsplit(url)
    results: list[Result | None] = [None] * len(texts)
    next_index = iter(range(len(texts)))

    async def client() -> None:
        for i in next_index:
            body = {"model": model, "prompt": texts[i], "max_tokens": max_tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}, "logit_bias": bias, "cache_prompt": True}
            results[i] = await _stream_completion(parts.hostname, parts.port, body)

    async def all_clients() -> None:
        await asyncio.gather(*(client() for _ in range(clients)))

    started = time.perf_counter()
    try:
        _run(all_clients())
    except Exception as e:  # noqa: BLE001 - the run stops; the first failure is reported
        raise SystemExit(f"serve_load: a request to {url} failed: {e}") from e
    run = Run(label, clients, time.perf_counter() - started)
    run.results = [r for r in results if r is not None]
    return run


def prefix_probe(url: str, tokenizer: Tokenizer, n_prefix: int, bias: dict, model: str) -> tuple[Result, Result]:
    """TTFT of two requests sharing an n_prefix-token prefix: the first computes it, the second may reuse it."""
    words = []
    while len(tokenizer.encode(" ".join(words).encode(), add_bos=True)) < n_prefix:
        words += FILLER.split()[:10]
    prefix = " ".join(words)
    bodies = [{"model": model, "prompt": f"{prefix}\nQuestion: {q}\nAnswer:", "max_tokens": 4, "temperature": 0,
               "stream": True, "stream_options": {"include_usage": True}, "logit_bias": bias, "cache_prompt": True}
              for q in ("what is the first book about?", "name a colour from the garden.")]
    return stream_completion(url, bodies[0]), stream_completion(url, bodies[1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(kind: str, binary: str | None, model: Path, parallel: int, threads: int, n_ctx: int):
    port = _free_port()
    if kind == "pyllm":
        cmd = [sys.executable, "-m", "pyllm.cli", "serve", str(model), "--port", str(port), "--parallel",
               str(parallel), "-c", str(n_ctx), "-t", str(threads), "--alias", "bench"]
    else:
        # llama-server's -c is the total context, shared by its -np slots
        cmd = [binary, "-m", str(model), "--port", str(port), "-np", str(parallel), "-c", str(n_ctx * parallel),
               "-t", str(threads), "-tb", str(threads), "--alias", "bench", "--log-disable"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            response = http_request(url, "GET", "/health", timeout=2)
            response.read()
            if response.status == 200:
                return proc, url
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {proc.returncode}: {' '.join(cmd)}")
        time.sleep(0.25)
    proc.kill()
    raise RuntimeError(f"{kind} server did not become healthy")


def p99(values: list[float]) -> float:
    """The 99th percentile, nearest rank (the largest value when there are fewer than 51)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{1e3 * statistics.fmean(values):8.0f} {1e3 * statistics.median(values):8.0f} {1e3 * p99(values):8.0f}"


def report(run: Run) -> None:
    rs = run.results
    print(f"\n== {run.label}: {run.clients} concurrent client(s), {len(rs)} requests, {run.wall:.1f} s")
    print(f"  request throughput   {len(rs) / run.wall:8.3f} req/s")
    print(f"  output throughput    {run.output_tokens / run.wall:8.2f} tok/s")
    print("                           mean   median      p99   (ms)")
    print(f"  TTFT                 {_ms([r.ttft for r in rs])}")
    print(f"  TPOT                 {_ms([r.tpot for r in rs if r.tpot is not None])}")
    print(f"  E2E latency          {_ms([r.e2e for r in rs])}")
    print(f"  decode rate          {decode_rate(run):8.2f} tok/s (clients / median TPOT)")


def decode_rate(run: Run) -> float:
    """The streams' aggregate tokens/s while generating: clients / median TPOT."""
    tpots = [r.tpot for r in run.results if r.tpot is not None]
    return run.clients / statistics.median(tpots) if tpots else 0.0


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=catalogue.SMALL_MODEL, help="path or catalogue name")
    parser.add_argument("--clients", default="1,4", help="comma-separated client counts (default 1,4)")
    parser.add_argument("--requests", type=int, default=8, help="requests per run (default 8)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="times through the client counts (default 3)")
    parser.add_argument("--n-ctx", type=int, default=2048, help="context per sequence")
    parser.add_argument("--prefix-tokens", type=int, default=400)
    parser.add_argument("--prompts", choices=["mixed", "short"], default="mixed",
                        help="prompt lengths: mixed (short, medium, long) or short only (decode-bound)")
    parser.add_argument("--llama-server", help="path of llama.cpp's llama-server, to measure side by side")
    parser.add_argument("--url", help="measure this running server (its root, e.g. http://127.0.0.1:8080) instead of "
                        "starting servers")
    parser.add_argument("--json", dest="json_path", type=Path, help="write the summary here as JSON")
    parser.add_argument("--plot", dest="plot_path", type=Path,
                        help="draw throughput and TTFT p99 against concurrent clients into this PNG (needs matplotlib)")
    parser.add_argument("--note", default="", help="a line for the picture's foot, e.g. how busy the machine was")
    parser.add_argument("--replot", type=Path, help="a saved --json to draw (with --plot) instead of measuring")
    args = parser.parse_args()
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
        if args.plot_path is None:
            parser.error("--replot draws into --plot OUT.png")
        saved = json.loads(args.replot.read_text())
        draw(saved["results"], saved["settings"], args.plot_path, args.note)
        return

    model = catalogue.resolve(args.model)
    with GGUFFile(model) as f:
        tokenizer = Tokenizer.from_gguf(f)
    bias = {str(t): -100 for t in tokenizer.eog_ids}  # fixed-length answers
    texts = prompts(args.requests, args.prompts)
    counts = [int(c) for c in args.clients.split(",")]
    kinds = [("pyllm", None)] + ([("llama.cpp", args.llama_server)] if args.llama_server else [])
    if args.url:
        kinds = [("server", None)]
    served_name = "bench"  # the alias the servers started here get
    if args.url:  # a running server: ask it what its model is called
        response = http_request(args.url, "GET", "/v1/models", timeout=10)
        listing = json.loads(response.read() or b"{}") if response.status == 200 else {}
        if not listing.get("data"):
            raise SystemExit(f"serve_load: {args.url} has no /v1/models list (HTTP {response.status}); "
                             "--url takes the server's root, e.g. http://127.0.0.1:8080")
        served_name = listing["data"][0]["id"]
    summary = []
    rows: list[dict] = []  # the --json summary's results
    for kind, binary in kinds:
        proc = None
        if args.url:
            url = args.url.rstrip("/")
        else:
            proc, url = start_server(kind, binary, model, max(counts), args.threads, args.n_ctx)
        try:
            run_load(url, kind, 1, texts[:1], 4, bias, served_name)  # warm-up
            runs: dict[int, list[Run]] = {c: [] for c in counts}
            reference: list[str] | None = None
            same = {c: 0 for c in counts}
            for r in range(args.rounds):
                for clients in counts if r % 2 == 0 else counts[::-1]:
                    run = run_load(url, kind, clients, texts, args.max_tokens, bias, served_name)
                    report(run)
                    runs[clients].append(run)
                    answers = [res.text for res in run.results]
                    reference = reference or answers
                    same[clients] += sum(a == b for a, b in zip(answers, reference, strict=False))
            cold, warm = prefix_probe(url, tokenizer, args.prefix_tokens, bias, served_name)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
        base = counts[0]
        for clients in counts:
            rates = [run.output_tokens / run.wall for run in runs[clients]]
            decode = [decode_rate(run) for run in runs[clients]]
            ttft_p99s = [1e3 * p99([res.ttft for res in run.results]) for run in runs[clients]]
            ttft_p99_ms = statistics.median(ttft_p99s)
            rows.append({
                "server": kind, "clients": clients, "output_tok_s": statistics.median(rates),
                "request_s": statistics.median([len(run.results) / run.wall for run in runs[clients]]),
                "decode_tok_s": statistics.median(decode), "ttft_p99_ms": ttft_p99_ms,
                "ttft_p50_ms": 1e3 * statistics.median([statistics.median(res.ttft for res in run.results)
                                                        for run in runs[clients]]),
                "output_tok_s_rounds": rates, "ttft_p99_ms_rounds": ttft_p99s})
            line = (f"{kind:10s} clients {clients}: {statistics.median(rates):7.2f} tok/s, decode "
                    f"{statistics.median(decode):7.2f} tok/s, TTFT p99 {ttft_p99_ms:6.0f} ms, answers equal to "
                    f"the first run's: {same[clients]}/{len(texts) * args.rounds}")
            if clients != base:
                line += (f"; vs {base} client(s) in the same round: output "
                         + spread([a.output_tokens / a.wall / (b.output_tokens / b.wall)
                                   for a, b in zip(runs[clients], runs[base], strict=True)])
                         + ", decode " + spread([decode_rate(a) / decode_rate(b)
                                                 for a, b in zip(runs[clients], runs[base], strict=True)]))
            summary.append(line)
        summary.append(f"{kind:10s} prefix probe: TTFT cold {1e3 * cold.ttft:.0f} ms, warm {1e3 * warm.ttft:.0f} ms"
                       + (f" ({warm.cached_tokens} cached tokens)" if warm.cached_tokens is not None else ""))
    print("\nsummary (" + f"{model.name}, {args.threads} threads, {args.requests} {args.prompts}-prompt requests of "
          f"{args.max_tokens} tokens a run, {args.rounds} rounds, medians; machine {os.cpu_count()} cpus)")
    for line in summary:
        print("  " + line)
    settings = {"model": model.name, "threads": args.threads, "requests": args.requests, "prompts": args.prompts,
                "max_tokens": args.max_tokens, "rounds": args.rounds, "cpus": os.cpu_count()}
    if args.json_path is not None:
        args.json_path.write_text(json.dumps({"settings": settings, "results": rows}, indent=2) + "\n")
        print(f"wrote {args.json_path}")
    if args.plot_path is not None:
        draw(rows, settings, args.plot_path, args.note)


def draw(rows: list[dict], settings: dict, out: Path, note: str) -> None:
    """The --json summary's rows as a picture: throughput and TTFT p99 against concurrent clients."""
    from pyllm import plot
    threads = plot.threads_phrase([settings["threads"]])
    title = (f"{settings['model']} \u00b7 {plot.cpu_description()} \u00b7 {threads} a server \u00b7 "
             f"{settings['requests']} {settings['prompts']}-prompt requests of {settings['max_tokens']} tokens a run")
    notes = [f"{settings['rounds']} round(s); TTFT p99 of a run's requests (nearest rank). Every run sends the same "
             "prompts: after a server's first run they may be in its prefix cache."] + ([note] if note else [])
    plot.save_figure(plot.benchmark_figure(serve_load=rows, title=title, notes=notes), out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
