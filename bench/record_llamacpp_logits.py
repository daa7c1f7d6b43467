"""Record llama.cpp's logits on the fixture models, for tests/test_llamacpp_logits.py.

    python bench/record_llamacpp_logits.py [--out tests/data/llamacpp_logits.npz]

Writes each fixture model of tests/fixture_models.py (every architecture x every tensor type
below), evaluates the fixture prompt with llama-cpp-python (logits of every position, one batch,
its default CPU paths), and saves the float32 logits with the sha256 of the model's tensor bytes.
Then the Q4_0 models again with a quantized KV cache's keys (type_k, flash attention off: values
in half precision), under "cache/<arch>/<type_k>".
CI then holds pyllm's logits to these bit for bit without needing llama.cpp. Rerun after
changing the fixture models or moving to another llama.cpp; say in the commit which build made
them (the x86 AVX2 build of llama-cpp-python 0.3.36 made the committed file).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import fixture_models  # noqa: E402

ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]
TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
TOKENS = [1, 5, 9, 17, 33, 40, 41, 60, 70, 80, 90, 95]  # 12 rows: llama.cpp's prompt paths (>= 8, groups of 4)
CACHE_K_TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]


def llamacpp_logits(llama_cpp, path: Path, **kwargs) -> np.ndarray:
    ref = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_batch=128, logits_all=True, verbose=False, n_threads=2,
                          **kwargs)
    ref.eval(TOKENS)
    logits = np.array(ref.scores[:len(TOKENS)], dtype=np.float32)
    del ref
    return logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "llamacpp_logits.npz")
    args = parser.parse_args()
    import llama_cpp

    record: dict[str, np.ndarray] = {"tokens": np.array(TOKENS, np.int32),
                                     "llama_cpp_version": np.array(llama_cpp.__version__)}
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ARCHS:
            for tensor_type in TYPES:
                path = Path(tmp) / f"{arch}-{tensor_type.name}.gguf"
                digest = fixture_models.write_fixture_model(path, arch, tensor_type)
                key = f"{arch}/{tensor_type.name}"
                record[key] = llamacpp_logits(llama_cpp, path)
                record[key + "/sha256"] = np.array(digest)
                print(f"{key:14s} logits {record[key].shape}, |max| {np.abs(record[key]).max():.3g}", flush=True)
                if tensor_type != Q.Q4_0:
                    continue
                for type_k in CACHE_K_TYPES:
                    cache_key = f"cache/{arch}/{type_k.name}"
                    record[cache_key] = llamacpp_logits(llama_cpp, path, type_k=int(type_k), flash_attn=False)
                    record[cache_key + "/sha256"] = np.array(digest)
                    print(f"{cache_key:20s} logits {record[cache_key].shape}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **record)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
