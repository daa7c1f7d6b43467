"""Python face of the C kernel core: dequantize, quantize, dot products, matmul.

Quantized data is handled as uint8 arrays of whole blocks; rows run along the
last axis. Weight type ids are ggml's (``GGMLType``). Every call checks shapes
and types here and again in C, and a bad argument raises ``KernelError``.

    >>> w = quantize(np.random.rand(64, 256).astype(np.float32), GGMLType.Q8_0)   # (64, 272) uint8
    >>> y = matmul(w, GGMLType.Q8_0, np.ones((2, 256), np.float32))               # (2, 64) float32
"""

from __future__ import annotations

import mmap
from enum import IntEnum

import numpy as np

from ._pyllm_c import ffi, lib


class KernelError(ValueError):
    """A kernel was given an unsupported type, a bad shape or a bad setting."""


def _c_names(prefix: str) -> dict[str, int]:
    """The C enum constants named prefix + NAME, as {NAME: value} in value order."""
    names = {name[len(prefix):]: getattr(lib, name) for name in dir(lib) if name.startswith(prefix)}
    return dict(sorted(((n, v) for n, v in names.items() if n != "COUNT"), key=lambda item: item[1]))


# Type ids are ggml's (GGUF stores them), and pyllm's layouts after them (Q4_0_LANES, Q5_0_G8, the 16-row tiles
# Q4_1_X16, Q8_0_X16, Q5_0_X16, Q4_K_X16, Q6_K_X16); the C core's enum pyllm_type is the one list, its table
# (pyllm_traits) the traits.
GGMLType = IntEnum("GGMLType", _c_names("PYLLM_TYPE_"))

# The kernel tiers (the C core's backends, pyllm_tier_name), in order of preference: the best is the last the CPU runs.
TIERS = tuple(ffi.string(lib.pyllm_tier_name(tier)).decode() for tier in range(lib.PYLLM_TIER_COUNT))

_STATUS = {
    lib.PYLLM_ERR_TYPE: "unsupported type",
    lib.PYLLM_ERR_SHAPE: "bad shape",
    lib.PYLLM_ERR_TIER: "SIMD tier not available on this CPU",
    lib.PYLLM_ERR_NOMEM: "out of memory",
    lib.PYLLM_ERR_THREADS: "bad thread count",
}


def _check(status: int, what: str) -> None:
    if status != lib.PYLLM_OK:
        raise KernelError(f"{what}: {_STATUS.get(status, f'error {status}')}")


def traits(type_id: int):
    """The C table's entry of a type id (pyllm_type_traits: name, block_size, type_size, vec_dot_type, plain_type,
    tile_rows, repacked, file_type), or None for an id it does not know."""
    entry = lib.pyllm_traits(int(type_id))
    return None if entry == ffi.NULL else entry


def type_name(type_id: int) -> str:
    return ffi.string(lib.pyllm_type_name(int(type_id))).decode()


def _traits(type_id: int) -> tuple[int, int]:
    """(block_size, type_size) of a supported type; KernelError otherwise."""
    entry = traits(type_id)
    if entry is None:
        raise KernelError(f"tensor type {type_id} is not supported by pyllm's kernels")
    return entry.block_size, entry.type_size


def row_bytes(type_id: int, n: int) -> int:
    """Bytes of one row of n elements of the type."""
    block_size, type_size = _traits(type_id)
    if n <= 0 or n % block_size:
        raise KernelError(f"{type_name(type_id)} rows hold a multiple of {block_size} elements, not {n}")
    return n // block_size * type_size


def activation_type(weight_type: int) -> GGMLType:
    """The format activations take in a dot product with this weight type."""
    _traits(weight_type)
    act = lib.pyllm_vec_dot_type(int(weight_type))
    if act < 0:
        raise KernelError(f"{type_name(weight_type)} is not a weight type")
    return GGMLType(act)


# ---- CPU tiers ----------------------------------------------------------------

def best_tier() -> str:
    """The best SIMD tier this CPU runs."""
    return TIERS[lib.pyllm_cpu_best_tier()]


def active_tier() -> str:
    """The tier matmul uses (best_tier() unless set_tier() or $PYLLM_TIER chose a lower one)."""
    return TIERS[lib.pyllm_active_tier()]


def set_tier(tier: str) -> None:
    if tier not in TIERS:
        raise KernelError(f"unknown tier {tier!r}; tiers: {', '.join(TIERS)}")
    _check(lib.pyllm_set_tier(TIERS.index(tier)), f"tier {tier}")


def physical_cores() -> int:
    return lib.pyllm_physical_cores()


# ---- conversions --------------------------------------------------------------

def _as_bytes(data: np.ndarray) -> np.ndarray:
    data = np.asarray(data)
    if not data.flags.c_contiguous:
        data = np.ascontiguousarray(data)
    return data.view(np.uint8) if data.dtype != np.uint8 else data


def dequantize(data: np.ndarray, type_id: int) -> np.ndarray:
    """Blocks of `type_id` (uint8, rows along the last axis) -> float32 values.

    A (rows, row_bytes) array gives (rows, row_elements); a 1-D one a 1-D array.
    Zero-copy input views (an mmapped GGUF tensor) are read in place.
    """
    raw = _as_bytes(data)
    block_size, type_size = _traits(type_id)
    if raw.ndim == 0 or raw.shape[-1] % type_size:
        raise KernelError(f"{type_name(type_id)} data must be whole blocks of {type_size} bytes")
    n = raw.size // type_size * block_size
    out = np.empty(raw.shape[:-1] + (raw.shape[-1] // type_size * block_size,), dtype=np.float32)
    if type_id == GGMLType.Q5_0_G8 and raw.ndim > 1:  # each row is grouped on its own
        for row, values in zip(raw.reshape(-1, raw.shape[-1]), out.reshape(-1, out.shape[-1]), strict=True):
            values[:] = dequantize(row, type_id)
        return out
    if n:
        _check(lib.pyllm_dequantize_row(int(type_id), ffi.from_buffer(raw), ffi.from_buffer("float[]", out), n),
               f"dequantize {type_name(type_id)}")
    return out


def _out_like(raw: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """The array a layout conversion of raw writes: `out` once checked (contiguous uint8 of raw's shape), or a new
    64-byte-aligned one."""
    if out is None:
        return aligned_empty(raw.shape)
    if out.shape != raw.shape or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise KernelError(f"out must be a contiguous uint8 array of shape {raw.shape}")
    return out


def matrix_layout(type_id: int, n_rows: int, for_matmul: bool = True) -> GGMLType:
    """The layout the active tier's matmuls read a matrix of `type_id` with n_rows rows in (C: pyllm_choose_layout): a
    faster one with the same bits where there is one (16-row tiles where the tier has their kernels, Q5_0 regrouped),
    Q4_0 in llama.cpp's order for its row count, else the type itself. for_matmul=False: a matrix only looked up by
    rows (an embedding)."""
    layout = lib.pyllm_choose_layout(int(type_id), int(n_rows), int(for_matmul))
    if layout < 0:
        raise KernelError(f"{type_name(type_id)} is not a weight type")
    return GGMLType(layout)


def repack(data: np.ndarray, type_id: int, layout: int, out: np.ndarray | None = None) -> np.ndarray:
    """A (n_rows, row_bytes) matrix of `type_id` rebuilt in `layout` (one whose traits say repacked): the same values
    and the same matmul bits, the bytes moved. Into `out` (the same shape, contiguous), or a new 64-byte-aligned array.
    A tiled layout keeps each tile's rows' bytes, so a matrix can go a slice of tiles at a time."""
    raw = _as_bytes(data)
    _, type_size = _traits(type_id)
    entry = traits(layout)
    tile_rows = entry.tile_rows if entry is not None else 1
    if raw.ndim != 2 or raw.shape[1] == 0 or raw.shape[1] % type_size or raw.shape[0] % tile_rows:
        what = f"({tile_rows} k, row_bytes)" if tile_rows > 1 else "(n_rows, row_bytes)"
        raise KernelError(f"a {type_name(type_id)} matrix to repack is {what} whole blocks of {type_size} bytes; "
                          f"got {raw.shape}")
    out = _out_like(raw, out)
    n = raw.shape[1] // type_size * _traits(type_id)[0]
    _check(lib.pyllm_repack(int(type_id), int(layout), ffi.from_buffer(raw), ffi.from_buffer(out), raw.shape[0], n),
           f"repack {type_name(type_id)} as {type_name(layout)}")
    return out


def _tiled_layout(type_id: int) -> int:
    """The 16-row tiled layout of a weight type (whichever tier has its kernels), or -1."""
    return next((t for t in GGMLType if (e := traits(t)) is not None and e.tile_rows > 1 and e.plain_type == type_id),
                -1)


def group_q5_0(data: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A Q5_0 matrix (n_rows, row_bytes) in the Q5_0_G8 layout: each row's blocks eight at a time (scales
    together, fifth bits transposed), the same values and the same matmul bits, fewer instructions a block for
    the kernels."""
    return repack(data, GGMLType.Q5_0, GGMLType.Q5_0_G8, out)


def interleaved_type(type_id: int) -> GGMLType | None:
    """The interleaved (16-row tiled) form of a weight type when this CPU's active tier has its decode kernels, else
    None."""
    layout = lib.pyllm_choose_layout(int(type_id), 16, 1)
    entry = traits(layout) if layout >= 0 else None
    return GGMLType(layout) if entry is not None and entry.tile_rows > 1 else None


_HUGE_PAGE = 2 << 20


def aligned_empty(shape: tuple[int, int]) -> np.ndarray:
    """An uninitialised uint8 array whose data starts on a 64-byte line; a large one in its own mapping, its whole
    2 MB pages asked to be huge where the kernel offers them (transparent huge pages on madvise): a fault a 2 MB page
    instead of 512, and fewer TLB misses when a decode step streams the matrix."""
    size = shape[0] * shape[1]
    if size >= _HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"):
        mapping = mmap.mmap(-1, size + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        data = np.frombuffer(mapping, dtype=np.uint8)
        start = -data.ctypes.data % _HUGE_PAGE
        try:  # a tail in small pages; a kernel without THP refuses the advice, which changes nothing else
            mapping.madvise(mmap.MADV_HUGEPAGE, start, size // _HUGE_PAGE * _HUGE_PAGE)
        except OSError:
            pass
        return data[start:start + size].reshape(shape)
    buffer = np.empty(size + 64, dtype=np.uint8)
    start = -buffer.ctypes.data % 64
    return buffer[start:start + size].reshape(shape)


def interleave(data: np.ndarray, type_id: int, out: np.ndarray | None = None) -> np.ndarray:
    """A Q4_1 / Q8_0 / Q5_0 / Q4_K / Q6_K matrix (n_rows, row_bytes), n_rows a multiple of 16, in its interleaved
    layout: 16 rows a tile, their quants side by side 4 bytes at a time (Q5_0's fifth bits as a 64-bit mask a lane,
    Q6_K's quants regrouped), the same values and the same matmul bits, for kernels that hold 16 weight rows in a
    vector."""
    return repack(data, type_id, _tiled_layout(type_id), out)


def quantize(x: np.ndarray, type_id: int) -> np.ndarray:
    """float32 values (rows along the last axis) -> uint8 blocks of `type_id`."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    block_size, type_size = _traits(type_id)
    if not lib.pyllm_can_quantize(int(type_id)):
        raise KernelError(f"quantizing to {type_name(type_id)} is not supported")
    if x.ndim == 0 or x.shape[-1] % block_size:
        raise KernelError(f"{type_name(type_id)} rows hold a multiple of {block_size} elements, not {x.shape[-1:]}")
    out = np.empty(x.shape[:-1] + (x.shape[-1] // block_size * type_size,), dtype=np.uint8)
    if x.size:
        _check(lib.pyllm_quantize_row(int(type_id), ffi.from_buffer("float[]", x), ffi.from_buffer(out), x.size),
               f"quantize {type_name(type_id)}")
    return out


def quantize_rows(x: np.ndarray, type_id: int, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 rows (n_rows, n) -> (n_rows, row_bytes) uint8 of file type `type_id`, the bytes llama.cpp's quantizer
    writes: its scale searches, steered by `importance` (n floats, an imatrix row) when given. Releases the GIL, so
    threads can quantize slices of a matrix side by side."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    block_size, type_size = _traits(type_id)
    if x.ndim != 2 or x.shape[1] == 0 or x.shape[1] % block_size:
        raise KernelError(f"{type_name(type_id)} rows hold a multiple of {block_size} elements, not {x.shape}")
    weights = ffi.NULL
    if importance is not None:
        importance = np.ascontiguousarray(importance, dtype=np.float32)
        if importance.shape != (x.shape[1],):
            raise KernelError(f"importance must hold {x.shape[1]} floats, not {importance.shape}")
        weights = ffi.from_buffer("float[]", importance)
    out = np.empty((x.shape[0], x.shape[1] // block_size * type_size), dtype=np.uint8)
    if x.shape[0]:
        _check(lib.pyllm_quantize_rows(int(type_id), ffi.from_buffer("float[]", x), ffi.from_buffer(out), x.shape[0],
                                       x.shape[1], weights), f"quantize to {type_name(type_id)}")
    return out


def quantize_activations(x: np.ndarray, weight_type: int) -> np.ndarray:
    """float32 activations (rows along the last axis) -> the format matmul pairs with `weight_type`.

    q8_0 / q8_1 activations round like llama.cpp's x86 backend (half to even, x * 127 / amax),
    which can differ by one step from the weight quantizer `quantize(x, Q8_0)`.
    """
    act = activation_type(weight_type)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0:
        raise KernelError("activations must have at least one axis")
    n = x.shape[-1]
    out = np.empty(x.shape[:-1] + (row_bytes(act, n),), dtype=np.uint8)
    rows_x, rows_out = x.reshape(-1, n), out.reshape(-1, out.shape[-1])
    what = f"activations for {type_name(weight_type)}"
    for r in range(rows_x.shape[0]):
        _check(lib.pyllm_quantize_activations(int(weight_type), ffi.from_buffer("float[]", rows_x[r]),
                                              ffi.from_buffer(rows_out[r]), n), what)
    return out.view(np.float32) if act == GGMLType.F32 else out


# ---- products -----------------------------------------------------------------

def vec_dot(weight_type: int, w: np.ndarray, act: np.ndarray, n: int, tier: str | None = None) -> float:
    """Dot product of one weight row and one activation row (from quantize_activations)."""
    w_raw, act_raw = _as_bytes(w), _as_bytes(act)
    if w_raw.size != row_bytes(weight_type, n):
        raise KernelError(f"weight row has {w_raw.size} bytes, {n} {type_name(weight_type)} elements need "
                          f"{row_bytes(weight_type, n)}")
    act_type = activation_type(weight_type)
    if act_raw.size != row_bytes(act_type, n):
        raise KernelError(f"activation row has {act_raw.size} bytes, expected {row_bytes(act_type, n)}")
    tier_id = lib.pyllm_active_tier() if tier is None else TIERS.index(tier)
    out = ffi.new("float *")
    _check(lib.pyllm_vec_dot(tier_id, int(weight_type), ffi.from_buffer(w_raw), ffi.from_buffer(act_raw), n, out),
           f"vec_dot {type_name(weight_type)} ({TIERS[tier_id]})")
    return float(out[0])


def matmul(w: np.ndarray, weight_type: int, x: np.ndarray, n_threads: int | None = None,
           out: np.ndarray | None = None) -> np.ndarray:
    """Y[M, N] = X[M, K] · W[N, K]ᵀ with W as (N, row_bytes) uint8 blocks of `weight_type`.

    Every row of Y is bit-identical whatever M and n_threads (default: all physical cores).
    A 1-D x gives a 1-D y.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim not in (1, 2):
        raise KernelError(f"matmul wants X (M, K) or (K,); got shape {x.shape}")
    y = WeightMatrix(w, weight_type, x.shape[-1])(np.atleast_2d(x), n_threads, out)
    return y[0] if x.ndim == 1 else y


class WeightMatrix:
    """A weight W (N rows of K elements, quantized) checked once, for repeated Y = X · Wᵀ.

    The forward pass multiplies by each weight once per layer per step; the argument checks and the choice of
    kernels (the active tier's kernel set for its layout, pyllm_kernels) are made here, once, so the per-call cost
    is the C call itself. A later set_tier does not change how a loaded weight multiplies.
    """

    def __init__(self, data: np.ndarray, weight_type: int, n_in: int) -> None:
        raw = _as_bytes(data)
        activation_type(weight_type)
        if raw.ndim != 2:
            raise KernelError(f"a weight is (N, row_bytes) blocks; got shape {raw.shape}")
        if raw.shape[1] != row_bytes(weight_type, n_in):
            raise KernelError(f"W rows have {raw.shape[1]} bytes; {n_in} {type_name(weight_type)} elements need "
                              f"{row_bytes(weight_type, n_in)}")
        self.data = raw
        self.type = int(weight_type)
        self.n_in = n_in
        self.n_out = raw.shape[0]
        self.ptr = ffi.from_buffer(raw)
        self.kernels = lib.pyllm_kernels(self.type)
        # the C core's pyllm_weight: the model's blocks copy it, matmul takes it
        self.c = ffi.new("pyllm_weight *", {"kernels": self.kernels, "data": self.ptr, "n_out": self.n_out,
                                            "n_in": n_in})
        self._what = f"matmul {type_name(self.type)}"  # for errors; built once, not per call

    def __call__(self, x: np.ndarray, n_threads: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """x (M, n_in) float32 -> (M, n_out) float32, into `out` when given."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.n_in:
            raise KernelError(f"input of shape {x.shape} for a weight with rows of {self.n_in}")
        shape = (x.shape[0], self.n_out)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise KernelError(f"out must be a contiguous float32 array of shape {shape}")
        if n_threads is not None and n_threads < 1:
            raise KernelError(f"n_threads must be at least 1, not {n_threads}")
        if x.shape[0] and self.n_out:
            _check(lib.pyllm_matmul(self.c, ffi.from_buffer("float[]", x), x.shape[0], ffi.from_buffer("float[]", out),
                                    n_threads or 0), self._what)
        return out

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` (int, (m,)) of W as float32 (m, n_in), whatever its layout (an embedding lookup)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        out = np.empty((len(ids), self.n_in), dtype=np.float32)
        status = lib.pyllm_dequantize_rows(self.type, self.ptr, self.n_out, self.n_in,
                                           ffi.from_buffer("int64_t[]", ids), len(ids), ffi.from_buffer("float[]", out))
        if status != lib.PYLLM_OK:  # the message only when needed: a decode step looks up rows every time
            _check(status, f"rows of {type_name(self.type)}")
        return out


# ---- forward-pass ops ---------------------------------------------------------

def _f32(a: np.ndarray, name: str) -> np.ndarray:
    if a.dtype != np.float32 or not a.flags.c_contiguous:
        raise KernelError(f"{name} must be a contiguous float32 array")
    return a


def _fptr(a: np.ndarray):
    return ffi.from_buffer("float[]", a)


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    """x (..., n) / rms(x) * weight (n,): each row alone."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = x.shape[-1]
    out = np.empty_like(x) if out is None else _f32(out, "out")
    w = ffi.NULL if weight is None else _fptr(_f32(weight, "weight"))
    if weight is not None and weight.shape != (n,):
        raise KernelError(f"rms_norm weight has shape {weight.shape}, rows have {n} elements")
    lib.pyllm_rms_norm(_fptr(x), w, _fptr(out), x.size // n, n, float(eps))
    return out


def rope(x: np.ndarray, positions: np.ndarray, n_rot: int, freq_base: float, freq_scale: float = 1.0,
         neox: bool = False) -> None:
    """In place on x (m, n_heads, head_dim) at positions (m,) int32."""
    _f32(x, "x")
    m, n_heads, head_dim = x.shape
    pos = np.ascontiguousarray(positions, dtype=np.int32)
    if pos.shape != (m,) or not 0 < n_rot <= head_dim or n_rot % 2:
        raise KernelError(f"rope: positions {pos.shape} for {m} rows, n_rot {n_rot} of head_dim {head_dim}")
    _check(lib.pyllm_rope(_fptr(x), ffi.from_buffer("int32_t[]", pos), m, n_heads, head_dim, n_rot,
                          float(freq_base), float(freq_scale), int(neox)), "rope")


def gated_activation(gate: np.ndarray, up: np.ndarray, kind: str) -> np.ndarray:
    """silu(gate) * up ("silu") or gelu_tanh(gate) * up ("gelu")."""
    gate, up = _f32(gate, "gate"), _f32(up, "up")
    if gate.shape != up.shape:
        raise KernelError(f"gated activation: gate {gate.shape} and up {up.shape} differ")
    out = np.empty_like(gate)
    if kind == "silu":
        width = gate.shape[-1] if gate.ndim else 1
        lib.pyllm_swiglu(_fptr(gate), _fptr(up), _fptr(out), gate.size // max(width, 1), width)
    elif kind == "gelu":
        lib.pyllm_geglu(_fptr(gate), _fptr(up), _fptr(out), gate.size)
    else:
        raise KernelError(f"gated activation: unknown kind {kind!r}")
    return out


def hadamard(x: np.ndarray, n: int) -> np.ndarray:
    """x (float32, its size a multiple of n, a power of two) with each run of n elements rotated by the
    orthonormal Walsh-Hadamard matrix, as llama.cpp rotates a quantized cache's keys and values (a copy)."""
    if x.dtype != np.float32:
        raise KernelError("hadamard: x must be float32")
    if n < 2 or n & (n - 1) or x.size % n:
        raise KernelError(f"hadamard: chunks of {n} (a power of two) over {x.size} elements")
    out = np.array(x, dtype=np.float32, order="C")
    lib.pyllm_hadamard(_fptr(out), out.size // n, n)
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_positions: np.ndarray, k_positions: np.ndarray,
              scale: float, window: int = 0, softcap: float = 0.0, n_threads: int | None = None,
              type_k: int = GGMLType.F16, type_v: int = GGMLType.F16) -> np.ndarray:
    """Causal attention: q (m, n_head, d) float32 over k, v (n_kv, n_head_kv, d) float16 -> (m, n_head, d); or, for
    a quantized cache (type_k / type_v another cache type), k or v (n_kv, row bytes) uint8 blocks of that type.

    Key t is visible to query r when k_positions[t] <= q_positions[r] (and within the sliding window).
    """
    _f32(q, "q")
    m, n_head, d = q.shape
    n_kv = len(k)
    shapes = []
    for name, a, t in (("k", k, type_k), ("v", v, type_v)):
        if not a.flags.c_contiguous:
            raise KernelError(f"{name} must be contiguous")
        if t == GGMLType.F16:
            if a.dtype != np.float16 or a.ndim != 3 or a.shape[2] != d:
                raise KernelError(f"{name} must be a float16 array (n_kv, n_head_kv, {d}) for an f16 cache")
            shapes.append(a.shape[1])
        else:
            if not lib.pyllm_kv_type_valid(int(t), d):
                raise KernelError(f"a {type_name(t)} cache cannot hold heads of {d} elements")
            if a.dtype != np.uint8 or a.ndim != 2 or a.shape[1] % row_bytes(t, d):
                raise KernelError(f"{name} must be uint8 rows of {type_name(t)} blocks, whole heads of {d}")
            shapes.append(a.shape[1] // row_bytes(t, d))
    n_head_kv = shapes[0]
    if len(v) != n_kv or shapes[1] != n_head_kv:
        raise KernelError(f"attention shapes: q {q.shape}, k {k.shape}, v {v.shape}")
    qpos = np.ascontiguousarray(q_positions, dtype=np.int32)
    kpos = np.ascontiguousarray(k_positions, dtype=np.int32)
    if len(qpos) != m or len(kpos) != n_kv:
        raise KernelError(f"attention: {len(qpos)} query and {len(kpos)} key positions for {m} queries, {n_kv} keys")
    out = np.empty_like(q)
    call = ffi.new("pyllm_attention_call *", {
        "q": _fptr(q), "k": ffi.from_buffer(k), "v": ffi.from_buffer(v), "qpos": ffi.from_buffer("int32_t[]", qpos),
        "kpos": ffi.from_buffer("int32_t[]", kpos), "m": m, "n_kv": n_kv, "out": _fptr(out),
        "k_type": int(type_k), "v_type": int(type_v)})
    _check(lib.pyllm_attention_batch(call, 1, n_head, n_head_kv, d, float(scale), int(window), float(softcap),
                                     0 if n_threads is None else n_threads), "attention")
    return out
