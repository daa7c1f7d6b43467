"""The forward pass against an independent float64 numpy reference, on tiny random
GGUF models of every supported architecture, and its batch invariance.

The reference reads the weights through gguf-py (GGUFReader + gguf.quants), not
through pyllm, and writes each block out plainly (HF-style math).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from fixture_models import (
    HEAD_DIM,
    N_EMBD,
    N_FF,
    N_HEAD,
    N_HEAD_KV,
    N_LAYER,
    N_VOCAB,
    write_fixture_model,
    write_hparams,
)
from gguf import GGMLQuantizationType as Q

from pyllm import kernels
from pyllm.arch import FAMILIES, ArchitectureError
from pyllm.gguf import GGUFFile
from pyllm.model import ContextFullError, Logits, Model

WINDOW = 4


def write_tiny_model(path: Path, arch: str, weight_type: Q, seed: int = 0, n_ctx: int = 64) -> Path:
    rng = np.random.default_rng(seed)
    fam = FAMILIES[arch]
    w = gguf.GGUFWriter(str(path), arch)
    write_hparams(w, arch, n_ctx, WINDOW)

    def add(name: str, shape: tuple[int, ...], scale: float, quantize: bool = True) -> None:
        data = (rng.standard_normal(shape) * scale).astype(np.float32)
        if quantize and weight_type != Q.F32:
            w.add_tensor(name, gguf.quants.quantize(data, weight_type), raw_dtype=weight_type)
        else:
            w.add_tensor(name, data)

    add("token_embd.weight", (N_VOCAB, N_EMBD), 0.5)
    add("output_norm.weight", (N_EMBD,), 0.2, quantize=False)
    if arch != "gemma3":
        add("output.weight", (N_VOCAB, N_EMBD), 0.1)
    for i in range(N_LAYER[arch]):
        p = f"blk.{i}."
        for name in ("attn_norm", "ffn_norm") + (("post_attention_norm", "post_ffw_norm") if fam.post_norms else ()):
            norm = (1 + 0.1 * rng.standard_normal(N_EMBD)).astype(np.float32)
            w.add_tensor(p + name + ".weight", norm)
        add(p + "attn_q.weight", (N_HEAD * HEAD_DIM, N_EMBD), 0.1)
        add(p + "attn_k.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), 0.1)
        add(p + "attn_v.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), 0.1)
        add(p + "attn_output.weight", (N_EMBD, N_HEAD * HEAD_DIM), 0.1)
        add(p + "ffn_gate.weight", (N_FF, N_EMBD), 0.1)
        add(p + "ffn_up.weight", (N_FF, N_EMBD), 0.1)
        add(p + "ffn_down.weight", (N_EMBD, N_FF), 0.1)
        if fam.qkv_bias:
            add(p + "attn_q.bias", (N_HEAD * HEAD_DIM,), 0.1, quantize=False)
            add(p + "attn_k.bias", (N_HEAD_KV * HEAD_DIM,), 0.1, quantize=False)
            add(p + "attn_v.bias", (N_HEAD_KV * HEAD_DIM,), 0.1, quantize=False)
        if fam.qk_norm:
            w.add_tensor(p + "attn_q_norm.weight", (1 + 0.1 * rng.standard_normal(HEAD_DIM)).astype(np.float32))
            w.add_tensor(p + "attn_k_norm.weight", (1 + 0.1 * rng.standard_normal(HEAD_DIM)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- the reference --------------------------------------------------------------

def reference_logits(path: Path, arch: str, tokens: list[int]) -> np.ndarray:
    """float64 logits (len(tokens), n_vocab), from gguf-py's reader and dequantizer."""
    reader = gguf.GGUFReader(str(path))
    t = {}
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape))
        t[tensor.name] = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float64).reshape(shape)
    fam = FAMILIES[arch]
    eps = 1e-6
    n = len(tokens)
    pos = np.arange(n)

    def norm(x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight

    def rope(x, base):  # x (n, heads, d)
        half = HEAD_DIM // 2
        inv = base ** (-np.arange(half) * 2.0 / HEAD_DIM)
        ang = pos[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        if fam.rope_neox:
            a, b = x[..., :half], x[..., half:]
            return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return out

    x = t["token_embd.weight"][tokens]
    if fam.embed_scale:
        x = x * np.sqrt(N_EMBD)
    for i in range(N_LAYER[arch]):
        p = f"blk.{i}."
        swa = fam.swa_pattern and i % fam.swa_pattern < fam.swa_pattern - 1
        h = norm(x, t[p + "attn_norm.weight"])
        q, k, v = (h @ t[p + f"attn_{c}.weight"].T for c in "qkv")
        if fam.qkv_bias:
            q, k, v = q + t[p + "attn_q.bias"], k + t[p + "attn_k.bias"], v + t[p + "attn_v.bias"]
        q, k, v = q.reshape(n, N_HEAD, HEAD_DIM), k.reshape(n, N_HEAD_KV, HEAD_DIM), v.reshape(n, N_HEAD_KV, HEAD_DIM)
        if fam.qk_norm:
            q, k = norm(q, t[p + "attn_q_norm.weight"]), norm(k, t[p + "attn_k_norm.weight"])
        base = 10000.0 if (swa or arch != "gemma3") else 1e6
        q, k = rope(q, base), rope(k, base)
        group = N_HEAD // N_HEAD_KV
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(HEAD_DIM)
        visible = pos[None, :] <= pos[:, None]
        if swa:
            visible &= pos[:, None] - pos[None, :] < WINDOW
        scores = np.where(visible[None], scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, -1)
        o = attn @ t[p + "attn_output.weight"].T
        if fam.post_norms:
            o = norm(o, t[p + "post_attention_norm.weight"])
        x = x + o
        h = norm(x, t[p + "ffn_norm.weight"])
        g, u = h @ t[p + "ffn_gate.weight"].T, h @ t[p + "ffn_up.weight"].T
        if fam.activation == "silu":
            a = g / (1 + np.exp(-g)) * u
        else:
            a = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) * u
        f = a @ t[p + "ffn_down.weight"].T
        if fam.post_norms:
            f = norm(f, t[p + "post_ffw_norm.weight"])
        x = x + f
    out = t.get("output.weight", t["token_embd.weight"])
    return norm(x, t["output_norm.weight"]) @ out.T


# ---- tests --------------------------------------------------------------------

TOKENS = [1, 17, 42, 5, 88, 3, 64, 12, 9, 31]


@pytest.mark.parametrize("weight_type", [Q.F32, Q.Q8_0, Q.Q4_0], ids=lambda t: t.name)
@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_forward_matches_numpy_reference(tmp_path: Path, arch: str, weight_type: Q) -> None:
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, weight_type)
    ref = reference_logits(path, arch, TOKENS)
    with GGUFFile(path) as f:
        model = Model(f, n_threads=2)
        got = model.forward(TOKENS, model.new_cache(32), logits="all")
    assert got.shape == ref.shape
    # float weights: float32 rounding and the half-precision KV cache (seen: < 6e-4); quantized weights:
    # the reference keeps float activations while pyllm quantizes them to q8 (seen: 1-3% rms here)
    rel_rms = np.sqrt(((got - ref) ** 2).mean() / (ref**2).mean())
    if weight_type == Q.F32:
        assert rel_rms < 2e-3
        np.testing.assert_array_equal(got.argmax(-1), ref.argmax(-1))
    else:
        assert rel_rms < 5e-2


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_logits_do_not_depend_on_batching(tmp_path: Path, arch: str) -> None:
    """The same bits whole, in chunks, one token at a time, and with 1 or 3 threads: 40 tokens, so a prompt's
    matmuls take rows in panels of 16 (where the CPU has panel kernels), groups of 4 and lone rows."""
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, Q.Q4_0, seed=1)
    tokens = [int(t) for t in np.random.default_rng(5).integers(0, N_VOCAB, 40)]
    with GGUFFile(path) as f:
        model = Model(f, n_threads=2)
        whole = model.forward(tokens, model.new_cache(64), logits="all")
        cache = model.new_cache(64)
        chunks = np.concatenate([model.forward(tokens[a:b], cache, logits="all")
                                 for a, b in ((0, 3), (3, 4), (4, 21), (21, 40))])
        cache = model.new_cache(64)
        model.n_threads = 1
        single = np.stack([model.forward([tok], cache) for tok in tokens])
        model.n_threads = 3
        threaded = model.forward(tokens, model.new_cache(64), logits="all")
    for other in (chunks, single, threaded):
        np.testing.assert_array_equal(whole.view(np.uint32), other.view(np.uint32))


def test_long_prompts_in_ffn_chunks_give_the_same_bits(tmp_path: Path) -> None:
    """A prompt longer than the FFN's row chunk (256 rows) gives the bits of the same tokens in two calls."""
    path = write_tiny_model(tmp_path / "gemma3.gguf", "gemma3", Q.Q8_0, seed=3, n_ctx=640)
    tokens = [int(t) for t in np.random.default_rng(6).integers(0, N_VOCAB, 600)]
    with GGUFFile(path) as f:
        model = Model(f, n_threads=2)
        whole = model.forward(tokens, model.new_cache(640), logits="all")
        cache = model.new_cache(640)
        halves = np.concatenate([model.forward(tokens[:250], cache, logits="all"),
                                 model.forward(tokens[250:], cache, logits="all")])
    np.testing.assert_array_equal(whole.view(np.uint32), halves.view(np.uint32))


def test_cache_reuse_after_truncate_gives_same_bits(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "llama.gguf", "llama", Q.Q8_0)
    with GGUFFile(path) as f:
        model = Model(f)
        cache = model.new_cache(32)
        first = model.forward(TOKENS, cache, logits="all")
        cache.truncate(6)  # keep a 6-token prefix, recompute the rest
        again = model.forward(TOKENS[6:], cache, logits="all")
    np.testing.assert_array_equal(first[6:].view(np.uint32), again.view(np.uint32))


def test_context_overflow_and_bad_tokens_raise(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "llama.gguf", "llama", Q.F32)
    with GGUFFile(path) as f:
        model = Model(f)
        with pytest.raises(ContextFullError, match="exceed the context of 8"):
            model.forward(TOKENS, model.new_cache(8))
        with pytest.raises(ValueError, match="out of range"):
            model.forward([N_VOCAB], model.new_cache(8))
        with pytest.raises(ValueError, match="no tokens"):
            model.forward([], model.new_cache(8))


def test_unsupported_architecture_is_a_clear_error(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "mamba")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(tmp_path / "x.gguf") as f, pytest.raises(ArchitectureError, match="'mamba' is not supported"):
        Model(f)


def test_sliding_window_ring_keeps_only_the_window(tmp_path: Path) -> None:
    """gemma3's sliding layers in a ring of window + max_batch slots: the same logits (close) as a
    cache holding everything, and the same bits however the prompt is split."""
    path = write_tiny_model(tmp_path / "gemma3.gguf", "gemma3", Q.Q8_0)
    tokens = TOKENS * 3  # 30 tokens, far past the window of 4
    with GGUFFile(path) as f:
        model = Model(f, n_threads=2)
        full = model.forward(tokens, model.new_cache(32, max_batch=64), logits="all")
        ring_cache = model.new_cache(32, max_batch=3)
        assert ring_cache.layers[0].ring and ring_cache.layers[0].capacity == WINDOW + 3
        assert not ring_cache.layers[5].ring  # the global layer keeps everything
        ring = model.forward(tokens, ring_cache, logits="all")
        cache = model.new_cache(32, max_batch=3)
        pieces = [model.forward(tokens[a:b], cache, logits="all") for a, b in ((0, 2), (2, 13), (13, 14), (14, 30))]
    np.testing.assert_allclose(ring, full, rtol=0, atol=1e-4 * np.abs(full).max())
    np.testing.assert_array_equal(np.concatenate(pieces).view(np.uint32), ring.view(np.uint32))


def test_truncating_past_an_overwritten_window_recomputes(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "gemma3.gguf", "gemma3", Q.Q8_0)
    with GGUFFile(path) as f:
        model = Model(f)
        cache = model.new_cache(32, max_batch=2)
        model.forward(TOKENS * 2, cache)
        assert cache.truncate(19) == 19  # its window is still in the ring
        assert cache.truncate(5) == 0    # slots of positions 2..4 were overwritten: start over
        assert cache.n_used == 0


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_context_shift_drops_old_tokens_and_rerotates_keys(tmp_path: Path, arch: str) -> None:
    """After shift(n_keep, n_discard), the cache equals one built from the kept tokens alone
    (positions renumbered), up to the float rounding of the re-rotation."""
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, Q.F32)
    tokens = TOKENS * 3
    with GGUFFile(path) as f:
        model = Model(f)
        cache = model.new_cache(20, max_batch=20)
        model.forward(tokens[:20], cache)
        cache.shift(n_keep=1, n_discard=9)
        assert cache.n_used == 11
        for layer in cache.layers:
            assert sorted(layer.positions[layer.positions >= 0]) == list(range(11))
        shifted = model.forward(tokens[20:24], cache, logits="all")
        # what the shifted cache holds for layer 0: keys of the kept tokens at their new positions
        fresh = model.new_cache(20, max_batch=20)
        model.forward([tokens[0]] + tokens[10:20], fresh)
        np.testing.assert_allclose(cache.layers[0].k[:11].astype(np.float32),
                                   fresh.layers[0].k[:11].astype(np.float32), rtol=0, atol=2e-2)
    assert shifted.shape == (4, N_VOCAB) and np.all(np.isfinite(shifted))


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_a_batch_of_several_sequences_gives_each_its_own_bits(tmp_path: Path, arch: str) -> None:
    """Rows of three sequences in one forward (a prefill chunk beside two decode steps), each with
    its own cache: every sequence's logits are bit-identical to running it alone."""
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, Q.Q4_0, seed=2)
    prompts = [TOKENS[:7], TOKENS[3:], TOKENS[::-1]]
    with GGUFFile(path) as f:
        model = Model(f, n_threads=2)
        alone = [model.forward(p + [5], model.new_cache(32), logits="all") for p in prompts]
        caches = [model.new_cache(32) for _ in prompts]
        model.forward(prompts[0], caches[0])
        model.forward(prompts[1], caches[1])
        out = model.forward_batch([
            ([5], caches[0], "last"),                    # a decode step
            (prompts[2] + [5], caches[2], "all"),        # a whole prefill
            ([5], caches[1], "last"),                    # another decode step
        ])
        with pytest.raises(ValueError, match="at most once"):
            model.forward_batch([([1], caches[0], "last"), ([2], caches[0], "last")])
    np.testing.assert_array_equal(out[0].view(np.uint32), alone[0][-1].view(np.uint32))
    np.testing.assert_array_equal(out[1].view(np.uint32), alone[2].view(np.uint32))
    np.testing.assert_array_equal(out[2].view(np.uint32), alone[1][-1].view(np.uint32))


def test_prefill_and_decode_are_the_batches_they_name(tmp_path: Path) -> None:
    """Model.prefill is one sequence's prompt (Model.forward by its old name), Model.decode one step of several
    sequences in one batch: each sequence's logits the bits of running it alone; Logits values and their strings are
    the same request."""
    path = write_tiny_model(tmp_path / "llama.gguf", "llama", Q.Q4_0, seed=4)
    prompts = [TOKENS[:5], TOKENS[2:9], TOKENS[::-1][:4]]
    with GGUFFile(path) as f:
        model = Model(f, n_threads=2)
        assert Model.forward is Model.prefill
        alone = [model.prefill(p + [7], model.new_cache(32), logits=Logits.ALL)[-1] for p in prompts]
        caches = [model.new_cache(32) for _ in prompts]
        for prompt, cache in zip(prompts, caches, strict=True):
            last = model.prefill(prompt, cache, logits="last")
            assert last.shape == (model.n_vocab,)
        steps = model.decode([(7, cache) for cache in caches])
        assert steps.shape == (len(prompts), model.n_vocab)
        assert [cache.n_used for cache in caches] == [len(p) + 1 for p in prompts]
        with pytest.raises(ValueError, match="logits must be"):
            model.forward_batch([([1], model.new_cache(8), "first")])
    for got, want in zip(steps, alone, strict=True):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("weight_type", [Q.Q4_1, Q.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_c_blocks_equal_the_step_by_step_reference(tmp_path: Path, arch: str, weight_type: Q) -> None:
    """pyllm_blocks_forward (every layer in one C call) gives the bits of the reference block that runs
    each step from Python: prefill in chunks through a ring cache, a batch of two sequences, decode,
    a prompt whose row-wise steps run on several threads, and the caches they leave."""
    path = tmp_path / f"{arch}.gguf"
    write_fixture_model(path, arch, weight_type, seed=3)
    tokens = TOKENS * 2
    with GGUFFile(path) as f:
        runs = []
        for reference in (False, True):
            model = Model(f, n_threads=2, reference=reference)
            a, b = model.new_cache(32, max_batch=3), model.new_cache(32, max_batch=3)
            logits = [model.forward(tokens[:13], a, logits="all"), model.forward(tokens[:2], b, logits="all")]
            logits += [x for x in model.forward_batch([([7], a, "last"), (tokens[2:5], b, "all")]) if x is not None]
            logits += [model.forward([tok], a) for tok in (3, 9)]
            # a prompt long enough (80 x 256 floats) that the row-wise steps are split across the threads
            logits.append(model.forward((TOKENS * 8)[:80], model.new_cache(96, max_batch=96), logits="all"))
            runs.append((logits, a, b))
    (got, *got_caches), (want, *want_caches) = runs
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    for g, w in zip(got_caches, want_caches, strict=True):
        for gl, wl in zip(g.layers, w.layers, strict=True):
            np.testing.assert_array_equal(gl.k.view(np.uint16), wl.k.view(np.uint16))
            np.testing.assert_array_equal(gl.positions, wl.positions)


@pytest.mark.parametrize(("arch", "weight_type"), [("llama", Q.Q4_1), ("gemma3", Q.Q8_0), ("qwen2", Q.Q5_0)],
                         ids=["llama-Q4_1", "gemma3-Q8_0", "qwen2-Q5_0"])
def test_q4_1_q8_0_and_q5_0_matrices_are_read_interleaved(tmp_path: Path, arch: str, weight_type: Q) -> None:
    """Where the CPU has the tile kernels, the matmuls read a Q4_1 / Q8_0 / Q5_0 matrix from its interleaved copy, and
    the embedding its rows from there when the output matrix is the (Q8_0) token_embd (gemma3's is tied); the
    tensors' own bytes stay the file's."""
    interleaved = kernels.interleaved_type(int(weight_type))
    if interleaved is None:
        pytest.skip(f"the {kernels.active_tier()} tier has no tile kernels")
    path = tmp_path / "m.gguf"
    write_fixture_model(path, arch, weight_type)
    with GGUFFile(path) as f:
        weights = Model(f, n_threads=1).weights
        for name, tensor in (("blk.0.attn_q.weight", weights.layers[0].wq),
                             ("blk.1.ffn_down.weight", weights.layers[1].w_down)):
            raw = f.raw(name)
            assert tensor.matrix.type == interleaved
            np.testing.assert_array_equal(tensor.data, raw)
            np.testing.assert_array_equal(tensor.matrix.data, kernels.interleave(raw, int(weight_type)))
        tied = arch == "gemma3"
        assert (weights.output is weights.token_embd) == tied
        assert weights.token_embd.matrix.type == (kernels.GGMLType.Q8_0_X16 if tied else kernels.GGMLType.Q8_0)
        tokens = np.array([5, 0, 95, 5])
        np.testing.assert_array_equal(weights.token_embd.matrix.rows(tokens),
                                      kernels.dequantize(f.raw("token_embd.weight")[tokens], kernels.GGMLType.Q8_0))


def test_q5_0_matrices_are_read_regrouped(tmp_path: Path) -> None:
    """Without Q5_0 tile kernels (any tier below avx512_vnni: here the generic one), the matmuls read a Q5_0 matrix
    from its regrouped copy (Q5_0_G8); the tensor's own bytes stay the file's."""
    path = tmp_path / "m.gguf"
    write_fixture_model(path, "qwen2", Q.Q5_0)
    tier = kernels.active_tier()
    with GGUFFile(path) as f:
        kernels.set_tier("generic")
        try:
            weights = Model(f, n_threads=1).weights
        finally:
            kernels.set_tier(tier)
        for name, tensor in (("blk.0.attn_q.weight", weights.layers[0].wq),
                             ("blk.0.ffn_up.weight", weights.layers[0].w_up)):
            raw = f.raw(name)
            assert tensor.matrix.type == kernels.GGMLType.Q5_0_G8
            np.testing.assert_array_equal(tensor.data, raw)
            np.testing.assert_array_equal(tensor.matrix.data, kernels.group_q5_0(raw))
        assert weights.output.matrix.type == kernels.GGMLType.Q5_0_G8  # qwen2's own output matrix
