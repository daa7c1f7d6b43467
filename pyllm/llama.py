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
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from . import catalogue
from . import params as check
from .arch import context_length
from .gguf import GGUFFile
from .grammar import LlamaGrammar, VocabIndex
from .kvcache import KVCache
from .memory import available_bytes, format_bytes
from .model import ContextFullError, Logits, Model
from .params import ParamError, ParamTypeError
from .sampling import SamplingParams
from .serve.engine import FINISHED, Engine, Request, Step
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


# Positions are int32 in the C core; the memory check below refuses far less than this on a real machine.
MAX_CTX = 2**31 - 1
MAX_THREADS = 256  # csrc/threadpool.h PYLLM_MAX_THREADS
MAX_PARALLEL = 1024


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
                 prefill_chunk: int = 512, cache_bytes: int = 1 << 30) -> None:
        """Load a model: a GGUF path, or a catalogue name (pulled first if needed); None: the default model.

        n_ctx: tokens each sequence holds (0: the model's training context); n_parallel sequences decode together
        (the engine's slots), up to max_queued more wait; prefill_chunk: most prompt tokens read in one step;
        cache_bytes: the prefix cache's budget. Every argument is checked here (ParamError / ParamTypeError naming
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
        self.model_path = str(catalogue.resolve(model_path or catalogue.DEFAULT_MODEL))
        self._file = GGUFFile(self.model_path)
        try:
            self.metadata = self._file.metadata
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
                          model: str | None = None, grammar: str | LlamaGrammar | None = None, *,
                          context_shift: bool = True) -> dict[str, Any] | CompletionStream:
        """Complete a prompt (text, where special-token text becomes those tokens, or token ids).

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
                              logit_bias=logit_bias, model=model, context_shift=context_shift, grammar=grammar)

    def _complete(self, prompt_tokens: list[int], prompt_param: str, *, max_tokens: Any, temperature: Any,
                  top_p: Any, min_p: Any, typical_p: Any, logprobs: Any, echo: Any, stop: Any, frequency_penalty: Any,
                  presence_penalty: Any, repeat_penalty: Any, top_k: Any, stream: Any, seed: Any, logit_bias: Any,
                  model: Any, context_shift: Any, grammar: Any = None) -> dict[str, Any] | CompletionStream:
        """A completion of prompt tokens; every argument checked here, once."""
        limit = self._budget(len(prompt_tokens), max_tokens, prompt_param, check.boolean("context_shift",
                                                                                          context_shift))
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
        result["timings"] = _timings(request, time.perf_counter())
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
                               tools: list[dict[str, Any]] | None = None, tool_choice: Any = None, *,
                               context_shift: bool = True) -> dict[str, Any] | CompletionStream:
        """Chat through the file's template (or the family's built-in one).

        response_format: {"type": "json_object"} (any JSON object), {"type": "json_schema", "json_schema":
        {"schema": {...}}}, or {"type": "text"}; grammar: GBNF text or a LlamaGrammar. Give one or neither.
        tools, tool_choice: OpenAI's (see pyllm.tools); calls come back as message.tool_calls with finish_reason
        "tool_calls". Not with stream yet.
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
        n_top = check.integer("top_logprobs", top_logprobs, minimum=0, maximum=self.n_vocab(), optional=True)
        result = self._complete(prompt_tokens, "messages", max_tokens=max_tokens, temperature=temperature,
                                top_p=top_p, min_p=min_p, typical_p=typical_p, stop=stop, stream=stream, seed=seed,
                                frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                                repeat_penalty=repeat_penalty, top_k=top_k, logit_bias=logit_bias,
                                logprobs=(n_top or 0) if check.boolean("logprobs", logprobs) else None,
                                echo=False, model=model, context_shift=context_shift,
                                grammar=constraint)
        if isinstance(result, CompletionStream):
            return self._chat_stream(result)
        assert isinstance(result, dict)
        choice = result["choices"][0]
        message: dict[str, Any] = {"role": "assistant", "content": choice["text"]}
        finish = choice["finish_reason"]
        if setup is not None:
            content, calls = parse_tool_calls(choice["text"], setup.names)
            if calls:
                message, finish = {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"
        return {"id": "chat" + result["id"], "object": "chat.completion", "created": result["created"],
                "model": result["model"],
                "choices": [{"index": 0, "message": message, "logprobs": choice["logprobs"],
                             "finish_reason": finish}],
                "usage": result["usage"], "timings": result["timings"]}

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
