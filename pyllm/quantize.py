"""`pyllm quantize`: a GGUF model rewritten in another quantization, as llama.cpp's llama-quantize writes it.

Two parts. `plan` decides each tensor's new type: llama.cpp's file types (Q4_K_M and the rest) are mixes, in which
some tensors get more bits (attn_v and ffn_down of some layers, the output matrix), tensors whose rows do not fit a
format's blocks fall back to one that does, and 1-D tensors (norms, biases) are kept as they are. `quantize_model`
then writes the file: each tensor to convert is dequantized to float32 and quantized by the C core's quantizers,
which give llama.cpp's bytes; the others are copied. The metadata is copied, with `general.file_type` and
`general.quantization_version` set as llama.cpp sets them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path

import numpy as np

from . import kernels
from .gguf import TYPE_TRAITS, GGUFFile, TensorInfo, ValueType, type_name
from .gguf_writer import GGUFWriter, MetadataValue, TensorEntry, metadata_of
from .imatrix import Imatrix
from .kernels import GGMLType

__all__ = ["FILE_TYPES", "WRITABLE_TYPES", "FileType", "QuantizeError", "TensorPlan", "file_type", "imatrix_metadata",
           "plan", "quantize_model", "tensor_bytes", "tensor_type"]

# llama.cpp's GGML_QNT_VERSION: the quantization format version its files record
QUANTIZATION_VERSION = 2


class QuantizeError(ValueError):
    """A quantization that cannot be done (bad type name, quantized input without allow_requantize, ...)."""


@dataclass(frozen=True)
class FileType:
    """A llama.cpp file type (LLAMA_FTYPE_*): its id, as `general.file_type` records it, and its base tensor type."""

    name: str
    id: int
    base: GGMLType


FILE_TYPES: dict[str, FileType] = {ft.name: ft for ft in [
    FileType("Q4_0", 2, GGMLType.Q4_0),
    FileType("Q4_1", 3, GGMLType.Q4_1),
    FileType("Q5_0", 8, GGMLType.Q5_0),
    FileType("Q5_1", 9, GGMLType.Q5_1),
    FileType("Q8_0", 7, GGMLType.Q8_0),
    FileType("Q2_K", 10, GGMLType.Q2_K),
    FileType("Q3_K_S", 11, GGMLType.Q3_K),
    FileType("Q3_K_M", 12, GGMLType.Q3_K),
    FileType("Q3_K_L", 13, GGMLType.Q3_K),
    FileType("Q4_K_S", 14, GGMLType.Q4_K),
    FileType("Q4_K_M", 15, GGMLType.Q4_K),
    FileType("Q5_K_S", 16, GGMLType.Q5_K),
    FileType("Q5_K_M", 17, GGMLType.Q5_K),
    FileType("Q6_K", 18, GGMLType.Q6_K),
    FileType("F16", 1, GGMLType.F16),
    FileType("BF16", 32, GGMLType.BF16),
    FileType("F32", 0, GGMLType.F32),
]}
# llama-quantize's short names for the medium mixes
_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}

# The tensor types a file can hold that pyllm can write (--output-type).
WRITABLE_TYPES = {type_name(t): t for t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1,
                                            GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K,
                                            GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)}


def file_type(name: str) -> FileType:
    """A file type by llama-quantize's name (any case; Q4_K for Q4_K_M ...) or its number."""
    key = name.strip().upper()
    key = _ALIASES.get(key, key)
    if key in FILE_TYPES:
        return FILE_TYPES[key]
    by_id = {str(ft.id): ft for ft in FILE_TYPES.values()}
    if key in by_id:
        return by_id[key]
    raise QuantizeError(f"unknown quantization type {name!r}; known: {', '.join([*FILE_TYPES, *_ALIASES])}")


def tensor_type(name: str) -> GGMLType:
    """A tensor type by its ggml name (any case), one pyllm writes."""
    found = WRITABLE_TYPES.get(name.strip().upper())
    if found is None:
        raise QuantizeError(f"unknown tensor type {name!r}; known: {', '.join(WRITABLE_TYPES)}")
    return found


# ---- which tensors are quantized, and to what -----------------------------------------------------------------

# Substrings of tensor names llama.cpp never quantizes (small or precision-critical matrices).
_KEEP_SUBSTRINGS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight",
    "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight",
    "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_",
    ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")

# K-quants on a row that is not a multiple of 256 fall back to a 32-element format of about as many bits.
_FALLBACK = {GGMLType.Q2_K: GGMLType.Q4_0, GGMLType.Q3_K: GGMLType.Q4_0, GGMLType.Q4_K: GGMLType.Q5_0,
             GGMLType.Q5_K: GGMLType.Q5_1, GGMLType.Q6_K: GGMLType.Q8_0}


def _block_size(type_id: int) -> int:
    return TYPE_TRAITS[type_id][1]


def _n_dims(shape: tuple[int, ...]) -> int:
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return n


def allows_quantization(t: TensorInfo) -> bool:
    """Whether llama.cpp would quantize this tensor at all: matrices whose name ends in "weight", not norms and the
    other small or sensitive ones."""
    if _n_dims(t.shape) < 2 or not t.name.endswith("weight"):
        return False
    return t.name not in _KEEP_NAMES and not any(s in t.name for s in _KEEP_SUBSTRINGS)


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for needle, category in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"),
                             ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                             ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                             ("ffn_down", "ffn_down")):
        if needle in name:
            return category
    return "other"


_LAYER = re.compile(r"blk\.([+-]?\d+)")


def _layer_of(name: str) -> int:
    match = _LAYER.match(name)
    return int(match.group(1)) if match else -1


def tensor_order(names: list[str]) -> list[str]:
    """llama.cpp's order of a model's tensors: by layer number (tensors outside the layers first), then by name."""
    return sorted(names, key=lambda n: (_layer_of(n), n.encode("utf-8")))


@dataclass(frozen=True)
class ModelShape:
    """What of the hyperparameters the mixes look at."""

    arch: str
    n_layer: int
    n_gqa: int        # query heads per kv head (0 when unknown)
    n_expert: int
    is_70b: bool      # llama.cpp's LLM_TYPE_70B: a Llama of 80 layers with grouped-query attention

    @classmethod
    def of(cls, metadata: Mapping[str, object]) -> ModelShape:
        arch = metadata.get("general.architecture")
        arch = arch if isinstance(arch, str) else ""

        def first_int(key: str) -> int:
            value = metadata.get(f"{arch}.{key}", 0)
            if isinstance(value, np.ndarray):
                value = value[0] if value.size else 0
            return int(value) if isinstance(value, int | np.integer) and not isinstance(value, bool) else 0

        n_layer = first_int("block_count")
        n_head, n_head_kv = first_int("attention.head_count"), first_int("attention.head_count_kv")
        if f"{arch}.attention.head_count_kv" not in metadata:
            n_head_kv = n_head
        n_gqa = n_head // n_head_kv if n_head_kv else 0
        return cls(arch, n_layer, n_gqa, first_int("expert_count"),
                   arch == "llama" and n_layer == 80 and n_head != n_head_kv)


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


@dataclass
class _MixState:
    """The counters llama.cpp's mix keeps as it walks the tensors in order."""

    n_attention_wv: int
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0


def _mix_type(t: TensorInfo, ftype: FileType, base: GGMLType, model: ModelShape, tied: bool,
              output_type: GGMLType | None, has_imatrix: bool, state: _MixState) -> GGMLType:
    """llama.cpp's choice for one quantized tensor of a mix (llama_tensor_get_type_impl, the file types pyllm
    writes)."""
    name, category, f, new = t.name, _category(t.name), ftype.name, base
    falcon = model.arch == "falcon"

    def layer(counter: int) -> int:
        if model.n_expert > 1:  # experts' tensors come in any order: the layer is read from the name
            found = _layer_of(name)
            if not 0 <= found < model.n_layer:
                raise QuantizeError(f"cannot tell the layer of tensor {name}")
            return found
        return counter

    if category == "output" or (tied and category == "token_embd"):
        if output_type is not None:
            return output_type
        if falcon or t.shape[0] % _block_size(base) != 0:
            return GGMLType.Q8_0
        return base if base == GGMLType.Q8_0 else GGMLType.Q6_K
    if category == "token_embd":
        return new
    if category in ("attn_v", "attn_qkv", "attn_kv_b"):
        if f == "Q2_K":
            new = GGMLType.Q4_K if model.n_gqa >= 4 else GGMLType.Q3_K
        elif f == "Q3_K_M":
            new = GGMLType.Q5_K if state.i_attention_wv < 2 else GGMLType.Q4_K
        elif f == "Q3_K_L":
            new = GGMLType.Q5_K
        elif f in ("Q4_K_M", "Q5_K_M") and _use_more_bits(state.i_attention_wv, state.n_attention_wv):
            new = GGMLType.Q6_K
        elif f == "Q4_K_S" and state.i_attention_wv < 4:
            new = GGMLType.Q5_K
        if model.is_70b and new in (GGMLType.Q3_K, GGMLType.Q4_K):
            new = GGMLType.Q5_K
        if model.n_expert == 8:
            new = GGMLType.Q8_0
        state.i_attention_wv += 1
    elif category == "attn_k":
        if model.n_expert == 8:
            new = GGMLType.Q8_0
    elif category == "ffn_down":
        i_layer, n_layer = layer(state.i_ffn_down), model.n_layer
        if f == "Q2_K":
            new = GGMLType.Q3_K
        elif f == "Q3_K_M":
            new = (GGMLType.Q5_K if i_layer < n_layer // 16
                   else GGMLType.Q4_K if not falcon or _use_more_bits(i_layer, n_layer) else GGMLType.Q3_K)
        elif f == "Q3_K_L":
            new = GGMLType.Q4_K if falcon else GGMLType.Q5_K
        elif f == "Q4_K_M":
            if falcon:
                new = (GGMLType.Q6_K if i_layer < n_layer // 16
                       else GGMLType.Q5_K if _use_more_bits(i_layer, n_layer) else GGMLType.Q4_K)
            elif _use_more_bits(i_layer, n_layer):
                new = GGMLType.Q6_K
        elif f == "Q5_K_M" and _use_more_bits(i_layer, n_layer):
            new = GGMLType.Q6_K
        elif f == "Q4_K_S" and not falcon and i_layer < n_layer // 8:
            new = GGMLType.Q5_K
        elif f in ("Q4_0", "Q5_0") and has_imatrix and i_layer < n_layer // 8:
            # the first layers' ffn_down go wrong in Q4_0/Q5_0 even with an imatrix; only then, so that a file
            # quantized without one stays as it always was
            new = GGMLType.Q4_1 if f == "Q4_0" else GGMLType.Q5_1
        state.i_ffn_down += 1
    elif category == "attn_output":
        if not falcon:
            if model.n_expert == 8:
                if f in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M"):
                    new = GGMLType.Q5_K
            elif f == "Q2_K":
                new = GGMLType.Q3_K
            elif f == "Q3_K_M":
                new = GGMLType.Q4_K
            elif f == "Q3_K_L":
                new = GGMLType.Q5_K
        elif f == "Q3_K_L":
            new = GGMLType.Q4_K
    elif category == "ffn_gate":
        layer(state.i_ffn_gate)
        state.i_ffn_gate += 1
    elif category == "ffn_up":
        layer(state.i_ffn_up)
        state.i_ffn_up += 1
    return new


def _fallback(t: TensorInfo, target: GGMLType) -> GGMLType:
    """A type whose blocks fit the tensor's rows: the K-quants' 32-element stand-ins, else F16."""
    if t.shape[0] % _block_size(target) == 0:
        return target
    target = _FALLBACK.get(target, target)
    return target if t.shape[0] % _block_size(target) == 0 else GGMLType.F16


@dataclass(frozen=True)
class TensorPlan:
    """One tensor of the output: its new type, and whether its bytes are converted (else copied)."""

    info: TensorInfo
    type: GGMLType

    @property
    def converted(self) -> bool:
        return self.type != self.info.type


def plan(f: GGUFFile, ftype: FileType, *, pure: bool = False, output_type: GGMLType | None = None,
         has_imatrix: bool = False) -> list[TensorPlan]:
    """Each tensor's new type, in llama.cpp's order (which is the output file's). has_imatrix: an importance matrix
    is given (llama.cpp's mixes change with one)."""
    model = ModelShape.of(f.metadata)
    names = tensor_order(list(f.tensors))
    tied = "output.weight" not in f.tensors
    state = _MixState(n_attention_wv=sum(_category(n) in ("attn_v", "attn_qkv", "attn_kv_b") for n in names))
    base = ftype.base
    quantized_base = _block_size(base) > 1
    plans = []
    for name in names:
        t = f.tensors[name]
        new: GGMLType = GGMLType(t.type)
        if allows_quantization(t):
            category = _category(name)
            if output_type is not None and category == "output":
                new = output_type
            elif not quantized_base:
                new = base
            else:
                new = base if pure else _mix_type(t, ftype, base, model, tied, output_type, has_imatrix, state)
                new = _fallback(t, new)
        plans.append(TensorPlan(t, new))
    return plans


# ---- writing ----------------------------------------------------------------------------------------------------

# Rows are converted a slab at a time (about this many float32 values), each slab split among the threads.
_SLAB_VALUES = 1 << 24


def _converted_pieces(f: GGUFFile, p: TensorPlan, importance: np.ndarray | None, pool: ThreadPoolExecutor,
                      n_threads: int, on_bytes: Callable[[int], None]):
    """The tensor's rows dequantized and quantized to the new type, a slab at a time."""
    raw = f.raw(p.info.name)
    n = p.info.shape[0]
    rows_per_expert = p.info.shape[1] if len(p.info.shape) > 1 else 1
    slab_rows = max(1, _SLAB_VALUES // n)
    if importance is not None and importance.size > n:  # one row of importance an expert: slabs stay in one
        slab_rows = min(slab_rows, rows_per_expert)
    for start in range(0, raw.shape[0], slab_rows):
        if importance is not None and importance.size > n:
            stop = min(start + slab_rows, (start // rows_per_expert + 1) * rows_per_expert, raw.shape[0])
            row_importance = importance[(start // rows_per_expert) * n:(start // rows_per_expert + 1) * n]
        else:
            stop = min(start + slab_rows, raw.shape[0])
            row_importance = importance
        values = kernels.dequantize(raw[start:stop], p.info.type)
        bounds = np.linspace(0, stop - start, min(n_threads, stop - start) + 1).astype(int)
        slices = [values[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        yield from pool.map(kernels.quantize_rows, slices, repeat(p.type), repeat(row_importance))
        f.release(p.info.name, start * p.info.row_bytes, stop * p.info.row_bytes)
        on_bytes((stop - start) * p.info.row_bytes)


def tensor_bytes(f: GGUFFile, p: TensorPlan, importance: np.ndarray | None = None, n_threads: int = 1) -> bytes:
    """One tensor of the output, whole: its converted bytes (or its input bytes when its type stays)."""
    if not p.converted:
        return f.raw(p.info.name).tobytes()
    with ThreadPoolExecutor(n_threads) as pool:
        return b"".join(bytes(piece) for piece in _converted_pieces(f, p, importance, pool, n_threads, lambda _: None))


def _copied_pieces(f: GGUFFile, p: TensorPlan, on_bytes: Callable[[int], None]):
    raw = f.raw(p.info.name).reshape(-1)
    step = 1 << 26
    for start in range(0, raw.size, step):
        yield raw[start:start + step]
        on_bytes(min(step, raw.size - start))


def output_metadata(f: GGUFFile, ftype: FileType, extra: Mapping[str, MetadataValue] | None = None,
                    ) -> dict[str, MetadataValue]:
    """The input's metadata, split keys removed, the quantization version and file type set (moved to the end, as
    llama.cpp's setters move a key they replace), then `extra`."""
    metadata = {k: v for k, v in metadata_of(f).items() if not k.startswith("split.")}
    for key, value in (("general.quantization_version", QUANTIZATION_VERSION), ("general.file_type", ftype.id),
                       *((k, v) for k, v in (extra or {}).items())):
        metadata.pop(key, None)
        metadata[key] = value if isinstance(value, MetadataValue) else MetadataValue(ValueType.UINT32, value)
    return metadata


def quantize_model(source: str | os.PathLike[str], target: str | os.PathLike[str], ftype: FileType, *,
                   pure: bool = False, allow_requantize: bool = False, output_type: GGMLType | None = None,
                   importance: Mapping[str, np.ndarray] | None = None, extra_metadata: Mapping[str, MetadataValue]
                   | None = None, n_threads: int | None = None,
                   progress: Callable[[int, int], None] | None = None) -> list[TensorPlan]:
    """Writes `source` quantized as `ftype` to `target` (replacing it). `importance`: an imatrix, tensor name ->
    per-column weights (n, or n * experts). `progress(done, total)` in input bytes. Returns the plan it followed."""
    source, target = Path(source), Path(target)
    if target.exists() and os.path.samefile(source, target):
        raise QuantizeError(f"input and output files are the same: {source}")
    n_threads = n_threads or kernels.physical_cores()
    with GGUFFile(source) as f:
        plans = plan(f, ftype, pure=pure, output_type=output_type, has_imatrix=bool(importance))
        for p in plans:
            if p.converted and _block_size(p.info.type) > 1 and not allow_requantize:
                raise QuantizeError(f"{p.info.name} is already quantized ({p.info.type_name}): requantizing from "
                                    f"{p.info.type_name} is disabled (pass --allow-requantize)")
        weights = _importance_for(plans, importance)
        total = sum(p.info.n_bytes for p in plans)
        done = 0

        def on_bytes(n: int) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(done, total)

        entries = [TensorEntry(p.info.name, p.type, p.info.shape) for p in plans]
        with GGUFWriter(target, output_metadata(f, ftype, extra_metadata), entries) as writer, \
                ThreadPoolExecutor(n_threads) as pool:
            for p in plans:
                pieces = (_converted_pieces(f, p, weights.get(p.info.name), pool, n_threads, on_bytes) if p.converted
                          else _copied_pieces(f, p, on_bytes))
                writer.write(p.info.name, pieces)
    return plans


def imatrix_metadata(file_name: str, imatrix: Imatrix) -> dict[str, MetadataValue]:
    """The keys llama-quantize records about the imatrix it used (its names truncated to 127 bytes, as there)."""
    def short(text: str) -> str:
        return text.encode("utf-8")[:127].decode("utf-8", errors="ignore")

    extra = {"quantize.imatrix.file": MetadataValue(ValueType.STRING, short(file_name))}
    if imatrix.datasets:
        extra["quantize.imatrix.dataset"] = MetadataValue(ValueType.STRING, short(imatrix.datasets[0]))
    extra["quantize.imatrix.entries_count"] = MetadataValue(ValueType.UINT32, len(imatrix.entries))
    if imatrix.chunk_count > 0:
        extra["quantize.imatrix.chunks_count"] = MetadataValue(ValueType.UINT32, imatrix.chunk_count)
    return extra


def _importance_for(plans: list[TensorPlan], importance: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """The imatrix rows of the tensors that are converted, checked against their shapes (llama.cpp: a size that does
    not match is an error, except for the token embeddings, which are quantized without)."""
    if not importance:
        return {}
    found = {}
    for p in plans:
        weights = importance.get(p.info.name)
        if weights is None or not p.converted:
            continue
        experts = p.info.shape[2] if len(p.info.shape) > 2 else 1
        weights = np.ascontiguousarray(weights, dtype=np.float32).reshape(-1)
        if weights.size != p.info.shape[0] * experts:
            if p.info.name in ("token_embd.weight", "per_layer_token_embd.weight"):
                continue
            raise QuantizeError(f"imatrix size {weights.size} is different from tensor size "
                                f"{p.info.shape[0] * experts} for {p.info.name}")
        if not np.isfinite(weights).all():
            raise QuantizeError(f"the imatrix holds a non-finite value for {p.info.name}")
        found[p.info.name] = weights
    return found

