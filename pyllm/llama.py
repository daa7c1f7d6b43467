"""`Llama`: the Python API, shaped like llama-cpp-python's.

    from pyllm import Llama
    llm = Llama()                                  # the default catalogue model
    llm.create_chat_completion([{"role": "user", "content": "Hi!"}])["choices"][0]["message"]["content"]

One Llama holds one model and one KV cache. A new prompt reuses the cached
prefix it shares with the previous one (a chat's earlier turns), so only the
new tokens are computed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import catalogue
from .chat_template import render_chat
from .gguf import GGUFFile
from .kvcache import KVCache
from .model import ContextFullError, Model
from .sampling import Sampler, SamplingParams
from .tokenizer import StreamDecoder, Tokenizer


@dataclass
class _Step:
    """One generated token, as the completion loop reports it."""
    token: int
    text: bytes
    logprob: float | None
    top_logprobs: dict[str, float] | None


def _stop_prefix_suffix(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a stop string (to hold back)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


class Llama:
    def __init__(self, model_path: str | Path | None = None, *, n_ctx: int = 512, n_threads: int | None = None,
                 n_gpu_layers: int = 0, seed: int | None = None, vocab_only: bool = False,
                 verbose: bool = False) -> None:
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
        train_ctx = int(self._file.get(f"{self._file.get('general.architecture')}.context_length", 2048))
        self.n_ctx = n_ctx or train_ctx
        self._cache: KVCache | None = None
        self._cached_tokens: list[int] = []

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

    def _prefill(self, tokens: list[int]) -> np.ndarray:
        """Bring the cache to `tokens` (reusing the shared prefix) and return the last token's logits."""
        model = self._require_model()
        if self._cache is None:
            self._cache = model.new_cache(self.n_ctx)
        shared = 0
        for a, b in zip(self._cached_tokens, tokens, strict=False):
            if a != b:
                break
            shared += 1
        shared = min(shared, len(tokens) - 1)  # recompute at least the last token for its logits
        shared = self._cache.truncate(shared)
        self._cached_tokens = self._cached_tokens[:shared]
        logits = model.forward(tokens[shared:], self._cache)
        self._cached_tokens = list(tokens)
        return logits

    def _context_shift(self, prompt: list[int]) -> None:
        """The context is full: keep the BOS (if any), drop the older half of the rest, go on."""
        assert self._cache is not None
        n_keep = 1 if prompt and prompt[0] == self.tokenizer.bos_id else 0
        n_discard = (self._cache.n_used - n_keep) // 2
        self._cache.shift(n_keep, n_discard)
        if self.verbose:
            print(f"pyllm: context full, dropped {n_discard} tokens after the first {n_keep}")
        # the shifted cache is not what a fresh prompt would compute: no prefix reuse from it
        self._cached_tokens = [-1] * self._cache.n_used

    def _decode_one(self, token: int) -> np.ndarray:
        assert self._cache is not None and self.model is not None
        logits = self.model.forward([token], self._cache)
        self._cached_tokens.append(token)
        return logits

    def generate(self, tokens: list[int], params: SamplingParams, max_tokens: int,
                 n_logprobs: int | None = None) -> Iterator[_Step]:
        """Sample up to max_tokens tokens after `tokens`, stopping at an end-of-generation token."""
        if not tokens:
            raise ValueError("the prompt is empty: give at least one token")
        if len(tokens) >= self.n_ctx:
            raise ContextFullError(f"the prompt has {len(tokens)} tokens; the context holds {self.n_ctx}")
        sampler = Sampler(params)
        history = list(tokens)
        logits = self._prefill(tokens)
        for _ in range(max_tokens):
            token = sampler.sample(logits, history)
            logprob, top = None, None
            if n_logprobs is not None:
                logprob, top_ids = sampler.logprobs(logits, token, n_logprobs)
                top = {self.tokenizer.token_to_piece(t).decode("utf-8", "replace"): lp for t, lp in top_ids.items()}
            if self.tokenizer.is_eog(token):
                return
            yield _Step(token, self.tokenizer.token_to_piece(token), logprob, top)
            history.append(token)
            if self._cache is not None and self._cache.n_used >= self.n_ctx:
                self._context_shift(tokens)
            logits = self._decode_one(token)

    # ---- completions ------------------------------------------------------------

    def _sampling(self, temperature: float, top_p: float, min_p: float, top_k: int, repeat_penalty: float,
                  frequency_penalty: float, presence_penalty: float, logit_bias: dict | None, seed: int | None,
                  typical_p: float) -> SamplingParams:
        bias = {int(k): float(v) for k, v in (logit_bias or {}).items()}
        return SamplingParams(temperature=temperature, top_p=top_p, min_p=min_p, top_k=top_k,
                              repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                              presence_penalty=presence_penalty, logit_bias=bias or None,
                              seed=self.seed if seed is None else seed, typical_p=typical_p)

    def _run_completion(self, prompt_tokens: list[int], *, max_tokens: int | None, stop: list[str],
                        params: SamplingParams,
                        n_logprobs: int | None) -> Iterator[tuple[str, _Step | None, str | None]]:
        """Yields (text delta, step, finish_reason); the last item carries the finish reason.

        Text is held back while it could still become a stop string, and never split inside a character.
        """
        limit = self.n_ctx - len(prompt_tokens) if max_tokens is None or max_tokens <= 0 else max_tokens
        decoder = StreamDecoder(self.tokenizer, continuation=True)  # the text as generated, no clean-up
        pending = ""
        n_generated = 0
        for step in self.generate(prompt_tokens, params, limit, n_logprobs):
            n_generated += 1
            pending += decoder.feed(step.token)
            hit = min((pending.find(s) for s in stop if s and s in pending), default=-1)
            if hit >= 0:
                yield pending[:hit], step, None
                yield "", None, "stop"
                return
            safe = len(pending) - _stop_prefix_suffix(pending, stop)
            yield pending[:safe], step, None
            pending = pending[safe:]
        pending += decoder.flush()
        finish = "length" if n_generated >= limit else "stop"
        yield pending, None, finish

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                          typical_p: float = 1.0, logprobs: int | None = None, echo: bool = False,
                          stop: str | list[str] | None = None, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: int | None = None, logit_bias: dict | None = None,
                          model: str | None = None) -> dict[str, Any] | Iterator[dict[str, Any]]:
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
        events = self._run_completion(prompt_tokens, max_tokens=max_tokens, stop=stops, params=params,
                                      n_logprobs=logprobs)

        def chunk(text: str, finish: str | None, lp: dict | None) -> dict[str, Any]:
            return {"id": completion_id, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]}

        def step_logprobs(step: _Step | None, text: str) -> dict | None:
            if logprobs is None or step is None:
                return None
            return {"tokens": [text], "text_offset": [0], "token_logprobs": [step.logprob],
                    "top_logprobs": [step.top_logprobs]}

        if stream:
            def streamer() -> Iterator[dict[str, Any]]:
                if prompt_text:
                    yield chunk(prompt_text, None, None)
                for text, step, finish in events:
                    if text or finish:
                        yield chunk(text, finish, step_logprobs(step, text))
            return streamer()

        texts, tokens_lp, top_lp, finish = [], [], [], "stop"
        n_completion = 0
        for text, step, reason in events:
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
                           "total_tokens": len(prompt_tokens) + n_completion}
        return result

    def __call__(self, prompt: str | list[int], **kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
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
                               model: str | None = None) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """Chat through the file's template (or the family's built-in one)."""
        prompt = self.apply_chat_template(messages)
        prompt_tokens = self.tokenize(prompt.encode("utf-8"), add_bos=not self._starts_with_bos(prompt), special=True)
        result = self.create_completion(prompt_tokens, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                        min_p=min_p, typical_p=typical_p, stop=stop, stream=stream, seed=seed,
                                        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                                        repeat_penalty=repeat_penalty, top_k=top_k, logit_bias=logit_bias,
                                        logprobs=(top_logprobs or 0) if logprobs else None, model=model)
        if stream:
            return self._chat_stream(result)  # type: ignore[arg-type]
        assert isinstance(result, dict)
        choice = result["choices"][0]
        return {"id": "chat" + result["id"], "object": "chat.completion", "created": result["created"],
                "model": result["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": choice["text"]},
                             "logprobs": choice["logprobs"], "finish_reason": choice["finish_reason"]}],
                "usage": result["usage"]}

    def _starts_with_bos(self, prompt: str) -> bool:
        tok = self.tokenizer
        return tok.bos_id is not None and tok.bos_id >= 0 and prompt.startswith(tok.token_text(tok.bos_id))

    @staticmethod
    def _chat_stream(chunks: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        first = True
        for c in chunks:
            base = {"id": "chat" + c["id"], "object": "chat.completion.chunk", "created": c["created"],
                    "model": c["model"]}
            if first:
                yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                            "finish_reason": None}]}
                first = False
            choice = c["choices"][0]
            delta = {"content": choice["text"]} if choice["text"] else {}
            yield {**base, "choices": [{"index": 0, "delta": delta, "logprobs": choice["logprobs"],
                                        "finish_reason": choice["finish_reason"]}]}

    def reset(self) -> None:
        """Forget the cached prompt."""
        self._cached_tokens = []
        if self._cache is not None:
            self._cache.clear()

    def close(self) -> None:
        self.model = None
        self._cache = None
        self._file.close()

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
