"""The C kernel core held to independent oracles.

- dequantization: bit-identical to gguf-py's numpy reference (gguf.quants), on
  random blocks and on the real tensors of the Gemma 3 and SmolLM2 files;
- quantization: bit-identical to gguf.quants where it implements the type;
- vec_dot: every SIMD tier gives the generic kernel's exact bits, and every
  kernel is close to the float64 dot of the dequantized operands;
- matmul: close to the float reference; each row bit-identical alone, in a
  batch, at 1 to 4 threads.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants as gq

from pyllm import kernels
from pyllm.gguf import TYPE_TRAITS, GGUFFile
from pyllm.kernels import GGMLType, KernelError

# the GGUF weight types (Q8_K, Q8_1: activations only; Q4_0_LANES: Q4_0 blocks in another reduction order;
# Q5_0_G8: Q5_0 blocks regrouped)
KERNEL_ONLY_TYPES = (GGMLType.Q4_0_LANES, GGMLType.Q5_0_G8)
# matrices interleaved 16 rows at a time: matmul only (no row of their own)
INTERLEAVED_TYPES = {GGMLType.Q4_1_X16: GGMLType.Q4_1, GGMLType.Q8_0_X16: GGMLType.Q8_0,
                     GGMLType.Q5_0_X16: GGMLType.Q5_0, GGMLType.Q4_K_X16: GGMLType.Q4_K,
                     GGMLType.Q6_K_X16: GGMLType.Q6_K}
WEIGHT_TYPES = [t for t in GGMLType if t not in (GGMLType.Q8_K, GGMLType.Q8_1, *KERNEL_ONLY_TYPES, *INTERLEAVED_TYPES)]
BLOCK_TYPES = [t for t in WEIGHT_TYPES if t not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16)]
MATMUL_TYPES = WEIGHT_TYPES + list(KERNEL_ONLY_TYPES)


def layout(type_id: GGMLType) -> GGMLType:
    """The GGUF type whose blocks a kernel type reads."""
    return {GGMLType.Q4_0_LANES: GGMLType.Q4_0, GGMLType.Q5_0_G8: GGMLType.Q5_0}.get(type_id, type_id)


def kernel_rows(type_id: GGMLType, rows: np.ndarray) -> np.ndarray:
    """GGUF blocks (n_rows, row_bytes) as the kernel type reads them: Q5_0_G8 regroups each row."""
    return kernels.group_q5_0(rows) if type_id == GGMLType.Q5_0_G8 else rows

# byte offsets of the fp16 scale fields inside one block of each format
FP16_FIELDS = {
    GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q5_0: (0,), GGMLType.Q5_1: (0, 2),
    GGMLType.Q8_0: (0,), GGMLType.Q2_K: (80, 82), GGMLType.Q3_K: (108,), GGMLType.Q4_K: (0, 2),
    GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,),
}


def random_fp16(rng: np.random.Generator, size: int, extreme: bool = False) -> np.ndarray:
    """Finite half floats: moderate ones, or drawn from every finite exponent (subnormals to 65504)."""
    if extreme:
        bits = rng.integers(0, 0x7C00, size=size, dtype=np.uint16) | (rng.integers(0, 2, size, np.uint16) << 15)
        return bits.view(np.float16)
    return rng.uniform(-0.05, 0.05, size).astype(np.float16)


def random_blocks(type_id: GGMLType, n_blocks: int, rng: np.random.Generator, extreme: bool = False) -> np.ndarray:
    """(n_blocks, type_size) uint8 with random quants and finite scales; block 0 is all zero."""
    block_size, type_size = TYPE_TRAITS[layout(type_id)][1:]
    if type_id == GGMLType.F32:
        values = rng.standard_normal(n_blocks).astype(np.float32)
        if extreme:
            values *= np.float32(1e30)
        out = values.view(np.uint8).reshape(n_blocks, 4)
    elif type_id == GGMLType.F16:
        out = random_fp16(rng, n_blocks, extreme).view(np.uint8).reshape(n_blocks, 2)
    elif type_id == GGMLType.BF16:
        if extreme:
            signs = rng.integers(0, 2, n_blocks, np.uint16) << 15
            bf16 = rng.integers(0, 0x7F80, size=n_blocks, dtype=np.uint16) | signs
        else:
            bf16 = (rng.standard_normal(n_blocks).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        out = bf16.view(np.uint8).reshape(n_blocks, 2)
    else:
        out = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
        for offset in FP16_FIELDS[layout(type_id)]:
            out[:, offset:offset + 2] = random_fp16(rng, n_blocks, extreme).view(np.uint8).reshape(n_blocks, 2)
    out = out.copy()
    out[0] = 0
    assert block_size >= 1
    return out


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# ---- dequantization -----------------------------------------------------------

@pytest.mark.parametrize("extreme", [False, True], ids=["moderate", "extreme-scales"])
@pytest.mark.parametrize("type_id", WEIGHT_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_reference(type_id: GGMLType, extreme: bool) -> None:
    rng = np.random.default_rng(int(type_id) * 7 + extreme)
    block_size = TYPE_TRAITS[type_id][1]
    n_blocks = 4096 // block_size * 8 if block_size == 1 else 300
    blocks = random_blocks(type_id, n_blocks, rng, extreme)
    rows = blocks.reshape(4, -1)
    ours = kernels.dequantize(rows, type_id)
    ref = gq.dequantize(rows, Q(int(type_id)))
    assert ours.shape == ref.shape
    np.testing.assert_array_equal(bits(ours), bits(ref))


def _real_tensor_cases(path, per_type_limit: int = 3):
    """(name, type) of up to `per_type_limit` tensors of each type in the file."""
    with GGUFFile(path) as f:
        seen: dict[int, int] = {}
        for info in f.tensors.values():
            if seen.get(info.type, 0) < per_type_limit:
                seen[info.type] = seen.get(info.type, 0) + 1
                yield info.name, info.type


@pytest.mark.parametrize("model", ["gemma_path", "smollm2_path"])
def test_dequantize_real_tensors_match_gguf_reference(model: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(model)
    cases = list(_real_tensor_cases(path))
    types = {t for _, t in cases}
    expected = {"gemma_path": {0, 6, 8, 12, 14}, "smollm2_path": {0, 3, 8}}[model]
    assert types == expected, f"the file's tensor types changed: {sorted(types)}"
    with GGUFFile(path) as f:
        for name, type_id in cases:
            raw = f.raw(name)[:2048]  # the 262144-row embedding: its first 2048 rows are plenty
            ours = kernels.dequantize(raw, type_id)
            ref = gq.dequantize(np.array(raw), Q(type_id))
            np.testing.assert_array_equal(bits(ours), bits(ref), err_msg=name)


# ---- quantization -------------------------------------------------------------

def _quantize_inputs(rng: np.random.Generator, block_size: int) -> np.ndarray:
    """Rows with normal blocks, an all-zero block, a constant block, huge and tiny magnitudes, ties."""
    x = rng.standard_normal((6, block_size * 64)).astype(np.float32)
    x[1, :block_size] = 0
    x[2, :block_size] = 0.75
    x[3] *= np.float32(6e4)
    x[4] *= np.float32(1e-6)
    x[5] = np.round(x[5] * 4) / 4  # many exact ties after scaling
    return x


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
@pytest.mark.parametrize("type_id", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
                                     GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_quantize_matches_gguf_reference(type_id: GGMLType) -> None:
    x = _quantize_inputs(np.random.default_rng(int(type_id)), 32)
    ours = kernels.quantize(x, type_id)
    ref = gq.quantize(x, Q(int(type_id))).view(np.uint8).reshape(ours.shape)
    np.testing.assert_array_equal(ours, ref)


def test_quantize_q8_K_properties() -> None:
    """Q8_K (activations only; gguf has no reference): error within half a step, exact group sums."""
    x = _quantize_inputs(np.random.default_rng(1), 256)
    q = kernels.quantize(x, GGMLType.Q8_K)
    blocks = q.reshape(-1, 292)
    d = blocks[:, :4].copy().view(np.float32)[:, 0]
    qs = blocks[:, 4:260].view(np.int8).astype(np.int32)
    bsums = blocks[:, 260:].copy().view(np.int16)
    np.testing.assert_array_equal(bsums, qs.reshape(-1, 16, 16).sum(-1))
    assert qs.min() >= -127 and qs.max() <= 127
    back = kernels.dequantize(q, GGMLType.Q8_K).reshape(-1, 256)
    err = np.abs(back - x.reshape(-1, 256))
    assert np.all(err <= np.abs(d)[:, None] * 0.5 * (1 + 1e-5) + 1e-30)
    amax = np.abs(x.reshape(-1, 256)).max(-1)
    np.testing.assert_allclose(np.abs(d), amax / 127, rtol=1e-6)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_float16_rounding_matches_numpy_everywhere() -> None:
    """fp32 -> fp16 (used by every quantizer) rounds like numpy on hard cases: ties, subnormals, overflow."""
    edges = np.array([65504, 65519.99, 65520, 1e6, 2**-24, 2**-25, 2**-25 * 1.0001, 2**-14, 2**-14 * (1 - 2**-12),
                      0.1, 1 / 3, 0, -0.0], dtype=np.float32)
    rng = np.random.default_rng(5)
    randoms = (rng.standard_normal(100_000) * 10.0 ** rng.integers(-9, 6, 100_000)).astype(np.float32)
    x = np.concatenate([edges, -edges, randoms])
    x = x[: x.size // 32 * 32]
    ours = kernels.quantize(x, GGMLType.F16).view(np.uint16)
    np.testing.assert_array_equal(ours, x.astype(np.float16).view(np.uint16))


# ---- vec_dot ------------------------------------------------------------------

def min_term_rounding(type_id: GGMLType, w: np.ndarray, act: np.ndarray) -> np.ndarray | float:
    """Q4_1 / Q5_1 multiply each block's m by its q8_1 activation's s = half(d * sum(a)), from the
    unrounded d: within 2^-10 (relative) of the sum of the dequantized activations.

    w (N, row_bytes) or one row, act (M, act_bytes) or one row -> the bound, (M, N) or a float."""
    if type_id not in (GGMLType.Q4_1, GGMLType.Q5_1):
        return 0.0
    n_blocks = np.atleast_2d(act).shape[-1] // 36
    blocks = np.atleast_2d(w).reshape(-1, n_blocks, TYPE_TRAITS[layout(type_id)][2])
    m = np.abs(blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64))     # (N, blocks)
    a = np.atleast_2d(act).reshape(-1, n_blocks, 36)
    d_a = a[..., :2].copy().view(np.float16)[..., 0].astype(np.float64)
    sums = a[..., 4:].view(np.int8).astype(np.int64).sum(-1)
    bound = np.abs(d_a * sums) @ m.T * 2.0**-10 * 1.01                                     # (M, N)
    return float(bound[0, 0]) if np.ndim(w) == 1 and np.ndim(act) == 1 else bound


AVAILABLE_TIERS = kernels.TIERS[: kernels.TIERS.index(kernels.best_tier()) + 1]


@pytest.mark.parametrize("type_id", MATMUL_TYPES, ids=lambda t: t.name)
def test_vec_dot_tiers_agree_and_match_float_dot(type_id: GGMLType) -> None:
    rng = np.random.default_rng(100 + int(type_id))
    block_size = TYPE_TRAITS[layout(type_id)][1]
    unit = 32 if block_size == 1 else block_size
    for n_units in (1, 2, 7, 8, 9, 17):
        n = unit * n_units + (5 if block_size == 1 else 0)  # float rows of odd length reach the tail
        blocks = random_blocks(type_id, n // block_size, rng)
        if n_units == 9:  # the zero block last instead of first
            blocks = np.roll(blocks, -1, axis=0)
        w = kernel_rows(type_id, blocks.reshape(1, -1)).reshape(-1)
        x = rng.standard_normal(n).astype(np.float32)
        act = kernels.quantize_activations(x, type_id)
        ref = kernels.vec_dot(type_id, w, act, n, tier="generic")
        for tier in AVAILABLE_TIERS[1:]:
            got = kernels.vec_dot(type_id, w, act, n, tier=tier)
            assert np.float32(got).view(np.uint32) == np.float32(ref).view(np.uint32), (tier, n)
        wf = kernels.dequantize(w, type_id).astype(np.float64)
        act_type = kernels.activation_type(type_id)
        xf = x.astype(np.float64) if act_type == GGMLType.F32 else kernels.dequantize(act, act_type).astype(np.float64)
        exact = float(wf @ xf)
        bound = 1e-5 * float(np.abs(wf * xf).sum()) + min_term_rounding(type_id, w, act) + 1e-6
        assert abs(ref - exact) <= bound, (n, ref, exact)


def test_vec_dot_against_unquantized_activations_is_close() -> None:
    """The activation quantization error stays within the per-format bound of q8 rounding."""
    rng = np.random.default_rng(3)
    w_float = rng.standard_normal((1, 4096)).astype(np.float32)
    x = rng.standard_normal(4096).astype(np.float32)
    exact = float(w_float[0].astype(np.float64) @ x.astype(np.float64))
    scale = float(np.abs(w_float[0]).sum() * np.abs(x).max())
    for type_id, rel in ((GGMLType.Q8_0, 0.01), (GGMLType.Q4_0, 0.05), (GGMLType.F16, 1e-3), (GGMLType.BF16, 1e-2)):
        w = kernels.quantize(w_float, type_id)[0]
        got = kernels.vec_dot(type_id, w, kernels.quantize_activations(x, type_id), 4096)
        assert abs(got - exact) <= rel * scale / 10, (type_id.name, got, exact)


# ---- matmul -------------------------------------------------------------------

@pytest.mark.parametrize("type_id", MATMUL_TYPES, ids=lambda t: t.name)
def test_matmul_matches_reference_and_rows_are_invariant(type_id: GGMLType) -> None:
    rng = np.random.default_rng(200 + int(type_id))
    k = 512
    n = 67  # odd, and not a multiple of the 16-row tile
    w = kernel_rows(type_id, random_blocks(type_id, n * k // TYPE_TRAITS[layout(type_id)][1], rng).reshape(n, -1))
    wf = kernels.dequantize(w, type_id).astype(np.float64)
    for m in (1, 2, 7, 64):
        x = rng.standard_normal((m, k)).astype(np.float32)
        y = kernels.matmul(w, type_id, x, n_threads=2)
        act_type = kernels.activation_type(type_id)
        act = kernels.quantize_activations(x, type_id)
        xf = x.astype(np.float64) if act_type == GGMLType.F32 else kernels.dequantize(act, act_type)
        ref = xf.astype(np.float64) @ wf.T
        bound = 1e-5 * (np.abs(xf) @ np.abs(wf).T) + min_term_rounding(type_id, w, act) + 1e-6
        assert np.all(np.abs(y - ref) <= bound)
        for threads in (1, 3, 4):
            np.testing.assert_array_equal(bits(kernels.matmul(w, type_id, x, n_threads=threads)), bits(y))
        for r in range(m):
            np.testing.assert_array_equal(bits(kernels.matmul(w, type_id, x[r], n_threads=1 + r % 3)), bits(y[r]))


@pytest.mark.parametrize("n_blocks", [1, 7, 8, 9, 16, 28])
def test_grouped_q5_0_is_q5_0(n_blocks: int) -> None:
    """Q5_0 regrouped (the layout the model's Q5_0 matrices get): the same values, and matmul's same bits for
    lone rows, decode batches and prompts, with groups, plain blocks after them, or both."""
    rng = np.random.default_rng(n_blocks)
    w = random_blocks(GGMLType.Q5_0, 9 * n_blocks, rng).reshape(9, -1)
    grouped = kernels.group_q5_0(w)
    if n_blocks >= 8:
        assert not np.array_equal(grouped, w)
    np.testing.assert_array_equal(bits(kernels.dequantize(grouped, GGMLType.Q5_0_G8)),
                                  bits(kernels.dequantize(w, GGMLType.Q5_0)))
    for m in (1, 4, 9, 33):
        x = rng.standard_normal((m, 32 * n_blocks)).astype(np.float32)
        np.testing.assert_array_equal(bits(kernels.matmul(grouped, GGMLType.Q5_0_G8, x, n_threads=2)),
                                      bits(kernels.matmul(w, GGMLType.Q5_0, x, n_threads=2)))
    with pytest.raises(KernelError, match="whole blocks"):
        kernels.group_q5_0(w[:, :21])


@pytest.mark.parametrize("interleaved", list(INTERLEAVED_TYPES), ids=lambda t: t.name)
def test_interleaved_is_plain(interleaved: GGMLType) -> None:
    """A Q4_1 / Q8_0 / Q5_0 / Q4_K / Q6_K matrix interleaved 16 rows at a time (the layout the model's get where the CPU
    has the tile kernels): the same rows, and matmul's same bits for lone rows, decode batches of every size (tile
    passes of several rows and a short last one) and prompts, at one and two threads, on the best tier and on the
    generic one (each row rebuilt for vec_dot)."""
    plain_type = INTERLEAVED_TYPES[interleaved]
    rng = np.random.default_rng(int(interleaved))
    n, n_blocks = 48, (9 if TYPE_TRAITS[plain_type][1] == 32 else 3)
    n_in = TYPE_TRAITS[plain_type][1] * n_blocks
    w = random_blocks(plain_type, n * n_blocks, rng).reshape(n, -1)
    tiles = kernels.interleave(w, plain_type)
    assert tiles.shape == w.shape and tiles.ctypes.data % 64 == 0 and not np.array_equal(tiles, w)
    ids = np.array([47, 0, 16, 5, 5])
    np.testing.assert_array_equal(bits(kernels.WeightMatrix(tiles, interleaved, n_in).rows(ids)),
                                  bits(kernels.dequantize(w[ids], plain_type)))
    tier = kernels.active_tier()
    try:
        for use_tier in dict.fromkeys((tier, "generic")):
            kernels.set_tier(use_tier)
            for m in (1, 2, 3, 4, 5, 8, 17, 35):
                x = rng.standard_normal((m, n_in)).astype(np.float32)
                for threads in (1, 2):
                    np.testing.assert_array_equal(bits(kernels.matmul(tiles, interleaved, x, n_threads=threads)),
                                                  bits(kernels.matmul(w, plain_type, x, n_threads=threads)))
    finally:
        kernels.set_tier(tier)
    with pytest.raises(KernelError, match="16 k"):
        kernels.interleave(w[:40], plain_type)
    with pytest.raises(KernelError, match="unsupported type"):
        kernels.interleave(random_blocks(GGMLType.Q4_0, 16, rng).reshape(16, -1), GGMLType.Q4_0)
    with pytest.raises(KernelError, match="bad shape"):
        kernels.WeightMatrix(tiles, interleaved, n_in).rows(np.array([48]))


def test_interleaved_type_follows_the_tier() -> None:
    """Matrices are interleaved only where the active tier has their tile kernels: Q4_1, Q8_0 and Q5_0 on avx512_vnni,
    Q4_K from avx2 up and on neon_dotprod and neon_i8mm, Q6_K from avx2 up (neon_i8mm's prompts rebuild the tiles into
    rows for its panels)."""
    tier = kernels.active_tier()
    try:
        for use_tier in AVAILABLE_TIERS:
            kernels.set_tier(use_tier)
            want = use_tier == "avx512_vnni"
            assert (kernels.interleaved_type(GGMLType.Q4_1) == GGMLType.Q4_1_X16) == want
            assert (kernels.interleaved_type(GGMLType.Q8_0) == GGMLType.Q8_0_X16) == want
            assert (kernels.interleaved_type(GGMLType.Q5_0) == GGMLType.Q5_0_X16) == want
            want_k_tiles = use_tier in ("avx2", "avx512", "avx512_vnni", "neon_dotprod", "neon_i8mm")
            assert (kernels.interleaved_type(GGMLType.Q4_K) == GGMLType.Q4_K_X16) == want_k_tiles
            want_q6_K_tiles = use_tier in ("avx2", "avx512", "avx512_vnni")
            assert (kernels.interleaved_type(GGMLType.Q6_K) == GGMLType.Q6_K_X16) == want_q6_K_tiles
    finally:
        kernels.set_tier(tier)


def test_matmul_on_real_mmapped_weights(gemma_path) -> None:
    """A real Q4_K tensor, read in place from the mmap, against its dequantized float product."""
    with GGUFFile(gemma_path) as f:
        info = f.tensors["blk.0.attn_output.weight"]
        w = f.raw(info.name)
        x = np.random.default_rng(0).standard_normal((3, info.shape[0])).astype(np.float32)
        y = kernels.matmul(w, info.type, x)
        ref = x.astype(np.float64) @ kernels.dequantize(w, info.type).astype(np.float64).T
        assert y.shape == (3, info.shape[1])
        np.testing.assert_allclose(y, ref, rtol=0, atol=0.02 * np.abs(ref).max())


# ---- contracts ----------------------------------------------------------------

def test_type_tables_agree_with_the_reader() -> None:
    for type_id, (name, block_size, type_size) in TYPE_TRAITS.items():
        assert kernels.type_name(type_id) == name
        assert kernels.row_bytes(type_id, block_size) == type_size


@pytest.mark.parametrize("type_id", [16, 99, -1], ids=["IQ2_XXS", "unknown", "negative"])
def test_unsupported_types_raise(type_id: int) -> None:
    with pytest.raises(KernelError, match="not supported"):
        kernels.dequantize(np.zeros(66, np.uint8), type_id)
    with pytest.raises(KernelError):
        kernels.matmul(np.zeros((1, 66), np.uint8), type_id, np.zeros((1, 256), np.float32))


def test_bad_shapes_and_settings_raise() -> None:
    with pytest.raises(KernelError, match="whole blocks"):
        kernels.dequantize(np.zeros(17, np.uint8), GGMLType.Q4_0)
    with pytest.raises(KernelError, match="multiple of 32"):
        kernels.quantize(np.zeros(33, np.float32), GGMLType.Q8_0)
    with pytest.raises(KernelError, match="not supported"):  # a tiled layout: no row of its own to write
        kernels.quantize(np.zeros(256, np.float32), GGMLType.Q4_K_X16)
    w = np.zeros((4, 18), np.uint8)
    with pytest.raises(KernelError, match="bytes"):
        kernels.matmul(w, GGMLType.Q4_0, np.zeros((2, 64), np.float32))
    with pytest.raises(KernelError, match="n_threads"):
        kernels.matmul(w, GGMLType.Q4_0, np.zeros((2, 32), np.float32), n_threads=0)
    with pytest.raises(KernelError, match="bad thread count"):
        kernels.matmul(w, GGMLType.Q4_0, np.zeros((2, 32), np.float32), n_threads=100_000)
    with pytest.raises(KernelError, match="not a weight type"):
        kernels.matmul(np.zeros((1, 292), np.uint8), GGMLType.Q8_K, np.zeros((1, 256), np.float32))
    with pytest.raises(KernelError, match="unknown tier"):
        kernels.set_tier("sse9")


def test_tier_selection() -> None:
    best = kernels.best_tier()
    try:
        kernels.set_tier("generic")
        assert kernels.active_tier() == "generic"
    finally:
        kernels.set_tier(best)
    assert kernels.active_tier() == best
    higher = kernels.TIERS[kernels.TIERS.index(best) + 1:]
    for tier in higher:
        with pytest.raises(KernelError, match="not available"):
            kernels.set_tier(tier)


def test_gated_activations_match_ggml_rules() -> None:
    """silu(g)·u exactly as float32 math; gelu(g)·u as ggml's CPU backend evaluates it (llama.cpp's numbers):
    gelu_tanh at g rounded to half precision, the result rounded to half precision, asymptotes beyond ±10."""
    rng = np.random.default_rng(7)
    edges = [-10.5, -10.0, -9.99, 0.0, 9.99, 10.0, 12.0, -0.0]
    gate = np.concatenate([rng.normal(0, 3, 5000), edges]).astype(np.float32)
    up = rng.normal(0, 1, len(gate)).astype(np.float32)

    g16 = gate.astype(np.float16).astype(np.float32)  # float32 math, as the C code and ggml do
    inner = np.float32(np.sqrt(2 / np.pi)) * g16 * (np.float32(1) + np.float32(0.044715) * g16 * g16)
    gelu = np.float32(0.5) * g16 * (np.float32(1) + np.tanh(inner))
    act = np.where(gate <= -10, 0.0, np.where(gate >= 10, gate, gelu.astype(np.float16).astype(np.float32)))
    want = act.astype(np.float32) * up
    got = kernels.gated_activation(gate, up, "gelu")
    # numpy's tanh and the C library's may differ by an ulp (magnified where 1 + tanh cancels), which can
    # move a result by one half-precision step; the rest is exact
    slack = np.abs(np.spacing(act.astype(np.float16)).astype(np.float32) * up) + np.abs(g16 * up) * 2.4e-7
    assert np.all(np.abs(got - want) <= slack)
    assert np.mean(got == want) > 0.95

    silu = gate.astype(np.float64) / (1 + np.exp(-gate.astype(np.float64))) * up
    np.testing.assert_allclose(kernels.gated_activation(gate, up, "silu"), silu, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("d", "window", "softcap"), [(64, 0, 0.0), (20, 5, 0.0), (256, 0, 30.0)])
def test_attention_matches_float_reference_and_tiers_agree(d: int, window: int, softcap: float) -> None:
    """Causal GQA attention over a half-precision cache (with empty slots, a sliding window, a softcap)
    against float64 math on the same half-precision keys and values, with the query and the softmax
    weights rounded to half precision as llama.cpp does; every tier gives the same bits."""
    rng = np.random.default_rng(d)
    m, n_kv, n_head, n_head_kv = 5, 23, 6, 2
    q = rng.standard_normal((m, n_head, d)).astype(np.float32)
    k = rng.standard_normal((n_kv, n_head_kv, d)).astype(np.float16)
    v = rng.standard_normal((n_kv, n_head_kv, d)).astype(np.float16)
    k_pos = np.arange(n_kv, dtype=np.int32)
    k_pos[[3, 11]] = -1                                  # empty slots
    q_pos = np.array([0, 4, 12, 21, 22], np.int32)
    scale = 1 / np.sqrt(d)

    want = np.zeros((m, n_head, d))
    for r in range(m):
        visible = (k_pos >= 0) & (k_pos <= q_pos[r]) & ((window == 0) | (q_pos[r] - k_pos < window))
        for h in range(n_head):
            hk = h // (n_head // n_head_kv)
            s = k[visible, hk].astype(np.float64) @ q[r, h].astype(np.float16).astype(np.float64) * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            weights = (p / p.sum()).astype(np.float16).astype(np.float64)
            want[r, h] = weights @ v[visible, hk].astype(np.float64)

    saved = kernels.active_tier()
    results = {}
    try:
        for tier in kernels.TIERS[:kernels.TIERS.index(kernels.best_tier()) + 1]:
            kernels.set_tier(tier)
            results[tier] = kernels.attention(q, k, v, q_pos, k_pos, scale, window, softcap, n_threads=2)
    finally:
        kernels.set_tier(saved)
    generic = results["generic"]
    np.testing.assert_allclose(generic, want, rtol=1e-4, atol=1e-5)
    for tier, got in results.items():
        np.testing.assert_array_equal(bits(got), bits(generic), err_msg=f"tier {tier}")


@pytest.mark.parametrize("shape", [(16, 100), (16, 210), (1536, 7350), (4096, 512)])
def test_aligned_empty_is_aligned_writable_and_its_own(shape: tuple[int, int]) -> None:
    """Repacked matrices' buffers: the shape asked for, writable, on a 64-byte line (a 2 MB page from 2 MB up, where
    huge pages may back them), and two of them never share bytes."""
    a, b = kernels.aligned_empty(shape), kernels.aligned_empty(shape)
    assert a.shape == shape and a.dtype == np.uint8 and a.flags.writeable
    assert a.ctypes.data % 64 == 0 and b.ctypes.data % 64 == 0
    if a.size >= 2 << 20:
        assert a.ctypes.data % (2 << 20) == 0
    a[:] = 1
    b[:] = 2
    assert int(a.sum()) == a.size and int(b.sum()) == 2 * b.size
