"""Perplexity of `pyllm quantize`'s outputs against llama-quantize's, both measured by llama.cpp's llama-perplexity.

    python bench/quantize_perplexity.py --llama-bin DIR --model MODEL.gguf --text FILE [--chunks 16] [--ctx 128]

For each file type: quantizes MODEL with both tools (--allow-requantize), runs llama-perplexity on each output
(-c CTX --chunks N, 2 threads) and prints a markdown row: the type, both sizes, both perplexities, their relative
difference and whether the two files are byte-identical. Not run in CI; the table goes in bench/README.md.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import subprocess
import sys
import tempfile
from pathlib import Path

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S",
         "Q5_K_M", "Q6_K"]


def perplexity(binary: Path, model: Path, text: Path, ctx: int, chunks: int) -> tuple[float, float]:
    run = subprocess.run([str(binary), "-m", str(model), "-f", str(text), "-c", str(ctx), "--chunks", str(chunks),
                          "-t", "2", "-b", str(ctx)], capture_output=True, text=True, check=True)
    found = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", run.stdout + run.stderr)
    if found is None:
        raise RuntimeError(f"no final estimate from llama-perplexity on {model}")
    return float(found.group(1)), float(found.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-bin", type=Path, required=True, help="folder of llama-quantize, llama-perplexity")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--text", type=Path, required=True)
    parser.add_argument("--ctx", type=int, default=128)
    parser.add_argument("--chunks", type=int, default=16)
    args = parser.parse_args()
    print("| type | llama-quantize MiB | pyllm MiB | PPL llama-quantize | PPL pyllm | difference | same bytes |")
    print("|---|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for ftype in TYPES:
            theirs, ours = Path(tmp) / f"lq-{ftype}.gguf", Path(tmp) / f"pyllm-{ftype}.gguf"
            subprocess.run([str(args.llama_bin / "llama-quantize"), "--allow-requantize", str(args.model),
                            str(theirs), ftype, "2"], capture_output=True, check=True)
            subprocess.run([sys.executable, "-m", "pyllm.cli", "quantize", str(args.model), str(ours), ftype,
                            "--allow-requantize", "-t", "2"], capture_output=True, check=True)
            ppl_theirs, err_theirs = perplexity(args.llama_bin / "llama-perplexity", theirs, args.text, args.ctx,
                                                args.chunks)
            ppl_ours, err_ours = perplexity(args.llama_bin / "llama-perplexity", ours, args.text, args.ctx,
                                            args.chunks)
            same = filecmp.cmp(theirs, ours, shallow=False)
            print(f"| {ftype} | {theirs.stat().st_size / 2**20:.1f} | {ours.stat().st_size / 2**20:.1f} "
                  f"| {ppl_theirs:.4f} ± {err_theirs:.4f} | {ppl_ours:.4f} ± {err_ours:.4f} "
                  f"| {100 * (ppl_ours / ppl_theirs - 1):+.3f}% | {'yes' if same else 'no'} |", flush=True)
            theirs.unlink()
            ours.unlink()


if __name__ == "__main__":
    main()
