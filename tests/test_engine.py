"""The engine and the prefix cache on tiny random models: batching, queueing, chunked prefill,
cancellation, context shift and prefix reuse never change a sequence's tokens."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from test_model import WINDOW, write_tiny_model

from pyllm.gguf import GGUFFile
from pyllm.model import Model
from pyllm.sampling import SamplingParams
from pyllm.serve.engine import Engine, EngineFailedError, QueueFullError, RequestFailedError
from pyllm.serve.prefix_cache import PrefixCache

EOG = 0
GREEDY = SamplingParams(temperature=0, logit_bias={EOG: float("-inf")})  # runs to max_tokens


class TinyTokenizer:
    """What the engine asks of a tokenizer."""
    bos_id = 1

    def is_eog(self, token: int) -> bool:
        return token == EOG

    def token_to_piece(self, token: int) -> bytes:
        return f"<{token}>".encode()


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request, tmp_path_factory) -> Model:
    path = write_tiny_model(tmp_path_factory.mktemp(request.param) / "m.gguf", request.param, Q.Q8_0)
    return Model(GGUFFile(path), n_threads=2)


PROMPTS = [[1, 17, 42, 5, 88, 3], [1, 17, 42, 9], [1, 60, 2, 2, 2, 2, 2, 2, 2, 7, 8], [1, 5]]


def generate(engine: Engine, prompt: list[int], n: int, params: SamplingParams = GREEDY) -> list[int]:
    return [step.token for step in engine.submit(prompt, params, n)]


def test_batched_queued_and_chunked_runs_give_the_tokens_of_a_lone_run(model: Model) -> None:
    alone_engine = Engine(model, TinyTokenizer(), n_ctx=48, n_parallel=1, prefill_chunk=64, cache_bytes=0)
    alone = [generate(alone_engine, p, 12) for p in PROMPTS]
    alone_engine.close()

    # two slots for four requests (two queue), prompts read 3 rows a step beside the decoding ones
    engine = Engine(model, TinyTokenizer(), n_ctx=48, n_parallel=2, prefill_chunk=3, cache_bytes=0)
    results: list[list[int] | None] = [None] * len(PROMPTS)

    def run(i: int) -> None:
        results[i] = generate(engine, PROMPTS[i], 12)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.close()
    assert results == alone


def test_prefix_reuse_gives_the_same_tokens(model: Model) -> None:
    engine = Engine(model, TinyTokenizer(), n_ctx=48, n_parallel=1)
    first = engine.submit(PROMPTS[0], GREEDY, 5)
    tokens = [s.token for s in first]
    assert first.n_cached == 0
    follow_up = PROMPTS[0] + tokens[:4] + [33, 34]          # the conversation goes on
    again = engine.submit(follow_up, GREEDY, 6)
    reused = [s.token for s in again]
    assert again.n_cached == len(PROMPTS[0]) + 4             # the prompt and the answer, but not the last token fed
    sibling = engine.submit(PROMPTS[0][:3] + [70, 71], GREEDY, 6)  # shares 3 tokens with the cached ones
    sibling_tokens = [s.token for s in sibling]
    assert sibling.n_cached == 3
    engine.close()

    fresh = Engine(model, TinyTokenizer(), n_ctx=48, n_parallel=1, cache_bytes=0)
    assert generate(fresh, follow_up, 6) == reused
    assert generate(fresh, PROMPTS[0][:3] + [70, 71], 6) == sibling_tokens
    fresh.close()


def test_prefix_cache_takes_copies_supersedes_and_evicts(model: Model) -> None:
    cache_a = model.new_cache(48)
    model.forward([1, 2, 3, 4, 5], cache_a)
    per_entry = 5 * cache_a.bytes_per_token()
    prefixes = PrefixCache(model, 48, max_bytes=2 * per_entry)
    prefixes.release(cache_a, [1, 2, 3, 4, 5])
    # a prompt sharing part of the entry gets a copy; the entry stays
    copy, n = prefixes.acquire([1, 2, 3, 9, 9])
    assert n == 3 and copy is not cache_a and len(prefixes) == 1
    # a prompt that continues the whole entry takes it
    taken, n = prefixes.acquire([1, 2, 3, 4, 5, 6])
    assert n == 5 and taken is cache_a and len(prefixes) == 0
    # an entry that extends another supersedes it; beyond max_bytes the least recently used goes
    model.forward([6], taken)
    prefixes.release(copy, [1, 2, 3])
    prefixes.release(taken, [1, 2, 3, 4, 5, 6])
    assert len(prefixes) == 1                                # [1, 2, 3] was a prefix of the longer one
    other = model.new_cache(48)
    model.forward([7, 8, 9, 10, 11], other)
    prefixes.release(other, [7, 8, 9, 10, 11])
    assert len(prefixes) == 1 and prefixes.n_bytes <= 2 * per_entry   # 6 + 5 tokens > the budget: the old one went
    assert prefixes.acquire([7, 8, 9, 10, 11, 12])[1] == 5


def test_caches_that_leave_are_kept_as_spares(model: Model) -> None:
    """Superseded, evicted and discarded caches come back empty for the next sequences (up to max_spare), and a
    sequence on a recycled cache gets the tokens it gets on a new one."""
    prefixes = PrefixCache(model, 48, max_bytes=1 << 20, max_spare=2)
    first = prefixes.new_cache()
    model.forward([1, 2, 3], first)
    prefixes.release(first, [1, 2, 3])
    longer = prefixes.new_cache()
    model.forward([1, 2, 3, 4], longer)
    prefixes.release(longer, [1, 2, 3, 4])                 # supersedes [1, 2, 3]: its cache becomes a spare
    spare, n = prefixes.acquire([50, 51, 52])
    assert spare is first and n == 0 and spare.n_used == 0
    assert all((layer.positions == -1).all() for layer in spare.layers)
    shifted = model.new_cache(48)
    model.forward([9, 9, 9], shifted)
    prefixes.discard(shifted)                                # a context shift's cache: nothing to reuse
    copy, n = prefixes.acquire([1, 2, 60])                   # a part of [1, 2, 3, 4]: copied into the spare
    assert copy is shifted and n == 2 and copy.n_used == 2
    for cache, prompt, n_cached in ((spare, [50, 51, 52], 0), (copy, [1, 2, 60], 2)):
        want = model.forward(prompt, model.new_cache(48))
        np.testing.assert_array_equal(model.forward(prompt[n_cached:], cache).view(np.uint32), want.view(np.uint32))
    for _ in range(3):
        prefixes.discard(model.new_cache(48))
    assert len(prefixes._spare) == 2                          # at most max_spare


def test_a_sliding_window_cache_that_moved_on_is_not_reused(tmp_path: Path) -> None:
    model = Model(GGUFFile(write_tiny_model(tmp_path / "g.gguf", "gemma3", Q.F32)), n_threads=1)
    prefixes = PrefixCache(model, 48, max_batch=2)
    cache = prefixes.new_cache()
    tokens = list(range(1, 20))
    model.forward(tokens, cache)                             # the ring of WINDOW + 2 slots has wrapped
    prefixes.release(cache, tokens)
    _, n = prefixes.acquire(tokens[:WINDOW] + [90])          # its first tokens are gone from the ring
    assert n == 0


def test_a_request_that_fails_to_sample_gets_the_error_and_the_others_go_on(model: Model, monkeypatch) -> None:
    """A sampling failure (here forced for prompts starting [1, 93]) ends that request with the error; the engine
    keeps serving the others, and a bias past the vocabulary is refused at submit."""
    from pyllm import sampling

    real = sampling.Sampler.sample

    def sample(self, logits, history=(), matcher=None):
        if list(history[:2]) == [1, 93]:
            raise sampling.SamplingError("forced failure")
        return real(self, logits, history, matcher)

    monkeypatch.setattr(sampling.Sampler, "sample", sample)
    engine = Engine(model, TinyTokenizer(), n_ctx=48, n_parallel=2)
    doomed = engine.submit([1, 93, 3], GREEDY, 5)
    fine = engine.submit(PROMPTS[1], GREEDY, 6)
    outcome: dict[str, object] = {}

    def consume() -> None:  # in a thread: a dead engine would leave these waiting for ever
        try:
            list(doomed)
        except sampling.SamplingError as exc:
            outcome["doomed"] = exc
        outcome["fine"] = [s.token for s in fine]

    waiter = threading.Thread(target=consume, daemon=True)
    waiter.start()
    waiter.join(timeout=60)
    assert "forced failure" in str(outcome.get("doomed")) and "fine" in outcome, "the engine stopped serving"
    tokens = outcome["fine"]
    with pytest.raises(sampling.SamplingError, match="outside the vocabulary"):
        engine.submit(PROMPTS[0], SamplingParams(temperature=0, logit_bias={10**6: 1.0}), 4)
    assert generate(engine, PROMPTS[1], 6) == tokens
    engine.close()


def test_a_burst_takes_the_free_slots_before_the_queue(model: Model) -> None:
    """Requests that arrive together while the scheduler is busy wait for their (free) slots without counting
    against max_queued: two slots and no queue take two requests, whatever the scheduler has admitted yet."""
    engine = Engine(model, TinyTokenizer(), n_ctx=16, n_parallel=2, max_queued=0)
    busy = [engine.submit(PROMPTS[i], GREEDY, 10_000) for i in range(2)]
    with pytest.raises(QueueFullError):
        engine.submit(PROMPTS[2], GREEDY, 3)
    for request in busy:
        stream = iter(request)
        next(stream)
        request.cancel()
        list(stream)
    assert generate(engine, PROMPTS[2], 3) == generate(engine, PROMPTS[2], 3)
    engine.close()


def test_queue_limit_cancellation_and_context_shift(model: Model) -> None:
    engine = Engine(model, TinyTokenizer(), n_ctx=16, n_parallel=1, max_queued=1)
    running = engine.submit(PROMPTS[0], GREEDY, 10_000)      # holds the slot until cancelled
    steps = iter(running)
    next(steps)
    waiting = engine.submit(PROMPTS[1], GREEDY, 3)
    with pytest.raises(QueueFullError):
        engine.submit(PROMPTS[2], GREEDY, 3)
    running.cancel()
    list(steps)
    assert len(list(waiting)) == 3
    shifting = engine.submit(PROMPTS[0], GREEDY, 40)         # 40 tokens in a 16-token context: shifts
    assert len(list(shifting)) == 40 and shifting.finish_reason == "length"

    endless = engine.submit(PROMPTS[3], GREEDY, 10_000)
    stream = iter(endless)
    next(stream)
    endless.cancel()
    list(stream)                                             # ends at the engine's next step
    assert endless.finish_reason == "cancelled"
    with pytest.raises(ValueError, match="empty"):
        engine.submit([], GREEDY, 3)
    engine.close()


def _consume(request) -> object:
    """A request's tokens, or the exception it ended with; in a thread, so that a hang fails the test."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append([step.token for step in request])
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert outcome, "the request never ended"
    return outcome[0]


def test_a_request_whose_cache_cannot_be_made_fails_alone(model: Model, monkeypatch) -> None:
    """No memory for one request's KV cache: that request ends with a RequestFailedError naming the cause, the
    engine serves the next ones unchanged."""
    engine = Engine(model, TinyTokenizer(), n_ctx=32, n_parallel=2)
    expected = generate(engine, PROMPTS[0], 5)
    real = engine.prefix_cache.acquire

    def acquire(prompt):
        if prompt[:2] == [1, 93]:
            raise MemoryError("Unable to allocate 35.8 GiB")
        return real(prompt)

    monkeypatch.setattr(engine.prefix_cache, "acquire", acquire)
    failed = _consume(engine.submit([1, 93, 4], GREEDY, 5))
    assert isinstance(failed, RequestFailedError) and "MemoryError: Unable to allocate 35.8 GiB" in str(failed)
    assert engine.healthy and _consume(engine.submit(PROMPTS[0], GREEDY, 5)) == expected
    engine.close()


def test_a_failing_scheduler_fails_every_request_and_refuses_new_ones(model: Model, monkeypatch) -> None:
    """An error outside any one request (here in the step itself) fails the engine: the running and the waiting
    requests get an EngineFailedError naming it, instead of waiting for ever; healthy turns False; submit refuses."""
    engine = Engine(model, TinyTokenizer(), n_ctx=32, n_parallel=1)
    started = threading.Event()
    real_step = engine._step

    def step() -> None:
        started.set()
        if engine.n_waiting:  # the second request is queued behind the first: now the scheduler breaks
            raise RuntimeError("scheduler bug")
        real_step()

    monkeypatch.setattr(engine, "_step", step)
    running = engine.submit(PROMPTS[0], GREEDY, 10_000)
    assert started.wait(30)
    waiting = engine.submit(PROMPTS[1], GREEDY, 3)
    for outcome in (_consume(running), _consume(waiting)):
        assert isinstance(outcome, EngineFailedError) and "RuntimeError: scheduler bug" in str(outcome)
    assert not engine.healthy and isinstance(engine.error, EngineFailedError)
    with pytest.raises(EngineFailedError, match="scheduler bug"):
        engine.submit(PROMPTS[2], GREEDY, 3)
    engine.close()  # returns: the thread has ended
