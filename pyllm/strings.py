"""`StringArray`: a read-only list of strings packed into one UTF-8 blob, with a C hash index.

A tokenizer's vocabulary is the largest thing in a GGUF header: Gemma 3's 262,144 token texts
as Python strs take about 20 MiB, and a dict from text to id another 18. Packed, the same texts
take their bytes plus 8 bytes of offset each, and the index (csrc/strings.c) 4 bytes a slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np

from ._pyllm_c import ffi, lib

__all__ = ["StringArray"]

_find = lib.pyllm_string_index_find


class StringArray(Sequence[str]):
    """Element i is ``blob[offsets[i]:offsets[i + 1]]`` decoded as UTF-8; `find` maps text back to i.

    The caller guarantees that every element is valid UTF-8 (`from_strings` does by construction;
    the GGUF reader checks the file's bytes before it builds one).
    """

    __slots__ = ("_blob", "_offsets", "_index", "_first_repeat")

    def __init__(self, blob: bytes, offsets: np.ndarray) -> None:
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(blob) \
                or (np.diff(offsets) < 0).any():
            raise ValueError("offsets must ascend from 0 to the blob's length")
        self._blob = blob
        self._offsets = offsets
        self._index = None
        self._first_repeat = -1

    @classmethod
    def from_strings(cls, strings: Iterable[str]) -> StringArray:
        encoded = [s.encode("utf-8") for s in strings]
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        return cls(b"".join(encoded), offsets)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.raw(i).decode("utf-8")

    def raw(self, i: int) -> bytes:
        """Element i's UTF-8 bytes."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} strings")
        i %= n
        return self._blob[self._offsets[i] : self._offsets[i + 1]]

    def __iter__(self) -> Iterator[str]:
        blob, bounds = self._blob, self._offsets.tolist()
        for start, end in zip(bounds, bounds[1:], strict=False):
            yield blob[start:end].decode("utf-8")

    def lengths(self) -> np.ndarray:
        """(n,) int64: each element's length in bytes."""
        return np.diff(self._offsets)

    def _built_index(self):  # noqa: ANN202 - a cffi pointer
        if self._index is None:
            first_repeat = ffi.new("int64_t *")
            index = lib.pyllm_string_index_new(ffi.from_buffer(self._blob), ffi.from_buffer("int64_t[]", self._offsets),
                                               len(self), first_repeat)
            if index == ffi.NULL:
                raise MemoryError(f"no memory for the index of {len(self)} strings")
            self._index = ffi.gc(index, lib.pyllm_string_index_free)
            self._first_repeat = int(first_repeat[0])
        return self._index

    def find(self, text: str | bytes) -> int:
        """The first i with self[i] == text, or -1. (A str with lone surrogates matches nothing.)"""
        index = self._index if self._index is not None else self._built_index()
        if isinstance(text, str):
            try:
                text = text.encode()
            except UnicodeEncodeError:
                return -1
        return _find(index, text, len(text))

    def first_repeat(self) -> int:
        """The first i whose text an earlier element already has, or -1 if all differ."""
        self._built_index()
        return self._first_repeat

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str | bytes) and self.find(text) >= 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray | list | tuple):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:4])
        return f"StringArray([{head}{', ...' if len(self) > 4 else ''}], {len(self)} strings)"
