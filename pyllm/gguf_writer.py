"""Writes GGUF files (version 3, little-endian): the layout `pyllm.gguf` reads.

The header (metadata, then each tensor's name, shape, type and data offset) is written first, then each tensor's bytes
in the order the header lists them, each starting on a multiple of the alignment. Tensor data is streamed: a tensor
can arrive in pieces, so a quantizer never holds a whole model. The file is written under a temporary name beside the
target and renamed over it once complete, so a failure leaves no half-written model behind.
"""

from __future__ import annotations

import math
import os
import struct
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .gguf import _SCALAR_DTYPES, _SCALAR_STRUCTS, DEFAULT_ALIGNMENT, GGUF_MAGIC, TYPE_TRAITS, ValueType
from .strings import StringArray

__all__ = ["GGUFWriter", "MetadataValue", "TensorEntry", "metadata_of"]

GGUF_VERSION = 3
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class MetadataValue:
    """One metadata value and its GGUF type: `element_type` is the element type of an array (`value_type` ARRAY)."""

    value_type: int
    value: Any
    element_type: int | None = None


@dataclass(frozen=True)
class TensorEntry:
    """A tensor to write: shape in GGUF order (shape[0] the row length)."""

    name: str
    type: int
    shape: tuple[int, ...]

    @property
    def n_bytes(self) -> int:
        _, block_size, type_size = TYPE_TRAITS[self.type]
        return math.prod(self.shape) // block_size * type_size


def metadata_of(f: Any) -> dict[str, MetadataValue]:
    """A read file's (`pyllm.gguf.GGUFFile`) metadata with its types, in file order, ready to write back."""
    return {key: MetadataValue(f.metadata_types[key], value, f.array_types.get(key))
            for key, value in f.metadata.items()}


def _string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return _U64.pack(len(raw)) + raw


def _inferred_type(value: Any) -> int:
    """The value type of an element of an array of arrays, as the reader returns it (a numpy array, a StringArray or
    a list)."""
    if isinstance(value, StringArray):
        return ValueType.STRING
    if isinstance(value, list):
        return ValueType.ARRAY
    array = np.asarray(value)
    if array.dtype == np.bool_:
        return ValueType.BOOL
    for vtype, dtype in _SCALAR_DTYPES.items():
        if vtype != ValueType.BOOL and array.dtype == dtype:
            return vtype
    raise ValueError(f"cannot tell the GGUF type of an array of {array.dtype}")


def _array(element_type: int, values: Any) -> bytes:
    head = _U32.pack(element_type) + _U64.pack(len(values))
    dtype = _SCALAR_DTYPES.get(element_type)
    if dtype is not None:
        return head + np.asarray(values).astype(dtype).tobytes()
    if element_type == ValueType.STRING:
        items = (values.raw(i) for i in range(len(values))) if isinstance(values, StringArray) else values
        return head + b"".join(_string(s) for s in items)
    if element_type == ValueType.ARRAY:
        return head + b"".join(_array(_inferred_type(v), v) for v in values)
    raise ValueError(f"unknown array element type {element_type}")


def _value(entry: MetadataValue) -> bytes:
    scalar = _SCALAR_STRUCTS.get(entry.value_type)
    if scalar is not None:
        return scalar.pack(entry.value)
    if entry.value_type == ValueType.STRING:
        return _string(entry.value)
    if entry.value_type == ValueType.ARRAY:
        element_type = entry.element_type if entry.element_type is not None else _inferred_type(entry.value)
        return _array(element_type, entry.value)
    raise ValueError(f"unknown metadata value type {entry.value_type}")


def _n_dims(shape: tuple[int, ...]) -> int:
    """ggml's dimension count: trailing dimensions of 1 are not written."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return n


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


class GGUFWriter:
    """Use as a context manager: the header is written on entry; then `write(name, pieces)` once a tensor, in the
    order given; on a clean exit the file is checked complete and moved to `path`."""

    def __init__(self, path: str | os.PathLike[str], metadata: dict[str, MetadataValue],
                 tensors: list[TensorEntry]) -> None:
        self.path = Path(path)
        self.metadata = metadata
        self.tensors = tensors
        alignment = metadata.get("general.alignment")
        self.alignment = int(alignment.value) if alignment is not None else DEFAULT_ALIGNMENT
        self._next = 0
        self._file: BinaryIO | None = None
        self._tmp: Path | None = None

    def _header(self) -> bytes:
        parts = [GGUF_MAGIC, _U32.pack(GGUF_VERSION), _U64.pack(len(self.tensors)), _U64.pack(len(self.metadata))]
        for key, entry in self.metadata.items():
            parts += [_string(key), _U32.pack(entry.value_type), _value(entry)]
        offset = 0
        for t in self.tensors:
            n_dims = _n_dims(t.shape)
            parts += [_string(t.name), _U32.pack(n_dims), struct.pack(f"<{n_dims}Q", *t.shape[:n_dims]),
                      _U32.pack(t.type), _U64.pack(offset)]
            offset += t.n_bytes + _pad(t.n_bytes, self.alignment)
        header = b"".join(parts)
        return header + bytes(_pad(len(header), self.alignment))

    def __enter__(self) -> GGUFWriter:
        fd, name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".part", dir=self.path.parent)
        self._tmp = Path(name)
        umask = os.umask(0)  # mkstemp makes the file private; the model gets the permissions any new file would
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        self._file = os.fdopen(fd, "wb")
        try:
            self._file.write(self._header())
        except BaseException:
            self._discard()
            raise
        return self

    def write(self, name: str, pieces: Iterable[bytes | np.ndarray | memoryview]) -> None:
        """Tensor `name`'s bytes, in pieces that add up to its size (the next tensor of the header)."""
        assert self._file is not None, "GGUFWriter.write outside its with-block"
        if self._next >= len(self.tensors) or self.tensors[self._next].name != name:
            raise ValueError(f"tensor {name!r} written out of order")
        entry = self.tensors[self._next]
        written = 0
        for piece in pieces:
            data = memoryview(np.ascontiguousarray(piece) if isinstance(piece, np.ndarray) else piece).cast("B")
            self._file.write(data)
            written += data.nbytes
        if written != entry.n_bytes:
            raise ValueError(f"tensor {name!r}: {written} bytes written, its type and shape make {entry.n_bytes}")
        self._file.write(bytes(_pad(written, self.alignment)))
        self._next += 1

    def _discard(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        if exc_type is not None or self._next != len(self.tensors):
            missing = len(self.tensors) - self._next
            self._discard()
            if exc_type is None:
                raise ValueError(f"{missing} tensors were never written")
            return
        assert self._file is not None and self._tmp is not None
        self._file.close()
        self._file = None
        os.replace(self._tmp, self.path)
        self._tmp = None
