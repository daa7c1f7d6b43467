"""Architectures as data: hyperparameters read from GGUF metadata, and the flags
that pick each family's block recipe (see model.py).

Defaults follow llama.cpp's where a key is absent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .gguf import GGUFFile


class ArchitectureError(ValueError):
    """The file's architecture is unsupported or its hyperparameters are inconsistent."""


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
        arch = f.get("general.architecture")
        if arch not in FAMILIES:
            raise ArchitectureError(f"{f.path}: architecture {arch!r} is not supported "
                                    f"(supported: {', '.join(sorted(FAMILIES))})")

        def key(name: str, default=None):
            value = f.get(f"{arch}.{name}", default)
            if value is None:
                raise ArchitectureError(f"{f.path}: missing hyperparameter {arch}.{name}")
            return value

        n_embd, n_head = int(key("embedding_length")), int(key("attention.head_count"))
        if n_head <= 0 or n_embd <= 0:
            raise ArchitectureError(f"{f.path}: bad head count {n_head} or embedding length {n_embd}")
        head_dim = int(key("attention.key_length", n_embd // n_head))
        n_head_kv = int(key("attention.head_count_kv", n_head))
        if n_head_kv <= 0 or n_head % n_head_kv:
            raise ArchitectureError(f"{f.path}: {n_head} heads do not divide into {n_head_kv} kv heads")
        scaling = f.get(f"{arch}.rope.scaling.type", "none")
        factor = float(f.get(f"{arch}.rope.scaling.factor", 1.0) or 1.0)
        rope_scale = 1.0 / factor if scaling == "linear" and factor > 0 else 1.0
        family = FAMILIES[arch]
        return cls(
            arch=arch,
            family=family,
            n_layer=int(key("block_count")),
            n_embd=n_embd,
            n_ff=int(key("feed_forward_length")),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            head_dim_v=int(key("attention.value_length", head_dim)),
            n_rot=int(key("rope.dimension_count", head_dim)),
            rope_base=float(key("rope.freq_base", 10000.0)),
            rope_scale=rope_scale,
            norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
            n_ctx_train=int(key("context_length", 2048)),
            sliding_window=int(key("attention.sliding_window", 0)) if family.swa_pattern else 0,
            attn_scale=1.0 / math.sqrt(head_dim),
        )
