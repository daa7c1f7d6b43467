"""The sampler chain: each stage against hand-computed cases and a plain reference implementation."""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter, deque

import numpy as np
import pytest

from pyllm.sampling import Sampler, SamplingError, SamplingParams, log_softmax, logprobs

# No truncation and no penalties: process() shows every token.
OPEN = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0}


def _logits(probs: list[float]) -> np.ndarray:
    return np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)


def _kept(sampler: Sampler, logits: np.ndarray, history: list[int] | tuple[int, ...] = ()) -> set[int]:
    return {int(i) for i in np.flatnonzero(np.isfinite(sampler.process(logits, history)))}


def _draws(sampler: Sampler, logits: np.ndarray, n: int, history: tuple[int, ...] = ()) -> Counter[int]:
    return Counter(sampler.sample(logits, history) for _ in range(n))


def _reference(logits: np.ndarray, history: list[int], p: SamplingParams) -> np.ndarray:
    """llama.cpp's chain written the obvious way: full sorts, Python loops, float32 logits."""
    x = np.array(logits, dtype=np.float32)
    n = x.shape[0]
    for tok, bias in (p.logit_bias or {}).items():
        x[tok] += np.float32(bias)
    if p.has_penalties:
        window = history if p.penalty_last_n < 0 else history[-p.penalty_last_n :]
        rp = np.float32(p.repeat_penalty)
        for tok, count in Counter(window).items():
            v = x[tok] * rp if x[tok] <= 0 else x[tok] / rp
            x[tok] = v - (np.float32(count) * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty))
    cand = sorted((i for i in range(n) if x[i] > -np.inf), key=lambda i: (-x[i], i))
    if 0 < p.top_k < n:
        cand = cand[: p.top_k]

    def probs(ids: list[int]) -> np.ndarray:
        z = x[ids].astype(np.float64)
        e = np.exp(z - z.max())
        return e / e.sum()

    if p.typical_p < 1.0 and len(cand) > 1:
        pr = probs(cand)
        ent = -sum(q * math.log(q) for q in pr if q > 0)
        shifted = [abs(-math.log(q) - ent) if q > 0 else math.inf for q in pr]
        order = sorted(range(len(cand)), key=lambda j: shifted[j])
        cum, last = 0.0, len(order)
        for i, j in enumerate(order):
            cum += pr[j]
            if cum > float(np.float32(p.typical_p)):
                last = i + 1
                break
        cand = sorted((cand[j] for j in order[:last]), key=lambda i: (-x[i], i))
    if p.top_p < 1.0 and len(cand) > 1:
        pr = probs(cand)
        cum, last = 0.0, len(cand)
        for i, q in enumerate(pr):
            cum += q
            if cum >= float(np.float32(p.top_p)):
                last = i + 1
                break
        cand = cand[:last]
    if p.min_p > 0.0 and len(cand) > 1:
        threshold = np.float32(max(x[cand])) + np.float32(math.log(np.float32(p.min_p)))
        cand = [i for i in cand if x[i] >= threshold]
    out = np.full(n, -np.inf, dtype=np.float32)
    out[cand] = x[cand]
    return out


# -- reproducibility ---------------------------------------------------------------------


def _run(seed: int | None, steps: int = 60, n_vocab: int = 500) -> list[int]:
    data = np.random.default_rng(123)
    sampler = Sampler(SamplingParams(seed=seed, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))
    out: list[int] = []
    for _ in range(steps):
        logits = data.standard_normal(n_vocab).astype(np.float32)
        out.append(sampler.sample(logits, out))
    return out


def test_same_seed_same_tokens() -> None:
    assert _run(7) == _run(7)


def test_different_seeds_differ() -> None:
    assert _run(7) != _run(8)


def test_unseeded_sampler_draws_valid_tokens() -> None:
    tokens = _run(None, steps=10)
    assert len(tokens) == 10 and all(0 <= t < 500 for t in tokens)


def test_reseed_restarts_the_stream() -> None:
    logits = np.zeros(1000, dtype=np.float32)
    sampler = Sampler(SamplingParams(seed=5, **OPEN))
    first = [sampler.sample(logits) for _ in range(20)]
    sampler.reseed(5)
    assert [sampler.sample(logits) for _ in range(20)] == first


# -- greedy ------------------------------------------------------------------------------


def test_greedy_is_argmax() -> None:
    data = np.random.default_rng(0)
    sampler = Sampler(SamplingParams(temperature=0.0, top_k=1, top_p=0.1))
    for _ in range(20):
        logits = data.standard_normal(3000).astype(np.float32)
        assert sampler.sample(logits) == int(np.argmax(logits))


def test_greedy_ties_go_to_lowest_id() -> None:
    logits = np.array([0.0, 3.0, 1.0, 3.0, 3.0], dtype=np.float32)
    assert Sampler(SamplingParams(temperature=0.0)).sample(logits) == 1


def test_greedy_applies_bias_and_penalties() -> None:
    logits = np.array([1.0, 5.0, 4.0, 0.0], dtype=np.float32)
    assert Sampler(SamplingParams(temperature=0, logit_bias={1: -2.0})).sample(logits) == 2
    assert Sampler(SamplingParams(temperature=0, repeat_penalty=2.0)).sample(logits, [1]) == 2
    assert Sampler(SamplingParams(temperature=0, presence_penalty=3.0)).sample(logits, [1, 2]) == 1


def test_greedy_fast_path_matches_the_reference_chain() -> None:
    """Greedy without penalties runs in one C call (pyllm_argmax); it picks what the numpy chain picks (the
    argmax of `process`, the biased logits) and raises what it raises, on rows with ties, biases (-inf too),
    infinities and NaN, whatever the vocabulary size, and leaves the logits alone."""
    data = np.random.default_rng(5)
    for trial in range(300):
        n = int(data.integers(1, 70)) if trial % 3 else int(data.integers(1000, 50000))
        logits = (data.integers(-3, 3, n) if trial % 4 == 0 else data.standard_normal(n)).astype(np.float32)
        kind = trial % 7
        if kind == 1:
            logits[data.integers(0, n)] = np.inf
        elif kind == 2:
            logits[data.integers(0, n)] = np.nan
        elif kind == 3:
            logits[:] = -np.inf
        ids = data.choice(n, size=min(n, 3), replace=False)
        values = data.choice([-np.inf, -2.0, 0.5, 3.0], size=len(ids))
        bias = {int(i): float(v) for i, v in zip(ids, values, strict=True)}
        sampler = Sampler(SamplingParams(temperature=0, logit_bias=bias if trial % 2 else None))
        before = logits.copy()
        try:
            want: int | str = int(np.argmax(sampler.process(logits)))
        except SamplingError as exc:
            want = str(exc)
        try:
            got: int | str = sampler.sample(logits)
        except SamplingError as exc:
            got = str(exc)
        assert got == want, (trial, n, kind)
        np.testing.assert_array_equal(logits, before)


# -- truncation stages -------------------------------------------------------------------


def test_top_k_only_draws_the_k_best() -> None:
    data = np.random.default_rng(1)
    logits = data.standard_normal(1000).astype(np.float32)
    best = set(np.argsort(-logits)[:5].tolist())
    sampler = Sampler(SamplingParams(seed=3, temperature=3.0, top_k=5, top_p=1.0, min_p=0.0))
    assert _kept(sampler, logits) == best
    drawn = _draws(sampler, logits, 2000)
    assert set(drawn) == best  # every one of the k best, and nothing else


def test_top_k_zero_and_oversized_mean_whole_vocabulary() -> None:
    logits = np.arange(10, dtype=np.float32)
    for k in (0, 10, 50):
        assert len(_kept(Sampler(SamplingParams(top_k=k, top_p=1.0, min_p=0.0)), logits)) == 10


def test_top_k_boundary_ties_keep_lowest_ids() -> None:
    logits = np.array([1.0, 2.0, 2.0, 0.0, 2.0, 2.0], dtype=np.float32)
    assert _kept(Sampler(SamplingParams(top_k=3, top_p=1.0, min_p=0.0)), logits) == {1, 2, 4}


def test_top_p_hand_computed() -> None:
    logits = _logits([0.03, 0.5, 0.07, 0.25, 0.15])  # sorted: 1 (.5), 3 (.25), 4 (.15), 2 (.07), 0 (.03)

    def kept(top_p: float) -> set[int]:
        return _kept(Sampler(SamplingParams(top_k=0, top_p=top_p, min_p=0.0)), logits)

    assert kept(0.4) == {1}  # 0.5 >= 0.4
    assert kept(0.7) == {1, 3}  # 0.75 >= 0.7
    assert kept(0.8) == {1, 3, 4}  # 0.75 < 0.8 <= 0.90
    assert kept(0.95) == {1, 3, 4, 2}  # 0.97
    assert kept(0.99) == {0, 1, 2, 3, 4}
    assert kept(0.0) == {1}  # always at least one token
    sampler = Sampler(SamplingParams(seed=11, temperature=1.0, top_k=0, top_p=0.8, min_p=0.0))
    drawn = _draws(sampler, logits, 2000)
    assert set(drawn) == {1, 3, 4}
    # renormalised over the kept set: .5/.9, .25/.9, .15/.9
    for tok, expected in ((1, 0.5 / 0.9), (3, 0.25 / 0.9), (4, 0.15 / 0.9)):
        assert abs(drawn[tok] / 2000 - expected) < 0.035


def test_top_p_sees_probabilities_after_top_k() -> None:
    # After top-k=2 the two survivors have probabilities 2/3 and 1/3 (before: .4 and .2).
    logits = _logits([0.4, 0.2, 0.2, 0.2])
    sampler = Sampler(SamplingParams(top_k=2, top_p=0.6, min_p=0.0))
    assert _kept(sampler, logits) == {0}


def test_min_p_hand_computed() -> None:
    logits = _logits([0.03, 0.5, 0.07, 0.25, 0.15])

    def kept(min_p: float) -> set[int]:
        return _kept(Sampler(SamplingParams(top_k=0, top_p=1.0, min_p=min_p)), logits)

    assert kept(0.25) == {1, 3, 4}  # p >= 0.125
    assert kept(0.4) == {1, 3}  # p >= 0.2
    assert kept(0.9) == {1}
    assert kept(1.0) == {1}
    assert kept(0.05) == {0, 1, 2, 3, 4}  # p >= 0.025
    sampler = Sampler(SamplingParams(seed=2, temperature=5.0, top_k=0, top_p=1.0, min_p=0.4))
    assert set(_draws(sampler, logits, 500)) == {1, 3}


def test_typical_hand_computed() -> None:
    # p = .5 .25 .15 .07 .03: entropy H = 1.2691; |-log p - H| = .576, .117, .628, 1.390, 2.238
    # ranking: token 3 (.25), 1 (.5), 4 (.15), 2 (.07), 0 (.03); cumulative .25, .75, .90, .97, 1
    logits = _logits([0.03, 0.5, 0.07, 0.25, 0.15])

    def kept(typical_p: float) -> set[int]:
        return _kept(Sampler(SamplingParams(top_k=0, top_p=1.0, min_p=0.0, typical_p=typical_p)), logits)

    assert kept(0.0) == {3}
    assert kept(0.2) == {3}  # the most typical token is not the most likely one
    assert kept(0.5) == {1, 3}
    assert kept(0.8) == {1, 3, 4}
    assert kept(0.95) == {1, 2, 3, 4}
    assert kept(1.0) == {0, 1, 2, 3, 4}


@pytest.mark.parametrize("case", range(40))
def test_chain_matches_reference(case: int) -> None:
    data = np.random.default_rng(1000 + case)
    n = int(data.integers(2, 300))
    # coarse values so that ties happen
    logits = (np.round(data.standard_normal(n) * 4) / 2).astype(np.float32)
    if case % 5 == 0:
        logits[data.integers(0, n, 3)] = -np.inf
    history = data.integers(0, n, int(data.integers(0, 150))).tolist()
    params = SamplingParams(
        top_k=int(data.choice([0, 1, 3, 40, n + 5])),
        top_p=float(data.choice([1.0, 0.95, 0.5, 0.1])),
        min_p=float(data.choice([0.0, 0.05, 0.3])),
        typical_p=float(data.choice([1.0, 1.0, 0.9, 0.4])),
        repeat_penalty=float(data.choice([1.0, 1.3, 0.8])),
        frequency_penalty=float(data.choice([0.0, 0.2, -0.1])),
        presence_penalty=float(data.choice([0.0, 0.5])),
        penalty_last_n=int(data.choice([-1, 0, 8, 64])),
        logit_bias={int(data.integers(0, n)): float(data.choice([-math.inf, 2.0, -1.5]))},
        seed=case,
    )
    sampler = Sampler(params)
    expected = _reference(logits, history, params)
    if not np.isfinite(expected).any():
        with pytest.raises(SamplingError):
            sampler.process(logits, history)
        return
    got = sampler.process(logits, history)
    assert np.array_equal(got, expected)
    allowed = set(np.flatnonzero(np.isfinite(expected)).tolist())
    for _ in range(20):
        assert sampler.sample(logits, history) in allowed


def test_large_vocabulary_top_k_zero_matches_reference_order() -> None:
    # top_k=0 over a big vocabulary goes through the partial-sort path of top-p and typical.
    data = np.random.default_rng(5)
    logits = (data.standard_normal(20000) * 2).astype(np.float32)
    for extra in ({"top_p": 0.9}, {"top_p": 0.3, "typical_p": 0.6}, {"top_p": 0.999, "min_p": 0.01}):
        params = SamplingParams(**{**OPEN, **extra})
        assert np.array_equal(Sampler(params).process(logits, []), _reference(logits, [], params))


# -- penalties ---------------------------------------------------------------------------


def test_penalties_change_exactly_the_window_tokens() -> None:
    logits = np.array([2.0, -1.0, 0.5, 3.0, -2.0, 0.0, 1.0, 4.0], dtype=np.float32)
    # window of 6: tokens 3 (x2), 1 (x1), 5 (x1), 6 (x2); tokens 0 and 7 are older than the window
    history = [0, 7, 7, 3, 1, 6, 3, 5, 6]
    params = SamplingParams(repeat_penalty=2.0, frequency_penalty=0.25, presence_penalty=0.5, penalty_last_n=6, **OPEN)
    got = Sampler(params).process(logits, history)
    expected = logits.copy()
    expected[3] = 3.0 / 2.0 - 2 * 0.25 - 0.5
    expected[1] = -1.0 * 2.0 - 1 * 0.25 - 0.5
    expected[5] = 0.0 - 1 * 0.25 - 0.5
    expected[6] = 1.0 / 2.0 - 2 * 0.25 - 0.5
    np.testing.assert_array_equal(got, expected)


def test_penalty_window_sizes() -> None:
    logits = np.ones(4, dtype=np.float32)
    history = [0, 1, 2]
    for last_n, changed in ((0, set()), (1, {2}), (2, {1, 2}), (-1, {0, 1, 2}), (100, {0, 1, 2})):
        got = Sampler(SamplingParams(presence_penalty=1.0, penalty_last_n=last_n, **OPEN)).process(logits, history)
        assert set(np.flatnonzero(got != 1.0).tolist()) == changed


def test_penalties_accept_any_history_sequence() -> None:
    logits = np.ones(6, dtype=np.float32)
    sampler = Sampler(SamplingParams(presence_penalty=1.0, **OPEN))
    want = sampler.process(logits, [1, 4, 4])
    for history in ((1, 4, 4), np.array([1, 4, 4]), deque([1, 4, 4]), range(1, 5, 3)):
        np.testing.assert_array_equal(sampler.process(logits, history), want)


def test_default_repeat_penalty_is_off() -> None:
    logits = np.array([1.0, 2.0, -1.0], dtype=np.float32)
    np.testing.assert_array_equal(Sampler(SamplingParams(**OPEN)).process(logits, [0, 1, 2, 2]), logits)


# -- bias and temperature ----------------------------------------------------------------


def test_logit_bias_minus_inf_bans_a_token() -> None:
    logits = np.array([0.0, 5.0, 4.9, 1.0], dtype=np.float32)
    assert Sampler(SamplingParams(temperature=0, logit_bias={1: -math.inf})).sample(logits) == 2
    sampler = Sampler(SamplingParams(seed=4, temperature=2.0, logit_bias={1: -math.inf}, **OPEN))
    assert 1 not in _draws(sampler, logits, 1000)
    assert sampler.process(logits, [])[1] == -np.inf


def test_logit_bias_adds_and_accepts_string_keys() -> None:
    logits = np.zeros(4, dtype=np.float32)
    got = Sampler(SamplingParams(logit_bias={"2": 1.5, 0: -0.5}, **OPEN)).process(logits, [])
    np.testing.assert_array_equal(got, [-0.5, 0.0, 1.5, 0.0])


def test_temperature_sharpens_and_flattens() -> None:
    logits = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    n = 3000
    share: dict[float, float] = {}
    for temp in (0.5, 1.0, 2.0):
        sampler = Sampler(SamplingParams(seed=9, temperature=temp, **OPEN))
        drawn = _draws(sampler, logits, n)
        expected = np.exp(logits / temp) / np.exp(logits / temp).sum()
        for tok in range(4):
            assert abs(drawn[tok] / n - expected[tok]) < 0.03
        share[temp] = drawn[0] / n
    assert share[0.5] > share[1.0] > share[2.0]


def test_tiny_temperature_behaves_like_greedy() -> None:
    logits = np.array([1.0, 1.5, 1.4999, -3.0], dtype=np.float32)
    sampler = Sampler(SamplingParams(seed=0, temperature=1e-30, **OPEN))
    assert set(_draws(sampler, logits, 50)) == {1}


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", "hot"),
        ("top_k", -1),
        ("top_k", 2.5),
        ("top_k", True),
        ("top_p", -0.01),
        ("top_p", 1.01),
        ("min_p", -0.5),
        ("min_p", 2.0),
        ("typical_p", 1.5),
        ("typical_p", -1.0),
        ("repeat_penalty", 0.0),
        ("repeat_penalty", -1.0),
        ("frequency_penalty", math.nan),
        ("presence_penalty", math.inf),
        ("penalty_last_n", -2),
        ("penalty_last_n", 1.5),
        ("logit_bias", [1, 2]),
        ("logit_bias", {-1: 1.0}),
        ("logit_bias", {"x": 1.0}),
        ("logit_bias", {3: math.inf}),
        ("logit_bias", {3: math.nan}),
        ("logit_bias", {3: "big"}),
        ("seed", -1),
        ("seed", 1.5),
    ],
)
def test_bad_params_raise_naming_the_parameter(name: str, value: object) -> None:
    with pytest.raises(SamplingError, match=name) as info:
        SamplingParams(**{name: value})  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


def test_defaults_match_llama_cpp_python() -> None:
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.typical_p) == (0.8, 40, 0.95, 0.05, 1.0)
    assert (p.repeat_penalty, p.frequency_penalty, p.presence_penalty, p.penalty_last_n) == (1.0, 0.0, 0.0, 64)
    assert p.logit_bias is None and p.seed is None


def test_replace_revalidates() -> None:
    with pytest.raises(SamplingError, match="top_p"):
        dataclasses.replace(SamplingParams(), top_p=3.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingParams().top_k = 3  # type: ignore[misc]


def test_bad_logits_and_history() -> None:
    sampler = Sampler(SamplingParams(seed=0, repeat_penalty=1.1))
    with pytest.raises(SamplingError, match="1-D"):
        sampler.sample(np.zeros((2, 3), dtype=np.float32), [])
    with pytest.raises(SamplingError, match="1-D"):
        sampler.sample(np.zeros(0, dtype=np.float32), [])
    with pytest.raises(SamplingError, match="NaN"):
        sampler.sample(np.array([0.0, np.nan], dtype=np.float32), [])
    with pytest.raises(SamplingError, match="floating"):
        sampler.sample(np.array([1, 2, 3]), [])
    with pytest.raises(SamplingError, match="outside the vocabulary"):
        sampler.sample(np.zeros(4, dtype=np.float32), [1, 9])
    with pytest.raises(SamplingError, match="-inf"):
        Sampler(SamplingParams(logit_bias={0: -math.inf, 1: -math.inf})).sample(np.zeros(2, np.float32), [])
    with pytest.raises(SamplingError, match="logit_bias token 7"):
        Sampler(SamplingParams(logit_bias={7: 1.0})).sample(np.zeros(4, np.float32), [])


def test_float64_and_float16_logits_accepted() -> None:
    logits = np.array([0.0, 3.0, 1.0])
    for dtype in (np.float64, np.float16):
        assert Sampler(SamplingParams(temperature=0)).sample(logits.astype(dtype), []) == 1


# -- logprobs ----------------------------------------------------------------------------


def test_logprobs_match_log_softmax_of_raw_logits() -> None:
    data = np.random.default_rng(3)
    logits = data.standard_normal(5000).astype(np.float32)
    ref = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    lp, top = logprobs(logits, 17, 5)
    assert lp == pytest.approx(ref[17], abs=1e-4)
    assert list(top) == np.argsort(-ref)[:5].tolist()
    for tok, value in top.items():
        assert value == pytest.approx(ref[tok], abs=1e-4)
    np.testing.assert_allclose(log_softmax(logits), ref, atol=1e-4)
    assert Sampler.logprobs(logits, 17, 0) == (lp, {})


def test_logprobs_ties_and_bounds() -> None:
    logits = np.array([1.0, 2.0, 2.0, 0.0], dtype=np.float32)
    lp, top = logprobs(logits, 3, 10)
    assert list(top) == [1, 2, 0, 3]
    assert lp == pytest.approx(top[3])
    assert sum(math.exp(v) for v in top.values()) == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(SamplingError, match="token"):
        logprobs(logits, 4, 1)
    with pytest.raises(SamplingError, match="top_n"):
        logprobs(logits, 0, -1)
    with pytest.raises(SamplingError, match="NaN"):
        logprobs(np.array([0.0, np.nan], dtype=np.float32), 0, 1)


# -- speed -------------------------------------------------------------------------------


def test_fast_on_a_262144_token_vocabulary() -> None:
    data = np.random.default_rng(0)
    logits = (data.standard_normal(262144) * 3).astype(np.float32)
    history = data.integers(0, 262144, 200).tolist()
    sampler = Sampler(SamplingParams(seed=0, repeat_penalty=1.1, presence_penalty=0.1))
    sampler.sample(logits, history)
    start = time.perf_counter()
    for _ in range(20):
        sampler.sample(logits, history)
    per_call = (time.perf_counter() - start) / 20
    assert per_call < 0.05, f"{per_call * 1e3:.1f} ms per sample"


def _rows_for_top_k() -> list[np.ndarray]:
    """Rows below and above the size where csrc/topk.c first finds a floor from slice maxima, with ties,
    -inf entries, and the orders that stress a heap (ascending, descending, all equal)."""
    rng = np.random.default_rng(7)
    rows = []
    for n in (5, 97, 4095, 4096, 49152):
        x = rng.standard_normal(n).astype(np.float32)
        ties = np.round(x * 2).astype(np.float32)
        banned = x.copy()
        banned[rng.choice(n, n // 3, replace=False)] = -np.inf
        rows += [x, np.sort(x), np.sort(x)[::-1].copy(), ties, banned, np.zeros(n, np.float32)]
    return rows


def test_top_k_in_c_equals_the_numpy_reference() -> None:
    from pyllm.sampling import _smallest, _top_k_ids

    checked = 0
    for x in _rows_for_top_k():
        for k in (1, 2, 3, 40, 255, 256):
            if k > x.shape[0]:
                continue
            want = _smallest(-x, k)
            got = _top_k_ids(x, k)
            assert np.array_equal(got, want), (x.shape[0], k)
            checked += 1
    assert checked == 150


def test_top_k_in_c_rejects_bad_shapes() -> None:
    from pyllm._pyllm_c import ffi, lib

    x = np.ones(8, np.float32)
    ids = np.empty(9, np.int32)
    for n, k in ((8, 0), (8, 9), (0, 1), (-1, 1)):
        status = lib.pyllm_top_k(ffi.from_buffer("float[]", x), n, k, ffi.from_buffer("int32_t[]", ids))
        assert status == lib.PYLLM_ERR_SHAPE, (n, k)
