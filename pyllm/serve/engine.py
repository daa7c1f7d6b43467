"""The engine: one scheduler thread owns the model and runs every sequence (continuous batching).

    engine = Engine(model, tokenizer, n_ctx=2048, n_parallel=4)
    request = engine.submit(prompt_tokens, SamplingParams(temperature=0), max_tokens=64)
    for step in request:              # Steps as they are sampled; request.finish_reason at the end
        ...

Requests wait in a queue and join the running batch between steps, up to n_parallel at a time; a
request that finds all n_parallel slots taken (or promised to earlier arrivals) and max_queued
requests waiting is refused (QueueFullError). Each step is one forward pass over:

- one decode row for every sequence that is generating, and
- up to `prefill_chunk` prompt rows of sequences still reading their prompts (oldest first),

so a long prompt is read a chunk per step and never freezes the streams already running. An
embedding request (submit_embedding) is a prompt read the same way, its rows' last hidden states kept
instead of a token sampled. A
sequence's logits are bit-identical whatever else shares its batch (see Model.forward_batch), so
batching never changes an answer. A new request starts from the longest prefix of its prompt that
the prefix cache holds; a finished one leaves its cache there. When a sequence's context is full,
the older half after the first token is dropped and generation goes on (context shift).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..grammar import GrammarMatcher, VocabIndex
from ..kvcache import KVCache
from ..model import ContextFullError, Model
from ..sampling import Sampler, SamplingError, SamplingParams
from ..text.tokenizer import Tokenizer
from .metrics import Metrics
from .prefix_cache import PrefixCache


class QueueFullError(RuntimeError):
    """More requests are waiting than the engine queues."""


class EngineClosedError(RuntimeError):
    """The engine was shut down."""


class EngineFailedError(EngineClosedError):
    """The engine's scheduler failed: it fails every unfinished request with this and takes no new ones."""


class RequestFailedError(RuntimeError):
    """One request could not be run (its cache could not be made, its step failed); the others go on."""


@dataclass
class Step:
    """One generated token."""
    token: int
    text: bytes                                # the token's piece
    logprob: float | None = None               # log-softmax of the raw logits (pyllm.logprobs)
    top_logprobs: dict[int, float] | None = None  # token id -> logprob, most likely first


FINISHED = object()  # the last event of a request (Request.next_event)


class Request:
    """A submitted generation: iterate it for its Steps (or take its events with next_event). Thread-safe to
    cancel from anywhere. `on_event`, when set, is called on the engine's thread once events it posted can be
    read (after a step's sampling, when the next step is about to run; an event loop's wake-up: see
    pyllm/serve/server.py); iterating needs no such call."""

    def __init__(self, prompt: list[int], params: SamplingParams, max_tokens: int, n_logprobs: int | None,
                 embedding: bool = False) -> None:
        self.prompt = prompt
        self.embedding = embedding              # its one event: the prompt's hidden states (n, n_embd), no Steps
        # with want_prompt_logprobs: each prompt token's (logprob, top logprobs) but the first's, filled (the whole
        # prompt read from an empty cache) by the time the first Step comes
        self.want_prompt_logprobs = False
        self.prompt_logprobs: list[tuple[float, dict[int, float] | None]] = []
        self.params = params
        self.max_tokens = max_tokens
        self.n_logprobs = n_logprobs
        self.n_cached = 0                       # prompt tokens that came from the prefix cache
        self.n_generated = 0
        self.finish_reason: str | None = None   # "stop" | "length" | "cancelled"
        self.submitted_at = time.perf_counter()
        self.first_token_at: float | None = None
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled = threading.Event()
        self.on_event: Callable[[], None] | None = None
        self.leader: Request | None = None      # another choice of the same prompt, whose prefill this one shares
        self._done = threading.Event()

    def wait_done(self, timeout: float | None = None) -> bool:
        """Wait until the engine has let go of the request (its cache released, e.g. into the prefix cache)."""
        return self._done.wait(timeout)

    def cancel(self) -> None:
        """Stop generating; the engine frees the sequence at its next step."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def __iter__(self) -> Iterator[Step]:
        while True:
            event = self._events.get()
            if event is FINISHED:
                return
            if isinstance(event, BaseException):
                raise event
            yield event

    def next_event(self, block: bool = True) -> Step | BaseException | object | None:
        """The next event: a Step, the engine's exception, or FINISHED; None when block is False and none has
        come yet."""
        try:
            return self._events.get(block=block)
        except queue.Empty:
            return None

    def _post(self, event: object, notify: bool = True) -> None:
        self._events.put(event)
        if event is FINISHED or isinstance(event, BaseException):
            self._done.set()
        if notify:
            self._notify()

    def _notify(self) -> None:
        on_event = self.on_event
        if on_event is not None:
            on_event()


@dataclass(eq=False)  # identity: the scheduler's lists remove a sequence by what it is
class _Sequence:
    request: Request
    cache: KVCache | None          # None while it waits for its leader's prompt (followers)
    fed: list[int]                 # the tokens whose keys and values the cache holds
    pending: list[int]             # prompt tokens not yet run
    sampler: Sampler
    history: list[int]             # prompt + generated, for the penalties
    next_token: int | None = None  # sampled, to be run in the next step
    shifted: bool = False          # the cache no longer holds a plain prefix of `fed`
    last_token_at: float = 0.0
    matcher: GrammarMatcher | None = None  # where the output is in the request's grammar, if it has one
    # choices of the same prompt waiting for this sequence's prompt: they take a copy of its cache and sample
    # from its last prompt logits, so the prompt is read once for all of them
    followers: list[_Sequence] = field(default_factory=list)
    leader: _Sequence | None = None
    hidden: list[np.ndarray] = field(default_factory=list)  # an embedding's hidden states, a chunk at a time


class Engine:
    def __init__(self, model: Model, tokenizer: Tokenizer, n_ctx: int, *, n_parallel: int = 4,
                 max_queued: int = 64, prefill_chunk: int = 256, cache_bytes: int = 1 << 30,
                 metrics: Metrics | None = None) -> None:
        if n_parallel < 1:
            raise ValueError(f"n_parallel must be >= 1, not {n_parallel}")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, not {prefill_chunk}")
        self.model = model
        self.tokenizer = tokenizer
        self.n_ctx = n_ctx
        self.n_parallel = n_parallel
        self.max_queued = max_queued
        self.prefill_chunk = prefill_chunk
        self.prefix_cache = PrefixCache(model, n_ctx, max_batch=prefill_chunk, max_bytes=cache_bytes)
        self.metrics = metrics or Metrics()
        self._waiting: deque[Request] = deque()
        self._active: list[_Sequence] = []
        self._wake = threading.Condition()
        self._closed = False
        self.error: EngineFailedError | None = None  # set once the scheduler has failed
        # requests with events their listeners have not heard of yet (_notify_listeners), in order
        self._unnotified: dict[Request, None] = {}
        self._thread = threading.Thread(target=self._run, name="pyllm-engine", daemon=True)
        self._thread.start()

    # ---- the public side (any thread) ------------------------------------------------------------

    def submit(self, prompt: list[int], params: SamplingParams, max_tokens: int,
               n_logprobs: int | None = None) -> Request:
        """Queue a generation of up to max_tokens tokens after `prompt`."""
        return self.submit_group(prompt, [params], max_tokens, n_logprobs)[0]

    def submit_group(self, prompt: list[int], params: list[SamplingParams], max_tokens: int,
                     n_logprobs: int | None = None, prompt_logprobs: bool = False) -> list[Request]:
        """Queue one generation of `prompt` per params (a request's n choices), all or none. The first reads
        the prompt; the others, if they run with it, copy its cache and sample from its last prompt logits
        instead of reading the prompt again; if they start later, the prefix cache or its cache gives them all
        but the prompt's last token. Either way their tokens are those they would get alone. prompt_logprobs (with
        n_logprobs): the first request also scores the prompt's tokens (Request.prompt_logprobs)."""
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token")
        if len(prompt) >= self.n_ctx:
            raise ContextFullError(f"the prompt has {len(prompt)} tokens; the context holds {self.n_ctx}")
        n_vocab = self.model.n_vocab
        if min(prompt) < 0 or max(prompt) >= n_vocab:
            raise ValueError(f"prompt token id out of range [0, {n_vocab})")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, not {max_tokens}")
        if not params:
            raise ValueError("no generation asked for")
        for p in params:
            if p.logit_bias and max(p.logit_bias) >= n_vocab:
                raise SamplingError(f"logit_bias token {max(p.logit_bias)} is outside the vocabulary "
                                    f"(n_vocab={n_vocab})")
        requests = [Request(list(prompt), p, max_tokens, n_logprobs) for p in params]
        requests[0].want_prompt_logprobs = prompt_logprobs and n_logprobs is not None
        for request in requests[1:]:
            request.leader = requests[0]
        self._enqueue(requests)
        return requests

    def submit_embedding(self, prompt: list[int]) -> Request:
        """Queue the reading of `prompt` (at most n_ctx tokens) for its last hidden states: the request's one
        event is their (len(prompt), n_embd) array, then it finishes ("stop"). It reads every token (no prefix
        is taken from the cache: pooling needs each row) in chunks beside the other sequences' steps."""
        if not prompt:
            raise ValueError("the input is empty: give at least one token")
        if len(prompt) > self.n_ctx:
            raise ContextFullError(f"the input has {len(prompt)} tokens; the context holds {self.n_ctx}")
        if min(prompt) < 0 or max(prompt) >= self.model.n_vocab:
            raise ValueError(f"input token id out of range [0, {self.model.n_vocab})")
        request = Request(list(prompt), SamplingParams(), 0, None, embedding=True)
        self._enqueue([request])
        return request

    def _enqueue(self, requests: list[Request]) -> None:
        """Put requests in the queue, all or none: QueueFullError beyond the free slots and max_queued."""
        with self._wake:
            if self.error is not None:
                raise self.error
            if self._closed:
                raise EngineClosedError("the engine is shut down")
            free_slots = max(0, self.n_parallel - len(self._active))  # taken by the next waiting ones at once
            if len(self._waiting) + len(requests) > self.max_queued + free_slots:
                raise QueueFullError(f"all {self.n_parallel} slots are busy and the queue of {self.max_queued} "
                                     "is full; try again later")
            self._waiting.extend(requests)
            self.metrics.requests_queued.set(len(self._waiting))
            self._wake.notify()

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    @property
    def n_active(self) -> int:
        return len(self._active)

    @property
    def healthy(self) -> bool:
        """Whether the scheduler runs and takes requests."""
        return self.error is None and not self._closed and self._thread.is_alive()

    def close(self) -> None:
        """Stop the scheduler; unfinished requests end with an EngineClosedError."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    # ---- the scheduler thread -------------------------------------------------------------------

    def _run(self) -> None:
        """The scheduler. An error in one request fails that request (see _admit and _step); an error anywhere
        else fails the engine: every unfinished request gets it, and submit refuses new ones."""
        error: EngineClosedError = EngineClosedError("the engine is shut down")
        try:
            self._schedule()
        except BaseException as exc:  # noqa: BLE001 - nobody else would ever see it, and every request would hang
            error = EngineFailedError(f"the engine failed and takes no more requests: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            with self._wake:
                self.error = error
        finally:
            with self._wake:
                self._closed = True
                waiting, self._waiting = list(self._waiting), deque()
            for seq in self._active:
                seq.request._post(error, notify=False)
            for request in waiting:
                request._post(error, notify=False)
            for request in [*waiting, *(seq.request for seq in self._active)]:
                request._notify()
            self._active = []
            self._unnotified.clear()

    def _schedule(self) -> None:
        while True:
            if not self._active:
                self._notify_listeners()  # nothing to compute: the last events go out now
            with self._wake:
                while not self._closed and not self._waiting and not self._active:
                    self._wake.wait()
                if self._closed:
                    break
                self._admit()
            self._drop_cancelled()
            if self._active:
                self._step()
        self._notify_listeners()

    def _admit(self) -> None:
        """Move waiting requests into free slots (called with the lock held)."""
        while self._waiting and len(self._active) < self.n_parallel:
            request = self._waiting.popleft()
            if request.cancelled:
                self._finish_request(request, "cancelled")
                continue
            if request.embedding:
                try:
                    cache = self.prefix_cache.new_cache()
                except Exception as exc:  # noqa: BLE001 - this request fails, not the engine
                    failure = RequestFailedError(f"no KV cache could be made for this request: "
                                                 f"{type(exc).__name__}: {exc}")
                    failure.__cause__ = exc
                    self._post(request, failure)
                    continue
                self.metrics.prompt_tokens.inc(len(request.prompt))
                self._active.append(_Sequence(request, cache, [], list(request.prompt), Sampler(request.params), []))
                continue
            matcher = None
            if request.params.grammar is not None:
                try:  # the vocabulary's index is built on a tokenizer's first grammar (Llama builds it earlier)
                    matcher = GrammarMatcher(request.params.grammar, VocabIndex.for_tokenizer(self.tokenizer))
                except Exception as exc:  # noqa: BLE001 - this request fails, not the engine
                    failure = RequestFailedError(f"the grammar could not be set up: {type(exc).__name__}: {exc}")
                    failure.__cause__ = exc
                    self._post(request, failure)
                    continue
            leader = self._leader_of(request)
            if leader is not None and (leader.pending or leader.next_token is None):
                # its leader is still reading the prompt: wait for it, in a slot, computing nothing
                follower = _Sequence(request, None, [], [], Sampler(request.params), list(request.prompt),
                                     matcher=matcher, leader=leader)
                leader.followers.append(follower)
                self._active.append(follower)
                self.metrics.prompt_tokens.inc(len(request.prompt))
                continue
            try:
                if leader is not None:  # it has read the prompt and generates: all but the prompt's last token
                    cache = leader.cache.copy_prefix(len(request.prompt) - 1, into=self.prefix_cache.new_cache())
                    n_cached = cache.n_used
                elif request.want_prompt_logprobs:  # every prompt row's logits are wanted: none from the cache
                    cache, n_cached = self.prefix_cache.new_cache(), 0
                else:
                    cache, n_cached = self.prefix_cache.acquire(request.prompt)
            except Exception as exc:  # noqa: BLE001 - e.g. no memory for its cache: this request fails, not the engine
                failure = RequestFailedError(f"no KV cache could be made for this request: {type(exc).__name__}: "
                                             f"{exc}")
                failure.__cause__ = exc
                self._post(request, failure)
                continue
            request.n_cached = n_cached
            self.metrics.prompt_tokens.inc(len(request.prompt))
            self.metrics.cached_prompt_tokens.inc(n_cached)
            if n_cached:
                self.metrics.prefix_cache_hits.inc()
            self._active.append(_Sequence(request, cache, request.prompt[:n_cached], request.prompt[n_cached:],
                                          Sampler(request.params), list(request.prompt), matcher=matcher))
        self.metrics.requests_queued.set(len(self._waiting))
        self.metrics.sequences_active.set(len(self._active))

    def _leader_of(self, request: Request) -> _Sequence | None:
        """The running sequence of the request's leader, when it holds a plain prefix the request can share."""
        if request.leader is None:
            return None
        for seq in self._active:
            if seq.request is request.leader:
                return None if seq.shifted or seq.cache is None else seq
        return None

    def _start_follower(self, follower: _Sequence, leader: _Sequence, logits: np.ndarray, now: float) -> None:
        """The leader has read the prompt: the follower takes a copy of its cache and samples from its logits."""
        follower.leader = None
        try:
            assert leader.cache is not None
            follower.cache = leader.cache.copy_prefix(leader.cache.n_used, into=self.prefix_cache.new_cache())
            follower.fed = list(leader.fed)
            follower.request.n_cached = len(follower.request.prompt)
            self.metrics.cached_prompt_tokens.inc(len(follower.request.prompt))
            self._sample(follower, logits, now)
        except Exception as exc:  # noqa: BLE001 - this request fails, the others go on
            self._fail(follower, exc)

    def _orphan_followers(self, seq: _Sequence) -> None:
        """The leader ended before its prompt did: its followers read the prompt themselves (from the prefix
        cache's longest prefix of it)."""
        followers, seq.followers = seq.followers, []
        for follower in followers:
            follower.leader = None
            try:
                cache, n_cached = self.prefix_cache.acquire(follower.request.prompt)
            except Exception as exc:  # noqa: BLE001 - this request fails, the others go on
                self._fail(follower, exc)
                continue
            prompt = follower.request.prompt
            follower.cache, follower.fed, follower.pending = cache, prompt[:n_cached], prompt[n_cached:]
            follower.request.n_cached = n_cached

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self._active if s.request.cancelled]:
            self._finish(seq, "cancelled")

    def _post(self, request: Request, event: object) -> None:
        """Post an event; its request hears of it (Request.on_event) at _notify_listeners: when the next step's
        batch is ready to run, or when there is nothing to run. A listener on another thread (the server's event loop)
        then takes the GIL while this thread computes, not while it samples the other sequences or builds
        the next batch."""
        request._post(event, notify=False)
        self._unnotified[request] = None

    def _notify_listeners(self) -> None:
        pending, self._unnotified = self._unnotified, {}
        for request in pending:
            request._notify()

    def _step(self) -> None:
        batch, members, failed = [], [], []
        budget = self.prefill_chunk
        for seq in self._active:
            if seq.cache is None:  # a follower waiting for its leader's prompt
                continue
            if seq.pending:
                if budget == 0:
                    continue
                chunk = seq.pending[:budget]
                budget -= len(chunk)
                mode = ("hidden" if seq.request.embedding else "all" if seq.request.want_prompt_logprobs
                        else "last" if len(chunk) == len(seq.pending) else "none")
            else:
                if seq.cache.n_used >= self.n_ctx:
                    try:
                        self._shift(seq)
                    except Exception as exc:  # noqa: BLE001 - this request fails, the others go on
                        failed.append((seq, exc))
                        continue
                chunk, mode = [seq.next_token], "last"
            batch.append((chunk, seq.cache, mode))
            members.append((seq, chunk))
        for seq, exc in failed:
            self._fail(seq, exc)
        if not batch:
            return
        self._notify_listeners()
        try:
            results = self.model.forward_batch(batch)
        except Exception as exc:  # noqa: BLE001 - the requests get the error, the engine goes on
            for seq, _ in members:
                self._fail(seq, exc)
            return
        now = time.perf_counter()
        for (seq, chunk), logits in zip(members, results, strict=True):
            if logits is not None and logits.ndim == 2 and not seq.request.embedding:  # a scored prompt chunk
                logits = self._score_prompt(seq, chunk, logits)
            seq.fed.extend(chunk)
            if seq.pending:
                seq.pending = seq.pending[len(chunk):]
            if seq.request.embedding:
                assert logits is not None
                seq.hidden.append(logits)
                if not seq.pending:
                    self._post(seq.request, np.concatenate(seq.hidden))
                    self._finish(seq, "stop")
                continue
            if logits is not None:
                for follower in list(seq.followers):  # before the leader samples (and perhaps finishes)
                    seq.followers.remove(follower)
                    self._start_follower(follower, seq, logits, now)
                try:
                    self._sample(seq, logits, now)
                except Exception as exc:  # noqa: BLE001 - this request gets the error, the others go on
                    self._fail(seq, exc)

    def _score_prompt(self, seq: _Sequence, chunk: list[int], rows: np.ndarray) -> np.ndarray | None:
        """Each row's logprobs of the prompt token after it, into the request; the last row's logits when the
        chunk ends the prompt (to sample from), else None."""
        request, start = seq.request, len(seq.fed)
        for j, row in enumerate(rows):
            following = start + j + 1
            if following < len(request.prompt):
                request.prompt_logprobs.append(seq.sampler.logprobs(row, request.prompt[following],
                                                                    request.n_logprobs or 0))
        return rows[-1] if len(chunk) == len(seq.pending) else None

    def _sample(self, seq: _Sequence, logits: np.ndarray, now: float) -> None:
        request = seq.request
        token = seq.sampler.sample(logits, seq.history, seq.matcher)
        if self.tokenizer.is_eog(token):
            self._finish(seq, "stop")
            return
        if seq.matcher is not None:
            seq.matcher.accept(token)
        step = Step(token, self.tokenizer.token_to_piece(token))
        if request.n_logprobs is not None:
            step.logprob, step.top_logprobs = seq.sampler.logprobs(logits, token, request.n_logprobs)
        if request.first_token_at is None:
            request.first_token_at = now
            self.metrics.ttft.observe(now - request.submitted_at)
        else:
            self.metrics.tpot.observe(now - seq.last_token_at)
        seq.last_token_at = now
        request.n_generated += 1
        self.metrics.generation_tokens.inc()
        self._post(request, step)
        seq.history.append(token)
        seq.next_token = token
        if request.n_generated >= request.max_tokens:
            self._finish(seq, "length")
        elif seq.matcher is not None and seq.matcher.is_complete:  # the grammar admits nothing more
            self._finish(seq, "stop")

    def _shift(self, seq: _Sequence) -> None:
        """The context is full: keep the BOS (if any), drop the older half of the rest."""
        n_keep = 1 if seq.fed and seq.fed[0] == self.tokenizer.bos_id else 0
        n_discard = (seq.cache.n_used - n_keep) // 2
        seq.cache.shift(n_keep, n_discard)
        seq.fed = seq.fed[:n_keep] + seq.fed[n_keep + n_discard:]
        seq.shifted = True  # keys were re-rotated: not what a fresh prompt computes, so not for reuse

    def _fail(self, seq: _Sequence, exc: BaseException) -> None:
        """End a sequence with an error: its request gets it, its cache (whatever it holds) is emptied for reuse."""
        self._active.remove(seq)
        self.metrics.sequences_active.set(len(self._active))
        self._detach(seq)
        if seq.cache is not None:
            self.prefix_cache.discard(seq.cache)
        self._orphan_followers(seq)
        self._post(seq.request, exc)

    def _finish(self, seq: _Sequence, reason: str) -> None:
        self._active.remove(seq)
        self.metrics.sequences_active.set(len(self._active))
        self._detach(seq)
        if seq.cache is None:
            pass
        elif seq.shifted:
            self.prefix_cache.discard(seq.cache)
        else:
            self.prefix_cache.release(seq.cache, seq.fed)
        self._orphan_followers(seq)  # after the release: they find the prompt in the prefix cache
        self._finish_request(seq.request, reason)

    @staticmethod
    def _detach(seq: _Sequence) -> None:
        """A follower that ends while waiting leaves its leader's list."""
        if seq.leader is not None and seq in seq.leader.followers:
            seq.leader.followers.remove(seq)
        seq.leader = None

    def _finish_request(self, request: Request, reason: str) -> None:
        request.finish_reason = reason
        self.metrics.requests_finished.inc(label=reason)
        self._post(request, FINISHED)
