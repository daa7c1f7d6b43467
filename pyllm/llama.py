"""`Llama`: the Python API, shaped like llama-cpp-python's.

    from pyllm import Llama
    llm = Llama()                                  # the default catalogue model
    llm.create_chat_completion([{"role": "user", "content": "Hi!"}])["choices"][0]["message"]["content"]

One Llama holds one model and an engine (pyllm.engine) that runs its
generations: up to n_parallel at once, batched, from any number of threads. A
new prompt continues from the longest prefix of it that the prefix cache holds
(a chat's earlier turns, a shared system prompt), so only the new tokens are
computed; `usage.prompt_tokens_details.cached_tokens` says how many were reused.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import catalogue
from .arch import context_length
from .chat_template import render_chat
from .engine import FINISHED, Engine, Request, Step
from .gguf import GGUFFile
from .model import ContextFullError, Model
from .sampling import SamplingParams
from .tokenizer import StreamDecoder, Tokenizer


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


class CompletionStream(Iterator[dict[str, Any]]):
    """The chunks of a streamed completion. Iterating waits for the engine; `poll()` takes what is ready
    without waiting (an event loop's way: Request.on_event says when to look again). `cancel()` (from any
    thread) stops the generation at the engine's next step; the iteration then ends."""

    def __init__(self, request: Request, text: _TextStream, chunks: Callable[[Piece], list[dict[str, Any]]],
                 first: list[dict[str, Any]]) -> None:
        self.request = request
        self._text = text
        self._chunks = chunks   # a piece -> its chunks
        self._ready: deque[dict[str, Any]] = deque(first)
        self._ended = False
        self._owns_request = True  # dropped unread, it cancels the generation (unless another stream took it over)

    def __next__(self) -> dict[str, Any]:
        while not self._ready:
            if self._ended:
                raise StopIteration
            self._take(self.request.next_event())
        return self._ready.popleft()

    def poll(self) -> list[dict[str, Any]] | None:
        """The chunks ready now: [] when none has come yet, None once the stream has ended and all were taken.
        Raises what the engine raised for the request."""
        while not self._ended and (event := self.request.next_event(block=False)) is not None:
            self._take(event)
        if self._ended and not self._ready:
            return None
        ready = list(self._ready)
        self._ready.clear()
        return ready

    def _take(self, event: object) -> None:
        if event is FINISHED:
            self._ended = True
            pieces = self._text.finish(self.request)
        elif isinstance(event, BaseException):
            self._ended = True
            raise event
        else:
            assert isinstance(event, Step)
            pieces = self._text.feed(event)
            if self._text.stopped:
                self._ended = True
                self.request.cancel()
        for piece in pieces:
            self._ready.extend(self._chunks(piece))

    def cancel(self) -> None:
        self.request.cancel()

    def close(self) -> None:
        """Stop and let go (from the iterating thread)."""
        self.request.cancel()
        self._ended = True
        self._ready.clear()

    def __del__(self) -> None:
        if self._owns_request:
            self.request.cancel()  # a stream dropped unread must not keep generating


class Llama:
    def __init__(self, model_path: str | Path | None = None, *, n_ctx: int = 512, n_threads: int | None = None,
                 n_gpu_layers: int = 0, seed: int | None = None, vocab_only: bool = False,
                 verbose: bool = False, n_parallel: int = 1, max_queued: int = 64, prefill_chunk: int = 512,
                 cache_bytes: int = 1 << 30) -> None:
        if n_ctx < 0:
            raise ValueError(f"n_ctx must be >= 0, not {n_ctx}")
        if n_threads is not None and n_threads < 1:
            raise ValueError(f"n_threads must be >= 1, not {n_threads}")
        if n_gpu_layers:
            raise ValueError("n_gpu_layers: GPU offload is not available in this build of pyllm; use 0")
        self.model_path = str(catalogue.resolve(model_path or catalogue.DEFAULT_MODEL))
        self._file = GGUFFile(self.model_path)
        self.metadata = self._file.metadata
        self.tokenizer = Tokenizer.from_gguf(self._file)
        self.verbose = verbose
        self.seed = seed
        self.model: Model | None = None if vocab_only else Model(self._file, n_threads=n_threads)
        train_ctx = self.model.config.n_ctx_train if self.model is not None else context_length(self._file)
        self.n_ctx = n_ctx or train_ctx
        self.n_parallel = n_parallel
        self.max_queued = max_queued
        self.prefill_chunk = prefill_chunk
        self.cache_bytes = cache_bytes
        self._engine: Engine | None = None

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

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return self.tokenizer.decode(list(tokens))

    # ---- evaluation ---------------------------------------------------------------

    def _require_model(self) -> Model:
        if self.model is None:
            raise ValueError("this Llama was opened with vocab_only=True: it has no weights to evaluate")
        return self.model

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """(len(tokens), n_vocab) float32: the logits after each token, from an empty context."""
        model = self._require_model()
        tokens = list(tokens)
        if len(tokens) > self.n_ctx:
            raise ContextFullError(f"{len(tokens)} tokens exceed the context of {self.n_ctx}")
        return model.forward(tokens, model.new_cache(self.n_ctx), logits="all")

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

    def _sampling(self, temperature: float, top_p: float, min_p: float, top_k: int, repeat_penalty: float,
                  frequency_penalty: float, presence_penalty: float, logit_bias: dict | None, seed: int | None,
                  typical_p: float) -> SamplingParams:
        bias = {int(k): float(v) for k, v in (logit_bias or {}).items()}
        return SamplingParams(temperature=temperature, top_p=top_p, min_p=min_p, top_k=top_k,
                              repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                              presence_penalty=presence_penalty, logit_bias=bias or None,
                              seed=self.seed if seed is None else seed, typical_p=typical_p)

    def _run_completion(self, request: Request, stop: list[str]) -> Iterator[tuple[str, Step | None, str | None]]:
        """Yields (text delta, step, finish_reason); the last item carries the finish reason.

        Text is held back while it could still become a stop string, and never split inside a character.
        Leaving the loop early (a closed stream, Ctrl-C) cancels the request.
        """
        try:
            yield from self._completion_text(request, stop)
        finally:
            request.cancel()

    def _completion_text(self, request: Request, stop: list[str]) -> Iterator[Piece]:
        text = _TextStream(self.tokenizer, stop)
        for step in request:
            yield from text.feed(step)
            if text.stopped:
                return
        yield from text.finish(request)

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                          typical_p: float = 1.0, logprobs: int | None = None, echo: bool = False,
                          stop: str | list[str] | None = None, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: int | None = None, logit_bias: dict | None = None,
                          model: str | None = None) -> dict[str, Any] | CompletionStream:
        """Complete a prompt (text, where special-token text becomes those tokens, or token ids)."""
        if suffix is not None:
            raise ValueError("suffix (fill-in-the-middle) is not supported")
        if isinstance(prompt, str):
            prompt_tokens = self.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        else:
            prompt_tokens = [int(t) for t in prompt]
        params = self._sampling(temperature, top_p, min_p, top_k, repeat_penalty, frequency_penalty,
                                presence_penalty, logit_bias, seed, typical_p)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        completion_id = f"cmpl-{uuid.uuid4()}"
        created = int(time.time())
        model_name = model or self.model_path
        prompt_text = self.detokenize(prompt_tokens).decode("utf-8", "replace") if echo else ""
        limit = self.n_ctx - len(prompt_tokens) if max_tokens is None or max_tokens <= 0 else max_tokens
        request = self.submit(prompt_tokens, params, limit, logprobs)

        def chunk(text: str, finish: str | None, lp: dict | None) -> dict[str, Any]:
            return {"id": completion_id, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]}

        def step_logprobs(step: Step | None, text: str) -> dict | None:
            if logprobs is None or step is None:
                return None
            return {"tokens": [text], "text_offset": [0], "token_logprobs": [step.logprob],
                    "top_logprobs": [step.top_logprobs]}

        if stream:
            def chunks(piece: Piece) -> list[dict[str, Any]]:
                text, step, finish = piece
                return [chunk(text, finish, step_logprobs(step, text))] if text or finish else []
            first = [chunk(prompt_text, None, None)] if prompt_text else []
            return CompletionStream(request, _TextStream(self.tokenizer, stops), chunks, first)

        texts, tokens_lp, top_lp, finish = [], [], [], "stop"
        n_completion = 0
        for text, step, reason in self._run_completion(request, stops):
            texts.append(text)
            if step is not None:
                n_completion += 1
                tokens_lp.append(step.logprob)
                top_lp.append(step.top_logprobs)
            finish = reason or finish
        result = chunk(prompt_text + "".join(texts), finish, None)
        if logprobs is not None:
            result["choices"][0]["logprobs"] = {"token_logprobs": tokens_lp, "top_logprobs": top_lp}
        result["usage"] = {"prompt_tokens": len(prompt_tokens), "completion_tokens": n_completion,
                           "total_tokens": len(prompt_tokens) + n_completion,
                           "prompt_tokens_details": {"cached_tokens": request.n_cached}}
        return result

    def __call__(self, prompt: str | list[int], **kwargs: Any) -> dict[str, Any] | CompletionStream:
        return self.create_completion(prompt, **kwargs)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        tok = self.tokenizer
        return render_chat(self._file.get("tokenizer.chat_template"), messages,
                           add_generation_prompt=add_generation_prompt,
                           bos_token=tok.token_text(tok.bos_id) if tok.bos_id is not None and tok.bos_id >= 0 else "",
                           eos_token=tok.token_text(tok.eos_id) if tok.eos_id is not None and tok.eos_id >= 0 else "",
                           family=self._file.get("general.architecture"))

    def create_chat_completion(self, messages: list[dict[str, Any]], temperature: float = 0.2, top_p: float = 0.95,
                               top_k: int = 40, min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: str | list[str] | None = None, seed: int | None = None,
                               max_tokens: int | None = None, presence_penalty: float = 0.0,
                               frequency_penalty: float = 0.0, repeat_penalty: float = 1.0,
                               logit_bias: dict | None = None, logprobs: bool = False,
                               top_logprobs: int | None = None,
                               model: str | None = None) -> dict[str, Any] | CompletionStream:
        """Chat through the file's template (or the family's built-in one)."""
        prompt_tokens = self.tokenize_chat(messages)
        result = self.create_completion(prompt_tokens, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                        min_p=min_p, typical_p=typical_p, stop=stop, stream=stream, seed=seed,
                                        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                                        repeat_penalty=repeat_penalty, top_k=top_k, logit_bias=logit_bias,
                                        logprobs=(top_logprobs or 0) if logprobs else None, model=model)
        if isinstance(result, CompletionStream):
            return self._chat_stream(result)
        assert isinstance(result, dict)
        choice = result["choices"][0]
        return {"id": "chat" + result["id"], "object": "chat.completion", "created": result["created"],
                "model": result["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": choice["text"]},
                             "logprobs": choice["logprobs"], "finish_reason": choice["finish_reason"]}],
                "usage": result["usage"]}

    def tokenize_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt tokens of a chat: its template rendered, special-token text as those tokens, BOS added
        unless the template wrote it."""
        prompt = self.apply_chat_template(messages)
        tok = self.tokenizer
        has_bos = tok.bos_id is not None and tok.bos_id >= 0 and prompt.startswith(tok.token_text(tok.bos_id))
        return self.tokenize(prompt.encode("utf-8"), add_bos=not has_bos, special=True)

    @staticmethod
    def _chat_stream(completion: CompletionStream) -> CompletionStream:
        """The completion's stream with its chunks as chat chunks, the assistant's role in a chunk first."""
        completion_chunks = completion._chunks
        state: dict[str, Any] = {"first": True}

        def chunks(piece: Piece) -> list[dict[str, Any]]:
            out = []
            for c in completion_chunks(piece):
                base = {"id": "chat" + c["id"], "object": "chat.completion.chunk", "created": c["created"],
                        "model": c["model"]}
                if state["first"]:
                    out.append({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                                     "finish_reason": None}]})
                    state["first"] = False
                choice = c["choices"][0]
                delta = {"content": choice["text"]} if choice["text"] else {}
                out.append({**base, "choices": [{"index": 0, "delta": delta, "logprobs": choice["logprobs"],
                                                 "finish_reason": choice["finish_reason"]}]})
            return out
        completion._owns_request = False
        return CompletionStream(completion.request, completion._text, chunks, [])

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
