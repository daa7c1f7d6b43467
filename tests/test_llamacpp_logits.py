"""pyllm's logits against llama.cpp's, recorded on the fixture models (bench/record_llamacpp_logits.py):
every architecture and every weight type, bit for bit, over a 12-token prompt (so llama.cpp ran
its prompt paths). llama.cpp is not needed here: its outputs
are in tests/data/llamacpp_logits.npz."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fixture_models import write_fixture_model
from gguf import GGMLQuantizationType as Q

from pyllm.gguf import GGUFFile
from pyllm.kernels import GGMLType
from pyllm.model import Model

RECORD = np.load(Path(__file__).parent / "data" / "llamacpp_logits.npz")
_RECORDED = sorted(key.rsplit("/", 1)[0] for key in RECORD.files if key.endswith("/sha256"))
CASES = [case for case in _RECORDED if not case.startswith("cache/")]
CACHE_CASES = [case for case in _RECORDED if case.startswith("cache/")]  # quantized keys: cache/<arch>/<type_k>


def test_the_record_covers_every_architecture_and_weight_type() -> None:
    assert {case.split("/")[0] for case in CASES} == {"llama", "qwen2", "qwen3", "gemma3"}
    assert {case.split("/")[1] for case in CASES} == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                                      "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}


@pytest.mark.parametrize("case", CASES)
def test_prompt_logits_are_llamacpps_bit_for_bit(tmp_path: Path, case: str) -> None:
    arch, type_name = case.split("/")
    path = tmp_path / "m.gguf"
    digest = write_fixture_model(path, arch, Q[type_name])
    assert digest == str(RECORD[case + "/sha256"]), \
        "the fixture model changed: rerun bench/record_llamacpp_logits.py with llama-cpp-python"
    tokens = [int(t) for t in RECORD["tokens"]]
    model = Model(GGUFFile(str(path)), n_threads=2)
    mine = model.forward(tokens, model.new_cache(128), logits="all")
    theirs = RECORD[case]
    same = mine.view(np.uint32) == theirs.view(np.uint32)
    assert same.all(), (f"{case}: {int(same.all(axis=1).sum())}/{len(tokens)} rows identical, "
                        f"largest difference {float(np.abs(mine - theirs).max()):.3g}")


def test_the_record_covers_every_architecture_with_quantized_keys() -> None:
    assert {tuple(case.split("/")[1:]) for case in CACHE_CASES} == {
        (arch, t) for arch in ("llama", "qwen2", "qwen3", "gemma3") for t in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")}


@pytest.mark.parametrize("case", CACHE_CASES)
def test_prompt_logits_over_quantized_keys_are_llamacpps_bit_for_bit(tmp_path: Path, case: str) -> None:
    """A quantized cache's keys (llama.cpp without flash attention: half-precision values): the keys and queries
    rotated, the keys quantized as llama.cpp stores them, the scores its vec_dot: the same bits."""
    _, arch, type_k = case.split("/")
    path = tmp_path / "m.gguf"
    assert write_fixture_model(path, arch, Q.Q4_0) == str(RECORD[case + "/sha256"])
    model = Model(GGUFFile(str(path)), n_threads=2)
    model.set_cache_types(GGMLType[type_k], GGMLType.F16)
    tokens = [int(t) for t in RECORD["tokens"]]
    mine = model.forward(tokens, model.new_cache(128), logits="all")
    theirs = RECORD[case]
    same = mine.view(np.uint32) == theirs.view(np.uint32)
    assert same.all(), (f"{case}: {int(same.all(axis=1).sum())}/{len(tokens)} rows identical, "
                        f"largest difference {float(np.abs(mine - theirs).max()):.3g}")
