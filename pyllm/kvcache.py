"""One sequence's KV cache: keys and values per layer in half precision (llama.cpp's default) or a
quantized type (`CACHE_TYPES`, llama.cpp's --cache-type-k/-v), kept by the C core (csrc/ops/kvcache.c)
in arrays this class owns.

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
from .kernels import GGMLType, _check, row_bytes

# The types a cache may keep its keys or values in (llama.cpp's --cache-type-k/-v names), f16 the default.
CACHE_TYPES = {"f16": GGMLType.F16, "q8_0": GGMLType.Q8_0, "q4_0": GGMLType.Q4_0, "q4_1": GGMLType.Q4_1,
               "q5_0": GGMLType.Q5_0, "q5_1": GGMLType.Q5_1}


def cache_type(value: str | int | None, what: str = "cache type") -> GGMLType:
    """A cache type from its name ("q8_0") or ggml type id (llama-cpp-python's type_k/type_v); None: f16."""
    if value is None:
        return GGMLType.F16
    if isinstance(value, str):
        if value.lower() in CACHE_TYPES:
            return CACHE_TYPES[value.lower()]
    elif isinstance(value, int) and not isinstance(value, bool) and value in CACHE_TYPES.values():
        return GGMLType(value)
    raise ValueError(f"{what} {value!r} is not one of {', '.join(CACHE_TYPES)}")


def check_cache_types(cfg: Config, type_k: GGMLType, type_v: GGMLType) -> None:
    """ValueError unless the model's heads fit the types' blocks (as llama.cpp requires)."""
    for name, t, d in (("keys", type_k, cfg.head_dim), ("values", type_v, cfg.head_dim_v)):
        if not lib.pyllm_kv_type_valid(int(t), d):
            raise ValueError(f"a {t.name.lower()} cache cannot hold this model's {name}: heads of {d} elements "
                             "are not whole blocks of 32")


def _rows(capacity: int, n_heads: int, d: int, type_id: GGMLType) -> np.ndarray:
    """A layer's empty keys or values: (capacity, n_heads, d) float16, or (capacity, row bytes) uint8 blocks."""
    if type_id == GGMLType.F16:
        return np.zeros((capacity, n_heads, d), np.float16)
    return np.zeros((capacity, row_bytes(type_id, n_heads * d)), np.uint8)


@dataclass
class LayerCache:
    k: np.ndarray           # (capacity, n_head_kv, head_dim) float16, or (capacity, row bytes) of type_k's blocks
    v: np.ndarray           # (capacity, n_head_kv, head_dim_v) float16, or (capacity, row bytes) of type_v's
    positions: np.ndarray   # (capacity,) int32, -1 for an empty slot
    ring: bool              # slot = position % capacity (sliding-window layer)
    type_k: GGMLType = GGMLType.F16
    type_v: GGMLType = GGMLType.F16
    k_row: int = 0          # elements of a slot's keys (n_head_kv * head_dim); 0: k[0].size (f16)
    v_row: int = 0
    k_rot: int = 0          # keys (and queries) rotated in chunks of this size before they are stored (C's
    v_rot: int = 0          # pyllm_kv_rotation); values likewise, and the attention's output rotated back

    def __post_init__(self) -> None:
        self.k_row = self.k_row or self.k[0].size
        self.v_row = self.v_row or self.v[0].size
        self.c = ffi.new("pyllm_kv_layer *", {
            "k": ffi.from_buffer(self.k), "v": ffi.from_buffer(self.v),
            "positions": ffi.from_buffer("int32_t[]", self.positions), "capacity": len(self.positions),
            "k_row": self.k_row, "v_row": self.v_row, "ring": int(self.ring),
            "k_type": int(self.type_k), "v_type": int(self.type_v), "k_rot": self.k_rot, "v_rot": self.v_rot})

    @property
    def capacity(self) -> int:
        return len(self.positions)


def _layer_capacity(cfg: Config, i: int, n_ctx: int, max_batch: int) -> tuple[int, bool]:
    """(slots, whether they form a ring) of layer i's cache."""
    ring = cfg.is_swa_layer(i) and cfg.sliding_window + max_batch < n_ctx
    return (cfg.sliding_window + max_batch if ring else n_ctx), ring


class KVCache:
    @staticmethod
    def bytes_needed(cfg: Config, n_ctx: int, max_batch: int, type_k: GGMLType = GGMLType.F16,
                     type_v: GGMLType = GGMLType.F16) -> int:
        """The bytes a cache of this shape holds once full (what KVCache allocates)."""
        return KVCache.bytes_holding(cfg, n_ctx, n_ctx, max_batch, type_k, type_v)

    @staticmethod
    def bytes_holding(cfg: Config, n_tokens: int, n_ctx: int, max_batch: int, type_k: GGMLType = GGMLType.F16,
                      type_v: GGMLType = GGMLType.F16) -> int:
        """The bytes of such a cache's slots that n_tokens tokens fill (a ring's slots at most)."""
        slot = (row_bytes(type_k, cfg.n_head_kv * cfg.head_dim) + row_bytes(type_v, cfg.n_head_kv * cfg.head_dim_v)
                + 4)  # keys, values, an int32 position
        return sum(min(n_tokens, _layer_capacity(cfg, i, n_ctx, max_batch)[0]) for i in range(cfg.n_layer)) * slot

    def __init__(self, cfg: Config, n_ctx: int, max_batch: int, type_k: GGMLType = GGMLType.F16,
                 type_v: GGMLType = GGMLType.F16) -> None:
        check_cache_types(cfg, type_k, type_v)
        self.config = cfg
        self.n_ctx = n_ctx
        self.max_batch = max_batch
        self.type_k, self.type_v = GGMLType(type_k), GGMLType(type_v)
        self.n_used = 0  # tokens in the sequence; the next token's position
        self.layers: list[LayerCache] = []
        for i in range(cfg.n_layer):
            capacity, ring = _layer_capacity(cfg, i, n_ctx, max_batch)
            self.layers.append(LayerCache(
                k=_rows(capacity, cfg.n_head_kv, cfg.head_dim, self.type_k),
                v=_rows(capacity, cfg.n_head_kv, cfg.head_dim_v, self.type_v),
                positions=np.full(capacity, -1, np.int32),
                ring=ring, type_k=self.type_k, type_v=self.type_v,
                k_row=cfg.n_head_kv * cfg.head_dim, v_row=cfg.n_head_kv * cfg.head_dim_v,
                k_rot=lib.pyllm_kv_rotation(int(self.type_k), cfg.head_dim, 0),
                v_rot=lib.pyllm_kv_rotation(int(self.type_v), cfg.head_dim_v, 1),
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
        copy = into if into is not None else KVCache(self.config, self.n_ctx, self.max_batch, self.type_k, self.type_v)
        if ((copy.n_ctx, copy.max_batch, len(copy.layers), copy.type_k, copy.type_v)
                != (self.n_ctx, self.max_batch, len(self.layers), self.type_k, self.type_v)):
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
        if k.size != len(pos) * layer.k_row or v.size != len(pos) * layer.v_row:
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
