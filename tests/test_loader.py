"""Loading a model refuses what it cannot run, with one line naming the cause: paths that are not files,
nonsense hyperparameters, values of the wrong type, lying length fields, tensors whose shape or type
disagrees with the hyperparameters; and the C blocks refuse a short vector even if Python passed one."""

from __future__ import annotations

import math
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from fixture_models import write_fixture_model
from fuzz.gguf_fuzz import Recipe, small_model
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from pyllm import Llama
from pyllm.arch import ArchitectureError
from pyllm.cli import main
from pyllm.gguf import GGUFError, GGUFFile
from pyllm.kernels import KernelError
from pyllm.model import Model, _CBlocks
from pyllm.text.tokenizer import TokenizerError

ROOT = Path(__file__).resolve().parents[1]
N_EMBD, HEAD_DIM, N_FF = 64, 16, 96  # small_model's


def model_file(path: Path, arch: str = "llama", bpe: bool = False, **kvs: Any) -> Path:
    """small_model(arch) with keys changed: key=(value, value type[, element type]), or None to drop it. Keys
    name their dots as "__" and may leave out the "{arch}." prefix of a hyperparameter."""
    recipe = small_model(arch, Q.Q8_0, bpe, seed=1)
    for name, value in kvs.items():
        key = name.replace("__", ".")
        if key not in recipe.kvs and not key.startswith(("general.", "tokenizer.")):
            key = f"{arch}.{key}"
        if value is None:
            recipe.kvs.pop(key, None)
        else:
            recipe.kvs[key] = (*value, None) if len(value) == 2 else value
    recipe.write(path)
    return path


def write(recipe: Recipe, path: Path) -> Path:
    recipe.write(path)
    return path


def refusal(path: Path) -> GGUFError:
    """The GGUFError loading `path` raises, checked to be one line starting with the path."""
    with pytest.raises(GGUFError) as info:
        Llama(str(path), n_ctx=16)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return info.value


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`pyllm ARGS` in a process of its own, from this checkout, with a time limit (a hang fails the test)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pyllm.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_base_model_loads_and_runs(tmp_path: Path) -> None:
    """The files below differ from this one in one lie each."""
    with Llama(str(model_file(tmp_path / "m.gguf")), n_ctx=16) as llm:
        assert llm.n_vocab() == 273
        out = llm.create_completion("hi", max_tokens=2, temperature=0)
        assert out["usage"]["completion_tokens"] >= 1


# ---- paths that are not regular files -------------------------------------------------------------------


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match=re.escape(f"{tmp_path}: not a regular file (a directory)")):
        GGUFFile(tmp_path)
    for args in (["run", str(tmp_path), "hi", "-n", "2"], ["info", str(tmp_path)], ["tokenize", str(tmp_path), "hi"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1, result.output
        assert result.output == f"Error: {tmp_path}: not a regular file (a directory)\n"


def test_a_device_is_refused() -> None:
    with pytest.raises(GGUFError, match="/dev/null: not a regular file \\(a character device\\)"):
        GGUFFile("/dev/null")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    for args in (["run", str(fifo), "hi", "-n", "2"], ["info", str(fifo)]):
        done = cli(*args)
        assert done.returncode == 1
        assert done.stderr == f"Error: {fifo}: not a regular file (a FIFO)\n"


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.gguf").write_bytes(b"")
    assert "the file is empty" in str(refusal(tmp_path / "empty.gguf"))


# ---- the short norm vector (read past its end by the AVX2 row scaling before) ---------------------------


def test_a_short_attn_norm_is_refused(tmp_path: Path) -> None:
    recipe = small_model("llama", Q.Q8_0, False, seed=1)
    recipe.tensors["blk.0.attn_norm.weight"] = (recipe.tensors["blk.0.attn_norm.weight"][0][:32].copy(), None)
    error = refusal(write(recipe, tmp_path / "short.gguf"))
    assert isinstance(error, ArchitectureError)
    assert str(error).endswith("tensor blk.0.attn_norm.weight has shape [32], expected [64] from the hyperparameters")
    result = CliRunner().invoke(main, ["run", str(tmp_path / "short.gguf"), "hi", "-n", "2"])
    assert result.exit_code == 1 and result.output == f"Error: {error}\n"


@pytest.mark.parametrize(("arch", "vector"), [("llama", "attn_norm"), ("llama", "ffn_norm"), ("qwen2", "bq"),
                                              ("qwen2", "bv"), ("qwen3", "k_norm"), ("gemma3", "post_ffw_norm")])
def test_the_c_blocks_refuse_a_short_vector(tmp_path: Path, arch: str, vector: str) -> None:
    """Defence in depth: a vector shorter than its step reads is refused by pyllm_blocks_forward too."""
    with GGUFFile(model_file(tmp_path / "m.gguf", arch)) as f:
        model = Model(f)
        cache = model.new_cache(8)
        layer = model.weights.layers[1]
        setattr(layer, vector, getattr(layer, vector)[:-1].copy())
        model._c_blocks = _CBlocks(model.config, model.weights)
        with pytest.raises(KernelError, match="transformer blocks: bad shape"):
            model.forward([1, 2, 3], cache)
        assert cache.n_used == 0


# ---- lying lengths -----------------------------------------------------------------------------------------


def _length_offset(path: Path, key: str) -> int:
    """The offset of the u64 length of `key`'s string value, or of its array's first string, or of its count."""
    reader = gguf.GGUFReader(path)
    field = reader.fields[key]
    base = reader.data.ctypes.data
    part = field.parts[3] if field.types[0] == V.STRING else field.parts[5 if field.types[-1] == V.STRING else 4]
    return part.ctypes.data - base


@pytest.mark.parametrize("key", ["general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.tokens",
                                 "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                                 "tokenizer.ggml.pre", "tokenizer.chat_template"])
@pytest.mark.parametrize("length", [2**64 - 1, 2**64 - 8, 2**63])
def test_a_negative_string_or_array_length_is_refused(tmp_path: Path, key: str, length: int) -> None:
    path = model_file(tmp_path / "m.gguf", bpe=key in ("tokenizer.ggml.merges", "tokenizer.ggml.pre"))
    data = bytearray(path.read_bytes())
    struct.pack_into("<Q", data, _length_offset(path, key), length)
    path.write_bytes(data)
    message = str(refusal(path))
    assert f"metadata {key!r}" in message
    assert re.search(r"truncated while reading|claims \d+ \w+ elements", message)


def test_a_negative_value_length_is_refused_at_load(tmp_path: Path) -> None:
    """value_length = -1 loaded, and the KV cache's shape error then killed the engine thread at the first
    request, so `pyllm run FILE hi -n 2` waited for ever."""
    path = model_file(tmp_path / "m.gguf", attention__value_length=(-1, V.INT32))
    assert "llama.attention.value_length = -1 is out of range" in str(refusal(path))
    done = cli("run", str(path), "hi", "-n", "2")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "llama.attention.value_length = -1" in done.stderr


# ---- nonsense hyperparameters -------------------------------------------------------------------------------

NONSENSE = [
    ("block_count", (0, V.UINT32), "llama.block_count = 0 is out of range"),
    ("block_count", (2**32 - 1, V.UINT32), "llama.block_count = 4294967295 is out of range"),
    ("attention.head_count", (0, V.UINT32), "llama.attention.head_count = 0 is out of range"),
    ("embedding_length", (1, V.UINT32), "llama.embedding_length = 1 is out of range"),
    ("embedding_length", (0, V.UINT32), "llama.embedding_length = 0 is out of range"),
    ("feed_forward_length", (0, V.UINT32), "llama.feed_forward_length = 0 is out of range"),
    ("attention.head_count_kv", (3, V.UINT32), "llama.attention.head_count = 4 is not a multiple of "
                                                "llama.attention.head_count_kv = 3"),
    ("attention.head_count_kv", (0, V.UINT32), "llama.attention.head_count_kv = 0 is out of range"),
    ("attention.head_count_kv", (8, V.UINT32), "llama.attention.head_count_kv = 8 is out of range (expected 1 to 4)"),
    ("attention.key_length", (2**31, V.UINT32), "llama.attention.key_length = 2147483648 is out of range"),
    ("attention.value_length", (8, V.UINT32), "llama.attention.value_length = 8 differs from the key length 16"),
    ("rope.dimension_count", (3, V.UINT32), "llama.rope.dimension_count = 3 must be even, 2 to the head dimension"),
    ("rope.dimension_count", (32, V.UINT32), "llama.rope.dimension_count = 32 must be even, 2 to the head dimension"),
    ("rope.freq_base", (math.nan, V.FLOAT32), "llama.rope.freq_base = nan is not a finite number"),
    ("rope.freq_base", (math.inf, V.FLOAT64), "llama.rope.freq_base = inf is not a finite number"),
    ("rope.freq_base", (0.0, V.FLOAT32), "llama.rope.freq_base = 0.0 must be above 0"),
    ("rope.freq_base", (1e300, V.FLOAT64), "llama.rope.freq_base = 1e+300 is out of the range of a 32-bit float"),
    ("rope.scaling.factor", (-2.0, V.FLOAT32), "llama.rope.scaling.factor = -2.0 must not be negative"),
    ("attention.layer_norm_rms_epsilon", (-1.0, V.FLOAT32), "llama.attention.layer_norm_rms_epsilon = -1.0 must"),
    ("attention.layer_norm_rms_epsilon", (-math.inf, V.FLOAT32), "layer_norm_rms_epsilon = -inf is not a finite"),
    ("context_length", (0, V.UINT32), "llama.context_length = 0 is out of range"),
    ("context_length", (2**63, V.UINT64), "llama.context_length = 9223372036854775808 is out of range"),
]


@pytest.mark.parametrize(("key", "value", "message"), NONSENSE, ids=[f"{k}={v[0]}" for k, v, _ in NONSENSE])
def test_a_nonsense_hyperparameter_is_refused_by_name(tmp_path: Path, key: str, value: tuple, message: str) -> None:
    assert message in str(refusal(model_file(tmp_path / "m.gguf", **{key.replace(".", "__"): value})))


def test_a_head_dimension_that_does_not_divide_is_refused(tmp_path: Path) -> None:
    path = model_file(tmp_path / "m.gguf", attention__key_length=None, attention__head_count=(3, V.UINT32),
                      attention__head_count_kv=(3, V.UINT32))
    assert ("llama.embedding_length = 64 does not divide into llama.attention.head_count = 3 heads, and there is "
            "no llama.attention.key_length") in str(refusal(path))


def test_a_scaling_factor_too_small_to_scale_by_is_refused(tmp_path: Path) -> None:
    """1 / 1e-300 is no float the C core can take."""
    path = model_file(tmp_path / "m.gguf", rope__scaling__type=("linear", V.STRING),
                      rope__scaling__factor=(1e-300, V.FLOAT64))
    assert "llama.rope.scaling.factor = 1e-300 is too small to scale by" in str(refusal(path))


def test_a_negative_sliding_window_is_refused(tmp_path: Path) -> None:
    path = model_file(tmp_path / "m.gguf", "gemma3", attention__sliding_window=(-1, V.INT32))
    assert "gemma3.attention.sliding_window = -1 is out of range" in str(refusal(path))


def test_a_missing_hyperparameter_is_named(tmp_path: Path) -> None:
    assert "missing metadata key llama.embedding_length" in str(
        refusal(model_file(tmp_path / "m.gguf", embedding_length=None)))


# ---- values of the wrong type -------------------------------------------------------------------------------

TYPE_LIES = [
    ("block_count", ("2", V.STRING), "llama.block_count holds the string '2', expected an integer"),
    ("block_count", ([2], V.ARRAY, V.INT32), "llama.block_count holds an array of 1, expected an integer"),
    ("block_count", (2.0, V.FLOAT32), "llama.block_count holds the float 2.0, expected an integer"),
    ("block_count", (True, V.BOOL), "llama.block_count holds the bool True, expected an integer"),
    ("attention.head_count", (math.inf, V.FLOAT32), "head_count holds the float inf, expected an integer"),
    ("rope.freq_base", ("1e4", V.STRING), "llama.rope.freq_base holds the string '1e4', expected a number"),
    ("rope.freq_base", ([1.0], V.ARRAY, V.FLOAT32), "llama.rope.freq_base holds an array of 1, expected a number"),
    ("rope.scaling.type", (1, V.UINT32), "llama.rope.scaling.type holds the integer 1, expected a string"),
    ("general.architecture", (["llama"], V.ARRAY, V.STRING), "general.architecture holds an array of 1"),
    ("general.architecture", (5, V.INT32), "general.architecture holds the integer 5, expected a string"),
    ("tokenizer.ggml.model", (5, V.INT32), "tokenizer.ggml.model holds the integer 5, expected a string"),
    ("tokenizer.ggml.model", (["llama"], V.ARRAY, V.STRING), "tokenizer.ggml.model holds an array of 1"),
    ("tokenizer.ggml.tokens", (5, V.INT32), "tokenizer.ggml.tokens is not an array of strings"),
    ("tokenizer.ggml.tokens", ([1, 2], V.ARRAY, V.INT32), "tokenizer.ggml.tokens is not an array of strings"),
    ("tokenizer.ggml.scores", ("x", V.STRING), "tokenizer.ggml.scores is not an array of numbers"),
    ("tokenizer.ggml.scores", (1.0, V.FLOAT32), "tokenizer.ggml.scores is not an array of numbers"),
    ("tokenizer.ggml.scores", (["a"] * 273, V.ARRAY, V.STRING), "tokenizer.ggml.scores is not an array of numbers"),
    ("tokenizer.ggml.token_type", ([0.5] * 273, V.ARRAY, V.FLOAT32), "token_type is not an array of integers"),
    ("tokenizer.ggml.token_type", (1, V.INT32), "tokenizer.ggml.token_type is not an array of integers"),
    ("tokenizer.ggml.bos_token_id", ("1", V.STRING), "tokenizer.ggml.bos_token_id holds the string '1'"),
    ("tokenizer.ggml.bos_token_id", (1.5, V.FLOAT32), "tokenizer.ggml.bos_token_id holds the float 1.5"),
    ("tokenizer.ggml.eos_token_id", (math.inf, V.FLOAT64), "tokenizer.ggml.eos_token_id holds the float inf"),
    ("tokenizer.ggml.eos_token_id", ([2], V.ARRAY, V.INT32), "tokenizer.ggml.eos_token_id holds an array of 1"),
    ("tokenizer.ggml.add_bos_token", (1, V.UINT8), "tokenizer.ggml.add_bos_token holds the integer 1, expected a bool"),
    ("tokenizer.ggml.add_space_prefix", ("no", V.STRING), "add_space_prefix holds the string 'no', expected a bool"),
    ("tokenizer.chat_template", (5, V.INT32), "tokenizer.chat_template holds the integer 5, expected a string"),
    ("tokenizer.chat_template", (["x"], V.ARRAY, V.STRING), "tokenizer.chat_template holds an array of 1"),
]


@pytest.mark.parametrize(("key", "value", "message"), TYPE_LIES, ids=[f"{k}:{v[1].name}" for k, v, _ in TYPE_LIES])
def test_a_value_of_the_wrong_type_is_refused_by_name(tmp_path: Path, key: str, value: tuple, message: str) -> None:
    assert message in str(refusal(model_file(tmp_path / "m.gguf", **{key.replace(".", "__"): value})))


@pytest.mark.parametrize(("key", "value", "message"), [
    ("tokenizer.ggml.merges", ([1, 2], V.ARRAY, V.INT32), "tokenizer.ggml.merges is not an array of strings"),
    ("tokenizer.ggml.pre", (["gpt-2"], V.ARRAY, V.STRING), "tokenizer.ggml.pre holds an array of 1, expected a"),
])
def test_a_bpe_key_of_the_wrong_type_is_refused(tmp_path: Path, key: str, value: tuple, message: str) -> None:
    error = refusal(model_file(tmp_path / "m.gguf", bpe=True, **{key.replace(".", "__"): value}))
    assert message in str(error) and isinstance(error, TokenizerError)


def test_vocab_only_loads_read_typed_values_too(tmp_path: Path) -> None:
    path = model_file(tmp_path / "m.gguf", context_length=("64", V.STRING))
    with pytest.raises(GGUFError, match="llama.context_length holds the string '64'"):
        Llama(str(path), vocab_only=True)


# ---- tensors against the hyperparameters --------------------------------------------------------------------


def _tensor_lie(tmp_path: Path, change) -> Path:
    recipe = small_model("qwen2", Q.Q8_0, False, seed=1)
    change(recipe)
    return write(recipe, tmp_path / "m.gguf")


def test_a_vocabulary_of_another_size_than_the_embedding_is_refused(tmp_path: Path) -> None:
    def more_tokens(recipe: Recipe) -> None:
        for key, extra in (("tokenizer.ggml.tokens", "extra"), ("tokenizer.ggml.scores", 0.0),
                           ("tokenizer.ggml.token_type", 1)):
            values, vtype, sub = recipe.kvs[key]
            recipe.kvs[key] = ([*values, extra], vtype, sub)

    message = str(refusal(_tensor_lie(tmp_path, more_tokens)))
    assert message.endswith("tensor token_embd.weight has shape [64, 273], expected [64, 274] from the hyperparameters")


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r.tensors.pop("blk.1.ffn_up.weight"), "missing tensor blk.1.ffn_up.weight"),
    (lambda r: r.tensors.__setitem__("blk.0.ffn_down.weight", (np.zeros((N_FF, N_EMBD // 32 * 34), np.uint8),
                                                                 Q.Q8_0)),  # transposed: 96 rows of 64
     "tensor blk.0.ffn_down.weight has shape [64, 96], expected [96, 64]"),
    (lambda r: r.tensors.__setitem__("blk.1.attn_k.bias", (np.zeros(HEAD_DIM, np.float32), None)),
     "tensor blk.1.attn_k.bias has shape [16], expected [32]"),
    (lambda r: r.tensors.__setitem__("output_norm.weight", (np.zeros((1, 34), np.uint8), Q.Q8_0)),
     "tensor output_norm.weight is Q8_0; a norm weight or bias must be F32, F16 or BF16"),
    (lambda r: r.tensors.__setitem__("blk.2.attn_norm.weight", (np.ones(N_EMBD, np.float32), None)),
     "tensor blk.2.attn_norm.weight belongs to layer 2, but qwen2.block_count is 2"),
])
def test_a_tensor_that_disagrees_with_the_hyperparameters_is_refused(tmp_path: Path, change, message: str) -> None:
    assert message in str(refusal(_tensor_lie(tmp_path, change)))


def test_trailing_unit_dimensions_are_accepted(tmp_path: Path) -> None:
    """llama.cpp takes (64, 1) for a (64,) vector; so does pyllm."""
    def column(recipe: Recipe) -> None:
        data, _ = recipe.tensors["blk.0.attn_norm.weight"]
        recipe.tensors["blk.0.attn_norm.weight"] = (data.reshape(1, -1), None)

    with Llama(str(_tensor_lie(tmp_path, column)), n_ctx=16) as llm:
        assert llm.logits([1, 2]).shape == (2, 273)


# ---- the command line on a bad file: one line, no traceback -------------------------------------------------


def test_info_summarises_a_file_whose_names_are_not_strings(tmp_path: Path) -> None:
    path = model_file(tmp_path / "m.gguf", general__name=([1, 2], V.ARRAY, V.INT32),
                      tokenizer__ggml__model=(3, V.UINT32), tokenizer__ggml__tokens=(7, V.UINT32))
    result = CliRunner().invoke(main, ["info", "--json", str(path)])
    assert result.exit_code == 0, result.output
    assert '"name": null' in result.output and '"vocab_size": null' in result.output


def test_tokenize_reports_a_bad_vocabulary_in_one_line(tmp_path: Path) -> None:
    path = model_file(tmp_path / "m.gguf", tokenizer__ggml__scores=("x", V.STRING))
    result = CliRunner().invoke(main, ["tokenize", str(path), "hi"])
    assert result.exit_code == 1
    assert result.output == f"Error: {path}: tokenizer.ggml.scores is not an array of numbers\n"


def test_tokenize_reports_a_text_the_vocabulary_cannot_encode(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_fixture_model(path, "llama", Q.Q8_0)  # tokens t3 .. t95: no byte tokens for SentencePiece's fallback
    result = CliRunner().invoke(main, ["tokenize", str(path), "hi"])
    assert result.exit_code == 1
    assert result.output == f"Error: {path}: the vocabulary has no byte token for 0xE2\n"
