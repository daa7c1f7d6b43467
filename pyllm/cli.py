"""The `pyllm` command line."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import click

from . import catalogue
from .gguf import GGUFError, GGUFFile
from .strings import StringArray


def _open_model(model: str) -> GGUFFile:
    try:
        return GGUFFile(catalogue.resolve(model))
    except (FileNotFoundError, GGUFError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc


def _summary(f: GGUFFile) -> dict:
    def text(key: str) -> str | None:  # a summary of any file: a key of another type shows as absent
        value = f.get(key)
        return value if isinstance(value, str) else None

    arch = text("general.architecture") or "?"
    n_params = sum(t.n_elements for t in f.tensors.values())
    types = Counter(t.type_name for t in f.tensors.values())
    hyper = {k[len(arch) + 1:]: v for k, v in f.metadata.items()
             if k.startswith(f"{arch}.") and isinstance(v, int | float | str | bool)}
    tokens = f.get("tokenizer.ggml.tokens")
    return {
        "path": str(f.path),
        "file_bytes": f.path.stat().st_size,
        "gguf_version": f.version,
        "architecture": arch,
        "name": text("general.name"),
        "parameters": n_params,
        "tensors": len(f.tensors),
        "tensor_types": dict(types.most_common()),
        "hyperparameters": hyper,
        "tokenizer": text("tokenizer.ggml.model"),
        "vocab_size": len(tokens) if isinstance(tokens, StringArray) else None,
        "chat_template": "tokenizer.chat_template" in f.metadata,
    }


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pyllm")
def main() -> None:
    """pyllm: run quantized GGUF language models on the CPU.

    MODEL arguments take a path to a .gguf file or a catalogue name (see `pyllm list`);
    a catalogue model not yet in the store is pulled first.
    """


@main.command()
@click.argument("model")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def info(model: str, as_json: bool) -> None:
    """Show a model's architecture, size, tensor types and hyperparameters."""
    with _open_model(model) as f:
        summary = _summary(f)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"{summary['name'] or Path(summary['path']).name}  ({summary['path']})")
    click.echo(f"  architecture   {summary['architecture']}")
    click.echo(f"  parameters     {summary['parameters'] / 1e6:.1f} M in {summary['tensors']} tensors")
    click.echo(f"  file           {summary['file_bytes'] / 2**20:.1f} MiB, GGUF v{summary['gguf_version']}")
    click.echo("  tensor types   " + ", ".join(f"{k} x{v}" for k, v in summary["tensor_types"].items()))
    click.echo(f"  tokenizer      {summary['tokenizer']}, {summary['vocab_size']} tokens"
               + (", chat template" if summary["chat_template"] else ""))
    for key, value in summary["hyperparameters"].items():
        click.echo(f"  {key:<38} {value}")


def _sampling_options(fn):
    """The sampling flags shared by `run` and `chat`."""
    options = [
        click.option("--temp", "temperature", type=float, default=None, help="Temperature; 0 is greedy."),
        click.option("--top-k", type=click.IntRange(min=0), default=40, show_default=True),
        click.option("--top-p", type=click.FloatRange(0, 1), default=0.95, show_default=True),
        click.option("--min-p", type=click.FloatRange(0, 1), default=0.05, show_default=True),
        click.option("--repeat-penalty", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True),
        click.option("--seed", type=int, default=None, help="Seed for reproducible sampling."),
        click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=None,
                     help="Most tokens to generate (default: to the end of the context)."),
        click.option("-c", "--ctx-size", "n_ctx", type=click.IntRange(min=16), default=4096, show_default=True),
        click.option("-t", "--threads", type=click.IntRange(min=1), default=None,
                     help="Threads (default: all physical cores)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _load(model: str, n_ctx: int, threads: int | None, seed: int | None):
    from .llama import Llama
    try:
        return Llama(str(catalogue.resolve(model)), n_ctx=n_ctx, n_threads=threads, seed=seed)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc


@main.command()
@click.argument("model")
@click.argument("prompt")
@_sampling_options
def run(model: str, prompt: str, temperature: float | None, top_k: int, top_p: float, min_p: float,
        repeat_penalty: float, seed: int | None, max_tokens: int | None, n_ctx: int, threads: int | None) -> None:
    """Complete PROMPT with MODEL and stream the text to stdout."""
    llm = _load(model, n_ctx, threads, seed)
    try:
        chunks = llm.create_completion(prompt, max_tokens=max_tokens or -1, temperature=0.8 if temperature is None
                                       else temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                       repeat_penalty=repeat_penalty, seed=seed, stream=True)
        for chunk in chunks:
            click.echo(chunk["choices"][0]["text"], nl=False)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo()


@main.command()
@click.argument("model", default=catalogue.DEFAULT_MODEL)
@click.option("--system", default=None, help="A system prompt.")
@click.option("--stats", is_flag=True, help="Print time to first token and tokens/s after each reply.")
@_sampling_options
def chat(model: str, system: str | None, stats: bool, temperature: float | None, top_k: int, top_p: float,
         min_p: float, repeat_penalty: float, seed: int | None, max_tokens: int | None, n_ctx: int,
         threads: int | None) -> None:
    """Talk with MODEL (default: the catalogue's default chat model).

    Replies stream as they are generated; earlier turns stay in the KV cache.
    /reset starts over, /exit (or Ctrl-D) quits, Ctrl-C stops a reply.
    """
    import time

    llm = _load(model, n_ctx, threads, seed)
    click.echo(f"pyllm chat: {Path(llm.model_path).name} ({llm.metadata.get('general.architecture')}), "
               f"context {llm.n_ctx}. /reset, /exit", err=True)
    messages: list[dict] = [{"role": "system", "content": system}] if system else []
    while True:
        try:
            line = input("> ")
        except EOFError:
            click.echo()
            return
        except KeyboardInterrupt:
            click.echo()
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return
        if text == "/reset":
            messages = messages[:1] if system else []
            llm.reset()
            click.echo("(conversation cleared)", err=True)
            continue
        messages.append({"role": "user", "content": text})
        reply, n_tokens, first_at = [], 0, None
        start = time.perf_counter()
        try:
            for chunk in llm.create_chat_completion(
                    messages, stream=True, max_tokens=max_tokens, temperature=0.8 if temperature is None
                    else temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty):
                piece = chunk["choices"][0]["delta"].get("content", "")
                if piece:
                    first_at = first_at or time.perf_counter()
                    n_tokens += 1
                    reply.append(piece)
                    click.echo(piece, nl=False)
        except KeyboardInterrupt:
            click.echo(" [stopped]", nl=False)
        except ValueError as exc:
            click.echo(f"\nerror: {exc}", err=True)
            messages.pop()
            continue
        click.echo()
        messages.append({"role": "assistant", "content": "".join(reply)})
        if stats and first_at is not None:
            elapsed = time.perf_counter() - first_at
            rate = (n_tokens - 1) / elapsed if n_tokens > 1 and elapsed > 0 else float("nan")
            click.echo(f"[ttft {1e3 * (first_at - start):.0f} ms, {rate:.1f} tok/s, {n_tokens} chunks]", err=True)


@main.command()
@click.argument("model", default=catalogue.DEFAULT_MODEL)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option("-np", "--parallel", type=click.IntRange(min=1), default=4, show_default=True,
              help="Sequences decoded together; further requests queue.")
@click.option("--max-queue", type=click.IntRange(min=0), default=64, show_default=True,
              help="Requests that may wait for a slot; beyond them the server answers 503.")
@click.option("-c", "--ctx-size", "n_ctx", type=click.IntRange(min=16), default=4096, show_default=True,
              help="Context of each sequence, in tokens.")
@click.option("--prefill-chunk", type=click.IntRange(min=1), default=128, show_default=True,
              help="Most prompt tokens read per step, so running streams keep flowing during a long prompt.")
@click.option("--cache-ram", type=click.IntRange(min=0), default=1024, show_default=True,
              help="MiB of finished sequences' KV kept for prompt-prefix reuse.")
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY' on every request but /health.")
@click.option("--alias", default=None,
              help="Model name /v1/models lists and responses carry (default: the file's name); requests may "
                   "also name the catalogue name the server was started by, or 'default'.")
@click.option("-t", "--threads", type=click.IntRange(min=1), default=None,
              help="Threads (default: all physical cores).")
def serve(model: str, host: str, port: int, parallel: int, max_queue: int, n_ctx: int, prefill_chunk: int,
          cache_ram: int, api_key: str | None, alias: str | None, threads: int | None) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API (default: the catalogue's default chat model).

    Endpoints: POST /v1/completions, /v1/chat/completions (stream: true for server-sent events),
    GET /v1/models, /health, /metrics; POST /tokenize, /detokenize.
    """
    import uvicorn

    from .llama import Llama
    from .server import create_app

    try:
        llm = Llama(str(catalogue.resolve(model)), n_ctx=n_ctx, n_threads=threads, n_parallel=parallel,
                    max_queued=max_queue, prefill_chunk=prefill_chunk, cache_bytes=cache_ram << 20)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    name = alias or Path(llm.model_path).stem
    catalogue_name = (model,) if model in catalogue.CATALOGUE and model != name else ()
    app = create_app(llm, model_name=name, api_key=api_key, other_names=catalogue_name)
    click.echo(f"pyllm serve: {name} on http://{host}:{port}/v1 ({parallel} parallel sequences of {n_ctx} "
               f"tokens{', API key required' if api_key else ''})", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


@main.command()
@click.argument("model")
@click.argument("text")
@click.option("--no-bos", is_flag=True, help="Do not add the BOS token.")
@click.option("--special/--no-special", default=True, show_default=True,
              help="Parse special-token text (e.g. <|im_start|>) as those tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print the ids as a JSON list.")
def tokenize(model: str, text: str, no_bos: bool, special: bool, as_json: bool) -> None:
    """Show how MODEL's tokenizer splits TEXT."""
    from .llama import Llama
    try:
        llm = Llama(str(catalogue.resolve(model)), vocab_only=True)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    try:  # a vocabulary can lack what the text needs (no byte token for a byte of it)
        ids = llm.tokenize(text.encode("utf-8"), add_bos=not no_bos, special=special)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(ids))
        return
    for i in ids:
        click.echo(f"{i:>8}  {llm.tokenizer.token_to_piece(i, special=True)!r}")


@main.command()
@click.argument("model")
@click.option("-f", "--file", "text_file", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path), help="The text to score (UTF-8).")
@click.option("-c", "--ctx-size", "n_ctx", type=click.IntRange(min=8), default=512, show_default=True,
              help="Tokens per chunk; the second half of each chunk is scored.")
@click.option("-t", "--threads", type=click.IntRange(min=1), default=None,
              help="Threads (default: all physical cores).")
@click.option("--json", "as_json", is_flag=True, help='Print only {"ppl", "n_chunks", "n_ctx"} as JSON.')
def perplexity(model: str, text_file: Path, n_ctx: int, threads: int | None, as_json: bool) -> None:
    """MODEL's perplexity on a text file, as llama.cpp's llama-perplexity computes it.

    The text is cut into chunks of --ctx-size tokens, each evaluated from an empty context (starting
    with BOS when the model uses one); the running estimate is printed to stderr after each chunk.
    """
    from .perplexity import PerplexityError
    from .perplexity import perplexity as run_perplexity

    try:
        text = text_file.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"cannot read {text_file}: {exc}") from exc
    if text.endswith("\n"):  # as llama.cpp's -f does
        text = text[:-1]
    llm = _load(model, n_ctx, threads, None)

    def progress(i: int, n_chunks: int, running: float) -> None:
        if not as_json:
            click.echo(f"[{i}]{running:.4f},", nl=i == n_chunks, err=True)

    try:
        result = run_perplexity(llm, text, n_ctx, progress=progress)
    except PerplexityError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result.as_dict()))
        return
    click.echo(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.ppl_err:.5f}")


def _int_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        values = [int(v) for v in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
    if any(v < 0 for v in values):
        raise click.BadParameter("values must be >= 0")
    return values


@main.command()
@click.argument("model")
@click.option("-p", "--n-prompt", default="512", show_default=True, callback=_int_list,
              help="Prompt lengths for the pp tests (comma-separated; 0 skips).")
@click.option("-n", "--n-gen", default="128", show_default=True, callback=_int_list,
              help="Token counts for the tg tests (comma-separated; 0 skips).")
@click.option("-t", "--threads", default=None, callback=lambda c, p, v: None if v is None else _int_list(c, p, v),
              help="Thread counts (comma-separated; default: all physical cores).")
@click.option("-r", "--repetitions", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print llama-bench-style JSON records.")
def bench(model: str, n_prompt: list[int], n_gen: list[int], threads: list[int] | None, repetitions: int,
          as_json: bool) -> None:
    """Measure prompt processing (pp) and generation (tg) speed, as llama-bench does.

    Also reports time to first token and time per output token for a real chat prompt,
    and the process's peak RSS.
    """
    import time

    from . import bench as benchmarks
    from .kernels import physical_cores

    thread_counts = threads or [physical_cores()]
    path = str(catalogue.resolve(model))
    records, latency = [], []
    for n_threads in thread_counts:
        llm = _load(path, max([*n_prompt, *n_gen, 64]) + 64, n_threads, None)
        assert llm.model is not None
        for p in (p for p in n_prompt if p > 0):
            records.append(benchmarks.bench_prompt(llm.model, path, p, n_threads, repetitions))
        for n in (n for n in n_gen if n > 0):
            records.append(benchmarks.bench_generation(llm.model, path, n, n_threads, repetitions))
        start, stamps = time.perf_counter(), []
        messages = [{"role": "user", "content": "Write a short poem about the sea."}]
        try:
            prompt = llm.apply_chat_template(messages)
        except ValueError:
            prompt = "Write a short poem about the sea."
        for _ in llm.create_completion(prompt, max_tokens=32, temperature=0, stream=True):
            stamps.append(time.perf_counter())
        if stamps:
            ttft = stamps[0] - start
            tpot = (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1)
            latency.append({"n_threads": n_threads, "ttft_ms": 1e3 * ttft, "tpot_ms": 1e3 * tpot})
        llm.close()
    rss = benchmarks.peak_rss_bytes()
    if as_json:
        click.echo(json.dumps([r.to_json() for r in records], indent=2))
        return
    click.echo("| model | threads | test | t/s |\n|---|---|---|---|")
    for r in records:
        test = f"pp{r.n_prompt}" if r.n_prompt else f"tg{r.n_gen}"
        click.echo(f"| {Path(path).name} | {r.n_threads} | {test} | {r.avg_ts:.2f} ± {r.stddev_ts:.2f} |")
    for lat in latency:
        click.echo(f"threads {lat['n_threads']}: TTFT {lat['ttft_ms']:.0f} ms, TPOT {lat['tpot_ms']:.1f} ms "
                   f"(chat prompt, 32 greedy tokens)")
    click.echo(f"peak RSS {rss / 2**20:.0f} MiB")


@main.command()
@click.argument("name", type=click.Choice(sorted(catalogue.CATALOGUE)))
def pull(name: str) -> None:
    """Fetch a catalogue model into the local store (sha256-checked)."""
    try:
        path = catalogue.pull(name, log=lambda msg: click.echo(msg, err=True))
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(str(path))


@main.command("list")
def list_models() -> None:
    """List the catalogue and which models are in the store."""
    click.echo(f"model store: {catalogue.store_dir()}")
    for name, entry in sorted(catalogue.CATALOGUE.items()):
        path = catalogue.local_path(name)
        state = f"{path.stat().st_size / 2**20:7.1f} MiB" if path else "  not pulled"
        default = " (default)" if name == catalogue.DEFAULT_MODEL else ""
        click.echo(f"  {name:<30} {state}  {entry.description}{default}")


if __name__ == "__main__":
    sys.exit(main())
