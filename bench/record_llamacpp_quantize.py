"""Record llama.cpp's llama-quantize outputs, for tests/test_quantize.py.

    python bench/record_llamacpp_quantize.py --llama-quantize PATH [--models DIR]
                                             [--out tests/data/llamacpp_quantize.json]

Runs llama-quantize on the cases below: Gemma 3 270M (the catalogue's Q4_K_M file, requantized with
--allow-requantize) to every file type pyllm writes, and the tiny fixture models of tests/fixture_models.py (float
input, rows a multiple of 256 so that no K-quant falls back) to every type, with --pure, --output-tensor-type and
importance matrices (GGUF and legacy, written by tests/fixture_models.py). For each output it saves the type and
the sha256 (first 16 hex digits) of every tensor's bytes in file order, general.file_type, and for the Gemma cases
the sha256 of the whole file. CI then holds `pyllm quantize` to them without llama.cpp. Not run in CI; rerun after
moving to another llama.cpp and say in the commit which build made the file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from gguf import GGMLQuantizationType as Q

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import fixture_models  # noqa: E402

from pyllm.gguf import GGUFFile  # noqa: E402

FILE_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",
              "Q5_K_S", "Q5_K_M", "Q6_K"]
GEMMA = "gemma-3-270m-q4_k_m.gguf"

# the fixture models' token embeddings are Q8_0, as in real files
REQUANT = "--allow-requantize"
# (name, input, file type, extra llama-quantize flags, imatrix kind or None). Inputs: "gemma", or "ARCH:TYPE" for a
# fixture model written by tests/fixture_models.py.
CASES: list[tuple[str, str, str, list[str], str | None]] = [
    *[(f"gemma/{t}", "gemma", t, [REQUANT], None) for t in FILE_TYPES],
    ("gemma/Q4_0-imatrix", "gemma", "Q4_0", [REQUANT], "gguf"),  # the mix changes with an imatrix
    ("gemma/Q3_K_M-imatrix", "gemma", "Q3_K_M", [REQUANT], "gguf"),
    *[(f"llama-F16/{t}", "llama:F16", t, [REQUANT], None) for t in FILE_TYPES],
    ("gemma3-BF16/Q4_K_M", "gemma3:BF16", "Q4_K_M", [REQUANT], None),
    ("qwen2-F32/Q5_K_S-pure", "qwen2:F32", "Q5_K_S", [REQUANT, "--pure"], None),
    ("llama-F16/Q4_K_M-output-Q5_0", "llama:F16", "Q4_K_M", [REQUANT, "--output-tensor-type", "q5_0"], None),
    ("llama-F16/F16-to-BF16", "llama:F16", "BF16", [REQUANT], None),
    *[(f"llama-F16/{t}-imatrix", "llama:F16", t, [REQUANT], "gguf")
      for t in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K"]],
    ("llama-F16/Q3_K_S-imatrix-legacy", "llama:F16", "Q3_K_S", [REQUANT], "legacy"),
]


def short_sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def describe(path: Path) -> dict:
    with GGUFFile(path) as f:
        return {"file_type": f.metadata["general.file_type"],
                "tensors": [[t.name, t.type_name, short_sha(f.raw(t.name).tobytes())] for t in f.tensors.values()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-quantize", required=True, help="the llama-quantize binary")
    parser.add_argument("--models", type=Path, default=ROOT / "models", help=f"the folder holding {GEMMA}")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "llamacpp_quantize.json")
    args = parser.parse_args()
    gemma_sha256 = hashlib.sha256((args.models / GEMMA).read_bytes()).hexdigest()
    record: dict = {"llama_quantize": "", "gemma_sha256": gemma_sha256, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        inputs: dict[str, Path] = {"gemma": args.models / GEMMA}
        digests: dict[str, str] = {}
        for name, source, ftype, flags, imatrix in CASES:
            if source not in inputs:
                arch, tensor_type = source.split(":")
                inputs[source] = tmp / f"{arch}-{tensor_type}.gguf"
                digests[source] = fixture_models.write_fixture_model(inputs[source], arch, Q[tensor_type])
            command = [args.llama_quantize, *flags]
            if imatrix is not None:
                matrix = tmp / f"imatrix-{imatrix}"
                fixture_models.write_fixture_imatrix(matrix, inputs[source], legacy=imatrix == "legacy")
                command += ["--imatrix", str(matrix)]
            out = tmp / "out.gguf"
            run = subprocess.run([*command, str(inputs[source]), str(out), ftype, "2"], check=True,
                                 capture_output=True, text=True)
            build = re.search(r"^version: (.*)$", run.stdout + run.stderr, re.M)  # llama.cpp's build, in its log
            record["llama_quantize"] = build.group(1) if build else "unknown"
            entry = {"input": source, "type": ftype, "flags": flags, "imatrix": imatrix, **describe(out)}
            if source == "gemma":
                if imatrix is None:  # (with one, its temporary path is in the file)
                    entry["file_sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()
            else:
                entry["input_tensors_sha256"] = digests[source]
            record["cases"][name] = entry
            types = sorted({t[1] for t in entry["tensors"]})
            print(f"{name:34s} {len(entry['tensors'])} tensors, {', '.join(types)}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
