"""Python face of the C kernel core: dequantize, quantize, dot products, matmul.

Quantized data is handled as uint8 arrays of whole blocks; rows run along the
last axis. Weight type ids are ggml's (``GGMLType``). Every call checks shapes
and types here and again in C, and a bad argument raises ``KernelError``.

    >>> w = quantize(np.random.rand(64, 256).astype(np.float32), GGMLType.Q8_0)   # (64, 272) uint8
    >>> y = matmul(w, GGMLType.Q8_0, np.ones((2, 256), np.float32))               # (2, 64) float32
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from ._pyllm_c import ffi, lib


class KernelError(ValueError):
    """A kernel was given an unsupported type, a bad shape or a bad setting."""


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    BF16 = 30
    # not a GGUF type: Q4_0 blocks reduced as llama.cpp reduces a Q4_0 matrix it leaves uninterleaved
    Q4_0_LANES = 31
    # not a GGUF type: a Q5_0 matrix with each row's blocks regrouped eight at a time (group_q5_0)
    Q5_0_G8 = 32
    # not GGUF types: a Q4_1 / Q8_0 / Q5_0 matrix interleaved 16 rows at a time (interleave)
    Q4_1_X16 = 33
    Q8_0_X16 = 34
    Q5_0_X16 = 35


TIERS = ("generic", "avx2", "avx512", "avx512_vnni")

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


def type_name(type_id: int) -> str:
    return ffi.string(lib.pyllm_type_name(int(type_id))).decode()


def _traits(type_id: int) -> tuple[int, int]:
    """(block_size, type_size) of a supported type; KernelError otherwise."""
    block_size = lib.pyllm_type_block_size(int(type_id))
    if block_size == 0:
        raise KernelError(f"tensor type {type_id} is not supported by pyllm's kernels")
    return block_size, lib.pyllm_type_size(int(type_id))


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


def group_q5_0(data: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A Q5_0 matrix (n_rows, row_bytes) in the Q5_0_G8 layout: each row's blocks eight at a time (scales
    together, fifth bits transposed), the same values and the same matmul bits, fewer instructions a block for
    the kernels. Into `out` (the same shape, contiguous), or a new 64-byte-aligned array."""
    raw = _as_bytes(data)
    _, type_size = _traits(GGMLType.Q5_0)
    if raw.ndim != 2 or raw.shape[1] == 0 or raw.shape[1] % type_size:
        raise KernelError(f"a Q5_0 matrix is (n_rows, row_bytes) whole blocks of {type_size} bytes; got {raw.shape}")
    out = _out_like(raw, out)
    n = raw.shape[1] // type_size * 32
    _check(lib.pyllm_group_q5_0(ffi.from_buffer(raw), ffi.from_buffer(out), raw.shape[0], n), "group Q5_0")
    return out


def interleaved_type(type_id: int) -> GGMLType | None:
    """The interleaved form of a weight type when this CPU's active tier has its decode kernels, else None."""
    interleaved = lib.pyllm_interleaved_type(int(type_id))
    return GGMLType(interleaved) if interleaved >= 0 else None


def aligned_empty(shape: tuple[int, int]) -> np.ndarray:
    """An uninitialised uint8 array whose data starts on a 64-byte line."""
    buffer = np.empty(shape[0] * shape[1] + 64, dtype=np.uint8)
    start = -buffer.ctypes.data % 64
    return buffer[start:start + shape[0] * shape[1]].reshape(shape)


def interleave(data: np.ndarray, type_id: int, out: np.ndarray | None = None) -> np.ndarray:
    """A Q4_1 / Q8_0 / Q5_0 matrix (n_rows, row_bytes), n_rows a multiple of 16, in its interleaved layout (the type
    interleaved_type names): 16 rows a tile, their quants side by side 4 bytes at a time (Q5_0's fifth bits as a
    64-bit mask a lane), the same values and the
    same matmul bits, for kernels that hold 16 weight rows in a vector. Into `out` (the same shape, contiguous),
    or a new 64-byte-aligned array. Each tile keeps its rows' bytes, so a matrix can go a slice of tiles at a time."""
    raw = _as_bytes(data)
    _, type_size = _traits(type_id)
    if raw.ndim != 2 or raw.shape[1] == 0 or raw.shape[1] % type_size or raw.shape[0] % 16:
        raise KernelError(f"an interleaved matrix is (16 k, row_bytes) whole blocks of {type_size} bytes; "
                          f"got {raw.shape}")
    out = _out_like(raw, out)
    n = raw.shape[1] // type_size * 32
    _check(lib.pyllm_interleave(int(type_id), ffi.from_buffer(raw), ffi.from_buffer(out), raw.shape[0], n),
           f"interleave {type_name(type_id)}")
    return out


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

    The forward pass multiplies by each weight once per layer per step; doing the
    argument checks here, once, keeps the per-call cost to the C call itself.
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
            _check(lib.pyllm_matmul(self.type, self.ptr, self.n_out, self.n_in, ffi.from_buffer("float[]", x),
                                    x.shape[0], ffi.from_buffer("float[]", out), n_threads or 0), self._what)
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


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_positions: np.ndarray, k_positions: np.ndarray,
              scale: float, window: int = 0, softcap: float = 0.0, n_threads: int | None = None) -> np.ndarray:
    """Causal attention: q (m, n_head, d) float32 over k, v (n_kv, n_head_kv, d) float16 -> (m, n_head, d).

    Key t is visible to query r when k_positions[t] <= q_positions[r] (and within the sliding window).
    """
    _f32(q, "q")
    for name, a in (("k", k), ("v", v)):
        if a.dtype != np.float16 or not a.flags.c_contiguous:
            raise KernelError(f"{name} must be a contiguous float16 array (the KV cache's type)")
    m, n_head, d = q.shape
    n_kv, n_head_kv, _ = k.shape
    if k.shape != v.shape or k.shape[2] != d:
        raise KernelError(f"attention shapes: q {q.shape}, k {k.shape}, v {v.shape}")
    qpos = np.ascontiguousarray(q_positions, dtype=np.int32)
    kpos = np.ascontiguousarray(k_positions, dtype=np.int32)
    out = np.empty_like(q)
    _check(lib.pyllm_attention(_fptr(q), ffi.from_buffer("uint16_t[]", k), ffi.from_buffer("uint16_t[]", v),
                               ffi.from_buffer("int32_t[]", qpos),
                               ffi.from_buffer("int32_t[]", kpos), m, n_kv, n_head, n_head_kv, d, float(scale),
                               int(window), float(softcap), _fptr(out), 0 if n_threads is None else n_threads),
           "attention")
    return out
