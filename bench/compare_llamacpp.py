"""pyllm against llama.cpp (llama-cpp-python) on the same GGUF file: logits and greedy text.

    python bench/compare_llamacpp.py MODEL [MODEL ...] [--tokens 32]

MODEL is a path or a catalogue name. For each, the prompt is tokenized by llama.cpp (so
only the forward pass is compared), then per-position logits (relative rms error, argmax
agreement) and a greedy continuation are compared. Needs llama-cpp-python; not run in CI.
"""

from __future__ import annotations

import argparse

import numpy as np

from pyllm import catalogue
from pyllm.gguf import GGUFFile
from pyllm.model import Model

PROMPT = b"The capital of France is Paris. The quick brown fox jumps over the lazy dog because"


def compare(path: str, n_tokens: int) -> None:
    import llama_cpp

    ll = llama_cpp.Llama(model_path=path, n_ctx=512, logits_all=True, verbose=False, n_threads=2)
    tokens = ll.tokenize(PROMPT, add_bos=True)
    ll.eval(tokens)
    ref = np.array(ll.scores[: len(tokens)], dtype=np.float32)
    model = Model(GGUFFile(path), n_threads=2)
    cache = model.new_cache(512)
    got = model.forward(tokens, cache, logits="all")
    rel_rms = float(np.sqrt(((got - ref) ** 2).mean() / (ref**2).mean()))
    agree = float(np.mean(got.argmax(-1) == ref.argmax(-1)))

    ours, logits = [], got[-1]
    for _ in range(n_tokens):
        ours.append(int(np.argmax(logits)))
        logits = model.forward([ours[-1]], cache)
    theirs = []
    for token in ll.generate(tokens, temp=0.0, top_k=1, reset=True):
        theirs.append(token)
        if len(theirs) == n_tokens:
            break
    same = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), n_tokens)
    print(f"{path}: {len(tokens)} prompt tokens, logits rel rms {rel_rms:.2e}, argmax agree {agree:.0%}, "
          f"greedy identical for {same}/{n_tokens} tokens")
    if same < n_tokens:
        print(f"  llama.cpp: {ll.detokenize(theirs)!r}\n  pyllm:     {ll.detokenize(ours)!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    for model in args.models:
        compare(str(catalogue.resolve(model)), args.tokens)


if __name__ == "__main__":
    main()
