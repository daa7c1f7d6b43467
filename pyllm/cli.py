"""The `pyllm` command line."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import click

from . import catalogue
from .chat import BASE_MODEL_MAX_TOKENS
from .gguf import GGUFError, GGUFFile
from .kvcache import CACHE_TYPES
from .strings import StringArray


def _open_model(model: str) -> GGUFFile:
    path = _resolve(model)
    try:
        return GGUFFile(path)
    except (FileNotFoundError, GGUFError) as exc:
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
        "kv_cache_bytes": _kv_cache_bytes(f),
    }


# `pyllm info` sizes the KV cache at the default context of run/chat/serve (-c) and at the training context.
INFO_CONTEXT = 4096


def _kv_cache_bytes(f: GGUFFile) -> dict[str, dict[str, int]] | None:
    """A sequence's full KV cache, by cache type, at INFO_CONTEXT tokens and at the training context; None for a
    file pyllm cannot run."""
    from .arch import ArchitectureError, Config
    from .kvcache import KVCache
    try:
        cfg = Config.from_gguf(f)
    except (ArchitectureError, GGUFError):
        return None
    sizes = {}
    for name in ("f16", "q8_0", "q4_0"):
        t = CACHE_TYPES[name]
        if cfg.head_dim % 32 and name != "f16":
            continue
        sizes[name] = {str(n): KVCache.bytes_needed(cfg, n, 512, t, t) for n in (INFO_CONTEXT, cfg.n_ctx_train)}
    return sizes


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
    if summary["kv_cache_bytes"]:
        contexts = list(summary["kv_cache_bytes"]["f16"])
        sizes = ", ".join(f"{name} " + " / ".join(f"{by_ctx[n] / 2**20:.0f}" for n in contexts)
                          for name, by_ctx in summary["kv_cache_bytes"].items())
        click.echo(f"  KV cache       {sizes} MiB at {' / '.join(contexts)} tokens (-ctk/-ctv)")
    for key, value in summary["hyperparameters"].items():
        click.echo(f"  {key:<38} {value}")


# `pyllm run` stops here unless -n says otherwise: a base model has no end-of-turn to stop at.
RUN_MAX_TOKENS = 512


def _sampling_options(max_tokens_default: int | None, max_tokens_help: str):
    """The sampling flags shared by `run` and `chat` (their -n defaults differ)."""
    def decorate(fn):
        options = [
            click.option("--temp", "temperature", type=click.FloatRange(min=0), default=0.8, show_default=True,
                         help="Temperature; 0 is greedy."),
            click.option("--top-k", type=click.IntRange(min=0), default=40, show_default=True,
                         help="Sample from the k most likely tokens (0: all)."),
            click.option("--top-p", type=click.FloatRange(0, 1), default=0.95, show_default=True,
                         help="Nucleus sampling: the most likely tokens up to this probability mass."),
            click.option("--min-p", type=click.FloatRange(0, 1), default=0.05, show_default=True,
                         help="Drop tokens less likely than this times the most likely one."),
            click.option("--repeat-penalty", type=click.FloatRange(min=0, min_open=True), default=1.0,
                         show_default=True, help="Penalty on tokens already in the text (1: off)."),
            click.option("--seed", type=click.IntRange(min=0), default=None,
                         help="Seed for reproducible sampling (default: random)."),
            click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=max_tokens_default,
                         show_default=max_tokens_default is not None, help=max_tokens_help),
            click.option("-c", "--ctx-size", "n_ctx", type=click.IntRange(min=16), default=4096, show_default=True,
                         help="Context size in tokens."),
            click.option("-t", "--threads", type=click.IntRange(min=1), default=None,
                         help="Threads (default: all physical cores)."),
        ]
        for option in reversed(options):
            fn = option(fn)
        return fn
    return decorate


def _cache_type_options(fn):
    """-ctk / -ctv: the KV cache's key and value types, as llama.cpp's flags."""
    for flag, short, what in (("--cache-type-k", "-ctk", "keys"), ("--cache-type-v", "-ctv", "values")):
        fn = click.option(short, flag, type=click.Choice(list(CACHE_TYPES), case_sensitive=False), default="f16",
                          show_default=True,
                          help=f"Type of the KV cache's {what}: q8_0 halves its memory, q4_0 takes about a "
                               "quarter, at some cost in accuracy.")(fn)
    return fn


def _resolve(model: str) -> Path:
    """A model argument's file, pulled first if it is a catalogue name not in the store yet."""
    try:
        return catalogue.resolve(model)
    except (OSError, RuntimeError) as exc:   # no such file, a failed pull, a store that cannot be written
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        raise click.ClickException(f"interrupted; `pyllm pull {model}` resumes the download") from None


def _load(model: str, n_ctx: int, threads: int | None, seed: int | None, cache_type_k: str = "f16",
          cache_type_v: str = "f16"):
    from .llama import Llama
    path = _resolve(model)
    try:
        return Llama(str(path), n_ctx=n_ctx, n_threads=threads, seed=seed, type_k=cache_type_k, type_v=cache_type_v)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc


def _display_name(model: str, llm) -> str:
    return model if model in catalogue.CATALOGUE else Path(llm.model_path).name


@main.command()
@click.argument("model")
@click.argument("prompt")
@click.option("--chat", is_flag=True, help="Apply the model's chat template: PROMPT is a user's message.")
@click.option("--system", default=None, help="A system prompt (implies --chat).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the whole response as JSON (the Python API's completion or chat completion, with usage) "
                   "instead of streaming the text.")
@_sampling_options(RUN_MAX_TOKENS, "Most tokens to generate; generation also stops at the end of the model's turn.")
@_cache_type_options
def run(model: str, prompt: str, chat: bool, system: str | None, as_json: bool, temperature: float, top_k: int,
        top_p: float, min_p: float, repeat_penalty: float, seed: int | None, max_tokens: int, n_ctx: int,
        threads: int | None, cache_type_k: str, cache_type_v: str) -> None:
    """Complete PROMPT with MODEL and stream the text to stdout (PROMPT '-': read it from stdin).

    With --chat (or --system), PROMPT is a question for a chat model, as `pyllm chat` would send it;
    a model without a chat template gets a warning and plain completion.
    """
    from .chat import has_chat_template

    if prompt == "-":
        prompt = click.get_text_stream("stdin").read()
        if prompt.endswith("\n"):  # as a file's last line ends
            prompt = prompt[:-1]
    llm = _load(model, n_ctx, threads, seed, cache_type_k, cache_type_v)
    chat = chat or system is not None
    if chat and not has_chat_template(llm):
        click.echo(f"warning: {_display_name(model, llm)} has no chat template (a base model): PROMPT is completed "
                   f"as plain text", err=True)
        chat = False
    sampling = dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                    repeat_penalty=repeat_penalty, seed=seed)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    try:
        if as_json:
            result = (llm.create_chat_completion(messages, **sampling) if chat
                      else llm.create_completion(prompt, **sampling))
            click.echo(json.dumps(result, indent=2, ensure_ascii=False))
            return
        if chat:
            for chunk in llm.create_chat_completion(messages, stream=True, **sampling):
                click.echo(chunk["choices"][0]["delta"].get("content", ""), nl=False)
        else:
            for chunk in llm.create_completion(prompt, stream=True, **sampling):
                click.echo(chunk["choices"][0]["text"], nl=False)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo()


@main.command()
@click.argument("model", default=catalogue.DEFAULT_MODEL)
@click.option("--system", default=None, help="A system prompt.")
@click.option("--stats", is_flag=True,
              help="After each reply: prompt tokens (and how many came from the cache), prefill tok/s, time to first "
                   "token, decode tok/s, time per output token, KV cache tokens used.")
@_sampling_options(None, "Most tokens per reply (default: until the model ends its turn, at most the context; "
                         f"{BASE_MODEL_MAX_TOKENS} for a model without a chat template).")
@_cache_type_options
def chat(model: str, system: str | None, stats: bool, temperature: float, top_k: int, top_p: float,
         min_p: float, repeat_penalty: float, seed: int | None, max_tokens: int | None, n_ctx: int,
         threads: int | None, cache_type_k: str, cache_type_v: str) -> None:
    """Talk with MODEL (default: the catalogue's default chat model).

    Replies stream as they are generated; earlier turns stay in the KV cache. Commands: /help,
    /set NAME VALUE (temp, top_k, top_p, min_p, repeat_penalty, seed, n), /system TEXT, /reset,
    /save FILE, /load FILE, /stats, /exit. End a line with \\ or wrap text in \"\"\" for several
    lines; on a terminal the arrow keys edit and recall earlier input. Ctrl-C stops a reply,
    Ctrl-D quits. A model without a chat template (a base model) completes each message as text.
    """
    from .chat import ChatSession, Settings, terminal_reader

    llm = _load(model, n_ctx, threads, seed, cache_type_k, cache_type_v)
    settings = Settings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                        repeat_penalty=repeat_penalty, seed=seed, max_tokens=max_tokens)
    session = ChatSession(llm, settings, system=system, stats=stats, out=click.echo,
                          model_name=_display_name(model, llm))
    read = terminal_reader() if sys.stdin.isatty() and sys.stdout.isatty() else input
    session.run(read)


@main.command()
@click.argument("model", default=catalogue.DEFAULT_MODEL)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option("-np", "--parallel", type=click.IntRange(min=1, max=1024), default=4, show_default=True,
              help="Sequences decoded together; further requests queue.")
@click.option("--max-queue", type=click.IntRange(min=0), default=64, show_default=True,
              help="Requests that may wait for a slot; beyond them the server answers 503.")
@click.option("-c", "--ctx-size", "n_ctx", type=click.IntRange(min=16), default=4096, show_default=True,
              help="Context of each sequence, in tokens.")
@click.option("--prefill-chunk", type=click.IntRange(min=1), default=128, show_default=True,
              help="Most prompt tokens read per step, so running streams keep flowing during a long prompt.")
@click.option("--cache-ram", type=click.IntRange(min=0), default=1024, show_default=True,
              help="MiB of finished sequences' KV kept for prompt-prefix reuse.")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Keep the prefix cache here across restarts: read at start, written at shutdown.")
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY' on every request but /health.")
@click.option("--alias", default=None,
              help="Model name /v1/models lists and responses carry (default: the file's name); requests may "
                   "also name the catalogue name the server was started by, or 'default'.")
@click.option("--max-body", type=click.IntRange(min=1), default=8, show_default=True,
              help="Largest request body, in MiB; larger ones get 413.")
@click.option("--allowed-hosts", default="", metavar="NAMES",
              help="Comma-separated host names answered without an API key, besides this machine's addresses and "
                   "localhost ('*': any). Other Host headers get 403, against DNS rebinding.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True, help="info: one line per request (status, tokens, time to first token, total).")
@click.option("-t", "--threads", type=click.IntRange(min=1, max=256), default=None,
              help="Threads (default: all physical cores).")
@_cache_type_options
def serve(model: str, host: str, port: int, parallel: int, max_queue: int, n_ctx: int, prefill_chunk: int,
          cache_ram: int, cache_dir: str | None, api_key: str | None, alias: str | None, max_body: int,
          allowed_hosts: str, log_level: str, threads: int | None, cache_type_k: str, cache_type_v: str) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API (default: the catalogue's default chat model).

    Endpoints: POST /v1/completions, /v1/chat/completions (stream: true for server-sent events),
    /v1/embeddings; GET /v1/models, /health, /metrics; POST /tokenize, /detokenize.
    """
    import logging
    import socket

    import uvicorn

    from .llama import Llama
    from .serve.server import create_app, header_timeout_protocol, shutdown_ending_requests

    try:  # the port first: a port in use is one line, before the model loads
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        listener = socket.socket(family, kind, proto)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("pyllm").setLevel(log_level.upper())
    try:
        llm = Llama(str(catalogue.resolve(model)), n_ctx=n_ctx, n_threads=threads, n_parallel=parallel,
                    max_queued=max_queue, prefill_chunk=prefill_chunk, cache_bytes=cache_ram << 20,
                    type_k=cache_type_k, type_v=cache_type_v)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        listener.close()
        raise click.ClickException(str(exc)) from exc
    if cache_dir is not None and Path(cache_dir).is_dir():
        loaded, refused = llm.load_prefix_cache(cache_dir)
        for line in refused:
            click.echo(f"pyllm serve: --cache-dir: skipped {line}", err=True)
        click.echo(f"pyllm serve: {loaded} cached prompt prefixes read from {cache_dir}", err=True)
    name = alias or Path(llm.model_path).stem
    catalogue_name = (model,) if model in catalogue.CATALOGUE and model != name else ()
    hosts = tuple(h.strip() for h in allowed_hosts.split(",") if h.strip()) + (host,)
    app = create_app(llm, model_name=name, api_key=api_key, other_names=catalogue_name, max_body_bytes=max_body << 20,
                     allowed_hosts=hosts)
    click.echo(f"pyllm serve: {name} on http://{host}:{listener.getsockname()[1]}/v1 ({parallel} parallel "
               f"sequences of {llm.n_ctx()} tokens{', API key required' if api_key else ''})", err=True)
    config = uvicorn.Config(app, log_level="warning" if log_level in ("info", "debug") else log_level,
                            timeout_graceful_shutdown=5, http=header_timeout_protocol())
    server = uvicorn.Server(config)

    def save_prefixes() -> None:
        try:
            saved = llm.save_prefix_cache(cache_dir)
            click.echo(f"pyllm serve: {saved} cached prompt prefixes written to {cache_dir}", err=True)
        except (OSError, ValueError) as exc:
            click.echo(f"pyllm serve: --cache-dir: could not write the prefix cache: {exc}", err=True)

    shutdown_ending_requests(server, llm.engine, then=save_prefixes if cache_dir is not None else None)
    try:
        server.run(sockets=[listener])
    finally:
        llm.close()  # ends what is still running, so that no worker thread waits on it


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
@_cache_type_options
def perplexity(model: str, text_file: Path, n_ctx: int, threads: int | None, as_json: bool, cache_type_k: str,
               cache_type_v: str) -> None:
    """MODEL's perplexity on a text file, as llama.cpp's llama-perplexity computes it.

    The text is cut into chunks of --ctx-size tokens, each evaluated from an empty context (starting
    with BOS when the model uses one). The running estimate goes to stderr after each chunk: on a
    progress bar when stderr is a terminal, else as llama-perplexity prints it; --json prints neither.
    """
    from .perplexity import PerplexityError
    from .perplexity import perplexity as run_perplexity

    try:
        text = text_file.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"cannot read {text_file}: {exc}") from exc
    if text.endswith("\n"):  # as llama.cpp's -f does
        text = text[:-1]
    llm = _load(model, n_ctx, threads, None, cache_type_k, cache_type_v)
    bar = _progress_bar(not as_json, desc="perplexity", unit="chunk")

    def progress(i: int, n_chunks: int, running: float) -> None:
        if bar is not None:
            bar.total = n_chunks
            bar.set_postfix_str(f"PPL {running:.4f}", refresh=False)
            bar.update(1)
        elif not as_json:   # llama-perplexity's log
            click.echo(f"[{i}]{running:.4f},", nl=i == n_chunks, err=True)

    try:
        result = run_perplexity(llm, text, n_ctx, progress=progress)
    except PerplexityError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        if bar is not None:
            bar.close()
    if as_json:
        click.echo(json.dumps(result.as_dict()))
        return
    click.echo(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.ppl_err:.5f}")


@main.command()
@click.argument("source", metavar="IN.gguf")
@click.argument("target", metavar="OUT.gguf")
@click.argument("type_name", metavar="TYPE")
@click.option("--pure", is_flag=True, help="Every quantized tensor in TYPE's base type: no mix, no Q8_0/Q6_K output "
              "(rows that do not fit its blocks still fall back).")
@click.option("--allow-requantize", is_flag=True,
              help="Accept quantized input (dequantized, then quantized again: worse than from F16/F32).")
@click.option("--output-type", "--output-tensor-type", "output_type", metavar="T", default=None,
              help="Tensor type of output.weight (of token_embd.weight when the model ties them), e.g. Q8_0.")
@click.option("--imatrix", "imatrix_file", metavar="FILE", default=None,
              help="Importance matrix from llama-imatrix (GGUF or legacy .dat) to steer the scale searches.")
@click.option("-t", "--threads", type=click.IntRange(min=1), default=None,
              help="Threads (default: all physical cores).")
def quantize(source: str, target: str, type_name: str, pure: bool, allow_requantize: bool, output_type: str | None,
             imatrix_file: str | None, threads: int | None) -> None:
    """Write IN.gguf quantized as TYPE to OUT.gguf, byte for byte as llama.cpp's llama-quantize would.

    \b
    TYPE: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S
          Q4_K_M Q5_K_S Q5_K_M Q6_K F16 BF16 F32 (Q3_K, Q4_K, Q5_K: the _M)

    The K mixes give some tensors more bits (attn_v, ffn_down, the output
    matrix); a tensor whose rows do not fit a type's blocks falls back to one
    that does; 1-D tensors (norms) are copied as they are. OUT.gguf is replaced
    if it exists.
    """
    from .gguf import GGUFError
    from .imatrix import ImatrixError, load_imatrix
    from .quantize import QuantizeError, file_type, imatrix_metadata, quantize_model, tensor_type

    try:
        ftype = file_type(type_name)
        out_type = tensor_type(output_type) if output_type is not None else None
        imatrix = load_imatrix(imatrix_file) if imatrix_file is not None else None
    except (QuantizeError, ImatrixError) as exc:
        raise click.ClickException(str(exc)) from exc
    bar = _progress_bar(True, desc=f"quantize {ftype.name}", unit="B", unit_scale=True, unit_divisor=1024)

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.update(done - bar.n)

    try:
        plans = quantize_model(source, target, ftype, pure=pure, allow_requantize=allow_requantize,
                               output_type=out_type, importance=imatrix.entries if imatrix else None,
                               extra_metadata=imatrix_metadata(imatrix_file, imatrix) if imatrix else None,
                               n_threads=threads, progress=progress)
    except (QuantizeError, GGUFError) as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"cannot write {target}: {exc.strerror or exc}") from exc
    finally:
        if bar is not None:
            bar.close()
    types = ", ".join(f"{k} x{v}" for k, v in Counter(p.type.name for p in plans).most_common())
    click.echo(f"{target}: {ftype.name}, {len(plans)} tensors ({types})", err=True)


def _progress_bar(wanted: bool, **kwargs):
    """A tqdm bar on stderr when wanted and stderr is a terminal, else None."""
    if not (wanted and sys.stderr.isatty()):
        return None
    from tqdm import tqdm
    return tqdm(file=sys.stderr, dynamic_ncols=True, **kwargs)


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
@click.option("-d", "--n-depth", default="0", show_default=True, callback=_int_list,
              help="Context depths (comma-separated): tokens put in the cache, untimed, before each pp and tg test.")
@click.option("-r", "--repetitions", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print llama-bench-style JSON records.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw the results into this PNG: decode tok/s and TPOT against depth, TTFT (the pp tests' "
                   "time on an empty cache) against prompt length, prompt tok/s against depth (needs matplotlib: "
                   "pip install 'pyllm[plot]').")
@click.option("--compare", "compare_paths", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="llama-bench JSON (`llama-bench -o json`) to draw beside pyllm's as llama.cpp (with --plot; "
                   "repeatable).")
@click.option("--serve-load", "serve_load_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="`bench/serve_load.py --json` output: adds throughput and TTFT p99 against concurrent clients "
                   "(with --plot).")
@_cache_type_options
def bench(model: str, n_prompt: list[int], n_gen: list[int], threads: list[int] | None, n_depth: list[int],
          repetitions: int, as_json: bool, plot_path: Path | None, compare_paths: tuple[Path, ...],
          serve_load_path: Path | None, cache_type_k: str, cache_type_v: str) -> None:
    """Measure prompt processing (pp) and generation (tg) speed, as llama-bench does.

    With -d, each test runs after that many tokens are in the cache (llama-bench's -d; shown as
    `pp512 @ d1024`). Also reports time to first token and time per output token for a real chat prompt,
    and the process's peak RSS. A progress bar runs on stderr when it is a terminal (not with --json).
    """
    import time

    from . import bench as benchmarks
    from .kernels import physical_cores

    compare: list[dict] = []
    serve_rows: list[dict] = []
    if plot_path is not None:  # checked before the minutes of measuring, not after
        compare, serve_rows = _plot_inputs(plot_path, compare_paths, serve_load_path)
    elif compare_paths or serve_load_path:
        raise click.UsageError("--compare and --serve-load are drawn by --plot: add --plot OUT.png")
    thread_counts = threads or [physical_cores()]
    path = str(_resolve(model))
    n_pp, n_tg = [p for p in n_prompt if p > 0], [n for n in n_gen if n > 0]
    depths = list(dict.fromkeys(n_depth))
    # a step per timed run (and its warm-up), and one for the chat-prompt latency run, per thread count
    bar = _progress_bar(not as_json, desc="bench", unit="run",
                        total=len(thread_counts) * (len(depths) * (len(n_pp) + len(n_tg)) * (repetitions + 1) + 1))

    def step(test: str) -> Callable[[], None]:
        if bar is None:
            return lambda: None
        bar.set_postfix_str(test)
        return lambda: bar.update(1)

    records, latency = [], []
    try:
        for n_threads in thread_counts:
            llm = _load(path, max([*n_prompt, *n_gen, 64]) + 64, n_threads, None, cache_type_k, cache_type_v)
            assert llm.model is not None
            for d in depths:
                for p in n_pp:
                    records.append(benchmarks.bench_prompt(
                        llm.model, path, p, n_threads, repetitions, n_depth=d,
                        on_run=step(f"{benchmarks.test_title(p, 0, d)}, {n_threads} threads")))
                for n in n_tg:
                    records.append(benchmarks.bench_generation(
                        llm.model, path, n, n_threads, repetitions, n_depth=d,
                        on_run=step(f"{benchmarks.test_title(0, n, d)}, {n_threads} threads")))
            done = step(f"chat prompt, {n_threads} threads")
            start, stamps = time.perf_counter(), []
            messages = [{"role": "user", "content": "Write a short poem about the sea."}]
            try:
                prompt = llm.apply_chat_template(messages)
            except ValueError:
                prompt = "Write a short poem about the sea."
            for _ in llm.create_completion(prompt, max_tokens=32, temperature=0, stream=True):
                stamps.append(time.perf_counter())
            done()
            if stamps:
                ttft = stamps[0] - start
                tpot = (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1)
                latency.append({"n_threads": n_threads, "ttft_ms": 1e3 * ttft, "tpot_ms": 1e3 * tpot})
            llm.close()
    finally:
        if bar is not None:
            bar.close()
    rss = benchmarks.peak_rss_bytes()
    if plot_path is not None:
        _draw_bench(plot_path, [r.to_json() for r in records], compare, serve_rows)
    wrote = f"wrote {plot_path}" if plot_path is not None else ""
    if as_json:
        click.echo(json.dumps([r.to_json() for r in records], indent=2))
        if wrote:
            click.echo(wrote, err=True)
        return
    click.echo("| model | threads | test | t/s |\n|---|---|---|---|")
    for r in records:
        test = benchmarks.test_title(r.n_prompt, r.n_gen, r.n_depth)
        click.echo(f"| {Path(path).name} | {r.n_threads} | {test} | {r.avg_ts:.2f} ± {r.stddev_ts:.2f} |")
    for lat in latency:
        click.echo(f"threads {lat['n_threads']}: TTFT {lat['ttft_ms']:.0f} ms, TPOT {lat['tpot_ms']:.1f} ms "
                   f"(chat prompt, 32 greedy tokens)")
    click.echo(f"peak RSS {rss / 2**20:.0f} MiB")
    if wrote:
        click.echo(wrote, err=True)


def _read_json(path: Path, option: str) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise click.BadParameter(f"{path} is not readable JSON: {exc}", param_hint=option) from None


def _plot_inputs(plot_path: Path, compare_paths: tuple[Path, ...], serve_load_path: Path | None
                 ) -> tuple[list[dict], list[dict]]:
    """(llama-bench records, serve_load rows) for --plot, every file checked and matplotlib found, else a one-line
    error."""
    from .plot import PlotUnavailable, require_matplotlib

    try:
        require_matplotlib()
    except PlotUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    if not plot_path.parent.is_dir():
        raise click.BadParameter(f"directory {plot_path.parent} does not exist", param_hint="--plot")
    if plot_path.suffix.lower() != ".png":
        raise click.BadParameter(f"{plot_path.name} is not a .png file name", param_hint="--plot")
    compare: list[dict] = []
    for compare_path in compare_paths:
        records = _read_json(compare_path, "--compare")
        wanted = ("n_prompt", "n_gen", "n_threads", "avg_ns")
        if not (isinstance(records, list) and records
                and all(isinstance(r, dict) and all(k in r for k in wanted) for r in records)):
            raise click.BadParameter(f"{compare_path} holds no llama-bench records (llama-bench -o json)",
                                     param_hint="--compare")
        compare += records
    serve_rows: list[dict] = []
    if serve_load_path is not None:
        summary = _read_json(serve_load_path, "--serve-load")
        rows = summary.get("results") if isinstance(summary, dict) else None
        wanted = ("server", "clients", "output_tok_s", "ttft_p99_ms")
        if not (isinstance(rows, list) and rows and all(isinstance(r, dict) and all(k in r for k in wanted)
                                                        for r in rows)):
            raise click.BadParameter(f"{serve_load_path} is not `bench/serve_load.py --json` output",
                                     param_hint="--serve-load")
        serve_rows = rows
    return compare, serve_rows


def _draw_bench(plot_path: Path, records: list[dict], compare: list[dict], serve_rows: list[dict]) -> None:
    from . import plot

    threads = sorted({r["n_threads"] for r in records})
    title = " · ".join(part for part in (
        Path(records[0]["model_filename"]).name if records else "",
        plot.cpu_description(), plot.threads_phrase(threads)) if part)
    try:
        figure = plot.benchmark_figure({"pyllm": records, "llama.cpp": compare}, serve_rows, title=title)
    except ValueError as exc:  # no tests ran (-p 0 -n 0) and nothing was given to compare
        raise click.ClickException(f"--plot: {exc}") from None
    plot.save_figure(figure, plot_path)


@main.command()
@click.argument("name", default=catalogue.DEFAULT_MODEL)
def pull(name: str) -> None:
    """Fetch catalogue model NAME (`pyllm list`; default: the default chat model) into the local store.

    A progress bar shows on stderr when it is a terminal. An interrupted pull resumes where it stopped
    when run again; nothing appears under the model's file name until the whole file checks out.
    """
    if name not in catalogue.CATALOGUE:
        raise click.BadParameter(f"{name!r} is not in the catalogue: {', '.join(sorted(catalogue.CATALOGUE))}",
                                 param_hint="NAME")
    try:
        path = catalogue.pull(name, log=lambda msg: click.echo(msg, err=True))
    except (OSError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        raise click.ClickException(f"interrupted; `pyllm pull {name}` resumes the download") from None
    click.echo(str(path))


@main.command("list")
def list_models() -> None:
    """List the catalogue and which models are in the store."""
    click.echo(f"model store: {catalogue.store_dir()}")
    for name, entry in sorted(catalogue.CATALOGUE.items()):
        state = "pulled    " if catalogue.local_path(name) else "not pulled"
        default = " (default)" if name == catalogue.DEFAULT_MODEL else ""
        click.echo(f"  {name:<30} {catalogue.human_bytes(entry.size):>10}  {state}  {entry.description}{default}")


if __name__ == "__main__":
    sys.exit(main())
