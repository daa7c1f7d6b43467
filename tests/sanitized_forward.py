"""Forward passes of each architecture's tiny model (tests/fixture_models) and the refusal of a hostile file,
for `make test-asan-py`: run against a build of the C core under AddressSanitizer and UndefinedBehaviorSanitizer,
a read past a buffer or undefined behaviour aborts the process.

    python tests/sanitized_forward.py BUILD_DIR   (BUILD_DIR/pyllm must hold the C core this imports)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
from fixture_models import write_fixture_model
from fuzz.gguf_fuzz import small_model
from gguf import GGMLQuantizationType as Q

from pyllm import _pyllm_c
from pyllm.arch import ArchitectureError
from pyllm.gguf import GGUFFile
from pyllm.kernels import KernelError
from pyllm.model import Model, _CBlocks

# Each family once, each with another weight layout: Q4_0 lanes, Q5_0 regrouped, K-quants, Q4_1 / Q8_0 plain.
MODELS = (("llama", Q.Q4_0), ("qwen2", Q.Q5_0), ("qwen3", Q.Q6_K), ("gemma3", Q.Q4_K), ("llama", Q.Q8_0),
          ("qwen2", Q.Q4_1))


def forward_passes(work: Path) -> None:
    """A prompt, then one decode step, through the C blocks and the step-by-step reference; finite logits."""
    for arch, weight_type in MODELS:
        path = work / f"{arch}-{weight_type.name}.gguf"
        write_fixture_model(path, arch, weight_type)
        with GGUFFile(path) as f:
            for reference in (False, True):
                model = Model(f, n_threads=2, reference=reference)
                cache = model.new_cache(32, max_batch=8)
                prompt = model.forward([1, 5, 9, 12, 3, 40, 41, 42, 7, 8, 95], cache, logits="all")  # 2 batches
                step = model.forward([17], cache)
                assert np.isfinite(prompt).all() and np.isfinite(step).all(), (arch, weight_type, reference)
        print(f"forward {arch} {weight_type.name}: ok", flush=True)


def hostile_file_refused(work: Path) -> None:
    """A short attn_norm is refused at load; and if Python ever passed one, the C blocks refuse it too."""
    recipe = small_model("llama", Q.Q8_0, False, seed=1)
    recipe.tensors["blk.0.attn_norm.weight"] = (recipe.tensors["blk.0.attn_norm.weight"][0][:32].copy(), None)
    recipe.write(work / "short.gguf")
    with GGUFFile(work / "short.gguf") as f:
        try:
            Model(f)
        except ArchitectureError as exc:
            assert "blk.0.attn_norm.weight has shape [32]" in str(exc), exc
        else:
            raise AssertionError("the short attn_norm loaded")
    small_model("llama", Q.Q8_0, False, seed=1).write(work / "ok.gguf")
    with GGUFFile(work / "ok.gguf") as f:
        model = Model(f)
        model.weights.layers[0].attn_norm = model.weights.layers[0].attn_norm[:32].copy()
        model._c_blocks = _CBlocks(model.config, model.weights)
        try:
            model.forward([1, 2, 3], model.new_cache(8))
        except KernelError as exc:
            assert "bad shape" in str(exc), exc
        else:
            raise AssertionError("the C blocks ran a short attn_norm")
    print("hostile file: refused", flush=True)


def main() -> None:
    build = Path(sys.argv[1]).resolve()
    if Path(_pyllm_c.__file__).resolve().parent != build / "pyllm":
        sys.exit(f"imported {_pyllm_c.__file__}, not the sanitized build in {build}")
    with tempfile.TemporaryDirectory(prefix="pyllm-asan-") as tmp:
        forward_passes(Path(tmp))
        hostile_file_refused(Path(tmp))


if __name__ == "__main__":
    main()
