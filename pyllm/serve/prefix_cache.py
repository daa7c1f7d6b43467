"""Prefix cache: finished sequences' KV caches, kept so that a later prompt that starts with the same
tokens (a system prompt, a chat's earlier turns) continues from them instead of recomputing them.

    cache, n_cached = prefixes.acquire(prompt)   # a cache holding the longest cached prefix of prompt
    ...                                          # run prompt[n_cached:] and generate
    prefixes.release(cache, tokens_in_cache)     # keep it for the next prompt

An entry wholly contained in the new prompt (the previous turn of the same chat) is handed over
as it is; one that shares only a part (the same system prompt, another question) is copied up to
the shared length, so it stays available to others. Entries are evicted least recently used first
once their tokens' bytes pass `max_bytes`. Reuse never changes a result: a token's logits are
bit-identical with or without it (attention reads the cache in one fixed order).

Caches that leave it (superseded, evicted, or discarded by the engine after a context shift) are
emptied and kept, up to `max_spare`, for the next sequences: a new one costs its allocation and the
first touch of every page it fills (SmolLM2 at n_ctx 2048: 47 MB, ~8 ms, a request's worth of
faults), which a server would otherwise pay for every request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..kvcache import KVCache
from ..model import Model

T = TypeVar("T")


@dataclass(eq=False)
class _Entry:
    tokens: list[int]     # the ids whose keys and values the cache holds, in order
    cache: KVCache
    last_used: int


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class PrefixCache:
    def __init__(self, model: Model, n_ctx: int, max_batch: int = 512, max_bytes: int = 1 << 30,
                 max_spare: int = 4) -> None:
        self.model = model
        self.n_ctx = n_ctx
        self.max_batch = max_batch
        self.max_bytes = max_bytes
        self.max_spare = max_spare
        self._entries: list[_Entry] = []
        self._spare: list[KVCache] = []  # emptied caches for the next sequences
        self._clock = 0
        self._latest: _Entry | None = None  # the entry released last (a Llama's context: save_state)
        self._lock = threading.Lock()
        self.hits = 0          # acquisitions that reused at least one token
        self.lookups = 0
        self.tokens_reused = 0

    def new_cache(self) -> KVCache:
        """An empty cache: a spare one, or a new one."""
        with self._lock:
            return self._spare_or_new()

    def discard(self, cache: KVCache) -> None:
        """A cache the caller is done with and that holds nothing to reuse: kept empty as a spare."""
        with self._lock:
            self._retire(cache)

    def _take_spare(self) -> KVCache | None:
        return self._spare.pop() if self._spare else None

    def _spare_or_new(self) -> KVCache:
        return self._take_spare() or self.model.new_cache(self.n_ctx, self.max_batch)

    def _retire(self, cache: KVCache) -> None:
        if len(self._spare) < self.max_spare:
            cache.clear()
            self._spare.append(cache)

    @property
    def n_bytes(self) -> int:
        return sum(self._entry_bytes(e) for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def _entry_bytes(self, entry: _Entry) -> int:
        return len(entry.tokens) * entry.cache.bytes_per_token()

    def acquire(self, prompt: list[int]) -> tuple[KVCache, int]:
        """(a cache for `prompt`, how many of its leading tokens the cache already holds).

        At most len(prompt) - 1 tokens come from cache: the last one is always run, for its logits.
        """
        limit = len(prompt) - 1
        with self._lock:
            self.lookups += 1
            best, best_n = None, 0
            for entry in self._entries:
                n = min(shared_prefix(entry.tokens, prompt), limit)
                if n > best_n:
                    best, best_n = entry, n
            if best is None:
                return self._spare_or_new(), 0
            self._clock += 1
            best.last_used = self._clock
            if best_n == len(best.tokens):       # the whole entry continues into this prompt: take it
                self._entries.remove(best)
                cache = best.cache
                n_cached = cache.truncate(best_n)
            else:                                # a shared part only: copy it, keep the entry for others
                cache = best.cache.copy_prefix(best_n, into=self._take_spare())
                n_cached = cache.n_used
            if n_cached:
                self.hits += 1
                self.tokens_reused += n_cached
            return cache, n_cached

    def release(self, cache: KVCache, tokens: list[int]) -> None:
        """Keep `cache`, which holds the keys and values of `tokens`, for later prompts."""
        if cache.n_used != len(tokens) or not tokens:
            self.discard(cache)  # not a plain prefix (e.g. after a context shift): nothing reusable
            return
        with self._lock:
            self._clock += 1
            # an entry this one extends is superseded by it
            for e in list(self._entries):
                if len(e.tokens) <= len(tokens) and tokens[:len(e.tokens)] == e.tokens:
                    self._entries.remove(e)
                    self._retire(e.cache)
            self._latest = _Entry(list(tokens), cache, self._clock)
            self._entries.append(self._latest)
            while self._entries and self.n_bytes > self.max_bytes:
                oldest = min(self._entries, key=lambda e: e.last_used)
                self._entries.remove(oldest)
                self._retire(oldest.cache)

    def latest(self, copy: Callable[[list[int], KVCache], T]) -> T | None:
        """copy(tokens, cache) of the entry released last, under the lock (so no sequence takes it meanwhile);
        None if it has gone since (evicted, superseded, or taken by a sequence that continues it)."""
        with self._lock:
            latest = self._latest
            if latest is None or not any(e is latest for e in self._entries):
                return None
            return copy(latest.tokens, latest.cache)

    def snapshot(self, copy: Callable[[list[int], KVCache], T]) -> list[T]:
        """copy(tokens, cache) of every entry, most recently used last, under the lock."""
        with self._lock:
            return [copy(e.tokens, e.cache) for e in sorted(self._entries, key=lambda e: e.last_used)]

    def clear(self) -> None:
        with self._lock:
            for e in self._entries:
                self._retire(e.cache)
            self._entries.clear()
