"""Saved state: a context's tokens and their KV cache, in memory (`LlamaState`) or in a file.

    state = llm.save_state()            # the last generation's context
    llm.load_state(state)               # a later prompt that extends state.tokens continues from it
    llm.save_session("doc.pyllm")       # the same, on disk
    llm.load_session("doc.pyllm")

The file (version 1), all integers little-endian:

    magic   b"PYLLMKV\\0"
    version u32
    length  u32 of the header that follows
    header  JSON: {"model": model identity, "n_ctx", "n_tokens", "layers": [[slots, k_row, v_row], ...],
                   "shapes": a slot's keys' and values' array shapes, "types": the cache's ["F16", "Q8_0"]}
    tokens  int32 x n_tokens
    layers  per layer: positions int32 x slots, keys x slots x k_row, values x slots x v_row, each float16 for
            an F16 cache, bytes (the blocks) for a quantized one; no "types": F16 both
    sha256  32 bytes, of everything before it

A layer keeps the slots that hold the context's tokens: all of them for full attention, the ring's for a
sliding-window layer. They are placed again by position, so a state loads into a Llama with another n_ctx
or prefill_chunk as long as its tokens fit. The keys and values are the very bits the cache held, so a
continuation's logits are bit-identical to never saving.

The model identity is a SHA-256 of the GGUF file's size, its header (metadata and tensor table) and the first
and last MiB of its tensor data: cheap on a many-GB file, and it tells apart other models, quantizations and
fine-tunes (whose weights differ throughout). A file from another model, truncated or damaged is refused with
a ParamError saying which.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .kernels import GGMLType
from .kvcache import KVCache
from .params import ParamError

MAGIC = b"PYLLMKV\0"
VERSION = 1
_FIXED = struct.Struct("<8sII")   # magic, version, header length
_DIGEST = 32
_MAX_HEADER = 1 << 20             # the header is a few hundred bytes per layer: a larger one is damage
_SAMPLE = 1 << 20


def model_identity(path: str | os.PathLike[str], data_offset: int) -> str:
    """The identity of a GGUF file (see the module's doc), as hex."""
    h = hashlib.sha256(b"pyllm model identity 1\0")
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        h.update(size.to_bytes(8, "little"))
        f.seek(0)
        h.update(f.read(data_offset))
        h.update(f.read(_SAMPLE))
        f.seek(max(data_offset, size - _SAMPLE))
        h.update(f.read(_SAMPLE))
    return h.hexdigest()


@dataclass
class LayerState:
    positions: np.ndarray   # (slots,) int32: the position each slot holds
    k: np.ndarray           # (slots, n_head_kv, head_dim) float16, or (slots, row bytes) uint8 for a quantized cache
    v: np.ndarray           # (slots, n_head_kv, head_dim_v) float16, or (slots, row bytes) uint8


def _dtype(type_id: GGMLType) -> str:
    return "<f2" if type_id == GGMLType.F16 else "u1"


@dataclass
class LlamaState:
    """A context: its tokens, the KV cache that holds them, and the model it was computed by."""
    model: str              # model_identity of the GGUF file
    n_ctx: int              # the context of the Llama it was saved from (informative)
    tokens: list[int]
    layers: list[LayerState]
    types: tuple[GGMLType, GGMLType] = (GGMLType.F16, GGMLType.F16)  # the cache's keys' and values'

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return sum(layer.k.nbytes + layer.v.nbytes + layer.positions.nbytes for layer in self.layers)

    # ---- from and into a cache ----

    @classmethod
    def from_cache(cls, model: str, tokens: list[int], cache: KVCache) -> LlamaState:
        """A copy of the slots of `cache` that hold `tokens` (which the cache holds, from position 0)."""
        n = len(tokens)
        assert cache.n_used == n
        layers = []
        for layer in cache.layers:
            slots = np.flatnonzero((layer.positions >= 0) & (layer.positions < n)) if layer.ring \
                else np.arange(n)
            layers.append(LayerState(layer.positions[slots].copy(), layer.k[slots].copy(), layer.v[slots].copy()))
        return cls(model, cache.n_ctx, list(tokens), layers, (cache.type_k, cache.type_v))

    def into_cache(self, cache: KVCache) -> None:
        """Write the state into an empty cache (of the same model) by position; ParamError where it cannot hold
        it."""
        n = self.n_tokens
        if n >= cache.n_ctx:
            raise ParamError(f"state: the saved context has {n} tokens; this Llama's context holds {cache.n_ctx} "
                             "(it needs room for one more)", "state")
        if len(self.layers) != len(cache.layers):
            raise ParamError(f"state: {len(self.layers)} layers saved, the model has {len(cache.layers)}", "state")
        if self.types != (cache.type_k, cache.type_v):
            saved, here = ("/".join(t.name.lower() for t in types)
                           for types in (self.types, (cache.type_k, cache.type_v)))
            raise ParamError(f"state: saved from a {saved} KV cache (keys/values); this Llama's is {here}", "state")
        cache.clear()
        for i, (saved, layer) in enumerate(zip(self.layers, cache.layers, strict=True)):
            if saved.k.shape[1:] != layer.k.shape[1:] or saved.v.shape[1:] != layer.v.shape[1:]:
                raise ParamError(f"state: layer {i} holds keys {saved.k.shape[1:]} and values {saved.v.shape[1:]}, "
                                 f"the model's are {layer.k.shape[1:]} and {layer.v.shape[1:]}", "state")
            order = np.argsort(saved.positions, kind="stable")  # in a ring the later of two positions wins its slot
            positions = saved.positions[order]
            if len(positions) and (positions[0] < 0 or positions[-1] >= n):
                raise ParamError(f"state: layer {i} holds positions outside [0, {n})", "state")
            if not layer.ring and not np.array_equal(positions, np.arange(n)):
                raise ParamError(f"state: layer {i} does not hold every one of the {n} tokens", "state")
            if layer.ring:
                keep = positions >= n - layer.capacity  # what the ring has room for
                order, positions = order[keep], positions[keep]
            slots = positions % layer.capacity if layer.ring else positions
            layer.k[slots] = saved.k[order]
            layer.v[slots] = saved.v[order]
            layer.positions[slots] = positions
        cache.n_used = n
        if n and cache.truncate(n) != n:  # a sliding-window layer lacks part of the window the next token reads
            raise ParamError("state: its sliding-window layers do not hold the window the next token needs", "state")

    # ---- bytes ----

    def to_bytes(self) -> bytes:
        header = json.dumps({"model": self.model, "n_ctx": self.n_ctx, "n_tokens": self.n_tokens,
                             "layers": [[len(s.positions), int(np.prod(s.k.shape[1:])), int(np.prod(s.v.shape[1:]))]
                                        for s in self.layers],
                             "shapes": [[list(s.k.shape[1:]), list(s.v.shape[1:])] for s in self.layers],
                             "types": [t.name for t in self.types]}).encode()
        parts = [_FIXED.pack(MAGIC, VERSION, len(header)), header, np.asarray(self.tokens, "<i4").tobytes()]
        k_dtype, v_dtype = (_dtype(t) for t in self.types)
        for s in self.layers:
            parts += [s.positions.astype("<i4").tobytes(), s.k.astype(k_dtype).tobytes(), s.v.astype(v_dtype).tobytes()]
        body = b"".join(parts)
        return body + hashlib.sha256(body).digest()

    @classmethod
    def from_bytes(cls, data: bytes, what: str = "the state", param: str = "state") -> LlamaState:
        """Parse `to_bytes`' output; a ParamError (naming `param`) saying what is wrong with anything else."""
        def bad(message: str) -> ParamError:
            return ParamError(f"{what}: {message}", param)

        if len(data) < _FIXED.size:
            if MAGIC.startswith(data[:len(MAGIC)]):
                raise bad(f"truncated: {len(data)} bytes, not even the fixed header")
            raise bad("not a pyllm session file (bad magic)")
        magic, version, header_len = _FIXED.unpack_from(data)
        if magic != MAGIC:
            raise bad("not a pyllm session file (bad magic)")
        if version != VERSION:
            raise bad(f"file format version {version}; this pyllm reads version {VERSION}")
        if header_len > _MAX_HEADER:
            raise bad(f"damaged: a header of {header_len} bytes")
        if len(data) < _FIXED.size + header_len:
            raise bad(f"truncated: {len(data)} bytes, inside the header")
        try:
            header = json.loads(data[_FIXED.size:_FIXED.size + header_len])
            model, n_ctx, n_tokens = str(header["model"]), int(header["n_ctx"]), int(header["n_tokens"])
            sizes = [(int(a), int(b), int(c)) for a, b, c in header["layers"]]
            shapes = [(tuple(int(x) for x in k), tuple(int(x) for x in v)) for k, v in header["shapes"]]
            types = tuple(GGMLType[str(t)] for t in header.get("types", ["F16", "F16"]))
            if len(types) != 2:
                raise ValueError("types")
        except (ValueError, KeyError, TypeError) as exc:
            raise bad(f"damaged: its header does not parse ({type(exc).__name__})") from None
        k_dtype, v_dtype = (np.dtype(_dtype(t)) for t in types)
        if n_tokens < 0 or len(shapes) != len(sizes) or any(min(s) < 0 for s in sizes) or any(
                int(np.prod(k)) != kr or int(np.prod(v)) != vr for (k, v), (_, kr, vr) in zip(shapes, sizes,
                                                                                                strict=True)):
            raise bad("damaged: its header's sizes do not agree")
        expected = _FIXED.size + header_len + 4 * n_tokens + sum(
            4 * n + n * (k_dtype.itemsize * kr + v_dtype.itemsize * vr) for n, kr, vr in sizes)
        if len(data) != expected + _DIGEST:
            state = "truncated" if len(data) < expected + _DIGEST else "damaged"
            raise bad(f"{state}: {len(data)} bytes where its header says {expected + _DIGEST}")
        if hashlib.sha256(memoryview(data)[:expected]).digest() != data[expected:]:
            raise bad("damaged: its checksum does not match its contents")
        pos = _FIXED.size + header_len
        tokens = np.frombuffer(data, "<i4", n_tokens, pos).tolist()
        pos += 4 * n_tokens
        layers = []
        for (n, kr, vr), (k_shape, v_shape) in zip(sizes, shapes, strict=True):
            positions = np.frombuffer(data, "<i4", n, pos).astype(np.int32)
            pos += 4 * n
            k = np.frombuffer(data, k_dtype, n * kr, pos).astype(k_dtype.newbyteorder("=")).reshape(n, *k_shape)
            pos += k_dtype.itemsize * n * kr
            v = np.frombuffer(data, v_dtype, n * vr, pos).astype(v_dtype.newbyteorder("=")).reshape(n, *v_shape)
            pos += v_dtype.itemsize * n * vr
            layers.append(LayerState(positions, k, v))
        return cls(model, n_ctx, tokens, layers, types)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the file whole or not at all (a temporary file renamed over `path`)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(self.to_bytes())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LlamaState:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ParamError(f"path: cannot read {str(path)!r}: {exc.strerror or exc}", "path") from None
        return cls.from_bytes(data, f"{path}", "path")
