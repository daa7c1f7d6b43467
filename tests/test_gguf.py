"""Tests of pyllm.gguf: valid files, a corpus of damaged files, fuzzing, and the real models."""

from __future__ import annotations

import hashlib
import itertools
import re
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from fixture_models import write_fixture_model
from gguf import GGMLQuantizationType, GGUFValueType
from hypothesis import given, settings
from hypothesis import strategies as st

from pyllm.gguf import TYPE_TRAITS, GGUFError, GGUFFile, TensorInfo, ValueType, type_name

VT = ValueType
Q8_0 = GGMLQuantizationType.Q8_0

# ---------------------------------------------------------------------------
# A byte-exact GGUF builder, so the damaged-file corpus can patch known positions.
# ---------------------------------------------------------------------------

_SCALAR_FORMATS = {
    VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I",
    VT.INT32: "<i", VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q",
    VT.FLOAT64: "<d",
}


def _string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def _value(vtype: int, value: Any) -> bytes:
    """A metadata value; an ARRAY value is (element type, items)."""
    if vtype == VT.STRING:
        return _string(value)
    if vtype == VT.ARRAY:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(_value(etype, v) for v in items)
    return struct.pack(_SCALAR_FORMATS[vtype], value)


@dataclass(frozen=True)
class Built:
    data: bytes
    at: dict[str, int]  # the offset of each named field (see build_gguf)

    def patch(self, field: str, fmt: str, *values: int, delta: int = 0) -> bytes:
        """The file with `values` packed at the offset of `field` (plus `delta`)."""
        data = bytearray(self.data)
        struct.pack_into(fmt, data, self.at[field] + delta, *values)
        return bytes(data)


Kv = tuple[str | bytes, int, Any]  # key, value type, value
Tensor = tuple[str | bytes, int, tuple[int, ...], bytes]  # name, ggml type, GGUF shape, data


def build_gguf(kvs: list[Kv], tensors: list[Tensor], *, alignment: int = 32, version: int = 3) -> Built:
    """A GGUF file laid out as GGUFWriter writes it: tensor data in order, each padded to
    the alignment. `at` names the offsets of the fields: version, tensor_count, kv_count,
    kv{i} (and kv{i}.type, kv{i}.value), ti{j} (and ti{j}.n_dims, .dims, .type, .offset),
    ti_end, data, t{j}.data, end."""
    out = bytearray(b"GGUF")
    at: dict[str, int] = {}

    def mark(name: str) -> None:
        at[name] = len(out)

    def pad() -> None:
        out.extend(bytes(-len(out) % alignment))

    mark("version")
    out += struct.pack("<I", version)
    mark("tensor_count")
    out += struct.pack("<Q", len(tensors))
    mark("kv_count")
    out += struct.pack("<Q", len(kvs))
    for i, (key, vtype, value) in enumerate(kvs):
        mark(f"kv{i}")
        out += _string(key)
        mark(f"kv{i}.type")
        out += struct.pack("<I", vtype)
        mark(f"kv{i}.value")
        out += _value(vtype, value)
    rel = 0
    for j, (name, ttype, shape, data) in enumerate(tensors):
        mark(f"ti{j}")
        out += _string(name)
        mark(f"ti{j}.n_dims")
        out += struct.pack("<I", len(shape))
        mark(f"ti{j}.dims")
        out += struct.pack(f"<{len(shape)}Q", *shape)
        mark(f"ti{j}.type")
        out += struct.pack("<I", ttype)
        mark(f"ti{j}.offset")
        out += struct.pack("<Q", rel)
        rel += len(data) + -len(data) % alignment
    mark("ti_end")
    pad()
    mark("data")
    for j, (*_, data) in enumerate(tensors):
        mark(f"t{j}.data")
        out += data
        pad()
    mark("end")
    return Built(bytes(out), at)


# The content of the main test file, written both by build_gguf and by gguf.GGUFWriter.
F32_DATA = np.arange(12, dtype=np.float32).reshape(3, 4) / 7  # numpy shape (3, 4): GGUF (4, 3)
F16_DATA = np.linspace(-2, 2, 8, dtype=np.float16)
Q8_SOURCE = np.sin(np.arange(64, dtype=np.float32)).reshape(2, 32)
Q8_DATA = gguf.quants.quantize(Q8_SOURCE, Q8_0)  # (2, 34) uint8 blocks

SCALARS: list[Kv] = [
    ("general.architecture", VT.STRING, "test"),
    ("t.u8", VT.UINT8, 200),
    ("t.i8", VT.INT8, -100),
    ("t.u16", VT.UINT16, 60000),
    ("t.i16", VT.INT16, -30000),
    ("t.u32", VT.UINT32, 4_000_000_000),
    ("t.i32", VT.INT32, -2_000_000_000),
    ("t.u64", VT.UINT64, 2**64 - 1),
    ("t.i64", VT.INT64, -(2**63)),
    ("t.f32", VT.FLOAT32, 0.25),
    ("t.f64", VT.FLOAT64, 1e300),
    ("t.bool", VT.BOOL, True),
    ("t.str", VT.STRING, "héllo ✓ 日本"),
    ("t.ints", VT.ARRAY, (VT.INT32, [1, -2, 3])),
    ("t.strs", VT.ARRAY, (VT.STRING, ["a", "", "ü", "<s>"])),
]
TENSORS: list[Tensor] = [
    ("f32", 0, (4, 3), F32_DATA.tobytes()),
    ("f16", 1, (8,), F16_DATA.tobytes()),
    ("q8", 8, (32, 2), Q8_DATA.tobytes()),
]
BASE = build_gguf(SCALARS, TENSORS)


def write_with_gguf_writer(path: Path) -> None:
    writer = gguf.GGUFWriter(path, "test")
    for key, vtype, value in SCALARS[1:]:  # the writer adds general.architecture itself
        if vtype == VT.ARRAY:
            writer.add_key_value(key, value[1], GGUFValueType.ARRAY, sub_type=GGUFValueType(value[0]))
        else:
            writer.add_key_value(key, value, GGUFValueType(vtype))
    writer.add_tensor("f32", F32_DATA)
    writer.add_tensor("f16", F16_DATA)
    writer.add_tensor("q8", Q8_DATA, raw_dtype=Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------------------
# Valid files
# ---------------------------------------------------------------------------


def test_type_traits_match_ggml() -> None:
    for type_id, (name, block_size, type_size) in TYPE_TRAITS.items():
        assert GGMLQuantizationType(type_id).name == name
        assert gguf.GGML_QUANT_SIZES[GGMLQuantizationType(type_id)] == (block_size, type_size)
        assert type_name(type_id) == name
    assert type_name(16) == "IQ2_XXS"
    assert type_name(99) == "unknown type 99"


def test_builder_writes_what_gguf_writer_writes(tmp_path: Path) -> None:
    write_with_gguf_writer(tmp_path / "w.gguf")
    assert (tmp_path / "w.gguf").read_bytes() == BASE.data


def test_reads_gguf_writer_file(tmp_path: Path) -> None:
    path = tmp_path / "w.gguf"
    write_with_gguf_writer(path)
    with GGUFFile(path) as f:
        assert f.path == path
        assert f.version == 3
        assert f.alignment == 32
        assert f.data_offset == BASE.at["data"]
        assert list(f.metadata) == [key for key, _, _ in SCALARS]
        for key, vtype, value in SCALARS:
            assert f.metadata_types[key] == vtype
            if vtype == VT.ARRAY:
                assert f.array_types[key] == value[0]
                got = f.metadata[key]
                assert (got.tolist() if isinstance(got, np.ndarray) else got) == value[1]
            else:
                assert f.metadata[key] == value
                assert type(f.metadata[key]) is type(value)
        assert set(f.array_types) == {"t.ints", "t.strs"}
        assert f.metadata["t.ints"].dtype == np.int32
        assert f.get("t.u8") == 200
        assert f.get("missing") is None
        assert f.get("missing", 7) == 7

        assert list(f.tensors) == ["f32", "f16", "q8"]
        data = BASE.at["data"]
        assert f.tensors["f32"] == TensorInfo("f32", 0, (4, 3), data, 48, 12)
        assert f.tensors["f16"] == TensorInfo("f16", 1, (8,), data + 64, 16, 8)
        assert f.tensors["q8"] == TensorInfo("q8", 8, (32, 2), data + 96, 68, 64)
        assert f.tensors["q8"].type_name == "Q8_0"
        assert (f.tensors["q8"].n_rows, f.tensors["q8"].row_bytes) == (2, 34)

        for name, array in (("f32", F32_DATA), ("f16", F16_DATA), ("q8", Q8_DATA)):
            raw = f.raw(name)
            assert raw.dtype == np.uint8
            assert raw.tobytes() == array.tobytes()
            assert not raw.flags.owndata
            assert not raw.flags.writeable
        assert f.raw("f32").shape == (3, 16)
        assert f.raw("q8").shape == (2, 34)

        f32 = f.array("f32")
        assert f32.dtype == np.float32
        assert f32.shape == (3, 4)
        np.testing.assert_array_equal(f32, F32_DATA)
        assert not f32.flags.owndata
        assert np.shares_memory(f32, f.raw("f32"))
        f16 = f.array("f16")
        assert f16.dtype == np.float16
        np.testing.assert_array_equal(f16, F16_DATA)
        assert np.shares_memory(f.array("q8"), f.raw("q8"))
        np.testing.assert_array_equal(f.array("q8"), Q8_DATA)


def test_views_outlive_close(tmp_path: Path) -> None:
    f = GGUFFile(write(tmp_path / "m.gguf", BASE.data))
    view = f.array("f32")
    assert "3 tensors" in repr(f)
    f.close()
    f.close()
    assert "closed" in repr(f)
    np.testing.assert_array_equal(view, F32_DATA)
    with pytest.raises(ValueError, match="closed"):
        f.raw("f32")
    # metadata is copied out of the mapping
    assert f.metadata["t.str"] == "héllo ✓ 日本"
    assert f.metadata["t.ints"].flags.owndata
    assert f.metadata["t.ints"].tolist() == [1, -2, 3]


def test_unknown_tensor_name(tmp_path: Path) -> None:
    with GGUFFile(write(tmp_path / "m.gguf", BASE.data)) as f, pytest.raises(KeyError, match="nope"):
        f.raw("nope")


def test_version_2(tmp_path: Path) -> None:
    # v2 and v3 share the layout (v1 had 32-bit counts and lengths)
    with GGUFFile(write(tmp_path / "v2.gguf", BASE.patch("version", "<I", 2))) as f:
        assert f.version == 2
        assert f.raw("q8").tobytes() == Q8_DATA.tobytes()


def test_custom_alignment(tmp_path: Path) -> None:
    built = build_gguf([*SCALARS, ("general.alignment", VT.UINT32, 64)], TENSORS, alignment=64)
    with GGUFFile(write(tmp_path / "a.gguf", built.data)) as f:
        assert f.alignment == 64
        assert f.data_offset == built.at["data"]
        assert f.data_offset % 64 == 0
        assert [t.offset - f.data_offset for t in f.tensors.values()] == [0, 64, 128]
        np.testing.assert_array_equal(f.array("f32"), F32_DATA)


def test_no_tensors_and_empty_arrays(tmp_path: Path) -> None:
    kvs: list[Kv] = [
        ("e.ints", VT.ARRAY, (VT.UINT8, [])),
        ("e.strs", VT.ARRAY, (VT.STRING, [])),
        ("e.s", VT.STRING, ""),
    ]
    with GGUFFile(write(tmp_path / "e.gguf", build_gguf(kvs, []).data)) as f:
        assert f.tensors == {}
        assert f.metadata["e.ints"].shape == (0,)
        assert f.metadata["e.strs"] == []
        assert f.metadata["e.s"] == ""


def test_nested_and_bool_arrays(tmp_path: Path) -> None:
    kvs: list[Kv] = [
        ("n.nested", VT.ARRAY, (VT.ARRAY, [(VT.UINT16, [1, 2]), (VT.STRING, ["x"])])),
        ("n.bools", VT.ARRAY, (VT.BOOL, [True, False, True])),
        ("n.floats", VT.ARRAY, (VT.FLOAT32, [0.5, -1.5])),
    ]
    with GGUFFile(write(tmp_path / "n.gguf", build_gguf(kvs, []).data)) as f:
        outer = f.metadata["n.nested"]
        assert f.array_types["n.nested"] == VT.ARRAY
        assert outer[0].tolist() == [1, 2]
        assert outer[1] == ["x"]
        assert f.metadata["n.bools"].dtype == np.bool_
        assert f.metadata["n.bools"].tolist() == [True, False, True]
        assert f.metadata["n.floats"].tolist() == [0.5, -1.5]


def test_every_supported_type_reads(tmp_path: Path) -> None:
    tensors: list[Tensor] = []
    for type_id, (name, block_size, type_size) in TYPE_TRAITS.items():
        raw = bytes(range(256)) * (3 * type_size)
        tensors.append((name, type_id, (2 * block_size, 3), raw[: 6 * type_size]))
    with GGUFFile(write(tmp_path / "t.gguf", build_gguf([], tensors).data)) as f:
        for name, type_id, _, raw in tensors:
            assert f.tensors[name].type == type_id
            assert f.raw(name).tobytes() == raw
            assert f.raw(name).shape == (3, len(raw) // 3)


# ---------------------------------------------------------------------------
# Damaged files: each must raise a one-line GGUFError naming the file and the problem.
# ---------------------------------------------------------------------------

TRUNCATED = r"truncated|past the end|cannot fit|bytes left"


def assert_rejected(path: Path, pattern: str) -> None:
    with pytest.raises(GGUFError) as info:
        GGUFFile(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message
    assert re.search(pattern, message), message


def _patched(field: str, fmt: str, *values: int, delta: int = 0) -> Callable[[], bytes]:
    return lambda: BASE.patch(field, fmt, *values, delta=delta)


def _built(kvs: list[Kv], tensors: list[Tensor], **kwargs: int) -> Callable[[], bytes]:
    return lambda: build_gguf(kvs, tensors, **kwargs).data


def _with_byte(field: str, delta: int, byte: int) -> Callable[[], bytes]:
    return _patched(field, "<B", byte, delta=delta)


def kv(key: str, field: str = "") -> str:
    """The `Built.at` name of a field of BASE's metadata entry `key` ("" for its start, ".type", ".value")."""
    return f"kv{[k for k, _, _ in SCALARS].index(key)}{field}"


CORPUS: dict[str, tuple[Callable[[], bytes], str]] = {
    "bad magic": (lambda: b"GGUG" + BASE.data[4:], "bad magic"),
    "not gguf": (lambda: b"\x89PNG\r\n\x1a\n" + bytes(100), "bad magic"),
    "version 1": (_patched("version", "<I", 1), "version 1 is not supported"),
    "version 0": (_patched("version", "<I", 0), "unsupported GGUF version 0"),
    "version 4": (_patched("version", "<I", 4), "unsupported GGUF version 4"),
    "version 0xffffffff": (_patched("version", "<I", 0xFFFFFFFF), "unsupported GGUF version 4294967295"),
    "big-endian": (_patched("version", ">I", 3), "big-endian"),
    "tensor count 2**63": (_patched("tensor_count", "<Q", 2**63), "cannot fit"),
    "tensor count 2**64-1": (_patched("tensor_count", "<Q", 2**64 - 1), "cannot fit"),
    "kv count 2**63": (_patched("kv_count", "<Q", 2**63), "cannot fit"),
    "kv count 2**64-1": (_patched("kv_count", "<Q", 2**64 - 1), "cannot fit"),
    # the first tensor info read as a key and a UINT16 (its n_dims): the tensor infos then start mid-field
    "kv count + 1": (_patched("kv_count", "<Q", len(SCALARS) + 1), "tensor #0"),
    "tensor count + 1": (_patched("tensor_count", "<Q", len(TENSORS) + 1), "tensor ''"),
    "key length 2**63": (_patched("kv0", "<Q", 2**63), "truncated while reading the key of metadata entry #0"),
    "string value length 2**63": (
        _patched(kv("t.str", ".value"), "<Q", 2**63), "truncated while reading metadata 't.str'"
    ),
    "string length 2**64-1": (_patched(kv("t.str", ".value"), "<Q", 2**64 - 1), "truncated"),
    "array element string length 2**63": (
        _patched(kv("t.strs", ".value"), "<Q", 2**63, delta=12), r"metadata 't\.strs'\[0\]"
    ),
    "tensor name length 2**63": (_patched("ti0", "<Q", 2**63), "the name of tensor #0"),
    "array length 2**62": (_patched(kv("t.ints", ".value"), "<Q", 2**62, delta=4), "more than the .* bytes left"),
    "array length 2**64-1": (_patched(kv("t.ints", ".value"), "<Q", 2**64 - 1, delta=4), "bytes left"),
    "string array length 2**60": (_patched(kv("t.strs", ".value"), "<Q", 2**60, delta=4), "bytes left"),
    # one more i32 element eats half of the next key's (t.strs) length, which becomes huge
    "array length + 1": (_patched(kv("t.ints", ".value"), "<Q", 4, delta=4), "the key of metadata entry #14"),
    "unknown value type": (_patched(kv("t.bool", ".type"), "<I", 13), "unknown value type 13"),
    "unknown value type 2**32-1": (_patched(kv("t.bool", ".type"), "<I", 2**32 - 1), "unknown value type"),
    "unknown array element type": (_patched(kv("t.ints", ".value"), "<I", 13), "unknown value type 13"),
    "bool 2": (_with_byte(kv("t.bool", ".value"), 0, 2), "metadata 't.bool' is a bool stored as 2"),
    "invalid UTF-8 key": (_with_byte("kv1", 8, 0xFF), "key of metadata entry #1 .*UTF-8"),
    "invalid UTF-8 value": (_with_byte(kv("t.str", ".value"), 9, 0xFF), "metadata 't.str' .*UTF-8"),
    "invalid UTF-8 array string": (_with_byte(kv("t.strs", ".value"), 20, 0xC3), r"'t\.strs'\[0\] .*UTF-8"),
    "invalid UTF-8 tensor name": (_with_byte("ti0", 8, 0x80), "tensor #0 .*UTF-8"),
    "n_dims 0": (_patched("ti0.n_dims", "<I", 0), "tensor 'f32' has 0 dimensions"),
    "n_dims 5": (_patched("ti0.n_dims", "<I", 5), "tensor 'f32' has 5 dimensions"),
    "n_dims 2**32-1": (_patched("ti0.n_dims", "<I", 2**32 - 1), "dimensions"),
    "dim 0": (_patched("ti0.dims", "<Q", 0, delta=8), "tensor 'f32' has dimension 1 = 0"),
    "dim 2**63 (negative)": (_patched("ti0.dims", "<Q", 2**63), "dimension 0 = 9223372036854775808"),
    "dim 2**64-1": (_patched("ti0.dims", "<Q", 2**64 - 1), "dimension 0"),
    "element count overflow": (_patched("ti0.dims", "<QQ", 2**32, 2**32), "has 18446744073709551616 elements"),
    "row length not a block multiple": (_patched("ti2.dims", "<Q", 16), "not a multiple of the Q8_0 block size 32"),
    "unknown type 99": (_patched("ti1.type", "<I", 99), r"tensor 'f16': unknown type 99 \(ggml type 99\) is not supp"),
    "unsupported IQ2_XXS": (_patched("ti1.type", "<I", 16), r"tensor 'f16': IQ2_XXS \(ggml type 16\) is not supported"),
    "unsupported Q8_1": (_patched("ti1.type", "<I", 9), "Q8_1 .*not supported"),
    "misaligned offset": (_patched("ti1.offset", "<Q", 65), "offset 65 is not a multiple of the alignment 32"),
    "offset past end": (_patched("ti1.offset", "<Q", 2**40), "tensor 'f16' data .* extends past the end"),
    "offset 2**64-32": (_patched("ti2.offset", "<Q", 2**64 - 32), "extends past the end"),
    "overlap": (_patched("ti1.offset", "<Q", 32), "tensor 'f16' .* overlaps tensor 'f32'"),
    "overlap same offset": (_patched("ti2.offset", "<Q", 0), "overlaps"),
    "duplicate tensor": (_built([], [TENSORS[0], TENSORS[1], TENSORS[0]]), "duplicate tensor name 'f32'"),
    "duplicate key": (_built([*SCALARS, SCALARS[3]], TENSORS), "duplicate metadata key 't.u16'"),
    "alignment u64": (_built([("general.alignment", VT.UINT64, 32)], TENSORS), "UINT32, not UINT64"),
    "alignment string": (_built([("general.alignment", VT.STRING, "32")], TENSORS), "UINT32, not STRING"),
    "alignment 0": (_built([("general.alignment", VT.UINT32, 0)], TENSORS), "0 is not a nonzero power of two"),
    "alignment 48": (
        _built([("general.alignment", VT.UINT32, 48)], TENSORS, alignment=48), "48 is not a nonzero power of two"
    ),
    # tensors at odd addresses: the kernels' blocks and floats would be read misaligned
    "alignment 1": (_built([("general.alignment", VT.UINT32, 1)], TENSORS, alignment=1), "1 is below 8"),
    "alignment 4": (_built([("general.alignment", VT.UINT32, 4)], TENSORS, alignment=4), "4 is below 8"),
    "arrays nested 3 deep": (
        _built([("deep", VT.ARRAY, (VT.ARRAY, [(VT.ARRAY, [(VT.UINT8, [1])])]))], []), "nests arrays deeper than 2"
    ),
    "empty file": (lambda: b"", "truncated while reading the magic"),
}


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_damaged_file_is_rejected(tmp_path: Path, case: str) -> None:
    make, pattern = CORPUS[case]
    assert_rejected(write(tmp_path / "bad.gguf", make()), pattern)


def test_gguf_error_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bad magic"):
        GGUFFile(write(tmp_path / "x.gguf", b"nope"))


def test_bool_array_must_be_0_or_1(tmp_path: Path) -> None:
    data = build_gguf([("b", VT.ARRAY, (VT.UINT8, [1, 0, 2]))], [])
    data = data.patch("kv0.value", "<I", VT.BOOL)  # the element type
    assert_rejected(write(tmp_path / "b.gguf", data), "metadata 'b' holds a bool that is not 0 or 1")


def test_string_array_element_that_splits_a_character(tmp_path: Path) -> None:
    # Packed, the elements are b"\xc3\xbc" = "ü", valid as a whole: each element is still checked.
    for elements, bad in (([b"ok", b"\xc3", b"\xbc"], 1), ([b"\xbc", b"x"], 0), ([b"a\xc3", b"", b"\xbc"], 0)):
        data = build_gguf([("s", VT.ARRAY, (VT.STRING, elements))], []).data
        assert_rejected(write(tmp_path / "s.gguf", data), rf"metadata 's'\[{bad}\] at offset \d+ is not valid UTF-8")


SECTION_BOUNDARIES = [
    "version", "tensor_count", "kv_count",
    *(f"kv{i}" for i in range(len(SCALARS))), *(f"kv{i}.value" for i in range(len(SCALARS))),
    *(f"ti{j}" for j in range(len(TENSORS))), *(f"ti{j}.offset" for j in range(len(TENSORS))),
    "ti_end", "data", *(f"t{j}.data" for j in range(len(TENSORS))),
]


@pytest.mark.parametrize("boundary", SECTION_BOUNDARIES)
def test_truncated_at_section_boundary(tmp_path: Path, boundary: str) -> None:
    cut = BASE.at[boundary]
    for end in (cut, cut + 1):
        assert_rejected(write(tmp_path / "t.gguf", BASE.data[:end]), TRUNCATED)


def test_truncated_at_every_header_byte_and_in_tensor_data(tmp_path: Path) -> None:
    last = BASE.at["t2.data"] + len(TENSORS[2][3])  # the end of the last tensor's bytes
    cuts = [*range(1, BASE.at["data"] + 1), *range(BASE.at["data"] + 1, last, 7), last - 1]
    for cut in cuts:
        assert_rejected(write(tmp_path / "t.gguf", BASE.data[:cut]), TRUNCATED)
    # the padding after the last tensor is not needed
    with GGUFFile(write(tmp_path / "t.gguf", BASE.data[:last])) as f:
        assert f.raw("q8").tobytes() == Q8_DATA.tobytes()


# ---------------------------------------------------------------------------
# Fuzzing: damage a small valid file at random; the reader may accept the result or
# raise GGUFError, nothing else.
# ---------------------------------------------------------------------------

SMALL = build_gguf(
    [
        ("general.architecture", VT.STRING, "fuzz"),
        ("f.u32", VT.UINT32, 7),
        ("f.f32", VT.FLOAT32, 1.5),
        ("f.bool", VT.BOOL, False),
        ("f.ints", VT.ARRAY, (VT.INT32, [1, 2, 3])),
        ("f.strs", VT.ARRAY, (VT.STRING, ["ab", "c"])),
        ("f.nested", VT.ARRAY, (VT.ARRAY, [(VT.UINT8, [1])])),
    ],
    [("a", 0, (4, 2), F32_DATA.tobytes()[:32]), ("b", 8, (32,), Q8_DATA.tobytes()[:34])],
)
INTERESTING = [0, 1, 2, 4, 5, 31, 32, 255, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]

mutations = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 2**16), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 2**16), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, 2**16), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.integers(0, 2**16), st.integers(1, 16)),
    st.tuples(st.just("u32"), st.integers(0, 2**16), st.sampled_from([v for v in INTERESTING if v < 2**32])),
    st.tuples(st.just("u64"), st.integers(0, 2**16), st.sampled_from(INTERESTING)),
)


def mutate(data: bytes, ops: list[tuple[str, int, Any]]) -> bytes:
    out = bytearray(data)
    for op, pos, arg in ops:
        pos %= len(out) + 1
        if op == "insert":
            out[pos:pos] = arg
        elif op == "delete":
            del out[pos : pos + arg]
        elif pos < len(out):
            if op == "flip":
                out[pos] ^= 1 << arg
            elif op == "set":
                out[pos] = arg
            else:
                size = 4 if op == "u32" else 8
                out[pos : pos + size] = arg.to_bytes(size, "little")
        if not out:
            out = bytearray(b"G")
    return bytes(out)


def test_fuzz_seed_is_valid(tmp_path: Path) -> None:
    assert len(SMALL.data) < 500
    with GGUFFile(write(tmp_path / "s.gguf", SMALL.data)) as f:
        assert len(f.tensors) == 2
        assert len(f.metadata) == 7


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(mutations, min_size=1, max_size=4))
def test_fuzz_mutated_file(tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, Any]]) -> None:
    data = mutate(SMALL.data, ops)
    path = write(tmp_path_factory.getbasetemp() / "fuzz.gguf", data)
    try:
        f = GGUFFile(path)
    except GGUFError as exc:
        assert str(exc).startswith(f"{path}: ")
        return
    with f:
        assert f.version in (2, 3)
        assert f.data_offset % f.alignment == 0
        end = f.data_offset
        for info in sorted(f.tensors.values(), key=lambda t: t.offset):
            assert end <= info.offset
            end = info.offset + info.n_bytes
            assert (info.offset - f.data_offset) % f.alignment == 0
            raw = f.raw(info.name)
            assert raw.nbytes == info.n_bytes
            assert raw.tobytes() == data[info.offset : end]
            assert f.array(info.name).nbytes == info.n_bytes
        assert end <= len(data)
        for key, value in f.metadata.items():
            assert key in f.metadata_types
            repr(value)


# ---------------------------------------------------------------------------
# The real models
# ---------------------------------------------------------------------------


def _as_python(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def test_smollm2_matches_gguf_reader(smollm2_path: Path) -> None:
    reader = gguf.GGUFReader(smollm2_path)
    with GGUFFile(smollm2_path) as f:
        assert f.get("general.architecture") == "llama"
        assert f.version == reader.fields["GGUF.version"].contents()
        assert f.alignment == reader.alignment
        assert f.data_offset == reader.data_offset
        fields = {key: field for key, field in reader.fields.items() if not key.startswith("GGUF.")}
        assert list(f.metadata) == list(fields)
        for key, field in fields.items():
            assert f.metadata_types[key] == field.types[0], key
            if field.types[0] == GGUFValueType.ARRAY:
                assert f.array_types[key] == field.types[1], key
            assert _as_python(f.metadata[key]) == field.contents(), key
        assert len(f.metadata["tokenizer.ggml.tokens"]) == 49152

        ours = [(t.name, t.type, t.shape, t.offset, t.n_bytes, t.n_elements) for t in f.tensors.values()]
        theirs = [
            (t.name, int(t.tensor_type), tuple(int(d) for d in t.shape), int(t.data_offset), int(t.n_bytes),
             int(t.n_elements))
            for t in reader.tensors
        ]
        assert ours == theirs
        first_of_each_type = {int(t.tensor_type): t for t in reversed(reader.tensors)}
        assert set(first_of_each_type) == {0, 3, 8}  # F32, Q4_1, Q8_0
        for t in [*first_of_each_type.values(), reader.tensors[-1]]:
            assert f.raw(t.name).tobytes() == t.data.tobytes(), t.name
            if t.tensor_type == GGMLQuantizationType.F32:
                np.testing.assert_array_equal(f.array(t.name), t.data)


def _tensor_table(infos: list[TensorInfo]) -> str:
    return "".join(f"{t.name} {t.type} {','.join(map(str, t.shape))} {t.offset} {t.n_bytes}\n" for t in infos)


# gguf.GGUFReader needs ~25 s to parse the Gemma file (its 262144-entry vocabulary), too
# slow for every test run, so these digests pin what it reports for that file (whose
# sha256 the catalogue pins): the sha256 of `_tensor_table` over its tensors, and of the
# vocabulary joined by newlines.
GEMMA_TENSOR_TABLE_SHA256 = "b6f8530e03e560ceea728986f29c8e42fa4550fa809deba930f1a48729cde6dc"
GEMMA_TOKENS_SHA256 = "afa3945939b919cdf06deb3aa2ef216bb7bfcf3c8bdc8fa2496e61f256df555c"


def test_gemma_matches_gguf_reader(gemma_path: Path) -> None:
    with GGUFFile(gemma_path) as f:
        assert f.get("general.architecture") == "gemma3"
        assert f.version == 3
        assert f.data_offset == 6525120
        assert len(f.metadata) == 33
        assert f.metadata["gemma3.block_count"] == 18
        assert f.metadata["gemma3.embedding_length"] == 640
        tokens = f.metadata["tokenizer.ggml.tokens"]
        assert len(tokens) == 262144
        assert tokens[5] == "[multimodal]"
        assert hashlib.sha256("\n".join(tokens).encode()).hexdigest() == GEMMA_TOKENS_SHA256
        assert f.metadata["tokenizer.ggml.scores"][1000] == -506.0
        assert f.metadata["tokenizer.ggml.token_type"][5] == 4

        infos = list(f.tensors.values())
        assert hashlib.sha256(_tensor_table(infos).encode()).hexdigest() == GEMMA_TENSOR_TABLE_SHA256
        assert Counter(t.type_name for t in infos) == {"F32": 109, "Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9}
        # packed as llama.cpp writes it: in order, each tensor padded to the alignment
        for before, after in itertools.pairwise(infos):
            assert after.offset == before.offset + before.n_bytes + -before.n_bytes % f.alignment
        assert infos[-1].offset + infos[-1].n_bytes == gemma_path.stat().st_size

        first_of_each_type = {t.type: t for t in reversed(infos)}
        with gemma_path.open("rb") as fh:
            for info in first_of_each_type.values():
                raw = f.raw(info.name)
                assert raw.shape == (info.n_rows, info.row_bytes)
                n = min(info.n_bytes, 1 << 16)
                fh.seek(info.offset)
                assert raw.reshape(-1)[:n].tobytes() == fh.read(n), info.name
                fh.seek(info.offset + info.n_bytes - n)
                assert raw.reshape(-1)[-n:].tobytes() == fh.read(n), info.name
        norm = f.array("output_norm.weight")
        assert norm.shape == (640,)
        assert norm.dtype == np.float32
        assert not norm.flags.owndata


def test_released_tensors_read_back_the_same(tmp_path: Path) -> None:
    """release() drops a tensor's pages from the process (the model does after copying a Q5_0 matrix); reading
    it again maps the file's bytes back in, unchanged. Tensors smaller than a page are left alone."""
    path = tmp_path / "m.gguf"
    write_fixture_model(path, "qwen2", GGMLQuantizationType.Q5_0)
    with GGUFFile(path) as f:
        names = ["blk.0.ffn_up.weight", "blk.0.attn_k.weight", "output_norm.weight"]
        before = {name: f.raw(name).copy() for name in names}
        assert before["blk.0.ffn_up.weight"].nbytes > 4 * 4096
        for name in names:
            f.release(name)
        f.release("blk.0.ffn_up.weight", 5000, 3 * 4096 + 17)  # a part: the pages wholly inside it
        f.release("blk.0.ffn_up.weight", 3 * 4096, 10**9)      # to past the end: clipped to the tensor
        for name in names:
            np.testing.assert_array_equal(f.raw(name), before[name])
