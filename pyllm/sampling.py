"""Token sampling: llama.cpp's default sampler chain over a logits vector.

`Sampler.sample` turns one row of logits into a token id by applying, in order, the
stages llama-cpp-python builds for ``create_completion``::

    logit bias -> penalties -> top-k -> typical -> top-p -> min-p -> temperature -> draw

with llama.cpp's definitions of each stage:

* **logit bias**: ``logit[t] += bias[t]``; a bias of ``-inf`` bans a token.
* **penalties**: over the *distinct* tokens of the last ``penalty_last_n`` history
  tokens (``-1`` = the whole history, ``0`` = off), with ``count`` the number of times a
  token occurs there: a logit ``<= 0`` is multiplied by ``repeat_penalty``, a positive one
  divided by it; then ``count * frequency_penalty + presence_penalty`` is subtracted.
* **top-k**: keep the ``top_k`` highest logits (``0`` = the whole vocabulary).
* **typical** (locally typical sampling, off at ``typical_p = 1``): rank tokens by
  ``|-log p - H|`` (H the entropy) and keep the shortest prefix of that ranking whose
  probability mass exceeds ``typical_p``.
* **top-p**: keep the smallest set of most likely tokens whose cumulative probability is
  ``>= top_p`` (always at least one token; off at ``top_p = 1``).
* **min-p**: keep the tokens with ``p >= min_p * p_max`` (in logit space:
  ``logit >= max_logit + log(min_p)``; off at ``min_p = 0``).
* **temperature**: divide the logits by ``temperature``, softmax, draw one token.

With a grammar (a `GrammarMatcher` passed to `sample`), the tokens it does not allow next get ``-inf``
first, after bias and penalties and before every other stage: the chain then runs over the allowed
tokens only. End-of-generation tokens are allowed only where the grammar can end.

The probabilities of each stage are those of the tokens still in the running, computed
from the (biased, penalised) logits *before* temperature, as llama.cpp does.
``temperature == 0`` is greedy decoding: the argmax of the biased, penalised logits, with
ties going to the lowest token id; no truncation stage and no random draw is involved.

Ties between equal logits are always broken towards the lower token id, so a run is a
pure function of (params, seed, logits sequence, history): the same seed gives the same
tokens. The random stream is numpy's PCG64 (`numpy.random.default_rng`), not llama.cpp's
``std::mt19937``, so seeded draws do not reproduce llama.cpp's token for token.

Nothing is fully sorted: top-k is one pass of the C core's heap (csrc/topk.c; a numpy
partition for ``top_k > 256``), and top-p / typical sort only a growing head of the
ranking until it holds the probability mass they need. With the default ``top_k=40`` a
call costs about 0.3 ms over a 49152-entry vocabulary; with ``top_k=0`` top-p costs more
in proportion to how many tokens it has to keep.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import params as check
from ._pyllm_c import ffi, lib
from .params import ParamError

__all__ = [
    "Sampler",
    "SamplingError",
    "SamplingParams",
    "log_softmax",
    "logprobs",
]

# llama-cpp-python passes min_keep = max(1, n_probs) with n_probs = 0 to every truncation stage.
_MIN_KEEP = 1


class SamplingError(ParamError):
    """A bad sampling parameter, or logits/history the sampler cannot use."""


class SamplingTypeError(SamplingError, TypeError):
    """A sampling parameter of the wrong type."""


def _as_sampling_error(exc: ParamError) -> SamplingError:
    kind = SamplingTypeError if isinstance(exc, TypeError) else SamplingError
    return kind(str(exc), exc.param)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings, with llama-cpp-python's ``create_completion`` names and defaults.

    Values are validated (and numbers normalised to float/int) on construction; a bad
    value raises `SamplingError` naming the parameter. Use `dataclasses.replace` to derive
    changed settings, which validates again.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    logit_bias: dict[int, float] | None = field(default=None)
    seed: int | None = None
    grammar: Any = None  # a compiled pyllm.grammar.Grammar (GBNF text and LlamaGrammar are compiled on construction)

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        try:
            put("temperature", check.number("temperature", self.temperature, minimum=0.0))
            put("top_k", check.integer("top_k", self.top_k, minimum=0))
            put("top_p", check.number("top_p", self.top_p, minimum=0.0, maximum=1.0))
            put("min_p", check.number("min_p", self.min_p, minimum=0.0, maximum=1.0))
            put("typical_p", check.number("typical_p", self.typical_p, minimum=0.0, maximum=1.0))
            put("repeat_penalty", check.number("repeat_penalty", self.repeat_penalty, minimum=0.0, above=True))
            put("frequency_penalty", check.number("frequency_penalty", self.frequency_penalty))
            put("presence_penalty", check.number("presence_penalty", self.presence_penalty))
            put("penalty_last_n", check.integer("penalty_last_n", self.penalty_last_n, minimum=-1))
            put("logit_bias", check.logit_bias(self.logit_bias))
            put("seed", check.integer("seed", self.seed, minimum=0, optional=True))
            put("grammar", check.grammar(self.grammar))
        except ParamError as exc:  # one exception type for every sampling setting, still naming it
            raise _as_sampling_error(exc) from None

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax (temperature 0)."""
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.penalty_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
        )


def _smallest(key: np.ndarray, m: int) -> np.ndarray:
    """Positions of the m smallest entries of `key`, ordered by key then position (a stable partial argsort)."""
    size = key.shape[0]
    if m >= size:
        return np.argsort(key, kind="stable")
    threshold = np.partition(key, m - 1)[m - 1]  # the m-th smallest value
    below = np.flatnonzero(key < threshold)
    ties = np.flatnonzero(key == threshold)[: m - below.shape[0]]  # lowest positions first
    sel = np.concatenate((below, ties))
    return sel[np.lexsort((sel, key[sel]))]


def _check_top(top: float) -> None:
    """The largest (biased, penalised) logit must be a number a token can be drawn at."""
    if np.isnan(top):
        raise SamplingError("logits contain NaN")
    if top == np.inf:
        raise SamplingError("logits contain +inf")
    if top == -np.inf:
        raise SamplingError("no token can be sampled: every logit is -inf (all banned)")


def _is_float32_row(a: object) -> bool:
    return (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 1 and a.shape[0] > 0
            and a.flags.c_contiguous)


def _top_k_ids(x: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest entries of x (float32 or float64, no NaN), ordered by value descending then id
    ascending: the C core's one-pass heap (csrc/topk.c) for float32 rows and k <= 256, ``_smallest(-x, k)``
    otherwise (the reference the C one is tested against: a partition and copies, 2-4x slower at k = 40 on a
    49k vocabulary, quicker from k ~ 500 on)."""
    if x.dtype != np.float32 or not 0 < k <= min(256, x.shape[0]):  # a larger k: the partition is quicker
        return _smallest(-x, k)
    x = np.ascontiguousarray(x)
    ids = np.empty(k, dtype=np.int32)
    lib.pyllm_top_k(ffi.from_buffer("float[]", x), x.shape[0], k, ffi.from_buffer("int32_t[]", ids))
    return ids.astype(np.intp)


def _mass_prefix(key: np.ndarray, probs: np.ndarray, p: float, *, strict: bool) -> np.ndarray:
    """The shortest prefix of the (key ascending, position ascending) order whose mass reaches `p`.

    "Reaches" is ``cumsum >= p``, or ``cumsum > p`` when `strict`; the whole order if it
    never does. Only a growing head of the order is ever sorted, so a prefix that holds
    most of the probability mass in a few tokens costs linear time, not a full sort.
    """
    size = key.shape[0]
    m = min(size, 1024)
    while True:
        order = _smallest(key, m)
        cum = np.cumsum(probs[order])
        if strict:
            over = np.flatnonzero(cum > p)
            pos = int(over[0]) if over.size else m
        else:
            pos = int(np.searchsorted(cum, p, side="left"))
        if pos < m:
            return order[: max(pos + 1, _MIN_KEEP)]
        if m == size:
            return order
        m = min(size, m * 8)


# exp(x) for x below this is < 1e-304 and is taken as 0: numpy's exp is many times slower
# when it has to produce subnormal numbers, and such weights cannot change any result.
_EXP_FLOOR = -700.0


def _exp_shifted(z: np.ndarray) -> np.ndarray:
    """exp(z) in float64 for z <= 0, with exp(z) = 0 below `_EXP_FLOOR`."""
    out = np.zeros(z.shape, dtype=np.float64)
    np.exp(z, out=out, where=z > _EXP_FLOOR)
    return out


def _softmax64(vals: np.ndarray) -> np.ndarray:
    z = vals.astype(np.float64)
    z -= z.max()
    w = _exp_shifted(z)
    w /= w.sum()
    return w


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float32 log-probabilities of a logits vector (llama-cpp-python's ``logits_to_logprobs``)."""
    x = np.asarray(logits, dtype=np.float32)
    m = x.max() if x.size else np.float32(0)
    if not np.isfinite(m):
        m = np.float32(0)
    shifted = np.subtract(x, m, dtype=np.float32)
    with np.errstate(divide="ignore"):
        lse = np.log(np.sum(np.exp(shifted), dtype=np.float32))
    return shifted - lse


def logprobs(logits: np.ndarray, token: int, top_n: int = 0) -> tuple[float, dict[int, float]]:
    """The log-probability of `token` and the `top_n` most likely tokens, from the raw logits.

    Computed from the log-softmax of the logits as given (no bias, penalties, truncation
    or temperature), which is what llama-cpp-python reports as ``logprobs``. The dict maps
    token id -> log-probability, most likely first (ties: lower id first); it holds
    exactly ``min(top_n, n_vocab)`` entries and does not add `token` if it is not among them.
    """
    x = np.asarray(logits)
    if x.ndim != 1 or x.shape[0] == 0:
        raise SamplingError(f"logits must be a non-empty 1-D array, got shape {x.shape}")
    n = x.shape[0]
    if not check.is_int(token) or not 0 <= int(token) < n:
        raise SamplingError(f"token {token!r} is outside the vocabulary (n_vocab={n})")
    if not check.is_int(top_n) or int(top_n) < 0:
        raise SamplingError(f"top_n must be an integer >= 0, got {top_n!r}", "top_n")
    lp = log_softmax(x)
    if np.isnan(lp).any():
        raise SamplingError("logits contain NaN or +inf, or every logit is -inf")
    k = min(int(top_n), n)
    if k == 0:
        top: np.ndarray = np.empty(0, dtype=np.int64)
    elif k < n:
        top = _top_k_ids(lp, k)
    else:
        top = np.lexsort((np.arange(n), -lp))
    return float(lp[int(token)]), {int(i): float(lp[i]) for i in top}


class Sampler:
    """Draws tokens with one `SamplingParams` and its own seeded random stream.

    One sampler serves one generation: the random stream advances by one draw per
    non-greedy `sample` call, so the same seed and the same sequence of (logits, history)
    calls give the same tokens. `history` is the token sequence the penalties look at
    (the caller decides whether it includes the prompt).
    """

    def __init__(self, params: SamplingParams | None = None, rng: np.random.Generator | None = None) -> None:
        """rng: the random stream to draw from (shared with whoever passes it); None: one seeded with
        params.seed."""
        self.params = params if params is not None else SamplingParams()
        if not isinstance(self.params, SamplingParams):
            raise SamplingError(f"params must be a SamplingParams, got {type(self.params).__name__}")
        self._rng = rng if rng is not None else np.random.default_rng(self.params.seed)
        bias = self.params.logit_bias or {}
        self._bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self._bias_vals = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        # the greedy path's C arguments, made once: its bias, and where the C call puts the id, its value, the NaN flag
        self._bias_c = (ffi.from_buffer("int64_t[]", self._bias_ids), ffi.from_buffer("float[]", self._bias_vals))
        self._found, self._top, self._nan = ffi.new("int64_t *"), ffi.new("float *"), ffi.new("int *")
        self._buf: np.ndarray | None = None
        self._buf_c = ffi.NULL  # _buf for C calls, made with it
        self._bias_checked_for = -1  # the row length the bias ids were last found inside

    def reseed(self, seed: int | None) -> None:
        """Restart the random stream from `seed` (None: fresh OS entropy)."""
        try:
            seed = check.integer("seed", seed, minimum=0, optional=True)
        except ParamError as exc:
            raise _as_sampling_error(exc) from None
        self._rng = np.random.default_rng(seed)

    # -- public entry points -------------------------------------------------------------

    def sample(self, logits: np.ndarray, history: Sequence[int] = (), matcher: Any = None) -> int:
        """The next token id for this row of logits (shape ``(n_vocab,)``), among the tokens `matcher` (a
        pyllm.grammar.GrammarMatcher) allows when one is given; the caller advances the matcher."""
        if matcher is None and self.params.greedy and not self.params.has_penalties and _is_float32_row(logits):
            return self._greedy(logits)
        x = self._prepare(logits, history, self._work_buffer(logits), matcher)
        if self.params.greedy:
            return int(np.argmax(x))
        ids, vals = self._truncate(x)
        return self._draw(ids, vals)

    def _greedy(self, logits: np.ndarray) -> int:
        """`sample` at temperature 0 without penalties in one C call (pyllm_argmax): the biased row's first
        largest entry, with _prepare's checks. A server's engine samples every sequence each step on the
        thread that runs the model, where each of _prepare's numpy calls let other threads take the GIL."""
        n = logits.shape[0]
        self._check_bias_ids(n)
        self._work_buffer(logits)
        lib.pyllm_argmax(ffi.from_buffer("float[]", logits), n, *self._bias_c, self._bias_ids.size, self._buf_c,
                         self._found, self._top, self._nan)
        _check_top(np.nan if self._nan[0] else self._top[0])
        return int(self._found[0])

    def _check_bias_ids(self, n: int) -> None:
        if n == self._bias_checked_for:
            return
        if self._bias_ids.size and int(self._bias_ids.max()) >= n:
            bad = int(self._bias_ids[self._bias_ids >= n][0])
            raise SamplingError(f"logit_bias token {bad} is outside the vocabulary (n_vocab={n})")
        self._bias_checked_for = n

    def process(self, logits: np.ndarray, history: Sequence[int] = (), matcher: Any = None) -> np.ndarray:
        """The logits the final draw sees, before temperature, as a new float32 ``(n_vocab,)`` array.

        Tokens removed by bias, top-k, typical, top-p or min-p are ``-inf``; the others hold
        their biased, penalised logits. With temperature 0 nothing is truncated: the result
        is the biased, penalised logits, whose argmax `sample` returns. With a `matcher`, the tokens it does
        not allow are -inf too.
        """
        x = self._prepare(logits, history, None, matcher)
        if self.params.greedy:
            return x
        ids, vals = self._truncate(x)
        out = np.full(x.shape[0], -np.inf, dtype=np.float32)
        out[ids] = vals
        return out

    logprobs = staticmethod(logprobs)

    # -- stages --------------------------------------------------------------------------

    def _work_buffer(self, logits: np.ndarray) -> np.ndarray | None:
        shape = np.shape(logits)
        if len(shape) != 1:
            return None  # _prepare reports the bad shape
        if self._buf is None or self._buf.shape != shape:
            self._buf = np.empty(shape, dtype=np.float32)
            self._buf_c = ffi.from_buffer("float[]", self._buf)  # the greedy path's scratch, for the C call
        return self._buf

    def _prepare(self, logits: np.ndarray, history: Sequence[int], out: np.ndarray | None,
                 matcher: Any = None) -> np.ndarray:
        """Copy the logits to float32 (into `out` if given), apply bias, penalties and the grammar's mask, check
        them."""
        a = np.asarray(logits)
        if a.ndim != 1 or a.shape[0] == 0:
            raise SamplingError(f"logits must be a non-empty 1-D array, got shape {a.shape}")
        if not np.issubdtype(a.dtype, np.floating):
            raise SamplingError(f"logits must be floating point, got dtype {a.dtype}")
        n = a.shape[0]
        if out is None:
            x = a.astype(np.float32, copy=True)
        else:
            x = out
            np.copyto(x, a, casting="same_kind")

        self._check_bias_ids(n)
        if self._bias_ids.size:
            x[self._bias_ids] += self._bias_vals

        p = self.params
        if p.has_penalties:
            self._apply_penalties(x, history)
        if matcher is not None:
            matcher.mask_logits(x)

        _check_top(x.max())
        return x

    def _apply_penalties(self, x: np.ndarray, history: Sequence[int]) -> None:
        p = self.params
        last_n = p.penalty_last_n
        if isinstance(history, np.ndarray):
            window: Any = history if last_n < 0 else history[-last_n:]
        else:
            try:
                window = history if last_n < 0 else history[-last_n:]
            except TypeError:  # an iterable without slicing (deque, generator)
                seq = list(history)
                window = seq if last_n < 0 else seq[-last_n:]
        w = np.asarray(window)
        if w.size == 0:
            return
        if w.ndim != 1 or not np.issubdtype(w.dtype, np.integer):
            raise SamplingError("history must be a sequence of integer token ids")
        n = x.shape[0]
        lo, hi = int(w.min()), int(w.max())
        if lo < 0 or hi >= n:
            raise SamplingError(f"history token {lo if lo < 0 else hi} is outside the vocabulary (n_vocab={n})")
        ids, counts = np.unique(w, return_counts=True)
        v = x[ids]
        rp = np.float32(p.repeat_penalty)
        v = np.where(v <= 0, v * rp, v / rp).astype(np.float32, copy=False)
        v -= counts.astype(np.float32) * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty)
        x[ids] = v

    def _truncate(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """top-k, typical, top-p, min-p: the surviving ids and their (pre-temperature) logits."""
        p = self.params
        n = x.shape[0]

        # Banned (-inf) tokens have probability 0: dropping them changes no stage's result.
        k = p.top_k if 0 < p.top_k < n else n
        if k < n:
            ids = _top_k_ids(x, k)  # sorted by logit, as llama.cpp leaves them
            vals = x[ids]
            if vals[-1] == -np.inf:  # fewer than k finite logits
                keep = vals > -np.inf
                ids, vals = ids[keep], vals[keep]
        else:
            ids = np.flatnonzero(x > -np.inf)  # id order; the stages below do not need sorted input
            vals = x[ids]

        if p.typical_p < 1.0 and ids.shape[0] > 1:
            z = vals.astype(np.float64)
            z -= z.max()
            logp = z - math.log(_exp_shifted(z).sum())
            probs = _exp_shifted(logp)
            entropy = -float(np.einsum("i,i->", probs, logp))  # not np.dot: BLAS adds threading overhead
            keep = _mass_prefix(np.abs(-logp - entropy), probs, float(np.float32(p.typical_p)), strict=True)
            ids, vals = ids[keep], vals[keep]

        if p.top_p < 1.0 and ids.shape[0] > 1:
            keep = _mass_prefix(-vals, _softmax64(vals), float(np.float32(p.top_p)), strict=False)
            ids, vals = ids[keep], vals[keep]

        if p.min_p > 0.0 and ids.shape[0] > 1:
            threshold = np.float32(vals.max()) + np.float32(math.log(np.float32(p.min_p)))
            keep = vals >= threshold
            if not keep.all():
                ids, vals = ids[keep], vals[keep]
        return ids, vals

    def _draw(self, ids: np.ndarray, vals: np.ndarray) -> int:
        u = self._rng.random()
        if ids.shape[0] == 1:
            return int(ids[0])
        z = vals.astype(np.float64)
        z -= z.max()
        z /= self.params.temperature  # after the shift, so a tiny temperature cannot overflow
        cdf = np.cumsum(_exp_shifted(z))
        i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        return int(ids[min(i, ids.shape[0] - 1)])
