"""Sentence embeddings: a prompt's last hidden states (after the output norm) pooled into one vector.

The pooling is the one the GGUF declares (`{arch}.pooling_type`: 1 mean, 2 cls, 3 last), as llama.cpp reads it;
a file that declares none (every generative model: type 0 or no key) is pooled by the mean, which is what
llama-server's `--pooling mean` and most embedding clients expect of such a model. Vectors are L2-normalized
unless the caller asks otherwise, as llama.cpp's embedding tools do.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import numpy as np


class Pooling(StrEnum):
    MEAN = "mean"  # the average of every token's state
    CLS = "cls"    # the first token's
    LAST = "last"  # the last token's


# llama.cpp's enum llama_pooling_type values as GGUF stores them (0: none, 4: rank are not sentence embeddings)
_GGUF_POOLING = {1: Pooling.MEAN, 2: Pooling.CLS, 3: Pooling.LAST}


def declared_pooling(metadata: dict[str, Any]) -> Pooling:
    """The pooling a model file declares, or MEAN where it declares none."""
    arch = metadata.get("general.architecture")
    value = metadata.get(f"{arch}.pooling_type")
    return _GGUF_POOLING.get(value, Pooling.MEAN) if isinstance(value, int) else Pooling.MEAN


def pool(hidden: np.ndarray, pooling: Pooling, normalize: bool) -> np.ndarray:
    """(n_tokens, n_embd) hidden states -> (n_embd,) float32, pooled (in float64) and, if asked, scaled to unit L2
    norm (a zero vector stays zero)."""
    states = hidden.astype(np.float64)
    if pooling == Pooling.MEAN:
        vector = states.mean(axis=0)
    elif pooling == Pooling.CLS:
        vector = states[0]
    else:
        vector = states[-1]
    if normalize:
        norm = float(np.sqrt(np.dot(vector, vector)))
        if norm > 0.0:
            vector = vector / norm
    return vector.astype(np.float32)
