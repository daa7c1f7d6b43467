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

import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from . import catalogue
from . import params as check
from .arch import context_length
from .embeddings import Pooling, declared_pooling, pool
from .gguf import GGUFFile
from .grammar import LlamaGrammar, VocabIndex
from .kvcache import KVCache
from .logprobs import LogprobTrack, chat_shape, completion_shape
from .memory import available_bytes, format_bytes
from .model import ContextFullError, Logits, Model
from .params import ParamError, ParamTypeError
from .sampling import SamplingParams
from .serve.engine import FINISHED, Engine, Request, Step
from .state import LlamaState, model_identity
from .text.chat_template import ChatTemplateError, render_chat_bounded, validate_messages
from .text.tokenizer import StreamDecoder, Tokenizer
from .tools import history_for_template, instructions, parse_tool_calls, setup_tools


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


def _timings(request: Request, finished_at: float) -> dict[str, Any]:
    """llama-server's `timings` of a finished request: prompt tokens computed (cache_n came from the prefix cache)
    and the time to the first token; tokens generated and the time after the first."""
    first = request.first_token_at if request.first_token_at is not None else finished_at
    prompt_ms, predicted_ms = 1e3 * (first - request.submitted_at), 1e3 * (finished_at - first)
    return {"prompt_n": len(request.prompt) - request.n_cached, "cache_n": request.n_cached, "prompt_ms": prompt_ms,
            "predicted_n": request.n_generated, "predicted_ms": predicted_ms}


class Llama:
    def __init__(self, model_path: str | os.PathLike[str] | None = None, *, n_ctx: int = 512,
                 n_threads: int | None = None, n_gpu_layers: int = 0, seed: int | None = None,
                 vocab_only: bool = False, verbose: bool = False, n_parallel: int = 1, max_queued: int = 64,
                 prefill_chunk: int = 512, cache_bytes: int = 1 << 30, embedding: bool = False,
                 pooling_type: str | None = None) -> None:
        """Load a model: a GGUF path, or a catalogue name (pulled first if needed); None: the default model.

        n_ctx: tokens each sequence holds (0: the model's training context); n_parallel sequences decode together
        (the engine's slots), up to max_queued more wait; prefill_chunk: most prompt tokens read in one step;
        cache_bytes: the prefix cache's budget. embedding: accepted for llama-cpp-python's callers (embed works
        either way); pooling_type: "mean", "cls" or "last" for embeddings (None: the file's, pyllm.embeddings).
        Every argument is checked here (ParamError / ParamTypeError naming
        it), and so is the memory the KV caches would take once full.
        """
        if model_path is not None and not isinstance(model_path, str | os.PathLike):
            raise ParamTypeError(f"model_path must be a path or a catalogue name, not {type(model_path).__name__}",
                                 "model_path")
        n_ctx = check.integer("n_ctx", n_ctx, minimum=0, maximum=MAX_CTX)
        self.n_threads = check.integer("n_threads", n_threads, minimum=1, maximum=MAX_THREADS, optional=True)
        if check.integer("n_gpu_layers", n_gpu_layers):
            raise ParamError("n_gpu_layers: GPU offload is not available in this build of pyllm; use 0",
                             "n_gpu_layers")
        self.seed = check.integer("seed", seed, minimum=0, optional=True)
        vocab_only = check.boolean("vocab_only", vocab_only)
        self.verbose = check.boolean("verbose", verbose)
        self.n_parallel = check.integer("n_parallel", n_parallel, minimum=1, maximum=MAX_PARALLEL)
        self.max_queued = check.integer("max_queued", max_queued, minimum=0)
        prefill_chunk = check.integer("prefill_chunk", prefill_chunk, minimum=1)
        self.cache_bytes = check.integer("cache_bytes", cache_bytes, minimum=0)
        self.embedding = check.boolean("embedding", embedding)
        if pooling_type is not None and pooling_type not in tuple(Pooling):
            raise ParamError(f"pooling_type must be one of {', '.join(Pooling)}, not {pooling_type!r}", "pooling_type")
        self.model_path = str(catalogue.resolve(model_path or catalogue.DEFAULT_MODEL))
        self._file = GGUFFile(self.model_path)
        try:
            self.metadata = self._file.metadata
            self.pooling = Pooling(pooling_type) if pooling_type is not None else declared_pooling(self.metadata)
            self.tokenizer = Tokenizer.from_gguf(self._file)
            self.model: Model | None = None if vocab_only else Model(self._file, n_threads=self.n_threads)
            train_ctx = self.model.config.n_ctx_train if self.model is not None else context_length(self._file)
            self.n_ctx = n_ctx or train_ctx
            self.prefill_chunk = min(prefill_chunk, self.n_ctx)
            if self.model is not None:
                self._check_memory(self.model)
        except BaseException:
            self._file.close()
            raise
        self._engine: Engine | None = None
        # the last completion's requests: the context save_state saves is the cache the last of them left
        self._last_requests: list[Request] = []
        self._model_id: str | None = None
        self._embed_lock = threading.Lock()

    def _check_memory(self, model: Model) -> None:
        """Refuse a context whose KV caches (full, one per sequence slot) and one batch's scratch could not fit."""
        cfg = model.config
        per_sequence = KVCache.bytes_needed(cfg, self.n_ctx, self.prefill_chunk)
        # a prompt chunk's activations: the blocks' scratch (see csrc/block.c) and a row of logits
        q_row, kv_row = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
        batch = 4 * self.prefill_chunk * (cfg.n_embd + max(2 * q_row + 2 * kv_row, 2 * cfg.n_ff)) + 4 * model.n_vocab
        needed = self.n_parallel * per_sequence + batch
        available = available_bytes()
        if needed > available:
            slots = f" x {self.n_parallel} sequences" if self.n_parallel > 1 else ""
            raise ParamError(f"n_ctx={self.n_ctx} needs {format_bytes(needed)} of memory (a KV cache of "
                             f"{format_bytes(per_sequence)}{slots}), more than the {format_bytes(available)} "
                             "available: use a smaller n_ctx", "n_ctx")

    @classmethod
    def from_catalogue(cls, name: str = catalogue.DEFAULT_MODEL, **kwargs: Any) -> Llama:
        """A catalogue model by name (`pyllm list`), pulled into the model store first if needed."""
        if name not in catalogue.CATALOGUE:
            known = ", ".join(sorted(catalogue.CATALOGUE))
            raise ValueError(f"unknown catalogue model {name!r}; the catalogue has: {known}")
        return cls(catalogue.pull(name), **kwargs)

    # ---- vocabulary ---------------------------------------------------------------

    def n_vocab(self) -> int:
        return self.tokenizer.n_vocab

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
        if len(tokens) > self.n_ctx:
            raise ContextFullError(f"{len(tokens)} tokens exceed the context of {self.n_ctx}", "tokens")
        return model.prefill(tokens, model.new_cache(self.n_ctx), logits=Logits.ALL)

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
        model = self._require_model()
        normalize, truncate = check.boolean("normalize", normalize), check.boolean("truncate", truncate)
        inputs, single = self._embedding_inputs(input)
        vectors, count = [], 0
        for i, tokens in enumerate(inputs):
            if len(tokens) > self.n_ctx:
                if not truncate:
                    raise ContextFullError(f"input{'' if single else f'[{i}]'}: {len(tokens)} tokens exceed the "
                                           f"context of {self.n_ctx}", "input")
                tokens = tokens[:self.n_ctx]
            with self._embed_lock:  # one at a time: each takes every thread
                hidden = model.hidden_states(tokens, model.new_cache(len(tokens), min(len(tokens),
                                                                                      self.prefill_chunk)))
            vectors.append(pool(hidden, self.pooling, normalize).tolist())
            count += len(tokens)
        result = vectors[0] if single else vectors
        return (result, count) if return_count else result

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
            self._engine = Engine(self._require_model(), self.tokenizer, self.n_ctx, n_parallel=self.n_parallel,
                                  max_queued=self.max_queued, prefill_chunk=self.prefill_chunk,
                                  cache_bytes=self.cache_bytes)
            if self.verbose:
                print(f"pyllm: engine with {self.n_parallel} sequence slot(s) of {self.n_ctx} tokens")
        return self._engine

    def submit(self, tokens: list[int], params: SamplingParams, max_tokens: int,
               n_logprobs: int | None = None) -> Request:
        """Start generating up to max_tokens tokens after `tokens` (stopping at an end-of-generation token);
        iterate the returned Request for its Steps."""
        return self.engine.submit(list(tokens), params, max_tokens, n_logprobs)

    def generate(self, tokens: list[int], params: SamplingParams, max_tokens: int,
                 n_logprobs: int | None = None) -> Iterator[Step]:
        request = self.submit(tokens, params, max_tokens, n_logprobs)
        try:
            yield from request
        finally:
            request.cancel()

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
        if n_prompt >= self.n_ctx:
            raise ContextFullError(f"the {prompt_param} has {n_prompt} tokens; the context holds {self.n_ctx}",
                                   prompt_param)
        room = self.n_ctx - n_prompt
        if max_tokens is None or max_tokens <= 0:
            return room
        if not context_shift and max_tokens > room:
            raise ContextFullError(f"max_tokens {max_tokens} + {n_prompt} prompt tokens exceed the context of "
                                   f"{self.n_ctx}", "max_tokens")
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
                                grammar=check.grammar(grammar))
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
        requests = self.engine.submit_group(list(prompt_tokens), choice_params, limit, logprobs)
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
            def lane(index: int, request: Request) -> _Lane:
                text, track = _TextStream(self.tokenizer, stops), new_track()

                def chunks(piece: Piece) -> list[dict[str, Any]]:
                    delta, step, finish = piece
                    if track is not None and step is not None:
                        track.add(step.token, step.text, step.logprob, step.top_logprobs)
                    if not delta and not finish:
                        return []
                    entries = None if track is None else track.take(delta, finish is not None, text.stopped)
                    return [chunk(index, delta, finish, entries)]
                return _Lane(request, text, chunks)

            lanes = [lane(index, request) for index, request in enumerate(requests)]
            first = [chunk(i, prompt_text, None, None) for i in range(n)] if prompt_text else []
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
                               tools: list[dict[str, Any]] | None = None, tool_choice: Any = None, *, n: int = 1,
                               context_shift: bool = True) -> dict[str, Any] | CompletionStream:
        """Chat through the file's template (or the family's built-in one).

        response_format: {"type": "json_object"} (any JSON object), {"type": "json_schema", "json_schema":
        {"schema": {...}}}, or {"type": "text"}; grammar: GBNF text or a LlamaGrammar. Give one or neither.
        tools, tool_choice: OpenAI's (see pyllm.tools); calls come back as message.tool_calls with finish_reason
        "tool_calls". Not with stream yet.
        n: choices (1..16), as create_completion's. logprobs=True (top_logprobs: 0..20 alternatives) fills each
        choice's logprobs.content in OpenAI's shape.
        """
        constraint = check.constraint(grammar, response_format)
        setup = setup_tools(tools, tool_choice)
        if setup is not None and setup.grammar is not None:
            if constraint is not None:
                raise ParamError("a required or named tool_choice constrains the output already: give no "
                                 "response_format or grammar with it", "tool_choice")
            constraint = setup.grammar
        if setup is not None and check.boolean("stream", stream):
            raise ParamError("stream: streaming with tools is not supported yet", "stream")
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
            return self._chat_stream(result)
        assert isinstance(result, dict)
        choices = []
        for choice in result["choices"]:
            message: dict[str, Any] = {"role": "assistant", "content": choice["text"]}
            finish = choice["finish_reason"]
            if setup is not None:
                content, calls = parse_tool_calls(choice["text"], setup.names)
                if calls:
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
    def _chat_stream(completion: CompletionStream) -> CompletionStream:
        """The completion's stream with its chunks as chat chunks, each choice's first saying the assistant's
        role."""
        def chat_lane(lane: _Lane) -> _Lane:
            first = [True]

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
                    delta = {"content": choice["text"]} if choice["text"] else {}
                    out.append({**base, "choices": [{"index": choice["index"], "delta": delta,
                                                     "logprobs": choice["logprobs"],
                                                     "finish_reason": choice["finish_reason"]}]})
                return out
            return _Lane(lane.request, lane.text, chunks)

        completion._owns_request = False
        return CompletionStream([chat_lane(lane) for lane in completion.lanes], [])

    # ---- saved state ------------------------------------------------------------

    def model_identity(self) -> str:
        """The model file's identity as saved states record it (pyllm.state.model_identity)."""
        if self._model_id is None:
            self._model_id = model_identity(self.model_path, self._file.data_offset)
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

    def reset(self) -> None:
        """Forget the cached prompts."""
        if self._engine is not None:
            self._engine.prefix_cache.clear()

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
