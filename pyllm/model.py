"""The forward pass: a GGUF model's weights, its KV cache, and its two phases, prefill and decode.

A transformer block (every family; the Family flags switch the optional parts):

    h = x + post_attn_norm(attn(rope(norm(x))))
    x = h + post_ffw_norm(down(act(gate(norm(h))) * up(norm(h))))

Weights stay quantized in the mmap; matmuls run in the C core over all rows of
a batch at once, attention per sequence over its cache. Every op computes each
row alone, in a fixed order, so a token's logits do not depend on how the
prompt was split into batches.

The phases (the C core tells them apart the same way, pyllm_phase_of: csrc/matmul/):

    prefill(tokens, cache)   one sequence's prompt, in batches of cache.max_batch rows: compute-bound
    decode([(token, cache)]) each sequence's next token, all in one batch: memory-bound, the weights read once
    forward_batch(...)       the batch both are made of: sequences' rows side by side, each asking for the
                             logits of all its rows, its last, or none (Logits); the engine mixes prefill
                             chunks and decode steps in it

All the layers of a batch run in one C call (csrc/model/block.c); Model._block_reference
sequences the same C ops from Python, step by step, as the reference that call
is tested against (Model(..., reference=True)).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from . import kernels
from ._pyllm_c import ffi, lib
from .arch import ArchitectureError, Config
from .gguf import GGUFFile
from .kernels import GGMLType
from .kvcache import KVCache, check_cache_types
from .params import ParamError


@dataclass(frozen=True)
class Tensor:
    """A weight in place in the mmap: (rows, row_bytes) blocks of `type`."""
    data: np.ndarray
    type: int
    shape: tuple[int, ...]   # GGUF order: shape[0] is the row length
    matrix: kernels.WeightMatrix  # the same values, checked once for matmuls (Q5_0: regrouped, Weights.tensor)


@dataclass
class Layer:
    attn_norm: np.ndarray
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    ffn_norm: np.ndarray
    w_gate: Tensor
    w_up: Tensor
    w_down: Tensor
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffw_norm: np.ndarray | None = None


class Weights:
    def __init__(self, f: GGUFFile, cfg: Config) -> None:
        self._f = f
        fam = cfg.family
        tied = "output.weight" not in f.tensors  # tied output (gemma, small llamas) reuses the embedding matrix
        self.token_embd = self.tensor("token_embd.weight", matmul=tied)
        self.output_norm = self.vector("output_norm.weight")
        self.output = self.token_embd if tied else self.tensor("output.weight")
        self.layers = []
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            opt = self.optional_vector
            self.layers.append(Layer(
                attn_norm=self.vector(p + "attn_norm.weight"),
                wq=self.tensor(p + "attn_q.weight"), wk=self.tensor(p + "attn_k.weight"),
                wv=self.tensor(p + "attn_v.weight"), wo=self.tensor(p + "attn_output.weight"),
                ffn_norm=self.vector(p + "ffn_norm.weight"),
                w_gate=self.tensor(p + "ffn_gate.weight"), w_up=self.tensor(p + "ffn_up.weight"),
                w_down=self.tensor(p + "ffn_down.weight"),
                bq=opt(p + "attn_q.bias") if fam.qkv_bias else None,
                bk=opt(p + "attn_k.bias") if fam.qkv_bias else None,
                bv=opt(p + "attn_v.bias") if fam.qkv_bias else None,
                q_norm=self.vector(p + "attn_q_norm.weight") if fam.qk_norm else None,
                k_norm=self.vector(p + "attn_k_norm.weight") if fam.qk_norm else None,
                post_attn_norm=self.vector(p + "post_attention_norm.weight") if fam.post_norms else None,
                post_ffw_norm=self.vector(p + "post_ffw_norm.weight") if fam.post_norms else None,
            ))

    def _info(self, name: str):
        info = self._f.tensors.get(name)
        if info is None:
            raise ArchitectureError(f"{self._f.path}: missing tensor {name}")
        return info

    def tensor(self, name: str, matmul: bool = True) -> Tensor:
        """A matrix, in the layout the C core chooses for it (kernels.matrix_layout): where one gains, the matmuls
        (`matmul`) read a copy rebuilt in a faster layout with the same bits (Q4_1, Q8_0, Q5_0, Q4_K, Q6_K in 16-row
        tiles where the CPU has those kernels, Q5_0 otherwise regrouped), its pages in the mapping released; a Q4_0
        matrix whose row count is not a multiple of 8 is reduced as llama.cpp reduces it. The kernels for that layout
        are chosen here, once (Tensor.matrix). The embedding reads its rows from the matrix (Tensor.matrix.rows),
        whichever layout it has."""
        info = self._info(name)
        raw = self._f.raw(name)
        layout = kernels.matrix_layout(info.type, raw.shape[0], matmul)
        matrix = raw
        if kernels.traits(layout).repacked:
            matrix = self._rebuilt(name, raw, lambda rows, out: kernels.repack(rows, info.type, layout, out))
        return Tensor(raw, info.type, info.shape, kernels.WeightMatrix(matrix, layout, info.shape[0]))

    def _rebuilt(self, name: str, raw: np.ndarray, convert) -> np.ndarray:
        """convert(rows, out) over the matrix a slice of rows (a multiple of 16, ~2 MB) at a time into a new
        aligned array, the slices shared among the cores (the C call releases the GIL; the kernel's zeroing of the new
        pages, most of the time, runs on the core that faults them), each slice's pages in the mapping released once
        converted: the file's bytes and the copy are never both resident beyond a few slices (Gemma's 178 MB output
        matrix had doubled its peak RSS)."""
        out = kernels.aligned_empty(raw.shape)
        rows = max(16, (2 << 20) // raw.shape[1] // 16 * 16)

        def rebuild(first: int) -> None:
            convert(raw[first:first + rows], out[first:first + rows])
            self._f.release(name, first * raw.shape[1], (first + rows) * raw.shape[1])

        firsts = range(0, raw.shape[0], rows)
        if len(firsts) == 1:
            rebuild(0)
        else:
            with ThreadPoolExecutor(max_workers=kernels.physical_cores()) as pool:
                list(pool.map(rebuild, firsts))
        return out

    def vector(self, name: str) -> np.ndarray:
        """A small tensor (norm weight, bias) as float32."""
        info = self._info(name)
        return kernels.dequantize(self._f.raw(name), info.type).reshape(-1)

    def optional_vector(self, name: str) -> np.ndarray | None:
        return self.vector(name) if name in self._f.tensors else None


class Logits(StrEnum):
    """Which logits a sequence's rows in a batch ask for (their values: the strings callers may pass instead)."""
    ALL = "all"    # every row's, (n, n_vocab): scoring a prompt (perplexity), the reference tests
    LAST = "last"  # the last row's, (n_vocab,): the next token, after a prefill or a decode step
    NONE = "none"  # none: a prompt's earlier chunks, which only fill the cache
    HIDDEN = "hidden"  # every row's last hidden state after the output norm, (n, n_embd): an embedding's input


@dataclass
class _Segment:
    """One sequence's rows inside a batch."""
    rows: slice
    tokens: np.ndarray
    positions: np.ndarray   # (len(tokens),) int32
    cache: KVCache
    logits: Logits

    def wanted(self) -> range:
        """The batch rows whose logits the segment asks for."""
        if self.logits in (Logits.ALL, Logits.HIDDEN):
            return range(self.rows.start, self.rows.stop)
        return range(self.rows.stop - 1, self.rows.stop) if self.logits == Logits.LAST else range(0)


class ContextFullError(ParamError):
    """More tokens than the context holds."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, param, "context_length_exceeded")


class _CBlocks:
    """The layers as the C core's pyllm_block structs: all of them run in one call per batch."""

    def __init__(self, cfg: Config, weights: Weights) -> None:
        fam = cfg.family
        self.config = ffi.new("pyllm_block_config *", {
            "n_embd": cfg.n_embd, "n_head": cfg.n_head, "n_head_kv": cfg.n_head_kv, "head_dim": cfg.head_dim,
            "n_rot": cfg.n_rot, "n_ff": cfg.n_ff, "norm_eps": cfg.norm_eps, "attn_scale": cfg.attn_scale,
            "rope_neox": int(fam.rope_neox), "scale_query": int(fam.scale_query),
            "activation": {"silu": 0, "gelu": 1}[fam.activation]})
        self.blocks = ffi.new("pyllm_block[]", cfg.n_layer)
        for i, layer in enumerate(weights.layers):
            block = self.blocks[i]
            for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
                setattr(block, name, getattr(layer, name).matrix.c[0])  # with the kernels chosen at load
            for name in ("attn_norm", "ffn_norm", "bq", "bk", "bv", "q_norm", "k_norm", "post_attn_norm",
                         "post_ffw_norm"):
                vector = getattr(layer, name)
                setattr(block, name, {"data": ffi.NULL, "n": 0} if vector is None else
                        {"data": ffi.from_buffer("float[]", vector), "n": len(vector)})
            block.rope_base, block.rope_scale = cfg.layer_rope(i)
            block.window = cfg.sliding_window if cfg.is_swa_layer(i) else 0

    def forward(self, x: np.ndarray, segments: list[_Segment], n_threads: int) -> None:
        """x (m, n_embd) float32, in place, through every layer."""
        segs = ffi.new("pyllm_segment[]", [
            {"row0": seg.rows.start, "n_rows": len(seg.tokens),
             "positions": ffi.from_buffer("int32_t[]", seg.positions), "kv": seg.cache.c_layers}
            for seg in segments])
        kernels._check(lib.pyllm_blocks_forward(
            self.config, self.blocks, len(self.blocks), ffi.from_buffer("float[]", x), x.shape[0], segs, len(segments),
            n_threads), "transformer blocks")


class Model:
    def __init__(self, f: GGUFFile, n_threads: int | None = None, reference: bool = False,
                 rope_freq_base: float = 0.0, rope_freq_scale: float = 0.0) -> None:
        """reference: run each block step by step from Python (Model._block_reference), the slow
        path the C blocks (pyllm_blocks_forward) are tested against. rope_freq_base, rope_freq_scale: in place of
        the file's RoPE base and linear frequency scale (0: the file's), as llama.cpp's context parameters; the
        sliding-window layers keep their own (Config.layer_rope)."""
        self.file = f
        self.config = Config.from_gguf(f)
        self.file_rope = (self.config.rope_base, self.config.rope_scale)  # what the file says
        if rope_freq_base or rope_freq_scale:
            self.config = replace(self.config, rope_base=rope_freq_base or self.config.rope_base,
                                  rope_scale=rope_freq_scale or self.config.rope_scale)
        self.weights = Weights(f, self.config)
        self.n_threads = n_threads or kernels.physical_cores()  # counted once, here
        self.n_vocab = self.weights.output.shape[1]
        self.reference = reference
        self._c_blocks = _CBlocks(self.config, self.weights)
        self.cache_types = (GGMLType.F16, GGMLType.F16)

    def new_cache(self, n_ctx: int, max_batch: int = 512) -> KVCache:
        """A cache for one sequence of up to n_ctx tokens, of the model's cache types (`cache_types`); forward()
        runs at most max_batch rows at once."""
        return KVCache(self.config, n_ctx, max_batch, *self.cache_types)

    def set_cache_types(self, type_k: GGMLType = GGMLType.F16, type_v: GGMLType = GGMLType.F16) -> None:
        """The types every cache new_cache makes from now on keeps its keys and values in (ValueError if the
        model's heads do not fit them)."""
        check_cache_types(self.config, type_k, type_v)
        self.cache_types = (GGMLType(type_k), GGMLType(type_v))

    def _matmul(self, w: Tensor, x: np.ndarray) -> np.ndarray:
        return w.matrix(x, self.n_threads)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        x = self.weights.token_embd.matrix.rows(tokens)
        if self.config.family.embed_scale:
            x *= np.float32(np.sqrt(self.config.n_embd))
        return x

    def prefill(self, tokens: Sequence[int] | np.ndarray, cache: KVCache, logits: Logits | str = Logits.LAST
                ) -> np.ndarray:
        """Run one sequence's tokens (a prompt, continuing its cache) and return logits.

        logits: Logits.LAST -> (n_vocab,) for the last token; Logits.ALL -> (len(tokens), n_vocab).
        Longer inputs run in batches of cache.max_batch rows; results do not depend on it.
        """
        logits = Logits(logits)
        tokens = np.asarray(tokens, dtype=np.int64)
        if len(tokens) == 0:
            raise ValueError("no tokens to evaluate")
        if cache.n_used + len(tokens) > cache.n_ctx:
            raise ContextFullError(f"{cache.n_used} + {len(tokens)} tokens exceed the context of {cache.n_ctx}")
        outs = []
        for start in range(0, len(tokens), cache.max_batch):
            chunk = tokens[start:start + cache.max_batch]
            is_last = start + len(chunk) == len(tokens)
            wanted = logits if logits == Logits.ALL or is_last else Logits.NONE
            outs.append(self.forward_batch([(chunk, cache, wanted)])[0])
        return np.concatenate(outs) if logits == Logits.ALL else outs[-1]

    def hidden_states(self, tokens: Sequence[int] | np.ndarray, cache: KVCache) -> np.ndarray:
        """A prefill that keeps, instead of logits, every token's last hidden state after the output norm
        (len(tokens), n_embd): what llama.cpp pools into an embedding."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if len(tokens) == 0:
            raise ValueError("no tokens to evaluate")
        if cache.n_used + len(tokens) > cache.n_ctx:
            raise ContextFullError(f"{cache.n_used} + {len(tokens)} tokens exceed the context of {cache.n_ctx}")
        outs = [self._forward(self._segments([(tokens[start:start + cache.max_batch], cache, Logits.ALL)]),
                              project=False)
                for start in range(0, len(tokens), cache.max_batch)]
        return np.concatenate(outs)

    # The name the callers of one sequence's tokens (pyllm.llama, perplexity, the tests) have long used.
    forward = prefill

    def decode(self, steps: Sequence[tuple[int, KVCache]]) -> np.ndarray:
        """One decode step: each sequence's next token (continuing its own cache), all in one batch.
        Returns (len(steps), n_vocab) logits, row i step i's, each bit-identical to its sequence run alone."""
        return self._forward(self._segments([([token], cache, Logits.LAST) for token, cache in steps]))

    def forward_batch(self, seqs: Sequence[tuple[Sequence[int], KVCache, Logits | str]]) -> list[np.ndarray | None]:
        """One forward pass over the rows of several sequences, each continuing its own cache.

        seqs: (tokens, cache, logits) per sequence, logits a Logits (or its value "all" | "last" | "none" |
        "hidden"), at most cache.max_batch tokens each. Matmuls run once over all rows; attention per sequence.
        Each sequence's logits (or hidden states) are bit-identical to running it alone.
        """
        segments = self._segments(seqs)
        hidden = [seg for seg in segments if seg.logits == Logits.HIDDEN]
        if not hidden:
            return self._split(segments, self._forward(segments))
        states = self._forward(segments, project=False)  # the output matrix then runs on the rows that want logits
        results = self._split(segments, states)
        logit_rows = [j for j, seg in enumerate(segments) if seg.logits in (Logits.ALL, Logits.LAST)]
        if logit_rows:
            projected = self._matmul(self.weights.output, np.concatenate(
                [np.atleast_2d(results[j]) for j in logit_rows]))
            start = 0
            for j in logit_rows:
                n = len(segments[j].wanted())
                results[j] = projected[start:start + n] if segments[j].logits == Logits.ALL else projected[start]
                start += n
        return results

    @staticmethod
    def _split(segments: list[_Segment], out: np.ndarray) -> list[np.ndarray | None]:
        """The rows of `out` (the segments' wanted rows in order) back to their segments: an array of rows for
        ALL and HIDDEN, one row for LAST, None for NONE."""
        results: list[np.ndarray | None] = [None] * len(segments)
        start = 0
        for j, seg in enumerate(segments):
            n = len(seg.wanted())
            if n:
                results[j] = out[start:start + n] if seg.logits in (Logits.ALL, Logits.HIDDEN) else out[start]
                start += n
        return results

    def _forward(self, segments: list[_Segment], project: bool = True) -> np.ndarray:
        """The batch through every layer, each sequence's cache advanced; the logits of the rows the segments ask
        for, (n_wanted, n_vocab) in segment order (the output norm and matrix run on those rows alone), or with
        project=False their hidden states after the output norm, (n_wanted, n_embd)."""
        all_tokens = np.concatenate([seg.tokens for seg in segments])
        self._check_ids(all_tokens)
        x = self.embed(all_tokens)
        if self.reference:
            positions = np.concatenate([seg.positions for seg in segments])
            for i, layer in enumerate(self.weights.layers):
                x = self._block_reference(i, layer, x, positions, segments)
        else:
            self._c_blocks.forward(x, segments, self.n_threads)
        for seg in segments:
            seg.cache.n_used += len(seg.tokens)
        picked = [row for seg in segments for row in seg.wanted()]
        if not picked:
            return np.empty((0, self.n_vocab if project else self.config.n_embd), np.float32)
        h = kernels.rms_norm(x[picked], self.weights.output_norm, self.config.norm_eps)
        return self._matmul(self.weights.output, h) if project else h

    def _segments(self, seqs: Sequence[tuple[Sequence[int], KVCache, Logits | str]]) -> list[_Segment]:
        """The batch's sequences as segments of its rows, each checked against its cache."""
        if not seqs:
            raise ValueError("no sequences in the batch")
        segments = []
        row = 0
        for tokens, cache, logits in seqs:
            tokens = np.asarray(tokens, dtype=np.int64)
            n = len(tokens)
            if n == 0:
                raise ValueError("no tokens to evaluate")
            if n > cache.max_batch:
                raise ValueError(f"{n} rows exceed the cache's batch limit of {cache.max_batch}")
            if cache.n_used + n > cache.n_ctx:
                raise ContextFullError(f"{cache.n_used} + {n} tokens exceed the context of {cache.n_ctx}")
            try:
                wanted = Logits(logits)
            except ValueError:
                raise ValueError(f"logits must be 'all', 'last', 'none' or 'hidden', not {logits!r}") from None
            positions = np.arange(cache.n_used, cache.n_used + n, dtype=np.int32)
            segments.append(_Segment(slice(row, row + n), tokens, positions, cache, wanted))
            row += n
        if len({id(seg.cache) for seg in segments}) != len(segments):
            raise ValueError("a batch holds each sequence (cache) at most once")
        return segments

    def _check_ids(self, tokens: np.ndarray) -> None:
        n_vocab_in = self.weights.token_embd.shape[1]
        if len(tokens) <= 64:  # a decode batch's few ids as ints: two numpy reductions cost more
            ids = tokens.tolist()
            low, high = min(ids), max(ids)
        else:
            low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= n_vocab_in:
            raise ValueError(f"token id out of range [0, {n_vocab_in})")

    def _block_reference(self, i: int, layer: Layer, x: np.ndarray, positions: np.ndarray,
                         segments: list[_Segment]) -> np.ndarray:
        cfg, fam = self.config, self.config.family
        m = x.shape[0]
        h = kernels.rms_norm(x, layer.attn_norm, cfg.norm_eps)
        q, k, v = self._matmul(layer.wq, h), self._matmul(layer.wk, h), self._matmul(layer.wv, h)
        if layer.bq is not None:
            q += layer.bq
        if layer.bk is not None:
            k += layer.bk
        if layer.bv is not None:
            v += layer.bv
        q = q.reshape(m, cfg.n_head, cfg.head_dim)
        k = k.reshape(m, cfg.n_head_kv, cfg.head_dim)
        v = v.reshape(m, cfg.n_head_kv, cfg.head_dim_v)
        if fam.qk_norm:
            q = kernels.rms_norm(q, layer.q_norm, cfg.norm_eps)
            k = kernels.rms_norm(k, layer.k_norm, cfg.norm_eps)
        base, scale = cfg.layer_rope(i)
        kernels.rope(q, positions, cfg.n_rot, base, scale, fam.rope_neox)
        kernels.rope(k, positions, cfg.n_rot, base, scale, fam.rope_neox)
        score_scale = cfg.attn_scale
        if fam.scale_query:
            q *= np.float32(score_scale)
            score_scale = 1.0
        window = cfg.sliding_window if cfg.is_swa_layer(i) else 0
        attn = np.empty((m, cfg.n_head, cfg.head_dim_v), np.float32)
        for seg in segments:
            rows = seg.rows
            rot = seg.cache.layers[i]
            if rot.k_rot:  # a quantized cache's rotations (see KVCache)
                q[rows] = kernels.hadamard(q[rows], rot.k_rot)
                k[rows] = kernels.hadamard(k[rows], rot.k_rot)
            if rot.v_rot:
                v[rows] = kernels.hadamard(v[rows], rot.v_rot)
            seg.cache.store(i, seg.positions, k[rows], v[rows])
            k_all, v_all, k_pos = seg.cache.visible(i, int(seg.positions[-1]) + 1)
            attn[rows] = kernels.attention(np.ascontiguousarray(q[rows]), k_all, v_all, seg.positions, k_pos,
                                           score_scale, window, n_threads=self.n_threads, type_k=seg.cache.type_k,
                                           type_v=seg.cache.type_v)
            if rot.v_rot:
                attn[rows] = kernels.hadamard(attn[rows], rot.v_rot)
        o = self._matmul(layer.wo, attn.reshape(m, -1))
        if layer.post_attn_norm is not None:
            o = kernels.rms_norm(o, layer.post_attn_norm, cfg.norm_eps)
        x = x + o
        h = kernels.rms_norm(x, layer.ffn_norm, cfg.norm_eps)
        a = kernels.gated_activation(self._matmul(layer.w_gate, h), self._matmul(layer.w_up, h), fam.activation)
        f = self._matmul(layer.w_down, a)
        if layer.post_ffw_norm is not None:
            f = kernels.rms_norm(f, layer.post_ffw_norm, cfg.norm_eps)
        return x + f
