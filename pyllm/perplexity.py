"""Perplexity of a text, by llama.cpp's `llama-perplexity` protocol.

    from pyllm.llama import Llama
    from pyllm.perplexity import perplexity
    result = perplexity(Llama("model.gguf"), open("wiki.test.raw").read(), n_ctx=512)
    print(result.ppl, "+/-", result.ppl_err)

The protocol (llama.cpp tools/perplexity/perplexity.cpp, the default non-strided mode):

* the whole text is tokenized once, adding BOS when the vocabulary asks for it, and with
  special-token text left as plain text;
* it is cut into n_tokens // n_ctx chunks of n_ctx tokens (the tail is dropped); at least
  2 * n_ctx tokens are required;
* each chunk is evaluated from an empty cache, its first token replaced by BOS when the
  vocabulary adds BOS;
* only the second half of each chunk is scored: the logits at positions n_ctx // 2 ..
  n_ctx - 2 predict the token that follows (n_ctx - n_ctx // 2 - 1 scores a chunk);
* ppl = exp(sum of negative log-likelihoods / number of scored tokens), the running value
  after each chunk being what llama-perplexity prints as ``[i]ppl,``, and the uncertainty
  ppl * sqrt(var(nll) / (count - 1)) as its "Final estimate" line gives.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .model import Logits

if TYPE_CHECKING:
    from .llama import Llama
    from .model import Model

MIN_CTX = 8
# Rows of logits computed at once: bounds the memory for large vocabularies (262k for Gemma 3).
_SCORE_BATCH = 128


class PerplexityError(ValueError):
    """The text or the settings do not allow a perplexity run."""


@dataclass(frozen=True)
class PerplexityResult:
    """What `perplexity` measured.

    ppl: exp(nll / n_scored), llama-perplexity's "Final estimate".
    ppl_err: its uncertainty, as llama-perplexity's "+/-" (nan with fewer than 2 scores).
    n_chunks, n_ctx: chunks evaluated, tokens per chunk.
    n_tokens: tokens in the whole text (BOS included).
    nll: the summed negative log-likelihood (nats) over all scored tokens; n_scored: their count.
    chunk_ppl: each chunk's own perplexity.
    running_ppl: the estimate after each chunk (llama-perplexity's ``[1]x,[2]y,...``).
    """

    ppl: float
    n_chunks: int
    n_ctx: int
    nll: float
    n_scored: int
    n_tokens: int
    ppl_err: float
    chunk_ppl: list[float] = field(default_factory=list)
    running_ppl: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"ppl": self.ppl, "n_chunks": self.n_chunks, "n_ctx": self.n_ctx}


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits[i])[targets[i]] per row, in float64."""
    x = np.asarray(logits, dtype=np.float64)
    top = x.max(axis=-1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(x - top).sum(axis=-1))
    return log_z - x[np.arange(len(targets)), targets]


def _model(llm: Llama) -> Model:
    if llm.model is None:
        raise PerplexityError("this Llama was opened with vocab_only=True: it has no weights to evaluate")
    return llm.model


def chunk_nll(llm: Llama, chunk: list[int]) -> np.ndarray:
    """Evaluate one chunk from an empty cache; the nll of each token after the first half."""
    model = _model(llm)
    n_ctx = len(chunk)
    first = n_ctx // 2
    cache = model.new_cache(n_ctx)
    model.prefill(chunk[:first], cache, logits=Logits.LAST)  # the unscored half only fills the cache
    out = []
    # logits at positions first .. n_ctx-2 predict chunk[first+1 .. n_ctx-1]
    for start in range(first, n_ctx - 1, _SCORE_BATCH):
        stop = min(start + _SCORE_BATCH, n_ctx - 1)
        logits = model.prefill(chunk[start:stop], cache, logits=Logits.ALL)
        out.append(token_nll(logits, np.asarray(chunk[start + 1:stop + 1])))
    return np.concatenate(out)


def perplexity(llm: Llama, text: str, n_ctx: int,
               progress: Callable[[int, int, float], None] | None = None) -> PerplexityResult:
    """Perplexity of `text` with chunks of `n_ctx` tokens (see the module docstring).

    progress(i, n_chunks, running_ppl) is called after chunk i (1-based).
    Raises PerplexityError when the text is too short or n_ctx is out of range.
    """
    model = _model(llm)
    tok = llm.tokenizer
    if n_ctx < MIN_CTX:
        raise PerplexityError(f"the context must be at least {MIN_CTX} tokens, not {n_ctx}")
    n_ctx_train = model.config.n_ctx_train
    if n_ctx > n_ctx_train:
        raise PerplexityError(f"the context of {n_ctx} exceeds the model's training context of {n_ctx_train}")
    if tok.add_eos:
        raise PerplexityError("the vocabulary appends EOS to every text; llama-perplexity refuses such models")
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    if len(tokens) < 2 * n_ctx:
        raise PerplexityError(f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of "
                              f"{n_ctx}; the text tokenizes to only {len(tokens)} tokens")
    n_chunks = len(tokens) // n_ctx
    total = total2 = 0.0
    count = 0
    chunk_ppl, running = [], []
    for i in range(n_chunks):
        chunk = tokens[i * n_ctx:(i + 1) * n_ctx]
        if tok.add_bos:
            chunk[0] = tok.bos_id
        nll = chunk_nll(llm, chunk)
        total += float(nll.sum())
        total2 += float((nll * nll).sum())
        count += len(nll)
        chunk_ppl.append(math.exp(float(nll.mean())))
        running.append(math.exp(total / count))
        if progress is not None:
            progress(i + 1, n_chunks, running[-1])
    mean = total / count
    ppl = math.exp(mean)
    var = total2 / count - mean * mean
    err = ppl * math.sqrt(var / (count - 1)) if count > 1 and var > 0 else float("nan")
    return PerplexityResult(ppl=ppl, n_chunks=n_chunks, n_ctx=n_ctx, nll=total, n_scored=count,
                            n_tokens=len(tokens), ppl_err=err, chunk_ppl=chunk_ppl, running_ppl=running)
