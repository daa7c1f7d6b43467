"""Architectures as data: hyperparameters read from GGUF metadata, the flags that pick each family's block
recipe (see model.py), and the tensors each family reads.

`Config.from_gguf` is the one place a model file is checked before any kernel sees it: every
hyperparameter is read with its type and range checked, then every tensor the model reads
(`tensor_specs`) is checked for presence, type and shape against them, from the tensor table alone
(no tensor data is read). A file that fails raises `ArchitectureError`, a `GGUFError` whose one-line
message names the key or the tensor.

Defaults follow llama.cpp's where a key is absent.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ._pyllm_c import lib
from .gguf import REQUIRED, GGUFError, GGUFFile, metadata_float, metadata_int, metadata_str, type_name
from .strings import StringArray


class ArchitectureError(GGUFError):
    """The file's architecture is unsupported, or its hyperparameters or tensors are inconsistent."""


@dataclass(frozen=True)
class Family:
    """What distinguishes a family's transformer block."""
    rope_neox: bool                # rotate pairs (i, i + n_rot/2) instead of (2i, 2i+1)
    activation: str                # "silu" (SwiGLU) or "gelu" (GeGLU, tanh approximation)
    qkv_bias: bool = False         # qwen2: biases on q, k, v (optional tensors)
    qk_norm: bool = False          # qwen3, gemma3: RMSNorm on each head of q and k
    post_norms: bool = False       # gemma3: RMSNorm after attention and after the FFN
    embed_scale: bool = False      # gemma: embeddings times sqrt(n_embd)
    scale_query: bool = False      # gemma3: the attention scale multiplies q (before its half-precision
                                   # rounding, as llama.cpp does) instead of the scores
    swa_pattern: int = 0           # gemma3: every n-th layer global, the others sliding-window
    swa_rope_base: float = 10000.0


FAMILIES: dict[str, Family] = {
    "llama": Family(rope_neox=False, activation="silu"),
    "qwen2": Family(rope_neox=True, activation="silu", qkv_bias=True),
    "qwen3": Family(rope_neox=True, activation="silu", qk_norm=True),
    "gemma3": Family(rope_neox=True, activation="gelu", qk_norm=True, post_norms=True, embed_scale=True,
                     scale_query=True, swa_pattern=6),
}

# Bounds on the sizes, far beyond any released model and far inside the int32 / int64 sizes the C core
# derives from them (cache slots x row widths, rows x columns); outside them a file is damaged or hostile.
MAX_LAYERS = 1 << 12
MIN_EMBD = 8                 # no transformer is this narrow; a width of 1 once loaded and ran
MAX_EMBD = 1 << 16
MAX_HEADS = 1 << 10
MAX_HEAD_DIM = 1 << 12
MAX_FF = 1 << 20
MAX_CTX = 1 << 24            # Llama 4 Scout's 10M is the longest yet
MAX_WINDOW = (1 << 31) - 1   # an int32 in the C core
FLOAT32_MAX = 3.4028234663852886e38  # the C core takes the float settings as floats: larger is out of range
DEFAULT_CTX = 2048

# Norm weights and biases are dequantized once at load; llama.cpp's converters write them as floats.
VECTOR_TYPES = frozenset({0, 1, 30})  # F32, F16, BF16


@dataclass(frozen=True)
class Config:
    arch: str
    family: Family
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int          # key/query head size
    head_dim_v: int
    n_rot: int
    rope_base: float
    rope_scale: float      # freq_scale = 1 / linear scaling factor
    norm_eps: float
    n_ctx_train: int
    sliding_window: int
    attn_scale: float
    n_vocab: int           # the embedding's rows: the tokenizer's vocabulary size when the file has one

    def is_swa_layer(self, layer: int) -> bool:
        pattern = self.family.swa_pattern
        return pattern > 0 and self.sliding_window > 0 and layer % pattern < pattern - 1

    def layer_rope(self, layer: int) -> tuple[float, float]:
        """(freq_base, freq_scale) of a layer: sliding-window layers use the local base, unscaled."""
        if self.is_swa_layer(layer):
            return self.family.swa_rope_base, 1.0
        return self.rope_base, self.rope_scale

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Config:
        """The file's hyperparameters, checked, once every tensor the model reads has been checked against
        them (check_tensors)."""
        cfg = _read_hyperparameters(f)
        check_tensors(f, cfg)
        return cfg


def _error(f: GGUFFile):
    return lambda message: ArchitectureError(f"{f.path}: {message}")


def architecture(f: GGUFFile) -> str:
    """general.architecture, one pyllm supports."""
    arch = metadata_str(f.metadata, "general.architecture", None, error=_error(f))
    if arch not in FAMILIES:
        raise ArchitectureError(f"{f.path}: architecture {arch!r} is not supported "
                                f"(supported: {', '.join(sorted(FAMILIES))})")
    return arch


def context_length(f: GGUFFile) -> int:
    """The training context ({arch}.context_length; 2048 when absent), also for a file with no model."""
    arch = f.metadata.get("general.architecture")
    if not isinstance(arch, str):
        return DEFAULT_CTX
    return metadata_int(f.metadata, f"{arch}.context_length", DEFAULT_CTX, lo=1, hi=MAX_CTX, error=_error(f))


def _read_hyperparameters(f: GGUFFile) -> Config:
    arch = architecture(f)
    family = FAMILIES[arch]
    error = _error(f)
    meta = f.metadata

    def int_key(name: str, lo: int, hi: int, default: int = REQUIRED) -> int:
        return metadata_int(meta, f"{arch}.{name}", default, lo=lo, hi=hi, error=error)

    def float_key(name: str, default: float) -> float:
        value = metadata_float(meta, f"{arch}.{name}", default, error=error)
        if abs(value) > FLOAT32_MAX:
            raise error(f"{arch}.{name} = {value} is out of the range of a 32-bit float")
        return value

    n_layer = int_key("block_count", 1, MAX_LAYERS)
    n_embd = int_key("embedding_length", MIN_EMBD, MAX_EMBD)
    n_ff = int_key("feed_forward_length", 1, MAX_FF)
    n_head = int_key("attention.head_count", 1, MAX_HEADS)
    n_head_kv = int_key("attention.head_count_kv", 1, n_head, n_head)
    if n_head % n_head_kv:
        raise error(f"{arch}.attention.head_count = {n_head} is not a multiple of "
                    f"{arch}.attention.head_count_kv = {n_head_kv} (grouped-query attention shares each kv head "
                    "among a whole group)")
    key_length = f"{arch}.attention.key_length"
    if key_length not in meta and n_embd % n_head:
        raise error(f"{arch}.embedding_length = {n_embd} does not divide into {arch}.attention.head_count = "
                    f"{n_head} heads, and there is no {key_length}")
    head_dim = int_key("attention.key_length", 1, MAX_HEAD_DIM, n_embd // n_head)
    head_dim_v = int_key("attention.value_length", 1, MAX_HEAD_DIM, head_dim)
    if head_dim_v != head_dim:
        raise error(f"{arch}.attention.value_length = {head_dim_v} differs from the key length {head_dim} "
                    "(not supported)")
    n_rot = int_key("rope.dimension_count", 0, MAX_HEAD_DIM, head_dim)
    if not lib.pyllm_rope_dims_valid(n_rot, head_dim):
        raise error(f"{arch}.rope.dimension_count = {n_rot} must be even, 2 to the head dimension {head_dim}")
    rope_base = float_key("rope.freq_base", 10000.0)
    if rope_base <= 0:
        raise error(f"{arch}.rope.freq_base = {rope_base} must be above 0")
    scaling = metadata_str(meta, f"{arch}.rope.scaling.type", "none", error=error)
    factor = float_key("rope.scaling.factor", 1.0)
    if factor < 0:
        raise error(f"{arch}.rope.scaling.factor = {factor} must not be negative")
    rope_scale = 1.0 / factor if scaling == "linear" and factor > 0 else 1.0  # 0: unset, as llama.cpp reads it
    if rope_scale > FLOAT32_MAX:
        raise error(f"{arch}.rope.scaling.factor = {factor} is too small to scale by")
    norm_eps = float_key("attention.layer_norm_rms_epsilon", 1e-5)
    if norm_eps < 0:
        raise error(f"{arch}.attention.layer_norm_rms_epsilon = {norm_eps} must not be negative")
    sliding_window = int_key("attention.sliding_window", 0, MAX_WINDOW, 0) if family.swa_pattern else 0
    return Config(
        arch=arch,
        family=family,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        n_rot=n_rot,
        rope_base=rope_base,
        rope_scale=rope_scale,
        norm_eps=norm_eps,
        n_ctx_train=int_key("context_length", 1, MAX_CTX, DEFAULT_CTX),
        sliding_window=sliding_window,
        attn_scale=1.0 / math.sqrt(head_dim),
        n_vocab=_vocabulary_size(f),
    )


def _vocabulary_size(f: GGUFFile) -> int:
    """The rows the embedding must have: the tokenizer's token count (llama.cpp sizes the embedding by it, so no
    token id the tokenizer makes falls outside it), else, for a file with no vocabulary, the embedding's own."""
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, StringArray):
        return len(tokens)
    if tokens is not None:
        raise ArchitectureError(f"{f.path}: tokenizer.ggml.tokens is not an array of strings")
    embd = f.tensors.get("token_embd.weight")
    if embd is None:
        raise ArchitectureError(f"{f.path}: missing tensor token_embd.weight")
    return embd.shape[-1] if len(embd.shape) > 1 else 1


@dataclass(frozen=True)
class TensorSpec:
    """A tensor the model reads: its GGUF shape (ne0 first: (n_in, n_out) for a matrix), and whether the
    matmuls read it (any weight type they take) or it is a norm weight or bias (a float type)."""
    name: str
    shape: tuple[int, ...]
    matrix: bool
    required: bool = True


def tensor_specs(cfg: Config, tied_output: bool) -> list[TensorSpec]:
    """Every tensor a model of this config reads, llama.cpp's tensor list for its families."""
    fam = cfg.family
    q_row, kv_row = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    specs = [TensorSpec("token_embd.weight", (cfg.n_embd, cfg.n_vocab), True),
             TensorSpec("output_norm.weight", (cfg.n_embd,), False)]
    if not tied_output:
        specs.append(TensorSpec("output.weight", (cfg.n_embd, cfg.n_vocab), True))
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        specs += [
            TensorSpec(p + "attn_norm.weight", (cfg.n_embd,), False),
            TensorSpec(p + "attn_q.weight", (cfg.n_embd, q_row), True),
            TensorSpec(p + "attn_k.weight", (cfg.n_embd, kv_row), True),
            TensorSpec(p + "attn_v.weight", (cfg.n_embd, kv_row), True),
            TensorSpec(p + "attn_output.weight", (q_row, cfg.n_embd), True),
            TensorSpec(p + "ffn_norm.weight", (cfg.n_embd,), False),
            TensorSpec(p + "ffn_gate.weight", (cfg.n_embd, cfg.n_ff), True),
            TensorSpec(p + "ffn_up.weight", (cfg.n_embd, cfg.n_ff), True),
            TensorSpec(p + "ffn_down.weight", (cfg.n_ff, cfg.n_embd), True),
        ]
        if fam.qkv_bias:
            specs += [TensorSpec(p + "attn_q.bias", (q_row,), False, required=False),
                      TensorSpec(p + "attn_k.bias", (kv_row,), False, required=False),
                      TensorSpec(p + "attn_v.bias", (kv_row,), False, required=False)]
        if fam.qk_norm:
            specs += [TensorSpec(p + "attn_q_norm.weight", (cfg.head_dim,), False),
                      TensorSpec(p + "attn_k_norm.weight", (cfg.head_dim,), False)]
        if fam.post_norms:
            specs += [TensorSpec(p + "post_attention_norm.weight", (cfg.n_embd,), False),
                      TensorSpec(p + "post_ffw_norm.weight", (cfg.n_embd,), False)]
    return specs


_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.")


def check_tensors(f: GGUFFile, cfg: Config) -> None:
    """Every tensor the model reads is present (or optional), of a type its kernel takes, and of the shape the
    hyperparameters give (trailing 1s allowed, as llama.cpp allows them); no tensor belongs to a layer past
    block_count (a block count that hides layers is a lie about the model)."""
    for spec in tensor_specs(cfg, tied_output="output.weight" not in f.tensors):
        info = f.tensors.get(spec.name)
        if info is None:
            if spec.required:
                raise ArchitectureError(f"{f.path}: missing tensor {spec.name}")
            continue
        if spec.matrix and lib.pyllm_vec_dot_type(info.type) < 0:
            raise ArchitectureError(f"{f.path}: tensor {spec.name} is {type_name(info.type)}, which the matmuls "
                                    "do not take")
        if not spec.matrix and info.type not in VECTOR_TYPES:
            raise ArchitectureError(f"{f.path}: tensor {spec.name} is {type_name(info.type)}; a norm weight or "
                                    "bias must be F32, F16 or BF16")
        shape = info.shape
        while len(shape) > len(spec.shape) and shape[-1] == 1:
            shape = shape[:-1]
        if shape != spec.shape:
            raise ArchitectureError(f"{f.path}: tensor {spec.name} has shape {list(info.shape)}, expected "
                                    f"{list(spec.shape)} from the hyperparameters")
    for name in f.tensors:
        match = _LAYER_TENSOR.match(name)
        if match and int(match.group(1)) >= cfg.n_layer:
            raise ArchitectureError(f"{f.path}: tensor {name} belongs to layer {match.group(1)}, but "
                                    f"{cfg.arch}.block_count is {cfg.n_layer}")
