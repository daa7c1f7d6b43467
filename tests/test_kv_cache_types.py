"""Quantized KV caches (llama.cpp's --cache-type-k/-v): the attention over quantized keys and values against
a float64 numpy reference that decodes the blocks itself, every tier's bits equal, batch invariance of the
whole model, memory, saved state, and the flags of the command line and the Python API."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as Q
from test_model import N_VOCAB, write_tiny_model

from pyllm import kernels
from pyllm.cli import main
from pyllm.gguf import GGUFFile
from pyllm.kernels import GGMLType
from pyllm.kvcache import CACHE_TYPES, KVCache, cache_type
from pyllm.llama import Llama
from pyllm.model import Model
from pyllm.params import ParamError

# ---- a plain numpy reading of the blocks (ggml's layouts), independent of the C core ----

BLOCK_BYTES = {GGMLType.Q8_0: 34, GGMLType.Q4_0: 18, GGMLType.Q4_1: 20, GGMLType.Q5_0: 22, GGMLType.Q5_1: 24}


def decode_blocks(raw: np.ndarray, type_id: GGMLType, with_min: bool = True) -> np.ndarray:
    """(rows, bytes) of 32-element blocks -> (rows, elements) float64 (without_min: a q4_1 / q5_1 block's d * q
    alone; `block_mins` has their m)."""
    rows = raw.reshape(len(raw), -1, BLOCK_BYTES[type_id])
    d = rows[..., 0:2].copy().view(np.float16).astype(np.float64)            # (rows, blocks, 1)
    if type_id == GGMLType.Q8_0:
        values = d * rows[..., 2:].view(np.int8)
    else:
        has_min = type_id in (GGMLType.Q4_1, GGMLType.Q5_1)
        start = 4 if has_min else 2
        high = None
        if type_id in (GGMLType.Q5_0, GGMLType.Q5_1):
            bits = rows[..., start:start + 4].copy().view(np.uint32)[..., 0]  # (rows, blocks)
            high = (bits[..., None] >> np.arange(32)) & 1
            start += 4
        qs = rows[..., start:start + 16]
        q = np.concatenate([qs & 0xF, qs >> 4], axis=-1).astype(np.int64)    # elements 0..15, then 16..31
        if high is not None:
            q = q | (high.astype(np.int64) << 4)
        if has_min:
            m = rows[..., 2:4].copy().view(np.float16).astype(np.float64)
            values = d * q + (m if with_min else 0)
        else:
            values = d * (q - (16 if high is not None else 8))
    return values.reshape(len(raw), -1)


def block_mins(raw: np.ndarray) -> np.ndarray:
    """A q4_1 / q5_1 row's blocks' m (the value of a zero), (rows, blocks) float64."""
    rows = raw.reshape(len(raw), -1, BLOCK_BYTES[GGMLType.Q4_1] if raw.shape[1] % 24 else 24)
    return rows[..., 2:4].copy().view(np.float16).astype(np.float64)[..., 0]


def quantize_query_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A query as llama.cpp's x86 build quantizes activations to q8_0 / q8_1, decoded: blocks of 32 scaled by
    d = amax / 127 (rounded to half precision once stored), values rounded half to even; and q8_1's per-block
    s = d * sum(q), rounded to half precision."""
    blocks = x.astype(np.float32).reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.rint(blocks * inv)
    s = (d[:, 0] * q.sum(axis=1).astype(np.float32)).astype(np.float16).astype(np.float64)
    return (q * d.astype(np.float16).astype(np.float64)).reshape(x.shape), s


def cache_rows(x: np.ndarray, type_id: GGMLType, n_heads: int, d: int) -> np.ndarray:
    if type_id == GGMLType.F16:
        return x.astype(np.float16).reshape(len(x), n_heads, d)
    return kernels.quantize(x, type_id)


def decoded(rows: np.ndarray, type_id: GGMLType, with_min: bool = True) -> np.ndarray:
    if type_id == GGMLType.F16:
        return rows.reshape(len(rows), -1).astype(np.float64)
    return decode_blocks(rows, type_id, with_min)


def key_scores(type_k: GGMLType, kd: np.ndarray, mins: np.ndarray | None, query: np.ndarray) -> np.ndarray:
    """q . k for every key of one kv head (kd: (n_kv, d) decoded without mins; mins: (n_kv, blocks) or None)."""
    if type_k == GGMLType.F16:
        return kd @ query.astype(np.float16).astype(np.float64)
    values, s = quantize_query_q8(query)
    return kd @ values + (0 if mins is None else mins @ s)


PAIRS = [(GGMLType.Q8_0, GGMLType.Q8_0), (GGMLType.Q4_0, GGMLType.Q4_0), (GGMLType.F16, GGMLType.Q8_0),
         (GGMLType.Q8_0, GGMLType.F16), (GGMLType.Q4_1, GGMLType.Q5_0), (GGMLType.Q5_1, GGMLType.Q4_1)]


@pytest.mark.parametrize(("type_k", "type_v"), PAIRS, ids=lambda t: t.name.lower())
def test_quantized_attention_matches_reference_and_any_grouping(type_k: GGMLType, type_v: GGMLType) -> None:
    """Scores from the stored key blocks and the query in the key type's activation format, the softmax
    weights (rounded to half precision for half-precision values), the weighted sum over the stored values:
    float64 math agrees;
    every tier gives the same bits, and so do the rows alone, a prompt's 16-row blocks and 1 or 3 threads."""
    rng = np.random.default_rng(int(type_k) * 10 + int(type_v))
    m, n_kv, n_head, n_head_kv, d = 21, 40, 6, 2, 64
    q = rng.standard_normal((m, n_head, d)).astype(np.float32)
    k = cache_rows(rng.standard_normal((n_kv, n_head_kv * d)).astype(np.float32), type_k, n_head_kv, d)
    v = cache_rows(rng.standard_normal((n_kv, n_head_kv * d)).astype(np.float32), type_v, n_head_kv, d)
    k_pos = np.arange(n_kv, dtype=np.int32)
    k_pos[[3, 30]] = -1                                         # empty slots
    q_pos = np.arange(n_kv - m, n_kv, dtype=np.int32)
    scale, window = 0.125, 25

    has_min = type_k in (GGMLType.Q4_1, GGMLType.Q5_1)
    kd = decoded(k, type_k, with_min=False).reshape(n_kv, n_head_kv, d)
    mins = block_mins(k).reshape(n_kv, n_head_kv, d // 32) if has_min else None
    vd = decoded(v, type_v).reshape(n_kv, n_head_kv, d)
    group = n_head // n_head_kv
    want, slack = np.zeros((m, n_head, d)), np.zeros((m, n_head, d))
    for r in range(m):
        visible = (k_pos >= 0) & (k_pos <= q_pos[r]) & (q_pos[r] - k_pos < window)
        for h in range(n_head):
            hk = h // group
            s = key_scores(type_k, kd[visible, hk], None if mins is None else mins[visible, hk], q[r, h]) * scale
            p = np.exp(s - s.max())
            if type_v != GGMLType.F16:  # quantized values take the weights as they are
                want[r, h] = p / p.sum() @ vd[visible, hk]
                continue
            weights = (p / p.sum()).astype(np.float16)
            want[r, h] = weights.astype(np.float64) @ vd[visible, hk]
            # float32 and float64 may round a weight to half precision either way: a half-precision step each
            slack[r, h] = np.spacing(weights).astype(np.float64) @ np.abs(vd[visible, hk])

    def run(rows: slice, n_threads: int = 2) -> np.ndarray:
        return kernels.attention(np.ascontiguousarray(q[rows]), k, v, q_pos[rows], k_pos, scale, window,
                                 n_threads=n_threads, type_k=type_k, type_v=type_v)

    saved = kernels.active_tier()
    results = {}
    try:
        for tier in kernels.TIERS[:kernels.TIERS.index(kernels.best_tier()) + 1]:
            kernels.set_tier(tier)
            results[tier] = run(slice(None))
        whole = results[saved]
        alone = np.concatenate([run(slice(r, r + 1), n_threads=1) for r in range(m)])
        threaded = run(slice(None), n_threads=3)
    finally:
        kernels.set_tier(saved)
    assert np.all(np.abs(results["generic"] - want) <= slack + 1e-5 * np.abs(want) + 1e-6)
    assert np.mean(np.abs(results["generic"] - want) <= 1e-4 * np.abs(want) + 1e-5) > 0.99
    for tier, got in results.items():
        np.testing.assert_array_equal(got.view(np.uint32), results["generic"].view(np.uint32), err_msg=tier)
    for other in (alone, threaded):
        np.testing.assert_array_equal(other.view(np.uint32), whole.view(np.uint32))


def test_a_cache_type_needs_whole_blocks_per_head() -> None:
    q = np.zeros((1, 2, 48), np.float32)
    k = np.zeros((4, 2 * 48 // 32 * 34), np.uint8)
    with pytest.raises(kernels.KernelError, match="cannot hold heads of 48"):
        kernels.attention(q, k, k, [3], np.arange(4), 1.0, type_k=GGMLType.Q8_0, type_v=GGMLType.Q8_0)


@pytest.mark.parametrize(("type_k", "type_v"), [("q8_0", "q8_0"), ("q4_0", "f16")])
def test_model_logits_with_a_quantized_cache_do_not_depend_on_batching(tmp_path: Path, type_k: str,
                                                                       type_v: str) -> None:
    """The whole model over a quantized cache: the same bits whole, in chunks, a token at a time and with 3
    threads (gemma3: sliding-window ring layers too); near the f16 cache's logits."""
    path = write_tiny_model(tmp_path / "gemma3.gguf", "gemma3", Q.Q4_0, seed=1)
    tokens = [int(t) for t in np.random.default_rng(5).integers(0, N_VOCAB, 40)]
    with GGUFFile(path) as f:
        model = Model(f, n_threads=2)
        f16 = model.forward(tokens, model.new_cache(64), logits="all")
        model.set_cache_types(cache_type(type_k), cache_type(type_v))
        whole = model.forward(tokens, model.new_cache(64), logits="all")
        cache = model.new_cache(64)
        chunks = np.concatenate([model.forward(tokens[a:b], cache, logits="all")
                                 for a, b in ((0, 3), (3, 4), (4, 21), (21, 40))])
        cache = model.new_cache(64)
        single = np.stack([model.forward([tok], cache) for tok in tokens])
        model.n_threads = 3
        threaded = model.forward(tokens, model.new_cache(64), logits="all")
    for other in (chunks, single, threaded):
        np.testing.assert_array_equal(whole.view(np.uint32), other.view(np.uint32))
    assert not np.array_equal(whole, f16)
    np.testing.assert_allclose(whole, f16, atol=0.05 * np.abs(f16).max())


def test_cache_memory_and_saved_state(tmp_path: Path, smollm2_path: Path) -> None:
    """q8_0 keeps 34 bytes per 32 values (17/32 of f16), q4_0 18; a saved state comes back bit for bit into a
    cache of its types and is refused by one of other types."""
    sizes = {}
    for name in ("f16", "q8_0", "q4_0"):
        llm = Llama(str(smollm2_path), n_ctx=64, type_k=name, type_v=name)
        assert llm.model is not None
        cfg = llm.model.config
        sizes[name] = llm.model.new_cache(64).nbytes
        assert sizes[name] == KVCache.bytes_needed(cfg, 64, 64, *llm.model.cache_types) - 4 * 64 * cfg.n_layer
        llm.close()
    assert sizes["q8_0"] * 32 == sizes["f16"] * 17 and sizes["q4_0"] * 32 == sizes["f16"] * 9

    llm = Llama(str(smollm2_path), n_ctx=128, type_k="q8_0", type_v="q4_0")
    first = llm.create_completion("The capital of France is", max_tokens=4, temperature=0)
    state = llm.save_state()
    assert state.types == (GGMLType.Q8_0, GGMLType.Q4_0)
    llm.save_session(tmp_path / "s.pyllm")
    again = Llama(str(smollm2_path), n_ctx=128, type_k="q8_0", type_v="q4_0")
    again.load_session(tmp_path / "s.pyllm")
    other = Llama(str(smollm2_path), n_ctx=128)
    with pytest.raises(ParamError, match="q8_0/q4_0 KV cache"):
        other.load_session(tmp_path / "s.pyllm")
    prompt = "The capital of France is" + first["choices"][0]["text"] + " and"
    assert (again.create_completion(prompt, max_tokens=4, temperature=0)["choices"][0]["text"]
            == llm.create_completion(prompt, max_tokens=4, temperature=0)["choices"][0]["text"])
    for one in (llm, again, other):
        one.close()


def test_context_shift_over_a_quantized_cache(smollm2_path: Path) -> None:
    """Generation goes on past n_ctx: the kept keys are decoded, rotated and quantized again."""
    llm = Llama(str(smollm2_path), n_ctx=48, type_k="q4_0", type_v="q8_0")
    out = llm.create_completion("Count: one, two, three,", max_tokens=80, temperature=0)
    assert out["usage"]["completion_tokens"] == 80 or out["choices"][0]["finish_reason"] == "stop"
    llm.close()


def test_api_and_cli_take_cache_types(smollm2_path: Path) -> None:
    assert cache_type(None) == GGMLType.F16 and cache_type(8) == GGMLType.Q8_0 and cache_type("Q4_0") == GGMLType.Q4_0
    for bad in ("q2_k", 0, 10, True):
        with pytest.raises(ValueError, match="is not one of"):
            cache_type(bad)
    result = CliRunner().invoke(main, ["run", str(smollm2_path), "Hello", "-n", "3", "--temp", "0", "-c", "64",
                                       "-ctk", "q8_0", "-ctv", "q4_0"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["run", str(smollm2_path), "Hello", "-ctk", "q3_k"])
    assert result.exit_code == 2 and "'q3_k' is not one of" in result.output
    assert set(CACHE_TYPES) == {"f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"}
    result = CliRunner().invoke(main, ["bench", str(smollm2_path), "-p", "8", "-n", "2", "-r", "1", "-ctk", "q8_0",
                                       "-ctv", "q4_0", "--json"])
    assert result.exit_code == 0, result.output
    import json
    records = json.loads(result.output)
    assert [(r["type_k"], r["type_v"]) for r in records] == [("q8_0", "q4_0")] * 2  # as llama-bench's JSON


def test_info_and_chat_stats_show_the_cache_memory(smollm2_path: Path) -> None:
    """`pyllm info` sizes the cache of each type at 4096 tokens and the training context, as KVCache
    allocates it; chat's statistics give the bytes used and the types."""
    from pyllm.chat import ChatSession, Settings

    result = CliRunner().invoke(main, ["info", str(smollm2_path), "--json"])
    assert result.exit_code == 0, result.output
    import json
    sizes = json.loads(result.output)["kv_cache_bytes"]
    llm = Llama(str(smollm2_path), n_ctx=4096, type_k="q8_0", type_v="q8_0", prefill_chunk=512)
    assert llm.model is not None
    assert sizes["q8_0"]["4096"] == KVCache.bytes_needed(llm.model.config, 4096, 512, GGMLType.Q8_0, GGMLType.Q8_0)
    assert sizes["f16"]["4096"] > sizes["q8_0"]["4096"] > sizes["q4_0"]["4096"]
    lines: list[str] = []
    session = ChatSession(llm, Settings(temperature=0, max_tokens=4), stats=True,
                          out=lambda text="", **_: lines.append(text),
                          model_name="smollm2")
    session.handle("Hi")
    used, full, types = llm.kv_cache_bytes(llm.n_ctx())
    assert (used, types) == (full, "q8_0") and full == sizes["q8_0"]["4096"]
    assert any(f"/{full / 2**20:.1f} MiB q8_0" in line for line in lines), lines
    llm.close()


def test_hadamard_rotation_is_the_orthonormal_walsh_matrix() -> None:
    """kernels.hadamard against the Sylvester matrix built by numpy; applied twice it gives x back."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 128)).astype(np.float32)
    for n in (64, 128):
        h = np.array([[1.0]])
        while len(h) < n:
            h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
        want = (x.reshape(-1, n).astype(np.float64) @ h / np.sqrt(n)).reshape(x.shape)
        got = kernels.hadamard(x, n)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(kernels.hadamard(got, n), x, rtol=1e-5, atol=1e-5)
    with pytest.raises(kernels.KernelError, match="power of two"):
        kernels.hadamard(x, 48)


def test_prefix_reuse_and_parallel_sequences_over_a_quantized_cache(smollm2_path: Path) -> None:
    """A prompt that reuses a cached prefix, and two sequences decoded together, give the tokens of a lone
    run from an empty cache (the prefix's slots are copied block for block)."""
    import threading

    prompt = "List three fruits and three vegetables, one per line:"
    alone = Llama(str(smollm2_path), n_ctx=256, type_k="q4_0", type_v="q8_0")
    want = alone.create_completion(prompt, max_tokens=12, temperature=0)["choices"][0]["text"]
    alone.close()
    llm = Llama(str(smollm2_path), n_ctx=256, n_parallel=2, type_k="q4_0", type_v="q8_0")
    first = llm.create_completion(prompt, max_tokens=12, temperature=0)
    again = llm.create_completion(prompt, max_tokens=12, temperature=0)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(
        llm.create_completion(prompt, max_tokens=12, temperature=0)["choices"][0]["text"])) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [first["choices"][0]["text"], again["choices"][0]["text"], *results] == [want] * 4
    llm.close()
