"""Generated tokens' log-probabilities in OpenAI's two shapes.

Every value is the log-softmax of the model's raw logits at that position: the distribution the model
itself predicts, before logit bias, penalties, a grammar's mask, temperature or truncation. That is what
OpenAI's API and llama.cpp report, and it does not change with the sampling settings. The engine computes
it (pyllm.sampling.logprobs); here it becomes

- a completion's parallel lists: {"tokens", "token_logprobs", "top_logprobs" (a {text: logprob} per
  token), "text_offset" (the token's first character in the choice's text)}, or
- a chat message's entries: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}.

A token goes out with the chunk of text its text starts in: the text is held back while it could still
become a stop string and never split inside a character, so a chunk may carry several tokens or none.
Tokens wholly inside a stop string that cut the text are left out, as their text is.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Any

from .text.tokenizer import Tokenizer


@dataclass
class TokenLogprob:
    token: int
    piece: bytes
    logprob: float | None   # None: an echoed prompt's first token (nothing before it predicts it)
    top: dict[int, float] | None  # token id -> logprob, most likely first
    offset: int             # its text's first character in the choice's text


class LogprobTrack:
    """The logprobs of one choice's tokens, handed out with the text they make."""

    def __init__(self, base_offset: int = 0) -> None:
        # the same incremental decoding as the text's (StreamDecoder, continuation=True), so offsets agree
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._chars = base_offset      # characters the tokens so far make
        self._emitted = base_offset    # characters handed out
        self._pending: list[TokenLogprob] = []

    def add(self, token: int, piece: bytes, logprob: float | None, top: dict[int, float] | None) -> None:
        self._pending.append(TokenLogprob(token, piece, logprob, top if logprob is None else top or {}, self._chars))
        self._chars += len(self._utf8.decode(piece))

    def take(self, text: str, final: bool, cut: bool) -> list[TokenLogprob]:
        """The tokens whose text starts in what has been handed out once `text` is; at the end (`final`)
        all that are left, but for those a stop string cut off (`cut`)."""
        self._emitted += len(text)
        if final and not cut:
            ready, self._pending = self._pending, []
            return ready
        ready = [e for e in self._pending if e.offset < self._emitted]
        self._pending = [] if final else self._pending[len(ready):]
        return ready


def _text(tokenizer: Tokenizer, token: int) -> str:
    return tokenizer.token_to_piece(token).decode("utf-8", "replace")


def completion_shape(tokenizer: Tokenizer, entries: list[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's completions `logprobs`. Two top tokens with the same text keep the likelier one's value."""
    tops: list[dict[str, float] | None] = []
    for e in entries:
        if e.top is None:
            tops.append(None)
            continue
        top: dict[str, float] = {}
        for t, lp in e.top.items():
            top.setdefault(_text(tokenizer, t), lp)
        tops.append(top)
    return {"tokens": [e.piece.decode("utf-8", "replace") for e in entries],
            "token_logprobs": [e.logprob for e in entries], "top_logprobs": tops,
            "text_offset": [e.offset for e in entries]}


def chat_shape(tokenizer: Tokenizer, entries: list[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's chat `logprobs`: `bytes` are the token's own (a character split over tokens shows as U+FFFD in
    `token`)."""
    def entry(token: int, piece: bytes, logprob: float) -> dict[str, Any]:
        return {"token": piece.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(piece)}

    return {"content": [{**entry(e.token, e.piece, e.logprob),
                         "top_logprobs": [entry(t, tokenizer.token_to_piece(t), lp) for t, lp in (e.top or {}).items()]}
                        for e in entries]}


def prompt_entries(tokenizer: Tokenizer, prompt: list[int], scored: list[tuple[float, dict[int, float] | None]],
                   echoed: str) -> list[TokenLogprob]:
    """An echoed prompt's tokens as logprob entries, their offsets in the echoed text: scored[i - 1] is token
    i's; the first echoed token has none (OpenAI's and llama-cpp-python's null), and a leading BOS, which the
    echo leaves out, is left out here too."""
    track = LogprobTrack()
    first = 1 if prompt and prompt[0] == tokenizer.bos_id else 0
    for i in range(first, len(prompt)):
        logprob, top = (None, None) if i == first else scored[i - 1]
        track.add(prompt[i], tokenizer.token_to_piece(prompt[i]), logprob, top)
    return track.take(echoed, True, False)
