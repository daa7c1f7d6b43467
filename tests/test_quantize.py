"""`pyllm quantize` against llama.cpp's llama-quantize, whose outputs bench/record_llamacpp_quantize.py recorded into
tests/data/llamacpp_quantize.json (llama.cpp is not needed here): the same tensor types, the same bytes.

Gemma 3 270M (Q4_K_M, requantized) to every file type: every tensor's type, and the bytes of the tensors of two
layers a type; two types written whole, the file's sha256 compared. The fixture models (float input, rows of 256 so
no K-quant falls back, importance matrices): every tensor's type and bytes. Then the writer against the gguf
package's reader, the output against pyllm's own loader, and the command's errors.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from fixture_models import write_fixture_imatrix, write_fixture_model
from gguf import GGMLQuantizationType as Q

from pyllm import quantize as q
from pyllm.cli import main
from pyllm.gguf import GGUFFile, ValueType
from pyllm.gguf_writer import GGUFWriter, MetadataValue, TensorEntry
from pyllm.imatrix import load_imatrix
from pyllm.kernels import GGMLType

RECORD = json.loads((Path(__file__).parent / "data" / "llamacpp_quantize.json").read_text())
CASES = RECORD["cases"]
GEMMA_CASES = sorted(name for name, case in CASES.items() if case["input"] == "gemma")
FIXTURE_CASES = sorted(name for name, case in CASES.items() if case["input"] != "gemma")
QUANTIZED_FILE_TYPES = [name for name, ft in q.FILE_TYPES.items() if ft.base not in (GGMLType.F32, GGMLType.F16,
                                                                                       GGMLType.BF16)]


# Two chunks of 64 tokens to score: plain prose, nothing from a file that may change.
PARAGRAPH = ('The old lighthouse stood at the end of the harbour wall for more than a century. Every evening the '
             'keeper climbed its narrow stairs, trimmed the wick and wound the clockwork that turned the lens. '
             'Ships coming home through the winter storms looked for its beam long before they could see the town.'
             ' When the electric lamp arrived, the keeper stayed on to polish the brass and to tell visitors how '
             'the light had once been kept burning through the longest night of the year. Children from the school'
             ' came every spring to count the steps, and each class found a different number, because someone '
             'always lost count halfway up. The keeper wrote their answers in a notebook that he kept beside the '
             'logbook of passing ships.')


def short_sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def options(case: dict) -> dict:
    """quantize_model's keywords for a recorded case's llama-quantize flags."""
    flags = case["flags"]
    out = flags[flags.index("--output-tensor-type") + 1] if "--output-tensor-type" in flags else None
    return {"pure": "--pure" in flags, "allow_requantize": "--allow-requantize" in flags,
            "output_type": q.tensor_type(out) if out else None}


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> GGUFFile:
    if hashlib.sha256(gemma_path.read_bytes()).hexdigest() != RECORD["gemma_sha256"]:
        pytest.fail(f"{gemma_path} is not the file the record was made from")
    with GGUFFile(gemma_path) as f:
        yield f


@pytest.fixture(scope="module")
def gemma_imatrix(gemma: GGUFFile, tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    path = tmp_path_factory.mktemp("imatrix") / "gemma.imatrix"
    write_fixture_imatrix(path, gemma.path)
    return load_imatrix(path).entries


def test_the_record_covers_every_file_type() -> None:
    assert {CASES[name]["type"] for name in GEMMA_CASES} == set(QUANTIZED_FILE_TYPES)
    assert all(CASES[f"llama-F16/{t}"]["type"] == t for t in QUANTIZED_FILE_TYPES)
    assert {CASES[name]["imatrix"] for name in FIXTURE_CASES} == {None, "gguf", "legacy"}


@pytest.mark.parametrize("name", GEMMA_CASES)
def test_gemma_tensor_types_are_llamacpps(gemma: GGUFFile, name: str) -> None:
    case = CASES[name]
    ftype = q.file_type(case["type"])
    plans = q.plan(gemma, ftype, has_imatrix=case["imatrix"] is not None,
                   **{k: v for k, v in options(case).items() if k != "allow_requantize"})
    assert [(p.info.name, p.type.name) for p in plans] == [(t[0], t[1]) for t in case["tensors"]]
    assert ftype.id == case["file_type"]


@pytest.mark.parametrize("name", GEMMA_CASES)
def test_gemma_tensor_bytes_are_llamacpps(gemma: GGUFFile, gemma_imatrix: dict[str, np.ndarray], name: str) -> None:
    """Two layers' tensors a type (the first, and one that moves from type to type), bit for bit."""
    case = CASES[name]
    layers = {"blk.0.", f"blk.{1 + 5 * GEMMA_CASES.index(name) % 17}."}
    expected = {t[0]: t[2] for t in case["tensors"] if t[0].startswith(tuple(layers))}
    importance = gemma_imatrix if case["imatrix"] else {}
    everything = q.plan(gemma, q.file_type(case["type"]), pure="--pure" in case["flags"],
                        has_imatrix=bool(importance))
    plans = [p for p in everything if p.info.name in expected]
    # Q4_K_M to Q4_K_M converts nothing (llama-quantize copies a tensor that keeps its type); the others do here
    assert any(p.converted for p in plans) == any(p.converted for p in everything) == (case["type"] != "Q4_K_M")
    got = {p.info.name: short_sha(q.tensor_bytes(gemma, p, importance.get(p.info.name), n_threads=2))
           for p in plans}
    assert got == expected


@pytest.fixture(scope="module")
def gemma_q8_0(gemma: GGUFFile, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma requantized to Q8_0 by pyllm, written whole."""
    out = tmp_path_factory.mktemp("q8_0") / "gemma-q8_0.gguf"
    q.quantize_model(gemma.path, out, q.file_type("Q8_0"), n_threads=2, **options(CASES["gemma/Q8_0"]))
    return out


def test_gemma_whole_file_is_llamacpps_q8_0(gemma_q8_0: Path) -> None:
    assert hashlib.sha256(gemma_q8_0.read_bytes()).hexdigest() == CASES["gemma/Q8_0"]["file_sha256"]


def test_gemma_whole_file_is_llamacpps_q3_k_m(gemma: GGUFFile, tmp_path: Path) -> None:
    """The mix with the most types in it (Q4_0, Q4_K, Q5_0, Q5_1, Q5_K, Q8_0, F32)."""
    case = CASES["gemma/Q3_K_M"]
    out = tmp_path / "out.gguf"
    q.quantize_model(gemma.path, out, q.file_type(case["type"]), n_threads=2, **options(case))
    assert hashlib.sha256(out.read_bytes()).hexdigest() == case["file_sha256"]


@pytest.fixture(scope="module")
def fixture_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("inputs")
    inputs = {}
    for source in sorted({CASES[name]["input"] for name in FIXTURE_CASES}):
        arch, tensor_type = source.split(":")
        path = folder / f"{arch}-{tensor_type}.gguf"
        digest = write_fixture_model(path, arch, Q[tensor_type])
        recorded = {CASES[n]["input_tensors_sha256"] for n in FIXTURE_CASES if CASES[n]["input"] == source}
        assert recorded == {digest}, "the fixture models changed: rerun bench/record_llamacpp_quantize.py"
        inputs[source] = path
    return inputs


@pytest.mark.parametrize("name", FIXTURE_CASES)
def test_fixture_models_are_quantized_as_llamacpp_does(fixture_inputs: dict[str, Path], tmp_path: Path,
                                                       name: str) -> None:
    case = CASES[name]
    source = fixture_inputs[case["input"]]
    importance, extra = None, None
    if case["imatrix"] is not None:
        matrix_path = tmp_path / "imatrix"
        write_fixture_imatrix(matrix_path, source, legacy=case["imatrix"] == "legacy")
        matrix = load_imatrix(matrix_path)
        importance, extra = matrix.entries, q.imatrix_metadata(str(matrix_path), matrix)
    out = tmp_path / "out.gguf"
    q.quantize_model(source, out, q.file_type(case["type"]), importance=importance, extra_metadata=extra,
                     n_threads=2, **options(case))
    with GGUFFile(out) as f:
        got = [[t.name, t.type_name, short_sha(f.raw(t.name).tobytes())] for t in f.tensors.values()]
        assert f.metadata["general.file_type"] == case["file_type"]
        if importance is not None:
            assert f.metadata["quantize.imatrix.entries_count"] == len(importance)
    assert got == case["tensors"]


def test_requantized_model_loads_and_generates_like_the_original(gemma: GGUFFile, gemma_q8_0: Path) -> None:
    """Q8_0 from Q4_K_M loses little: pyllm loads the file, generates, and its perplexity on a text is within 2% of
    the original's."""
    from pyllm.llama import Llama
    from pyllm.perplexity import perplexity

    text = PARAGRAPH
    results = []
    for path in (gemma.path, gemma_q8_0):
        llm = Llama(str(path), n_ctx=64, n_threads=2, verbose=False)
        try:
            completion = llm.create_completion("The three primary colors are", max_tokens=4, temperature=0.0)
            results.append((completion["choices"][0]["text"], perplexity(llm, text, 64).ppl))
        finally:
            llm.close()
    (_, original), (words, requantized) = results
    assert words.strip() and abs(requantized / original - 1) < 0.02, results


# ---- the writer ------------------------------------------------------------------------------------------------

def test_writer_output_reads_back_in_the_gguf_package(tmp_path: Path) -> None:
    """Every kind of metadata value and tensors of several types, read by gguf-py (an independent reader)."""
    from pyllm.strings import StringArray

    metadata = {
        "general.architecture": MetadataValue(ValueType.STRING, "llama"),
        "u8": MetadataValue(ValueType.UINT8, 200), "i16": MetadataValue(ValueType.INT16, -300),
        "u64": MetadataValue(ValueType.UINT64, 2**40), "f64": MetadataValue(ValueType.FLOAT64, 0.1),
        "flag": MetadataValue(ValueType.BOOL, True), "f32": MetadataValue(ValueType.FLOAT32, 1.5),
        "words": MetadataValue(ValueType.ARRAY, StringArray.from_strings(["a", "ünï", ""]), ValueType.STRING),
        "ints": MetadataValue(ValueType.ARRAY, np.array([1, -2, 3], np.int32), ValueType.INT32),
        "nested": MetadataValue(ValueType.ARRAY, [np.array([1.0, 2.0], np.float32), np.array([3], np.int64)],
                                ValueType.ARRAY),
    }
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((3, 64)).astype(np.float32)
    q4 = q.kernels.quantize_rows(weights, GGMLType.Q4_0)
    tensors = [TensorEntry("a.weight", GGMLType.F32, (64, 3)), TensorEntry("b.weight", GGMLType.Q4_0, (64, 3)),
               TensorEntry("c.bias", GGMLType.F32, (5,))]
    path = tmp_path / "w.gguf"
    with GGUFWriter(path, metadata, tensors) as w:
        w.write("a.weight", [weights[:1], weights[1:]])
        w.write("b.weight", [q4])
        w.write("c.bias", [np.arange(5, dtype=np.float32)])
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["u8"].contents() == 200 and reader.fields["i16"].contents() == -300
    assert reader.fields["u64"].contents() == 2**40 and reader.fields["f64"].contents() == 0.1
    assert reader.fields["flag"].contents() is True and reader.fields["f32"].contents() == 1.5
    assert reader.fields["words"].contents() == ["a", "ünï", ""]
    assert reader.fields["ints"].contents() == [1, -2, 3]
    by_name = {t.name: t for t in reader.tensors}
    np.testing.assert_array_equal(by_name["a.weight"].data, weights)
    assert bytes(by_name["b.weight"].data.tobytes()) == q4.tobytes()
    assert [t.data_offset % 32 for t in reader.tensors] == [0, 0, 0]
    with GGUFFile(path) as f:  # and pyllm's own reader, nested arrays included
        assert [list(v) for v in f.metadata["nested"]] == [[1.0, 2.0], [3]]


def test_writer_leaves_nothing_behind_when_a_tensor_is_short(tmp_path: Path) -> None:
    path = tmp_path / "w.gguf"
    with pytest.raises(ValueError, match="bytes written"):
        with GGUFWriter(path, {}, [TensorEntry("a", GGMLType.F32, (4,))]) as w:
            w.write("a", [np.zeros(3, np.float32)])
    assert list(tmp_path.iterdir()) == []


# ---- the command ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make_args, message", [
    (lambda m, t: [str(m), str(t / "o.gguf"), "Q9_K"], "unknown quantization type 'Q9_K'"),
    (lambda m, t: [str(m), str(t / "o.gguf"), "Q4_0"], "requantizing from Q5_0 is disabled"),
    (lambda m, t: [str(t / "missing.gguf"), str(t / "o.gguf"), "Q4_0"], "cannot read the file"),
    (lambda m, t: [str(m), str(m), "Q4_0", "--allow-requantize"], "input and output files are the same"),
    (lambda m, t: [str(m), str(t / "no" / "o.gguf"), "Q4_0", "--allow-requantize"], "cannot write"),
    (lambda m, t: [str(m), str(t / "o.gguf"), "Q4_0", "--output-type", "Q3"], "unknown tensor type 'Q3'"),
    (lambda m, t: [str(m), str(t / "o.gguf"), "Q4_0", "--imatrix", str(t / "none.dat")], "cannot read the imatrix"),
])
def test_errors_are_one_line(gemma_path: Path, tmp_path: Path, make_args, message: str) -> None:
    result = CliRunner().invoke(main, ["quantize", *make_args(gemma_path, tmp_path)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], result.output
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("name, flags", [
    ("llama-F16/Q4_K_M-output-Q5_0", ["q4_k", "--output-type", "q5_0"]),
    ("llama-F16/Q3_K_M-imatrix", ["Q3_K_M", "--imatrix", "IMATRIX"]),
])
def test_the_command_writes_what_llamacpp_does(fixture_inputs: dict[str, Path], tmp_path: Path, name: str,
                                               flags: list[str]) -> None:
    case = CASES[name]
    out, matrix = tmp_path / "o.gguf", tmp_path / "imatrix.gguf"
    write_fixture_imatrix(matrix, fixture_inputs["llama:F16"])
    flags = [str(matrix) if f == "IMATRIX" else f for f in flags]
    result = CliRunner().invoke(main, ["quantize", str(fixture_inputs["llama:F16"]), str(out), *flags,
                                       "--allow-requantize", "-t", "1"])
    assert result.exit_code == 0, result.output
    with GGUFFile(out) as f:
        assert [[t.name, t.type_name, short_sha(f.raw(t.name).tobytes())] for t in f.tensors.values()] \
            == case["tensors"]
        if "--imatrix" in flags:
            assert f.metadata["quantize.imatrix.file"] == str(matrix)
            assert f.metadata["quantize.imatrix.dataset"] == "fixture.txt"
            assert f.metadata["quantize.imatrix.chunks_count"] == 10
