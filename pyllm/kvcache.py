"""One sequence's KV cache: half-precision keys and values per layer, kept by the C core
(csrc/kvcache.c) in arrays this class owns.

Full-attention layers keep every cached token in order: slot i holds the i-th
token. Sliding-window layers keep a ring of `window + max_batch` slots, the
token at position p in slot p % capacity: enough for the first query of a batch
to see its whole window while the batch's own keys are written.

Slots are a function of positions only, and attention reduces over slots in
index order, so a token's result never depends on how its sequence was split
into batches.

When the context is full, `shift()` drops the oldest tokens after the first
`n_keep` and re-rotates the remaining keys to their new positions (context
shift), so generation can go on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._pyllm_c import ffi, lib
from .arch import Config
from .kernels import _check


@dataclass
class LayerCache:
    k: np.ndarray           # (capacity, n_head_kv, head_dim) float16
    v: np.ndarray           # (capacity, n_head_kv, head_dim_v) float16
    positions: np.ndarray   # (capacity,) int32, -1 for an empty slot
    ring: bool              # slot = position % capacity (sliding-window layer)

    def __post_init__(self) -> None:
        self.c = ffi.new("pyllm_kv_layer *", {
            "k": ffi.from_buffer("uint16_t[]", self.k), "v": ffi.from_buffer("uint16_t[]", self.v),
            "positions": ffi.from_buffer("int32_t[]", self.positions), "capacity": len(self.positions),
            "k_row": self.k[0].size, "v_row": self.v[0].size, "ring": int(self.ring)})

    @property
    def capacity(self) -> int:
        return len(self.positions)


def _layer_capacity(cfg: Config, i: int, n_ctx: int, max_batch: int) -> tuple[int, bool]:
    """(slots, whether they form a ring) of layer i's cache."""
    ring = cfg.is_swa_layer(i) and cfg.sliding_window + max_batch < n_ctx
    return (cfg.sliding_window + max_batch if ring else n_ctx), ring


class KVCache:
    @staticmethod
    def bytes_needed(cfg: Config, n_ctx: int, max_batch: int) -> int:
        """The bytes a cache of this shape holds once full (what KVCache allocates)."""
        slot = 2 * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v) + 4  # half-precision k and v, an int32 position
        return sum(_layer_capacity(cfg, i, n_ctx, max_batch)[0] for i in range(cfg.n_layer)) * slot

    def __init__(self, cfg: Config, n_ctx: int, max_batch: int) -> None:
        self.config = cfg
        self.n_ctx = n_ctx
        self.max_batch = max_batch
        self.n_used = 0  # tokens in the sequence; the next token's position
        self.layers: list[LayerCache] = []
        for i in range(cfg.n_layer):
            capacity, ring = _layer_capacity(cfg, i, n_ctx, max_batch)
            self.layers.append(LayerCache(
                k=np.zeros((capacity, cfg.n_head_kv, cfg.head_dim), np.float16),
                v=np.zeros((capacity, cfg.n_head_kv, cfg.head_dim_v), np.float16),
                positions=np.full(capacity, -1, np.int32),
                ring=ring,
            ))
        self.c_layers = ffi.new("pyllm_kv_layer *[]", [layer.c for layer in self.layers])  # for pyllm_blocks_forward

    @property
    def nbytes(self) -> int:
        return sum(layer.k.nbytes + layer.v.nbytes for layer in self.layers)

    def bytes_per_token(self) -> int:
        """Cache bytes one more token of the sequence occupies (ring layers are bounded, not counted)."""
        return sum(layer.k[0].nbytes + layer.v[0].nbytes for layer in self.layers if not layer.ring)

    def copy_prefix(self, n_tokens: int, into: KVCache | None = None) -> KVCache:
        """A cache holding this one's first n_tokens (fewer, possibly 0, where a ring has moved on): `into` (one of
        the same shape, whatever it held) or a new one."""
        copy = into if into is not None else KVCache(self.config, self.n_ctx, self.max_batch)
        if (copy.n_ctx, copy.max_batch, len(copy.layers)) != (self.n_ctx, self.max_batch, len(self.layers)):
            raise ValueError("copy_prefix: the target cache has another shape")
        n_tokens = min(n_tokens, self.n_used)
        for mine, theirs in zip(self.layers, copy.layers, strict=True):
            n_slots = mine.capacity if mine.ring else n_tokens  # a ring's slots are spread over all of it
            theirs.k[:n_slots] = mine.k[:n_slots]
            theirs.v[:n_slots] = mine.v[:n_slots]
            theirs.positions[:n_slots] = mine.positions[:n_slots]
        copy.n_used = self.n_used
        copy.truncate(n_tokens)  # forgets the slots past n_tokens (and all, where a ring lost the window)
        return copy

    def store(self, i: int, positions: np.ndarray, k: np.ndarray, v: np.ndarray) -> LayerCache:
        """Write a batch's keys and values (rounded to half precision, as llama.cpp's cache keeps them)."""
        layer = self.layers[i]
        pos = np.ascontiguousarray(positions, dtype=np.int32)
        k = np.ascontiguousarray(k, dtype=np.float32)
        v = np.ascontiguousarray(v, dtype=np.float32)
        if k.size != len(pos) * layer.k[0].size or v.size != len(pos) * layer.v[0].size:
            raise ValueError(f"store: {len(pos)} positions for keys {k.shape} and values {v.shape}")
        _check(lib.pyllm_kv_store(layer.c, ffi.from_buffer("int32_t[]", pos), ffi.from_buffer("float[]", k),
                                  ffi.from_buffer("float[]", v), len(pos)), "KV cache store")
        return layer

    def clear(self) -> None:
        for layer in self.layers:
            lib.pyllm_kv_truncate(layer.c, 0)
        self.n_used = 0

    def truncate(self, n_tokens: int) -> int:
        """Keep the first n_tokens (a shared prompt prefix); return how many are kept.

        A ring may already have overwritten part of the window the next token needs; then the
        prefix cannot be reused and the cache is cleared (0 is returned).
        """
        n_tokens = min(n_tokens, self.n_used)
        for layer in self.layers:
            if layer.ring and n_tokens > 0:
                needed = np.arange(max(0, n_tokens - self.config.sliding_window), n_tokens)
                if not np.array_equal(layer.positions[needed % layer.capacity], needed):
                    self.clear()
                    return 0
        for layer in self.layers:
            lib.pyllm_kv_truncate(layer.c, n_tokens)
        self.n_used = n_tokens
        return n_tokens

    def shift(self, n_keep: int, n_discard: int) -> None:
        """Drop tokens [n_keep, n_keep + n_discard), move the rest down and re-rotate their keys."""
        if not 0 <= n_keep and 0 < n_discard and n_keep + n_discard <= self.n_used:
            raise ValueError(f"cannot discard {n_discard} tokens after {n_keep} of {self.n_used}")
        cfg = self.config
        for i, layer in enumerate(self.layers):
            base, scale = cfg.layer_rope(i)
            _check(lib.pyllm_kv_shift(layer.c, n_keep, n_discard, cfg.n_head_kv, cfg.head_dim, cfg.n_rot, base, scale,
                                      int(cfg.family.rope_neox)), "KV cache shift")
        self.n_used -= n_discard

    def visible(self, i: int, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(k, v, positions) of the slots attention reads for layer i, for tokens before position `end`."""
        layer = self.layers[i]
        n = layer.capacity if layer.ring else end
        return layer.k[:n], layer.v[:n], layer.positions[:n]
