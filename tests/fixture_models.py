"""Tiny GGUF models with random weights of any tensor type, the same bytes on every machine.

The bytes come from splitmix64 over a counter (not numpy's generators, whose streams may change
between versions), and quantized tensors are random blocks with scales chosen to keep weights
near 0.1, so no quantizer is involved. llama.cpp loads these files (they carry a small
SentencePiece-style vocabulary); bench/record_llamacpp_logits.py records its logits on them into
tests/data, and tests/test_llamacpp_logits.py holds pyllm to those logits bit for bit.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

from pyllm.arch import FAMILIES

N_VOCAB, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, HEAD_DIM = 96, 256, 512, 4, 2, 64
N_LAYER = {"llama": 2, "qwen2": 2, "qwen3": 2, "gemma3": 6}  # gemma3: 5 sliding layers, then a global one
WINDOW = 8

# Per type: (block elements, block bytes, [(byte offset of an fp16 scale, its magnitude), ...])
BLOCKS: dict[Q, tuple[int, int, list[tuple[int, float]]]] = {
    Q.Q4_0: (32, 18, [(0, 0.02)]),
    Q.Q4_1: (32, 20, [(0, 0.01), (2, 0.08)]),
    Q.Q5_0: (32, 22, [(0, 0.01)]),
    Q.Q5_1: (32, 24, [(0, 0.005), (2, 0.08)]),
    Q.Q8_0: (32, 34, [(0, 0.001)]),
    Q.Q2_K: (256, 84, [(80, 0.003), (82, 0.002)]),
    Q.Q3_K: (256, 110, [(108, 0.001)]),
    Q.Q4_K: (256, 144, [(0, 1e-4), (2, 1e-4)]),
    Q.Q5_K: (256, 176, [(0, 5e-5), (2, 1e-4)]),
    Q.Q6_K: (256, 210, [(208, 3e-5)]),
}


class Bytes:
    """A deterministic byte stream: splitmix64 of 0, 1, 2, ... from a seed."""

    def __init__(self, seed: int) -> None:
        with np.errstate(over="ignore"):  # modulo 2^64, as splitmix64 means
            self.counter = np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)

    def take(self, n: int) -> np.ndarray:
        words = (n + 7) // 8
        with np.errstate(over="ignore"):
            z = self.counter + np.arange(1, words + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z ^= z >> np.uint64(31)
            self.counter += np.uint64(words) * np.uint64(0x9E3779B97F4A7C15)
        return z.view(np.uint8)[:n].copy()

    def uniform(self, shape: tuple[int, ...]) -> np.ndarray:
        """float32 in [-1, 1)"""
        n = int(np.prod(shape))
        bits = self.take(4 * n).view(np.uint32) >> np.uint32(8)
        return (bits.astype(np.float32) / np.float32(1 << 23) - np.float32(1.0)).reshape(shape)


def random_tensor(rng: Bytes, shape: tuple[int, int], tensor_type: Q, scale: float) -> np.ndarray:
    """(rows, cols) weights as float32 / float16 / bfloat16 bits, or random blocks of a quantized type."""
    rows, cols = shape
    if tensor_type in (Q.F32, Q.F16, Q.BF16):
        values = rng.uniform(shape) * np.float32(scale * 1.7)
        if tensor_type == Q.F32:
            return values
        if tensor_type == Q.F16:
            return values.astype(np.float16)
        return (values.view(np.uint32) >> np.uint32(16)).astype(np.uint16)  # truncated to bfloat16
    elements, size, scales = BLOCKS[tensor_type]
    blocks = rng.take(rows * cols // elements * size).reshape(-1, size)
    for offset, magnitude in scales:
        half = (np.float32(magnitude) * (np.float32(1.0) + np.float32(0.5) * rng.uniform((len(blocks),))))
        blocks[:, offset:offset + 2] = half.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, cols // elements * size)


def write_hparams(w: gguf.GGUFWriter, arch: str, n_ctx: int, window: int) -> None:
    """The hyperparameters of the tiny models (these shapes), shared with tests/test_model.py's."""
    w.add_context_length(n_ctx)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER[arch])
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0 if arch != "gemma3" else 1e6)
    if FAMILIES[arch].swa_pattern:
        w.add_sliding_window(window)


def write_fixture_model(path: Path, arch: str, weight_type: Q, seed: int = 1) -> str:
    """Writes the model; returns the sha256 of its tensor bytes (what the recorded logits belong to)."""
    rng = Bytes(seed)
    fam = FAMILIES[arch]
    digest = hashlib.sha256()
    w = gguf.GGUFWriter(str(path), arch)
    write_hparams(w, arch, 128, WINDOW)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, N_VOCAB)])
    w.add_token_scores([0.0] * N_VOCAB)
    w.add_token_types([2, 3, 3] + [1] * (N_VOCAB - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def add(name: str, data: np.ndarray, raw_type: Q | None = None) -> None:
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(data).tobytes())
        if raw_type is None or raw_type in (Q.F32, Q.F16):
            w.add_tensor(name, data)
        else:  # bfloat16 bits and quantized blocks go in as bytes
            w.add_tensor(name, np.ascontiguousarray(data).view(np.uint8), raw_dtype=raw_type)

    def matrix(name: str, rows: int, cols: int, scale: float, tensor_type: Q = weight_type) -> None:
        add(name, random_tensor(rng, (rows, cols), tensor_type, scale), tensor_type)

    def vector(name: str, n: int, center: float, spread: float) -> None:
        add(name, np.float32(center) + np.float32(spread) * rng.uniform((n,)))

    # Q8_0 like the real files; Q4_0 in the Q4_0 models, so gemma3's tied output is a Q4_0 matrix too
    matrix("token_embd.weight", N_VOCAB, N_EMBD, 0.5, Q.Q4_0 if weight_type == Q.Q4_0 else Q.Q8_0)
    vector("output_norm.weight", N_EMBD, 1.0, 0.2)
    if arch != "gemma3":
        matrix("output.weight", N_VOCAB, N_EMBD, 0.1)
    for i in range(N_LAYER[arch]):
        p = f"blk.{i}."
        for name in ("attn_norm", "ffn_norm") + (("post_attention_norm", "post_ffw_norm") if fam.post_norms else ()):
            vector(p + name + ".weight", N_EMBD, 1.0, 0.2)
        matrix(p + "attn_q.weight", N_HEAD * HEAD_DIM, N_EMBD, 0.1)
        matrix(p + "attn_k.weight", N_HEAD_KV * HEAD_DIM, N_EMBD, 0.1)
        matrix(p + "attn_v.weight", N_HEAD_KV * HEAD_DIM, N_EMBD, 0.1)
        matrix(p + "attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM, 0.1)
        matrix(p + "ffn_gate.weight", N_FF, N_EMBD, 0.1)
        matrix(p + "ffn_up.weight", N_FF, N_EMBD, 0.1)
        matrix(p + "ffn_down.weight", N_EMBD, N_FF, 0.1)
        if fam.qkv_bias:
            vector(p + "attn_q.bias", N_HEAD * HEAD_DIM, 0.0, 0.1)
            vector(p + "attn_k.bias", N_HEAD_KV * HEAD_DIM, 0.0, 0.1)
            vector(p + "attn_v.bias", N_HEAD_KV * HEAD_DIM, 0.0, 0.1)
        if fam.qk_norm:
            vector(p + "attn_q_norm.weight", HEAD_DIM, 1.0, 0.1)
            vector(p + "attn_k_norm.weight", HEAD_DIM, 1.0, 0.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return digest.hexdigest()


def write_fixture_imatrix(path: Path, model: Path, legacy: bool = False, seed: int = 7) -> None:
    """An importance matrix for every matrix of `model` but the token embeddings, with random positive sums, as
    llama-imatrix writes it: GGUF (NAME.in_sum2, NAME.counts and the imatrix.* keys) or the legacy .dat layout."""
    from pyllm.gguf import GGUFFile  # only the names and widths; quick on a real model's vocabulary

    rng = Bytes(seed)
    with GGUFFile(model) as f:
        names = [(t.name, t.shape[0]) for t in f.tensors.values()
                 if len(t.shape) > 1 and t.shape[1] > 1 and t.name != "token_embd.weight"]
    sums = {name: (rng.uniform((n,)) + np.float32(1.0)) * np.float32(40.0) for name, n in names}
    if legacy:
        parts = [np.int32(len(names)).tobytes()]
        for name, _ in names:
            parts += [np.int32(len(name)).tobytes(), name.encode(), np.int32(10).tobytes(),
                      np.int32(sums[name].size).tobytes(), sums[name].astype(np.float32).tobytes()]
        parts += [np.int32(10).tobytes(), np.int32(len("fixture.txt")).tobytes(), b"fixture.txt"]
        path.write_bytes(b"".join(parts))
        return
    w = gguf.GGUFWriter(str(path), arch=None)
    w.add_array("imatrix.datasets", ["fixture.txt"])
    w.add_uint32("imatrix.chunk_count", 10)
    w.add_uint32("imatrix.chunk_size", 512)
    for name, _ in names:
        w.add_tensor(name + ".in_sum2", sums[name].reshape(1, -1))
        w.add_tensor(name + ".counts", np.array([[1500.0]], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
