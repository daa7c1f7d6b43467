"""Text <-> token ids from a GGUF file's ``tokenizer.*`` metadata, giving the ids llama.cpp gives.

Two vocabulary kinds, named by ``tokenizer.ggml.model``:

- ``llama``: SentencePiece-style (Llama 2, Gemma). Spaces become ``▁``; the text is split into
  characters, and adjacent pieces are merged best-score-first while the merged text is a token;
  what is left that is not a token falls back to ``<0xXX>`` byte tokens.
- ``gpt2``: byte-level BPE (GPT-2, Llama 3, SmolLM, Qwen). A pre-tokenizer named by
  ``tokenizer.ggml.pre`` splits the text into words (see `pyllm.pretokenizers`); each word's
  UTF-8 bytes are written in the GPT-2 byte alphabet and merged lowest-rank-first by
  ``tokenizer.ggml.merges``.

Before either, special-token texts are cut out of the text (llama.cpp's
``tokenizer_st_partition``): user-defined tokens always, control tokens only with
``special=True``. The pipeline, per call of `Tokenizer.encode`::

    text -> [BOS] + partition(text) -> raw pieces -> SPM / BPE ids, special ids as they are -> [EOS]

Decoding is ``llama_token_to_piece`` per token and ``llama_detokenize`` for a sequence (with
its leading-space strip and, for most BPE vocabularies, its "clean up spaces" pass).
`StreamDecoder` gives the same text incrementally, a whole UTF-8 character at a time.

Text may be `str` or `bytes`. Bytes that are not valid UTF-8 are treated as llama.cpp treats
them: SPM turns them into byte tokens, BPE reads each bad byte as U+FFFD.
"""

from __future__ import annotations

import codecs
import functools
import heapq
import logging
import operator
import re
from array import array
from collections.abc import Callable, Iterable, Mapping
from enum import IntFlag
from typing import Any

import numpy as np

from ..gguf import GGUFError, metadata_bool, metadata_int, metadata_str
from ..strings import StringArray
from .pretokenizers import PRE_TOKENIZERS, UNSUPPORTED_PRE, PreTokenizer

__all__ = ["StreamDecoder", "TokenAttr", "Tokenizer", "TokenizerError", "VocabularyError"]

log = logging.getLogger(__name__)


def _merge_pairs(sym: list[str], priority: Callable[[str], float | None], sep: str) -> list[str]:
    """Merge adjacent symbols, the pair with the lowest priority(left + sep + right) first (ties: leftmost),
    while some pair has one (priority None: none); the merged symbols in order.

    A heap of candidate pairs over a linked list of symbols: SentencePiece's merge (priority = -score of the
    merged piece, sep "") and byte-level BPE's (priority = merge rank of "left right", sep " ") alike.
    """
    n = len(sym)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap = []
    for i in range(n - 1):
        p = priority(sym[i] + sep + sym[i + 1])
        if p is not None:
            heap.append((p, i, i + 1, len(sym[i]) + len(sym[i + 1])))
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        _, left, right, size = pop(heap)
        ls, rs = sym[left], sym[right]
        if not ls or not rs or len(ls) + len(rs) != size:
            continue  # one side changed since this pair was queued
        merged = ls + rs
        sym[left] = merged
        sym[right] = ""
        after = nxt[right]
        nxt[left] = after
        if after >= 0:
            prv[after] = left
        before = prv[left]
        if before >= 0:
            p = priority(sym[before] + sep + merged)
            if p is not None:
                push(heap, (p, before, left, len(sym[before]) + len(merged)))
        if after >= 0:
            p = priority(merged + sep + sym[after])
            if p is not None:
                push(heap, (p, left, after, len(merged) + len(sym[after])))
    return [piece for piece in sym if piece]


def _string_array(value: Any) -> StringArray | None:
    """A metadata string array as a `StringArray` (a GGUF file's already is one; a list of str is packed)."""
    if isinstance(value, StringArray):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return StringArray.from_strings(value)
    return None


class TokenizerError(ValueError):
    """A vocabulary pyllm cannot use, or a token id it does not have."""


class VocabularyError(TokenizerError, GGUFError):
    """A file's ``tokenizer.*`` metadata that pyllm cannot use: a GGUFError too, like any other fault of a file."""


def _number_array(value: Any, integers: bool) -> np.ndarray | None:
    """A metadata array of numbers (integers only, if asked) as a 1-D numpy array; None for anything else."""
    if isinstance(value, str | StringArray):
        return None
    try:
        values = np.asarray(value)
    except ValueError:  # ragged nested lists
        return None
    if values.ndim != 1 or values.dtype.kind not in ("iu" if integers else "iuf"):
        return None
    return values


class TokenAttr(IntFlag):
    """Token attributes, llama.cpp's ``llama_token_attr`` bits."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


# Plain ints for the hot paths.
_UNKNOWN, _UNUSED, _NORMAL, _CONTROL, _USER_DEFINED, _BYTE = 1, 2, 4, 8, 16, 32
_LSTRIP, _RSTRIP = 128, 256
# tokenizer.ggml.token_type -> attribute (any other value: UNDEFINED)
_TYPE_ATTR = {1: _NORMAL, 2: _UNKNOWN, 3: _CONTROL, 4: _USER_DEFINED, 5: _UNUSED, 6: _BYTE}

_SPACE_MARK = "\u2581"  # "▁", SentencePiece's visible space
_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale
_C_SPACE_BYTES = _C_SPACE.encode()


def _gpt2_byte_alphabet() -> list[str]:
    """GPT-2's byte -> character table: printable Latin-1 stays, the rest moves to U+0100.."""
    chars = {b: chr(b) for b in [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(0x100 + shifted)
            shifted += 1
    return [chars[b] for b in range(256)]


_BYTE_CHARS = _gpt2_byte_alphabet()
_LATIN1_TO_ALPHABET = str.maketrans({b: c for b, c in enumerate(_BYTE_CHARS)})
_ALPHABET_TO_BYTE = {c: b for b, c in enumerate(_BYTE_CHARS)}

# One SPM symbol of raw bytes: a lead byte and as many bytes as it announces (fewer at the end).
_UTF8_CHUNK = re.compile(
    rb"[\xc0-\xdf][\x00-\xff]?|[\xe0-\xef][\x00-\xff]{0,2}|[\xf0-\xff][\x00-\xff]{0,3}|[\x00-\xbf]"
)

# llama_detokenize's clean-up passes (clean_up_tokenization_spaces), in order.
_CLEAN_PASSES = (
    (re.compile(rb" (?=[?!.,])"), b""),
    (re.compile(rb" ' "), b"'"),
    (re.compile(rb" (?='(?:[sm]|re|ve))"), b""),
)

# End-of-generation texts llama.cpp recognises (llama-vocab.cpp), and the texts it takes as
# EOT / EOM / FIM tokens when the file does not name them. The first match in a list wins.
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
    "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
)
# Tokens llama.cpp always renders (gpt-oss), whatever their type says.
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# GGUF keys of the special ids, in the order llama.cpp reads them (later keys win).
_SPECIAL_ID_KEYS = (
    ("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"), ("eom", "eom_token_id"),
    ("unk", "unknown_token_id"), ("sep", "seperator_token_id"), ("pad", "padding_token_id"),
    ("mask", "mask_token_id"), ("fim_pre", "fim_pre_token_id"), ("fim_suf", "fim_suf_token_id"),
    ("fim_mid", "fim_mid_token_id"), ("fim_pad", "fim_pad_token_id"), ("fim_rep", "fim_rep_token_id"),
    ("fim_sep", "fim_sep_token_id"), ("fim_pre", "prefix_token_id"), ("fim_suf", "suffix_token_id"),
    ("fim_mid", "middle_token_id"),
)

# Tokenizer models llama.cpp knows that pyllm does not implement.
_UNSUPPORTED_MODELS = ("bert", "t5", "rwkv", "plamo2", "gemma4", "hybriddna", "whitespace", "no_vocab", "none")


def _strtol_hex(text: str) -> int:
    """C strtol(text, 16) on the two characters of a ``<0xXX>`` token: leading hex digits, else 0."""
    m = re.match(r"[0-9A-Fa-f]+", text)
    return int(m.group(0), 16) & 0xFF if m else 0


def _decode_like_llama(data: bytes) -> str:
    """Bytes -> code points as llama.cpp's ``unicode_cpts_from_utf8`` reads them.

    Valid UTF-8 decodes as usual. Otherwise each byte that does not start a well-formed
    sequence (lead byte plus continuation bytes; overlong forms and surrogates are accepted,
    as llama.cpp accepts them) becomes U+FFFD on its own. A four-byte form above U+10FFFF,
    which llama.cpp cannot encode back, also becomes U+FFFD.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    out: list[str] = []
    i, n = 0, len(data)
    while i < n:
        b = data[i]
        if b < 0x80:
            out.append(chr(b))
            i += 1
            continue
        if b & 0x40 == 0:
            need = -1
        elif b & 0x20 == 0:
            need, cp = 1, b & 0x1F
        elif b & 0x10 == 0:
            need, cp = 2, b & 0x0F
        elif b & 0x08 == 0:
            need, cp = 3, b & 0x07
        else:
            need = -1
        if need < 0 or i + need >= n:
            out.append("\ufffd")
            i += 1
            continue
        tail = data[i + 1 : i + 1 + need]
        if any(c & 0xC0 != 0x80 for c in tail):
            out.append("\ufffd")
            i += 1
            continue
        for c in tail:
            cp = (cp << 6) | (c & 0x3F)
        out.append(chr(cp) if cp <= 0x10FFFF else "\ufffd")
        i += 1 + need
    return "".join(out)


def _clean_spaces(text: bytes) -> bytes:
    for pattern, replacement in _CLEAN_PASSES:
        text = pattern.sub(replacement, text)
    return text


class _SpecialTable:
    """Special-token texts in partition order (longest first), with a lookup to skip absent ones."""

    def __init__(self, entries: list[tuple[str, int, int]]) -> None:
        # entries: (text, id, attr), already in partition order
        self.entries = entries
        self._by_kind: dict[type, tuple[list[tuple[Any, int, bool, bool]], dict[Any, list[int]], list[int]]] = {}

    def _index(self, kind: type) -> tuple[list[tuple[Any, int, bool, bool]], dict[Any, list[int]], list[int]]:
        index = self._by_kind.get(kind)
        if index is None:
            rows = [
                (text if kind is str else text.encode("utf-8"), tid, bool(attr & _LSTRIP), bool(attr & _RSTRIP))
                for text, tid, attr in self.entries
            ]
            by_prefix: dict[Any, list[int]] = {}
            short: list[int] = []
            for i, row in enumerate(rows):
                if len(row[0]) < 2:
                    short.append(i)
                else:
                    by_prefix.setdefault(row[0][:2], []).append(i)
            index = self._by_kind[kind] = (rows, by_prefix, short)
        return index

    def candidates(self, text: str | bytes) -> list[tuple[Any, int, bool, bool]]:
        """The rows whose text occurs in `text`, in partition order."""
        rows, by_prefix, short = self._index(type(text))
        if len(rows) <= 64:
            return [row for row in rows if row[0] in text]
        found = {i for i in short if rows[i][0] in text}
        for gram in {text[i : i + 2] for i in range(len(text) - 1)}:
            hits = by_prefix.get(gram)
            if hits:
                found.update(i for i in hits if rows[i][0] in text)
        return [rows[i] for i in sorted(found)]


class Tokenizer:
    """A vocabulary and its tokenizer, built from GGUF ``tokenizer.*`` metadata.

    Attributes:
        model: ``"llama"`` (SentencePiece-style) or ``"gpt2"`` (byte-level BPE).
        pre: the BPE pre-tokenizer name (``tokenizer.ggml.pre``); None for SPM.
        n_vocab: the number of tokens.
        bos_id, eos_id, eot_id, eom_id, unk_id, pad_id, sep_id, mask_id: special ids, None if absent.
        fim_pre_id, fim_suf_id, fim_mid_id, fim_pad_id, fim_rep_id, fim_sep_id: fill-in-the-middle ids.
        add_bos, add_eos: whether ``encode(add_bos=True)`` adds BOS / EOS (llama.cpp's defaults:
            SPM adds BOS, BPE only for some pre-tokenizers, the file's keys overriding).
        add_space_prefix: SPM puts a space before the text (and decoding strips it again).
        clean_spaces: decoding applies llama.cpp's clean-up of spaces before punctuation.
        eog_ids: the end-of-generation ids, computed as llama.cpp computes them.
        chat_template: ``tokenizer.chat_template``, or None.
    """

    def __init__(self, metadata: Mapping[str, Any], *, source: str = "tokenizer") -> None:
        self._source = source
        self._read_model(metadata)
        self._read_vocabulary(metadata)
        ids = self._read_kind(metadata)
        self._read_special_ids(metadata, ids)
        self._find_special_tokens(ids)

        def text(key: str) -> str:  # names that only pick per-model quirks: any other value picks none
            value = metadata.get(key)
            return value if isinstance(value, str) else ""

        self._mark_strip_attrs(text("general.name"), text("tokenizer.ggml.pre"), text("general.architecture"))
        specials = [i for i, a in enumerate(self._attrs) if a & (_CONTROL | _USER_DEFINED | _UNKNOWN)]
        specials.sort(key=lambda i: -len(self._texts[i].encode("utf-8")))
        entries = [(self._texts[i], i, self._attrs[i]) for i in specials]
        self._specials_all = _SpecialTable(entries)
        self._specials_user = _SpecialTable([e for e in entries if not e[2] & (_CONTROL | _UNKNOWN)])

        self.chat_template: str | None = metadata_str(metadata, "tokenizer.chat_template", None, error=self._error)
        self._pieces: dict[int, bytes] = {}  # the rendered tokens so far
        self._byte_ids: list[int | None] | None = None
        self._bpe_word = functools.lru_cache(maxsize=1 << 16)(self._bpe_word_uncached)

    def _read_model(self, metadata: Mapping[str, Any]) -> None:
        """tokenizer.ggml.model: "llama" (SentencePiece-style) or "gpt2" (byte-level BPE)."""
        model = metadata_str(metadata, "tokenizer.ggml.model", None, error=self._error)
        if model is None:
            raise self._error("no tokenizer.ggml.model in the metadata")
        if model == "llama":
            self.model = "llama"
        elif model == "gpt2":
            self.model = "gpt2"
        elif model in _UNSUPPORTED_MODELS:
            raise self._error(f"tokenizer model {model!r} is not supported (pyllm reads 'llama' and 'gpt2')")
        else:
            raise self._error(f"unknown tokenizer model {model!r}")
        self.is_spm = self.model == "llama"

    def _read_vocabulary(self, metadata: Mapping[str, Any]) -> None:
        """The tokens' texts, scores and types."""
        tokens = metadata.get("tokenizer.ggml.tokens")
        texts = _string_array(tokens)
        if texts is None:
            if tokens is None:
                raise self._error("no tokenizer.ggml.tokens in the metadata")
            raise self._error("tokenizer.ggml.tokens is not an array of strings")
        n = len(texts)
        if n == 0:
            raise self._error("tokenizer.ggml.tokens is empty")
        self.n_vocab = n
        empty = np.flatnonzero(texts.lengths() == 0)
        if len(empty):
            for i in empty:
                log.warning("%s: empty token at index %d", self._source, i)
            texts = StringArray.from_strings(t or f"[EMPTY_{i}]" for i, t in enumerate(texts))
        # the vocabulary: id -> text, and text -> id through its index (no str or dict entry per token)
        self._texts = texts
        repeat = texts.first_repeat()
        if repeat >= 0:  # llama.cpp refuses such a vocabulary too
            raise self._error(f"token text {texts[repeat]!r} appears more than once in tokenizer.ggml.tokens")

        scores = metadata.get("tokenizer.ggml.scores")
        if scores is not None and (scores := _number_array(scores, integers=False)) is None:
            raise self._error("tokenizer.ggml.scores is not an array of numbers")
        if scores is not None and len(scores) < n:
            raise self._error(f"tokenizer.ggml.scores has {len(scores)} values for {n} tokens")
        # float32, as GGUF stores them and llama.cpp keeps them
        self._scores = array("f", bytes(4 * n) if scores is None else np.asarray(scores[:n], np.float32).tobytes())

        types = metadata.get("tokenizer.ggml.token_type")
        if types is None:
            attrs = array("i", [_NORMAL]) * n
        else:
            if (types := _number_array(types, integers=True)) is None:
                raise self._error("tokenizer.ggml.token_type is not an array of integers")
            if len(types) < n:
                raise self._error(f"tokenizer.ggml.token_type has {len(types)} values for {n} tokens")
            attrs = array("i", (_TYPE_ATTR.get(t, 0) for t in types[:n].tolist()))
        self._attrs = attrs

    def _read_kind(self, metadata: Mapping[str, Any]) -> dict[str, int | None]:
        """The vocabulary kind's defaults (llama_vocab::impl::load), the BPE merges and pre-tokenizer, and the
        file's flags over them; returns the default special ids."""
        ids: dict[str, int | None] = dict.fromkeys(
            ("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask",
             "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep"))
        self._pre: PreTokenizer | None = None
        self.pre: str | None = None
        self._merges = StringArray.from_strings([])
        if self.is_spm:
            ids.update(bos=1, eos=2, unk=0)
            self.add_space_prefix = True
            self.add_bos = True
            self.clean_spaces = False
        else:
            pre_tok = self._read_bpe(metadata)
            ids.update(bos=11, eos=11)
            if pre_tok.no_bos:
                ids["bos"] = None
            self.add_space_prefix = False
            self.add_bos = pre_tok.add_bos
            self.clean_spaces = pre_tok.clean_spaces
        self.add_eos = False
        self.add_space_prefix = metadata_bool(metadata, "tokenizer.ggml.add_space_prefix", self.add_space_prefix,
                                              error=self._error)
        # read for completeness: llama.cpp applies it only to UGM (T5) vocabularies
        self.remove_extra_whitespaces = metadata_bool(metadata, "tokenizer.ggml.remove_extra_whitespaces", False,
                                                      error=self._error)
        return ids

    def _read_bpe(self, metadata: Mapping[str, Any]) -> PreTokenizer:
        """A gpt2 vocabulary's merges (a merge's rank is its first index) and its pre-tokenizer."""
        if metadata.get("tokenizer.ggml.merges") is None:
            raise self._error("no tokenizer.ggml.merges in the metadata (a gpt2 vocabulary needs them)")
        merges = _string_array(metadata.get("tokenizer.ggml.merges"))
        if merges is None:
            raise self._error("tokenizer.ggml.merges is not an array of strings")
        self._merges = merges
        pre = metadata_str(metadata, "tokenizer.ggml.pre", None, error=self._error)
        if not pre:
            log.warning("%s: no tokenizer.ggml.pre, using the 'default' pre-tokenizer "
                        "(generation quality may suffer; llama.cpp does the same)", self._source)
            pre = "default"
        if pre in UNSUPPORTED_PRE:
            raise self._error(f"pre-tokenizer {pre!r} is not supported by pyllm")
        pre_tok = PRE_TOKENIZERS.get(pre)
        if pre_tok is None:
            raise self._error(f"unknown pre-tokenizer type {pre!r} (tokenizer.ggml.pre)")
        self._pre, self.pre = pre_tok, pre
        return pre_tok

    def _read_special_ids(self, metadata: Mapping[str, Any], ids: dict[str, int | None]) -> None:
        """The file's special token ids over the kind's defaults (out-of-range ones warned about and ignored), and
        its add_bos / add_eos flags."""
        n = self.n_vocab
        for name, value in ids.items():
            if value is not None and value >= n:
                log.warning("%s: default special token %s = %d is out of range, disabling it", self._source, name,
                            value)
                ids[name] = None
        for name, key in _SPECIAL_ID_KEYS:
            value = metadata_int(metadata, f"tokenizer.ggml.{key}", None, lo=-(1 << 63), hi=(1 << 64) - 1,
                                 error=self._error)
            if value is None:
                continue
            if not 0 <= value < n:
                log.warning("%s: bad special token tokenizer.ggml.%s = %d, keeping %s", self._source, key, value,
                            ids[name])
            else:
                ids[name] = value
        self.add_bos = metadata_bool(metadata, "tokenizer.ggml.add_bos_token", self.add_bos, error=self._error)
        self.add_eos = metadata_bool(metadata, "tokenizer.ggml.add_eos_token", self.add_eos, error=self._error)

    # -- construction helpers --

    @classmethod
    def from_gguf(cls, f: Any) -> Tokenizer:
        """The tokenizer of an open `pyllm.gguf.GGUFFile` (anything with a ``metadata`` mapping)."""
        return cls(f.metadata, source=str(getattr(f, "path", "tokenizer")))

    def _error(self, message: str) -> VocabularyError:
        return VocabularyError(f"{self._source}: {message}")

    def _find_special_tokens(self, ids: dict[str, int | None]) -> None:
        """EOT/EOM/FIM detection by text, unused marking and the end-of-generation set, as llama.cpp does."""
        tid = self.token_id
        attrs = self._attrs

        def force_control(i: int) -> None:
            if not attrs[i] & _CONTROL:
                log.debug("%s: control-looking token %d %r was not control-type", self._source, i, self._texts[i])
                attrs[i] |= _CONTROL

        for name, texts in (("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), *_FIM_TEXTS.items()):
            if ids[name] is None:
                found = next((i for i in map(tid, texts) if i is not None), None)
                if found is not None:
                    ids[name] = found
                    force_control(found)

        for i, a in enumerate(attrs):
            if a & _CONTROL and not a & _UNUSED and "unused" in self._texts[i]:
                attrs[i] = a | _UNUSED

        eog: set[int] = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}  # type: ignore[misc]
        for text in _EOG_TEXTS:
            i = tid(text)
            if i is not None:
                eog.add(i)
                force_control(i)
        for text in _ALWAYS_RENDERED:
            i = tid(text)
            if i is not None:
                attrs[i] = _USER_DEFINED
        for name in ("eos", "eot", "eom"):
            if ids[name] is not None:
                eog.add(ids[name])  # type: ignore[arg-type]
        eog_texts = {self._texts[i] for i in eog}
        end = tid("<|end|>")
        has_call = bool({"<|call|>", "<|calls|>"} & eog_texts)
        if end is not None and end in eog and has_call and ({"<|return|>", "<|flush|>"} & eog_texts):
            eog.discard(end)
            attrs[end] = _USER_DEFINED
        eos_s = tid("</s>")
        if eos_s is not None and eos_s in eog and {"<|tool_response>", "<|plamo:eos|>"} & eog_texts:
            eog.discard(eos_s)
            attrs[eos_s] = _NORMAL

        self.bos_id = ids["bos"]
        self.eos_id = ids["eos"]
        self.eot_id = ids["eot"]
        self.eom_id = ids["eom"]
        self.unk_id = ids["unk"]
        self.sep_id = ids["sep"]
        self.pad_id = ids["pad"]
        self.mask_id = ids["mask"]
        self.fim_pre_id = ids["fim_pre"]
        self.fim_suf_id = ids["fim_suf"]
        self.fim_mid_id = ids["fim_mid"]
        self.fim_pad_id = ids["fim_pad"]
        self.fim_rep_id = ids["fim_rep"]
        self.fim_sep_id = ids["fim_sep"]
        self.eog_ids: frozenset[int] = frozenset(eog)

    def _mark_strip_attrs(self, model_name: str, pre: str, arch: str) -> None:
        """The per-model LSTRIP/RSTRIP attributes llama.cpp sets by model name."""
        attrs, tid = self._attrs, self.token_id
        name = model_name.lower()
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or arch in (
            "nomic-bert-moe", "jina-bert-v3"
        ):
            if (i := tid("<mask>")) is not None:
                attrs[i] |= _LSTRIP
        elif "phi-3" in name or "phi3" in name:
            for i, a in enumerate(attrs):
                if a & (_CONTROL | _USER_DEFINED | _UNKNOWN):
                    attrs[i] = a | _RSTRIP
            if (i := tid("</s>")) is not None:
                attrs[i] |= _RSTRIP
            for text in ("<unk>", "<s>", "<|endoftext|>"):
                if (i := tid(text)) is not None:
                    attrs[i] &= ~_RSTRIP
        elif "modern-bert" in name and (i := tid("[MASK]")) is not None:
            attrs[i] |= _LSTRIP

    # -- vocabulary --

    def token_text(self, token_id: int) -> str:
        """The token's text as the vocabulary stores it (``▁`` for spaces in SPM, GPT-2 alphabet in BPE)."""
        return self._texts[self._check_id(token_id)]

    def token_score(self, token_id: int) -> float:
        return self._scores[self._check_id(token_id)]

    def token_attr(self, token_id: int) -> TokenAttr:
        return TokenAttr(self._attrs[self._check_id(token_id)])

    def token_id(self, text: str) -> int | None:
        """The id of the token whose vocabulary text is exactly `text`, or None."""
        i = self._texts.find(text)
        return i if i >= 0 else None

    def is_eog(self, token_id: int) -> bool:
        """Whether generating this token ends generation (EOS, EOT, ``<|im_end|>``, ...)."""
        return token_id in self.eog_ids

    def is_control(self, token_id: int) -> bool:
        return bool(self._attrs[self._check_id(token_id)] & _CONTROL)

    def _check_id(self, token_id: int) -> int:
        try:
            i = operator.index(token_id)
        except TypeError:
            raise TokenizerError(f"token id {token_id!r} is not an integer") from None
        if not 0 <= i < self.n_vocab:
            raise TokenizerError(f"token id {i} is out of range (the vocabulary has {self.n_vocab} tokens)")
        return i

    def __repr__(self) -> str:
        kind = "SPM" if self.is_spm else f"BPE pre={self.pre!r}"
        return f"Tokenizer({kind}, n_vocab={self.n_vocab}, bos={self.bos_id}, eos={self.eos_id})"

    # -- encoding --

    def encode(self, text: str | bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids for `text`, as ``llama_tokenize(text, add_special=add_bos, parse_special=special)``.

        `add_bos` adds what the vocabulary asks for: BOS when `add_bos` is set for it, and EOS
        when `add_eos` is. `special` turns control-token texts (``<|im_start|>``,
        ``<start_of_turn>``) into their ids; user-defined tokens are always matched.
        """
        if isinstance(text, str):
            try:
                text.encode("utf-8")
                piece: str | bytes = text
            except UnicodeEncodeError:  # lone surrogates: treat as the bytes they would be
                piece = text.encode("utf-8", "surrogatepass")
        elif isinstance(text, (bytes, bytearray, memoryview)):
            data = bytes(text)
            try:
                piece = data.decode("utf-8")
            except UnicodeDecodeError:
                piece = data
        else:
            raise TypeError(f"encode() takes str or bytes, not {type(text).__name__}")

        out: list[int] = []
        if add_bos and self.add_bos:
            if self.bos_id is None:
                raise self._error("the vocabulary asks for a BOS token but has none")
            out.append(self.bos_id)
        fragments = self._partition(piece, special) if piece else []
        if self.is_spm:
            prev_special = True
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special:
                    frag = (" " if isinstance(frag, str) else b" ") + frag
                self._spm_encode(frag, out)
                prev_special = False
        else:
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    self._bpe_encode(frag, out)
        if add_bos and self.add_eos:
            if self.eos_id is None:
                raise self._error("the vocabulary asks for an EOS token but has none")
            out.append(self.eos_id)
        return out

    def _partition(self, text: str | bytes, special: bool) -> list[Any]:
        """Cut special-token texts out of `text`: a list of raw pieces (str/bytes) and ids."""
        table = self._specials_all if special else self._specials_user
        frags: list[Any] = [text]
        for s, tid, lstrip, rstrip in table.candidates(text):
            if not any(not isinstance(f, int) and s in f for f in frags):
                continue
            space = _C_SPACE if isinstance(text, str) else _C_SPACE_BYTES
            new: list[Any] = []
            for f in frags:
                if isinstance(f, int) or s not in f:
                    new.append(f)
                    continue
                base, end = 0, len(f)
                while True:
                    m = f.find(s, base)
                    if m < 0:
                        if base < end:
                            new.append(f[base:])
                        break
                    left = f[base:m].rstrip(space) if lstrip else f[base:m]
                    if left:
                        new.append(left)
                    new.append(tid)
                    base = m + len(s)
                    if rstrip:
                        base = end - len(f[base:].lstrip(space))
                    if base >= end:
                        break
            frags = new
        return frags

    # SentencePiece-style

    def _spm_encode(self, text: str | bytes, out: list[int]) -> None:
        if isinstance(text, str):
            self._spm_merge(text.replace(" ", _SPACE_MARK), out)
            return
        # Not valid UTF-8: llama.cpp cuts the bytes into lead-byte-sized symbols; a symbol that
        # is not a character can never be part of a token, so it splits the text and becomes
        # byte tokens, and the valid stretches between merge as usual.
        data = text.replace(b" ", _SPACE_MARK.encode())
        start = 0
        for m in _UTF8_CHUNK.finditer(data):
            chunk = m.group()
            if chunk[0] < 0x80:
                continue
            try:
                chunk.decode("utf-8")
                continue
            except UnicodeDecodeError:
                pass
            if m.start() > start:
                self._spm_merge(data[start : m.start()].decode("utf-8"), out)
            out.extend(self._byte_token(b) for b in chunk)
            start = m.end()
        if start < len(data):
            self._spm_merge(data[start:].decode("utf-8"), out)

    def _spm_priority(self, text: str) -> float | None:
        """-score of the token `text`, None if it is none: SentencePiece merges the best-scoring piece first."""
        t = self._texts.find(text)
        return -self._scores[t] if t >= 0 else None

    def _spm_merge(self, text: str, out: list[int]) -> None:
        """Merge characters best-score-first (ties: leftmost) while the merged text is a token."""
        if not text:
            return
        find = self._texts.find
        for piece in _merge_pairs(list(text), self._spm_priority, ""):
            t = find(piece)
            if t >= 0:
                out.append(t)
            else:
                out.extend(self._byte_token(b) for b in piece.encode("utf-8", "surrogatepass"))

    def _byte_token(self, byte: int) -> int:
        """The SPM byte-fallback token ``<0xXX>`` (or the byte's own one-character token)."""
        table = self._byte_ids
        if table is None:
            table = self._byte_ids = []
            for b in range(256):
                t = self.token_id(f"<0x{b:02X}>")
                if t is None and b < 0x80:
                    t = self.token_id(chr(b))
                table.append(t)
        t = table[byte]
        if t is None:
            raise self._error(f"the vocabulary has no byte token for 0x{byte:02X}")
        return t

    # byte-level BPE

    def _bpe_encode(self, text: str | bytes, out: list[int]) -> None:
        if isinstance(text, bytes):
            text = _decode_like_llama(text)
        word_ids = self._bpe_word
        for word in self._pre.split(text):  # type: ignore[union-attr]
            out.extend(word_ids(word))

    def _bpe_word_uncached(self, word: str) -> tuple[int, ...]:
        find = self._texts.find
        if self._pre.byte_encode:  # type: ignore[union-attr]
            word = word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_LATIN1_TO_ALPHABET)
        if self._pre.ignore_merges:  # type: ignore[union-attr]
            t = find(word)
            if t >= 0:
                return (t,)
        parts = self._bpe_merge(word) if len(word) <= 48 else self._bpe_merge_long(word)
        ids: list[int] = []
        for part in parts:
            t = find(part)
            if t >= 0:
                ids.append(t)
            else:
                # llama.cpp looks the part up byte by byte; only ASCII bytes can be tokens
                ids.extend(t for c in part if c < "\x80" and (t := find(c)) >= 0)
        return tuple(ids)

    def _bpe_merge(self, word: str) -> list[str]:
        """Merge the lowest-ranked adjacent pair (ties: leftmost) until no pair has a rank."""
        rank = self._merges.find
        syms = list(word)
        while len(syms) > 1:
            best, best_i = -1, -1
            for i in range(len(syms) - 1):
                r = rank(syms[i] + " " + syms[i + 1])
                if r >= 0 and (best < 0 or r < best):
                    best, best_i = r, i
            if best_i < 0:
                break
            syms[best_i : best_i + 2] = [syms[best_i] + syms[best_i + 1]]
        return syms

    def _bpe_rank(self, pair: str) -> int | None:
        r = self._merges.find(pair)
        return r if r >= 0 else None

    def _bpe_merge_long(self, word: str) -> list[str]:
        """`_bpe_merge` with a priority queue, for long words."""
        return _merge_pairs(list(word), self._bpe_rank, " ")

    # -- decoding --

    def _piece(self, i: int) -> bytes:
        """The token's bytes as llama.cpp caches them (the `special=True` rendering)."""
        piece = self._pieces.get(i)
        if piece is None:
            attr, text = self._attrs[i], self._texts[i]
            if attr & (_UNKNOWN | _CONTROL | _USER_DEFINED):
                piece = text.encode("utf-8")
            elif attr & _NORMAL:
                if self.is_spm:
                    piece = text.replace(_SPACE_MARK, " ").encode("utf-8")
                else:
                    piece = self._decode_alphabet(text)
            elif attr & _BYTE:
                piece = bytes([_strtol_hex(text[3:5])])
            else:  # unused / undefined
                piece = b""
            self._pieces[i] = piece
        return piece

    @staticmethod
    def _decode_alphabet(text: str) -> bytes:
        """GPT-2 alphabet -> bytes; a character outside it becomes llama.cpp's ``[UNK_BYTE_..]`` marker."""
        out = bytearray()
        for c in text:
            b = _ALPHABET_TO_BYTE.get(c)
            if b is not None:
                out.append(b)
            else:
                out += b"[UNK_BYTE_0x" + c.encode("utf-8", "surrogatepass").hex().encode() + text.encode() + b"]"
        return bytes(out)

    def token_to_piece(self, token_id: int, special: bool = False, lstrip: int = 0) -> bytes:
        """The bytes of one token, as ``llama_token_to_piece``.

        Control and unknown tokens render as nothing unless `special`; user-defined tokens
        always render their text. `lstrip` drops up to that many leading spaces.
        """
        i = self._check_id(token_id)
        if not special and self._attrs[i] & (_UNKNOWN | _CONTROL):
            return b""
        piece = self._piece(i)
        while lstrip > 0 and piece[:1] == b" ":
            piece = piece[1:]
            lstrip -= 1
        return piece

    def decode(
        self,
        tokens: Iterable[int],
        special: bool = False,
        remove_special: bool = False,
        clean_spaces: bool | None = None,
        *,
        continuation: bool = False,
    ) -> bytes:
        """The bytes of a token sequence, as ``llama_detokenize(remove_special, unparse_special=special)``.

        The first token loses one leading space when the vocabulary adds a space prefix (unless
        a removed BOS came first); `remove_special` drops a leading BOS / trailing EOS that
        the vocabulary adds; `clean_spaces` (default: the vocabulary's setting) removes the
        space before ``?!.,`` and in `` 's`` / `` 're`` style contractions.

        `continuation=True` is for tokens that continue earlier text (generated tokens): the
        plain concatenation of the pieces, as llama.cpp's generation loop prints them (no
        leading-space strip; no clean-up unless `clean_spaces` asks for it).
        """
        ids = [self._check_id(t) for t in tokens]
        remove_space = self.add_space_prefix and not continuation
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        parts = []
        for i in ids:
            parts.append(self.token_to_piece(i, special, 1 if remove_space else 0))
            remove_space = False
        text = b"".join(parts)
        if (self.clean_spaces and not continuation) if clean_spaces is None else clean_spaces:
            text = _clean_spaces(text)
        return text

    def decode_text(
        self, tokens: Iterable[int], special: bool = False, remove_special: bool = False, *, continuation: bool = False
    ) -> str:
        """`decode` as a str, bytes that are not UTF-8 replaced by U+FFFD."""
        return self.decode(tokens, special, remove_special, continuation=continuation).decode("utf-8", "replace")

    def stream(
        self, special: bool = False, remove_special: bool = False, *, continuation: bool = False
    ) -> StreamDecoder:
        """A `StreamDecoder` for this vocabulary (the same options as `decode`)."""
        return StreamDecoder(self, special=special, remove_special=remove_special, continuation=continuation)


class StreamDecoder:
    """Decode tokens one at a time, handing back only whole UTF-8 characters.

    ``"".join(feed(t) for t in ids) + flush()`` equals ``tokenizer.decode(ids, ...).decode("utf-8",
    "replace")`` for the same options: a character split over several byte tokens comes out
    once its last byte arrives, and with the vocabulary's space clean-up the few bytes it may
    still change (around a space or an apostrophe) wait for the next token.

    For generated tokens, which continue the prompt's text, use ``continuation=True``: the
    text is then exactly the pieces llama.cpp prints, with no leading-space strip or clean-up.
    """

    def __init__(
        self, tokenizer: Tokenizer, special: bool = False, remove_special: bool = False, *, continuation: bool = False
    ) -> None:
        self._tok = tokenizer
        self._special = special
        self._remove_special = remove_special
        self._continuation = continuation
        self._clean = tokenizer.clean_spaces and not continuation
        self._remove_space = tokenizer.add_space_prefix and not continuation
        self._first = True
        self._held_eos = False
        self._raw = bytearray()  # decoded bytes not yet cleaned and handed out
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token_id: int) -> str:
        """Add one token; return the text that is now complete (possibly "")."""
        tok = self._tok
        i = tok._check_id(token_id)
        if self._first:
            self._first = False
            if self._remove_special and tok.add_bos and i == tok.bos_id:
                self._remove_space = False
                return ""
        if self._held_eos:  # an EOS that turned out not to be the last token
            self._held_eos = False
            self._append(tok.eos_id)  # type: ignore[arg-type]
        if self._remove_special and tok.add_eos and i == tok.eos_id:
            self._held_eos = True
            return ""
        self._append(i)
        return self._emit(final=False)

    def flush(self) -> str:
        """The rest of the text; the decoder is then ready for a new sequence."""
        self._held_eos = False
        text = self._emit(final=True)
        self._first = True
        self._remove_space = self._tok.add_space_prefix and not self._continuation
        return text

    def _append(self, i: int) -> None:
        self._raw += self._tok.token_to_piece(i, self._special, 1 if self._remove_space else 0)
        self._remove_space = False

    def _emit(self, final: bool) -> str:
        raw = self._raw
        if final:
            cut = len(raw)
        elif not self._clean:
            cut = len(raw)
        else:
            # The clean-up looks at most three bytes around a space or apostrophe: keep back
            # the tail until the three bytes before the cut hold neither.
            cut = len(raw)
            while cut > 0 and any(c in b" '" for c in raw[max(0, cut - 3) : cut]):
                cut -= 1
        done = bytes(raw[:cut])
        del raw[:cut]
        if self._clean:
            done = _clean_spaces(done)
        return self._utf8.decode(done, final)
