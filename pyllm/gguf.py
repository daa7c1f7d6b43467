"""A validating, zero-copy reader for GGUF model files (versions 2 and 3, little-endian).

The layout, all integers little-endian::

    magic b"GGUF" | version: u32 | tensor_count: u64 | kv_count: u64
    kv_count     x (key: string, value_type: u32, value)
    tensor_count x (name: string, n_dims: u32, dims: u64 * n_dims, type: u32, offset: u64)
    padding to the alignment (``general.alignment``, default 32)
    tensor data: each tensor at data_offset + offset

where a string is (length: u64, UTF-8 bytes) and an array value is
(element_type: u32, count: u64, elements).

The file is mapped read-only and every header field is checked against the file before
it is used, so a damaged or hostile file raises `GGUFError` (a one-line message that
starts with the file path) instead of crashing, hanging or allocating memory in
proportion to a lying length field. Tensor data is never copied: `GGUFFile.raw` and
`GGUFFile.array` return numpy views of the mapping. `metadata_int` and its siblings read one
metadata value with its type and range checked.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import stat
import struct
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np

from ._pyllm_c import ffi, lib
from .strings import StringArray

__all__ = [
    "DEFAULT_ALIGNMENT",
    "GGUF_MAGIC",
    "MAX_ARRAY_DEPTH",
    "MAX_DIMS",
    "MIN_ALIGNMENT",
    "REQUIRED",
    "SUPPORTED_VERSIONS",
    "TYPE_TRAITS",
    "GGUFError",
    "GGUFFile",
    "TensorInfo",
    "ValueType",
    "metadata_bool",
    "metadata_float",
    "metadata_int",
    "metadata_str",
    "type_name",
]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# The GGUF spec's least alignment. The kernels read a tensor's blocks and floats in place, as C structs and
# floats, which must sit at addresses of their own alignment (2 or 4 bytes): an alignment of 1 put a Q8_0
# matrix at an odd address (undefined behaviour, UBSan's report).
MIN_ALIGNMENT = 8
MAX_DIMS = 4
# A metadata value may be an array of arrays, but no deeper.
MAX_ARRAY_DEPTH = 2
_INT64_MAX = 2**63 - 1


def _file_types() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, elements per block, bytes per block) of the tensor types pyllm reads from files, from the
    C core's type table (csrc/formats/types.c), the one copy."""
    types = {}
    for type_id in range(lib.PYLLM_TYPE_COUNT):
        entry = lib.pyllm_traits(type_id)
        if entry != ffi.NULL and entry.file_type:
            types[type_id] = (ffi.string(entry.name).decode(), entry.block_size, entry.type_size)
    return types


TYPE_TRAITS: dict[int, tuple[str, int, int]] = _file_types()


# The tensor types `GGUFFile.array` returns as typed views.
_FLOAT_DTYPES: dict[int, np.dtype[Any]] = {0: np.dtype("<f4"), 1: np.dtype("<f2")}


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "an unknown kind of file")


class ValueType(IntEnum):
    """The type ids of GGUF metadata values."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Scalar value types: how one value is stored (a bool is one byte, 0 or 1).
_SCALAR_STRUCTS: dict[int, struct.Struct] = {
    ValueType.UINT8: struct.Struct("<B"),
    ValueType.INT8: struct.Struct("<b"),
    ValueType.UINT16: struct.Struct("<H"),
    ValueType.INT16: struct.Struct("<h"),
    ValueType.UINT32: struct.Struct("<I"),
    ValueType.INT32: struct.Struct("<i"),
    ValueType.FLOAT32: struct.Struct("<f"),
    ValueType.BOOL: struct.Struct("<B"),
    ValueType.UINT64: struct.Struct("<Q"),
    ValueType.INT64: struct.Struct("<q"),
    ValueType.FLOAT64: struct.Struct("<d"),
}
# How arrays of scalars are read (bool arrays are checked, then viewed as np.bool_).
_SCALAR_DTYPES: dict[int, np.dtype[Any]] = {
    ValueType.UINT8: np.dtype("<u1"),
    ValueType.INT8: np.dtype("<i1"),
    ValueType.UINT16: np.dtype("<u2"),
    ValueType.INT16: np.dtype("<i2"),
    ValueType.UINT32: np.dtype("<u4"),
    ValueType.INT32: np.dtype("<i4"),
    ValueType.FLOAT32: np.dtype("<f4"),
    ValueType.BOOL: np.dtype("<u1"),
    ValueType.UINT64: np.dtype("<u8"),
    ValueType.INT64: np.dtype("<i8"),
    ValueType.FLOAT64: np.dtype("<f8"),
}
# The fewest bytes one value of each type takes: an empty string is its u64 length,
# an empty array its element type and count.
_MIN_VALUE_BYTES: dict[int, int] = {
    **{t: s.size for t, s in _SCALAR_STRUCTS.items()},
    ValueType.STRING: 8,
    ValueType.ARRAY: 12,
}
# The fewest bytes a metadata entry (empty key, value type, one-byte value) and a tensor
# info (empty name, n_dims, one dim, type, offset) take: they bound the header counts.
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class GGUFError(ValueError):
    """A file that is not a well-formed GGUF file pyllm can read."""


def type_name(type_id: int) -> str:
    """The ggml name of a tensor type id ("Q4_K" for 12); "unknown type <id>" if none.

    Ids pyllm does not support are named by the ``gguf`` package when it is installed.
    """
    traits = TYPE_TRAITS.get(type_id)
    if traits is not None:
        return traits[0]
    try:
        from gguf import GGMLQuantizationType
    except ImportError:
        return f"unknown type {type_id}"
    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"unknown type {type_id}"


def _value_type_name(type_id: int) -> str:
    try:
        return ValueType(type_id).name
    except ValueError:
        return f"unknown value type {type_id}"


# ---- typed metadata values -------------------------------------------------------
#
# A key's value is checked by its Python type, which the reader derives from the GGUF value type (integers ->
# int, floats -> float, bools -> bool, strings -> str, arrays -> numpy arrays, StringArrays or lists), so the
# same checks serve a GGUFFile's metadata and a plain dict. `error(message)` builds the exception to raise
# (the caller's class, its file path in front).

REQUIRED: Any = object()  # the default of a key that must be present
MakeError = Callable[[str], Exception]


def _describe(value: Any) -> str:
    """What a metadata value is, for messages (an array by its length, not its elements)."""
    if isinstance(value, bool):
        return f"the bool {value}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the float {value}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("..." if len(value) > 40 else "")
    try:
        return f"an array of {len(value)}"
    except TypeError:
        return f"a {type(value).__name__}"


def _lookup(metadata: Mapping[str, Any], key: str, default: Any, error: MakeError) -> tuple[Any, bool]:
    """(the value, whether the file has it); error if it is required and absent."""
    if key in metadata:
        return metadata[key], True
    if default is REQUIRED:
        raise error(f"missing metadata key {key}")
    return default, False


def metadata_int(metadata: Mapping[str, Any], key: str, default: Any = REQUIRED, *, lo: int, hi: int,
                 error: MakeError) -> int:
    """An integer value (of any GGUF integer type) in [lo, hi]; a bool, float, string or array is refused."""
    value, present = _lookup(metadata, key, default, error)
    if not present:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{key} holds {_describe(value)}, expected an integer")
    if not lo <= value <= hi:
        raise error(f"{key} = {value} is out of range (expected {lo} to {hi})")
    return value


def metadata_float(metadata: Mapping[str, Any], key: str, default: Any = REQUIRED, *,
                   error: MakeError) -> float:
    """A finite number (a float, or an integer stored for one); NaN, infinities, bools, strings, arrays refused."""
    value, present = _lookup(metadata, key, default, error)
    if not present:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"{key} holds {_describe(value)}, expected a number")
    if not math.isfinite(value):
        raise error(f"{key} = {value} is not a finite number")
    return float(value)


def metadata_str(metadata: Mapping[str, Any], key: str, default: Any = REQUIRED, *, error: MakeError) -> str:
    value, present = _lookup(metadata, key, default, error)
    if present and not isinstance(value, str):
        raise error(f"{key} holds {_describe(value)}, expected a string")
    return value


def metadata_bool(metadata: Mapping[str, Any], key: str, default: Any = REQUIRED, *, error: MakeError) -> bool:
    value, present = _lookup(metadata, key, default, error)
    if present and not isinstance(value, bool):
        raise error(f"{key} holds {_describe(value)}, expected a bool")
    return value


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file.

    `shape` is in GGUF order: shape[0] (ne0) is the contiguous row length, so the
    numpy shape of the tensor is shape[::-1]. `offset` is absolute in the file.
    """

    name: str
    type: int
    shape: tuple[int, ...]
    offset: int
    n_bytes: int
    n_elements: int

    @property
    def type_name(self) -> str:
        return type_name(self.type)

    @property
    def n_rows(self) -> int:
        """The number of rows: the product of shape[1:]."""
        return self.n_elements // self.shape[0]

    @property
    def row_bytes(self) -> int:
        """The bytes of one row of shape[0] elements."""
        _, block_size, type_size = TYPE_TRAITS[self.type]
        return self.shape[0] // block_size * type_size


class _Cursor:
    """Bounds-checked reads from the mapped file; every failure is a GGUFError."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf = buf
        self.path = path
        self.size = len(buf)
        self.pos = 0

    def error(self, message: str) -> GGUFError:
        return GGUFError(f"{self.path}: {message}")

    @property
    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> int:
        """Claim the next n bytes for `what`; return their offset."""
        start = self.pos
        if n > self.size - start:
            raise self.error(
                f"truncated while reading {what}: {n} bytes needed at offset {start}, "
                f"{self.size - start} left"
            )
        self.pos = start + n
        return start

    def u32(self, what: str) -> int:
        return _U32.unpack_from(self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64.unpack_from(self.buf, self.take(8, what))[0]

    def string(self, what: str) -> str:
        """A length-prefixed UTF-8 string."""
        n = self.u64(f"the length of {what}")
        start = self.take(n, what)
        try:
            return self.buf[start : start + n].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.utf8_error(what, start, exc) from None

    def utf8_error(self, what: str, start: int, exc: UnicodeDecodeError) -> GGUFError:
        return self.error(f"{what} at offset {start} is not valid UTF-8 ({exc.reason} at byte {exc.start})")

    def string_array(self, what: str, count: int) -> StringArray:
        """`count` length-prefixed UTF-8 strings, packed into one `StringArray` (no str per element)."""
        buf, unpack, size = self.buf, _U64.unpack_from, self.size
        start = pos = self.pos
        lengths = array("q")   # each element's bytes
        prefixes = array("q")  # where each length prefix sits, from `start`
        for i in range(count):
            if size - pos < 8:
                self.pos = pos
                self.u64(f"the length of {what}[{i}]")  # raises: truncated
            n = unpack(buf, pos)[0]
            if n > size - pos - 8:
                self.pos = pos + 8
                self.take(n, f"{what}[{i}]")  # raises: truncated
            prefixes.append(pos - start)
            lengths.append(n)
            pos += 8 + n
        self.pos = pos
        offsets = np.zeros(count + 1, np.int64)  # into the packed blob, which drops the length prefixes
        np.cumsum(np.frombuffer(lengths, np.int64), out=offsets[1:])
        prefixes = np.frombuffer(prefixes, np.int64)
        region = np.frombuffer(buf, np.uint8, pos - start, start)
        in_prefix = np.zeros(len(region) + 1, np.int8)  # +1 inside a length prefix, by a running sum
        np.add.at(in_prefix, prefixes, 1)
        np.add.at(in_prefix, prefixes + 8, -1)
        blob = region[np.cumsum(in_prefix[:-1], dtype=np.int8) == 0].tobytes()
        strings = StringArray(blob, offsets)
        if not self._packed_utf8_valid(blob, offsets):
            for i in range(count):  # find the first bad one, for the message
                element = strings.raw(i)
                try:
                    element.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise self.utf8_error(f"{what}[{i}]", start + int(prefixes[i]) + 8, exc) from None
        return strings

    @staticmethod
    def _packed_utf8_valid(blob: bytes, offsets: np.ndarray) -> bool:
        """Whether every element is valid UTF-8: the whole blob is, and no element starts inside a
        character (then each ends where the next one starts, at a character boundary too)."""
        try:
            blob.decode("utf-8")
        except UnicodeDecodeError:
            return False
        starts = offsets[:-1][np.diff(offsets) > 0]
        return not (np.frombuffer(blob, np.uint8)[starts] & 0xC0 == 0x80).any()

    def value(self, vtype: int, what: str) -> Any:
        """One scalar or string metadata value of type `vtype` (arrays: see `array`)."""
        scalar = _SCALAR_STRUCTS.get(vtype)
        if scalar is not None:
            value = scalar.unpack_from(self.buf, self.take(scalar.size, what))[0]
            if vtype == ValueType.BOOL:
                if value > 1:
                    raise self.error(f"{what} is a bool stored as {value} (must be 0 or 1)")
                return bool(value)
            return value
        if vtype == ValueType.STRING:
            return self.string(what)
        raise self.error(f"{what} has unknown value type {vtype}")

    def array(self, what: str, depth: int) -> tuple[int, Any]:
        """An array value: (element type, elements).

        Scalar elements come back as a 1-D numpy array (a copy), strings as a
        `StringArray`, arrays as a list of their values.
        """
        if depth >= MAX_ARRAY_DEPTH:
            raise self.error(f"{what} nests arrays deeper than {MAX_ARRAY_DEPTH} levels")
        etype = self.u32(f"the element type of {what}")
        count = self.u64(f"the length of {what}")
        min_bytes = _MIN_VALUE_BYTES.get(etype)
        if min_bytes is None:
            raise self.error(f"{what} is an array of unknown value type {etype}")
        if count * min_bytes > self.left:
            raise self.error(
                f"{what} claims {count} {ValueType(etype).name} elements at offset {self.pos}, "
                f"more than the {self.left} bytes left in the file can hold"
            )
        dtype = _SCALAR_DTYPES.get(etype)
        if dtype is not None:
            start = self.take(count * dtype.itemsize, what)
            values = np.frombuffer(self.buf, dtype, count, start).copy()
            if etype == ValueType.BOOL:
                if (values > 1).any():
                    raise self.error(f"{what} holds a bool that is not 0 or 1")
                values = values.view(np.bool_)
            return etype, values
        if etype == ValueType.STRING:
            return etype, self.string_array(what, count)
        return etype, [self.array(f"{what}[{i}]", depth + 1)[1] for i in range(count)]


class GGUFFile:
    """A GGUF file mapped read-only, its header parsed and validated.

    Attributes:
        path: the file.
        version: the GGUF version (2 or 3).
        metadata: key -> value, in file order. Integers, floats, bools and strings
            are Python values; an array of scalars is a 1-D numpy array (a copy), an
            array of strings a `StringArray`, an array of arrays a list of those.
        metadata_types: key -> its `ValueType` id.
        array_types: for each array-valued key, the `ValueType` id of its elements.
        tensors: name -> `TensorInfo`, in file order.
        alignment: the tensor data alignment (``general.alignment``, default 32).
        data_offset: the offset of the tensor data section.

    Use it as a context manager or call `close()`. Arrays returned by `raw()` and
    `array()` keep the mapping alive on their own, so they stay valid after `close()`.
    Raises GGUFError for a malformed file and for one that cannot be read (missing, not a regular file,
    no permission).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.version = 0
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, int] = {}
        self.array_types: dict[str, int] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.alignment = DEFAULT_ALIGNMENT
        self.data_offset = 0
        self._mm: mmap.mmap | None = self._map()
        try:
            self._parse(_Cursor(self._mm, self.path))
        except BaseException:
            self.close()
            raise

    def _map(self) -> mmap.mmap:
        """The file mapped read-only. Only a regular file is opened: a directory, FIFO, socket or device is
        refused from its stat (opening a FIFO would wait for a writer), and the open itself does not block, in
        case the path was swapped for one since; the descriptor's own stat is checked again."""
        try:
            mode = os.stat(self.path).st_mode
            if not stat.S_ISREG(mode):
                raise GGUFError(f"{self.path}: not a regular file ({_file_kind(mode)})")
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise GGUFError(f"{self.path}: not a regular file ({_file_kind(st.st_mode)})")
                if st.st_size == 0:
                    raise GGUFError(f"{self.path}: truncated while reading the magic: the file is empty")
                return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
        except OSError as exc:
            raise GGUFError(f"{self.path}: cannot read the file: {exc.strerror or exc}") from None

    def _parse(self, cur: _Cursor) -> None:
        start = cur.take(4, "the magic")
        magic = cur.buf[start : start + 4]
        if magic != GGUF_MAGIC:
            raise cur.error(f"bad magic {magic!r} (expected {GGUF_MAGIC!r}): not a GGUF file")
        self.version = self._check_version(cur, cur.u32("the version"))
        n_tensors = cur.u64("the tensor count")
        n_kv = cur.u64("the metadata key count")
        if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > cur.left:
            raise cur.error(
                f"{n_tensors} tensors and {n_kv} metadata keys cannot fit in the "
                f"{cur.left} bytes after the header counts"
            )
        self._parse_metadata(cur, n_kv)
        self.alignment = self._check_alignment(cur)
        infos = self._parse_tensor_infos(cur, n_tensors)
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self._place_tensors(cur, infos)

    @staticmethod
    def _check_version(cur: _Cursor, version: int) -> int:
        if version in SUPPORTED_VERSIONS:
            return version
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in SUPPORTED_VERSIONS:
            raise cur.error(f"big-endian GGUF (version {swapped}) is not supported")
        if version == 1:
            raise cur.error("GGUF version 1 is not supported (only versions 2 and 3)")
        raise cur.error(f"unsupported GGUF version {version} (only versions 2 and 3)")

    def _parse_metadata(self, cur: _Cursor, n_kv: int) -> None:
        for i in range(n_kv):
            key = cur.string(f"the key of metadata entry #{i}")
            if key in self.metadata:
                raise cur.error(f"duplicate metadata key {key!r}")
            what = f"metadata {key!r}"
            vtype = cur.u32(f"the value type of {what}")
            if vtype == ValueType.ARRAY:
                self.array_types[key], value = cur.array(what, 0)
            else:
                value = cur.value(vtype, what)
            self.metadata_types[key] = vtype
            self.metadata[key] = value

    def _check_alignment(self, cur: _Cursor) -> int:
        key = "general.alignment"
        if key not in self.metadata:
            return DEFAULT_ALIGNMENT
        vtype = self.metadata_types[key]
        if vtype != ValueType.UINT32:
            raise cur.error(f"{key} must be a UINT32, not {_value_type_name(vtype)}")
        alignment = self.metadata[key]
        if alignment == 0 or alignment & (alignment - 1):
            raise cur.error(f"{key} = {alignment} is not a nonzero power of two")
        if alignment < MIN_ALIGNMENT:
            raise cur.error(f"{key} = {alignment} is below {MIN_ALIGNMENT} (the GGUF spec asks for a multiple of 8)")
        return alignment

    def _parse_tensor_infos(self, cur: _Cursor, n_tensors: int) -> list[tuple[str, int, tuple[int, ...], int]]:
        """The (name, type, shape, offset relative to the data section) of each tensor, checked."""
        infos: list[tuple[str, int, tuple[int, ...], int]] = []
        names: set[str] = set()
        for i in range(n_tensors):
            name = cur.string(f"the name of tensor #{i}")
            if name in names:
                raise cur.error(f"duplicate tensor name {name!r}")
            names.add(name)
            what = f"tensor {name!r}"
            n_dims = cur.u32(f"the dimension count of {what}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise cur.error(f"{what} has {n_dims} dimensions (must be 1 to {MAX_DIMS})")
            shape = struct.unpack_from(f"<{n_dims}Q", cur.buf, cur.take(8 * n_dims, f"the shape of {what}"))
            type_id = cur.u32(f"the type of {what}")
            rel_offset = cur.u64(f"the data offset of {what}")
            self._check_tensor(cur, what, shape, type_id, rel_offset)
            infos.append((name, type_id, shape, rel_offset))
        return infos

    def _check_tensor(self, cur: _Cursor, what: str, shape: tuple[int, ...], type_id: int, rel_offset: int) -> None:
        for axis, dim in enumerate(shape):
            if not 1 <= dim <= _INT64_MAX:
                raise cur.error(f"{what} has dimension {axis} = {dim} (must be 1 to 2**63-1)")
        n_elements = math.prod(shape)
        if n_elements > _INT64_MAX:
            raise cur.error(f"{what} of shape {list(shape)} has {n_elements} elements, which overflows int64")
        traits = TYPE_TRAITS.get(type_id)
        if traits is None:
            raise cur.error(f"{what}: {type_name(type_id)} (ggml type {type_id}) is not supported")
        tname, block_size, _ = traits
        if shape[0] % block_size:
            raise cur.error(
                f"{what} row length {shape[0]} is not a multiple of the {tname} block size {block_size}"
            )
        if rel_offset % self.alignment:
            raise cur.error(f"{what} data offset {rel_offset} is not a multiple of the alignment {self.alignment}")

    def _place_tensors(self, cur: _Cursor, infos: list[tuple[str, int, tuple[int, ...], int]]) -> None:
        """Make the TensorInfos; check that each tensor's data lies in the file, apart from the others."""
        for name, type_id, shape, rel_offset in infos:
            _, block_size, type_size = TYPE_TRAITS[type_id]
            n_elements = math.prod(shape)
            n_bytes = n_elements // block_size * type_size
            offset = self.data_offset + rel_offset
            if offset + n_bytes > cur.size:
                raise cur.error(
                    f"tensor {name!r} data [{offset}, {offset + n_bytes}) extends past the end of the file "
                    f"({cur.size} bytes)"
                )
            self.tensors[name] = TensorInfo(name, type_id, shape, offset, n_bytes, n_elements)
        previous: TensorInfo | None = None
        for info in sorted(self.tensors.values(), key=lambda t: t.offset):
            if previous is not None and info.offset < previous.offset + previous.n_bytes:
                raise cur.error(
                    f"tensor {info.name!r} data [{info.offset}, {info.offset + info.n_bytes}) overlaps "
                    f"tensor {previous.name!r} data [{previous.offset}, {previous.offset + previous.n_bytes})"
                )
            previous = info

    def get(self, key: str, default: Any = None) -> Any:
        """The metadata value of `key`, or `default`."""
        return self.metadata.get(key, default)

    def _buffer(self) -> mmap.mmap:
        if self._mm is None:
            raise ValueError(f"{self.path}: the GGUF file is closed")
        return self._mm

    def _info(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        return info

    def raw(self, name: str) -> np.ndarray:
        """The bytes of tensor `name`: a read-only uint8 view of shape (n_rows, row_bytes)."""
        info = self._info(name)
        data = np.frombuffer(self._buffer(), np.uint8, info.n_bytes, info.offset)
        return data.reshape(info.n_rows, info.row_bytes)

    def release(self, name: str, start: int = 0, stop: int | None = None) -> None:
        """Done with tensor `name`'s bytes [start, stop) for now (a copy replaced them; default: all of them): the
        pages wholly inside leave this process's resident set; a later read maps them in again from the file."""
        info = self._info(name)
        stop = info.n_bytes if stop is None else min(stop, info.n_bytes)
        page = mmap.PAGESIZE
        start = -(-(info.offset + start) // page) * page
        end = (info.offset + stop) // page * page
        if end > start and hasattr(mmap, "MADV_DONTNEED"):
            self._buffer().madvise(mmap.MADV_DONTNEED, start, end - start)

    def array(self, name: str) -> np.ndarray:
        """Tensor `name` as a read-only view: F32 and F16 typed, in numpy order (shape[::-1]);
        other types as the uint8 rows of `raw()`."""
        info = self._info(name)
        dtype = _FLOAT_DTYPES.get(info.type)
        if dtype is None:
            return self.raw(name)
        data = np.frombuffer(self._buffer(), dtype, info.n_elements, info.offset)
        return data.reshape(info.shape[::-1])

    def close(self) -> None:
        """Drop the mapping. Views handed out keep it alive until they are garbage."""
        mm, self._mm = self._mm, None
        if mm is not None:
            with contextlib.suppress(BufferError):  # live views: unmapped when the last one goes
                mm.close()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = ", closed" if self._mm is None else ""
        return (
            f"GGUFFile({str(self.path)!r}, version={self.version}, {len(self.metadata)} keys, "
            f"{len(self.tensors)} tensors{state})"
        )
