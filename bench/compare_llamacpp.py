"""pyllm against llama.cpp (llama-cpp-python) on the same GGUF files: the full fidelity comparison.

    nice python bench/compare_llamacpp.py MODEL [MODEL ...] [--requantize] [--n-ctx 128] [--tokens 64]
                                          [--exact] [--text FILE] [--threads 2] [--requant-dir DIR]

MODEL is a path or a catalogue name. For each model (and, with --requantize, for variants of the
gemma3-270m file made by llama.cpp's own quantizer: F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q3_K_M,
Q5_K_M, Q6_K, and "pure" Q2_K, Q3_K_S, Q4_K_M; files are kept in --requant-dir and reused):

1. tokenization: pyllm's Llama.tokenize against llama_cpp's on varied texts, special on and off;
2. greedy completion: a prompt (tokenized by llama.cpp, so only the forward pass differs) continued
   by argmax for --tokens tokens; counts the identical leading tokens (also logits rel rms / argmax).
   Before it, the prompt's logits at every position: how many rows are bit-identical (pyllm follows
   llama.cpp's arithmetic for a prompt; its one-token decode steps differ from it in a few
   reduction orders, so the generated tokens can part at a near tie);
3. chat (files with a chat template): create_chat_completion(temperature=0, max_tokens=--tokens)
   on both; the answers must be the same text;
   for 2 also "greedy vs llama.cpp prompt path": llama.cpp reading the whole sequence as a prompt for each
   next token, so that all its steps use its prompt arithmetic, which is pyllm's; the two runs should agree
   for all tokens, except where llama.cpp's Q4_K rows fall outside a group of 4 (they then take its
   one-token order);
   for 2 and 3 also llama.cpp against itself: the same greedy run with its repacked weight layouts
   off, and with a micro-batch of 1 token. Both are changes that should not matter, yet at a near
   tie they flip llama.cpp's own argmax. The "self" figure is the shorter of the two agreements
   with llama.cpp's default run. A greedy or chat result passes when pyllm agrees with llama.cpp's
   default run at least as far as llama.cpp agrees with itself;
4. perplexity by llama-perplexity's protocol on the same text and n_ctx: pyllm's through
   pyllm.perplexity, llama.cpp's from logits_all evaluations of the same chunks (first token
   replaced by BOS when the vocab adds BOS, second half scored); the relative difference (target
   |diff| < 0.5%).

With --exact, also llama.cpp's perplexity on an F32 dequantization of each file: the weights' own
perplexity without any 8-bit rounding of activations, to see which implementation is nearer to it.

The default perplexity text is the built-in prose followed by English paragraphs from CPython's own
reference documentation (pydoc_data.topics, in every Python install), about 6k tokens: enough
scored tokens that perplexity differences reflect the implementations and not a handful of tokens.

Prints a table at the end. An error on one side (e.g. a tensor type pyllm lacks) goes into the
row, not a crash. Needs llama-cpp-python; not run in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import math
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from llamacpp_params import llama_cpp_defaults

from pyllm import catalogue
from pyllm.gguf import GGUFFile
from pyllm.llama import Llama
from pyllm.perplexity import perplexity

PROMPT = b"The capital of France is Paris. The quick brown fox jumps over the lazy dog because"
CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Give me three tips for keeping a small vegetable garden healthy."}]

TOKENIZE_TEXTS = [
    "Hello world",
    "   leading spaces, double  spaces,\ttabs\nand newlines\n\n\ntrailing  ",
    "The year 1999 had 365 days; pi is 3.14159, and -42 + 1,000,000 = 999958.",
    "Ünïcödé: café, naïve, Straße, Ελληνικά, русский текст, 日本語のテキスト, 中文字符, 한국어",
    "Emoji 🦙🚀👩‍💻🇫🇷 and symbols ©®™ € £ ¥ → ≤ ≥ ∑ √",
    "def square(x):\n    return x ** 2  # comment\n\nif __name__ == '__main__':\n\tprint(square(3))\n",
    "<|im_start|>user\nHi there<|im_end|>\n<start_of_turn>model\nok<end_of_turn><s></s><bos><eos>",
    "https://example.com/path?q=1&r=two#frag and mail a.b@c.org; JSON {\"k\": [1, 2.5, null, true]}",
    "I'm sure they've done it, won't they? 'Single' \"double\" — dashes – and … ellipses!!!???",
    "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism ABCDEFGHIJKLMNOP",
    "\n \n\t\t  \r\n" + "=" * 40 + " " * 17 + "x",
]

# Original prose for the perplexity run (about 5 KB).
PROSE = """\
The harbour town woke slowly on winter mornings. Before the light came, the fishing boats were already moving out \
past the breakwater, their lamps swinging in the dark, and the only sounds on the quay were the gulls and the low \
engines. By the time the bakery opened, the first boats were small shapes on the horizon, and the women who \
mended nets had taken their places on the benches by the harbour wall.

Nobody in the town could remember when the lighthouse had last been painted. Its white tower had turned the colour \
of old paper, and the red band near the top had faded to a dull pink. Every few years the council promised to \
repair it, and every few years the money went instead to the school roof or the road over the hill. The keeper, \
who was eighty and still climbed the stairs twice a day, said the ships did not care what colour it was.

In the spring the hills behind the town turned green almost overnight. Farmers drove their sheep up to the high \
pastures along narrow lanes lined with stone walls, and for a week or two the whole valley smelled of wet grass \
and wood smoke. Children walked to school along the same lanes, stopping to look at the lambs, and arrived late \
with muddy shoes and excuses that the teacher had heard many times before.

The library was a single room above the post office. It held perhaps four thousand books, most of them donated, \
and a long table where students did their homework in the afternoons. The librarian kept a card for every reader \
and knew without looking which books each of them had borrowed. She believed that a town without a library was \
only a collection of houses, and she said so at every council meeting.

Trade had always been the life of the place. In the old days, ships carried wool and salted fish to the cities \
along the coast and came back with timber, cloth and news. The merchants built tall houses near the water, with \
wide windows on the upper floors so they could watch for their ships. Many of those houses still stand, although \
most have been divided into flats, and the windows now look out on pleasure boats instead of cargo.

When the railway arrived, everything changed. Goods that had taken a week by sea could reach the city in a day, \
and the harbour lost much of its business. Some families moved away to find work; others stayed and turned to \
farming or to the summer visitors who began to come by train. The station was built on the edge of town, and for \
a while people argued about whether it had saved the town or ruined it.

Science reached the valley in the form of a small weather station on the hill. Twice a day a volunteer read the \
thermometers, measured the rain and wrote the numbers in a book that was sent to the capital at the end of each \
month. After sixty years the records showed that the winters had become a little milder and the summers a little \
wetter, a change too slow for anyone to notice but clear enough on paper.

Music was another matter. Every Friday evening a group of players met in the back room of the inn with fiddles, an \
accordion and whatever else people happened to bring. They played the old dance tunes that had been passed down \
for generations, rarely written down, and each player had a slightly different version. Visitors sometimes tried \
to record them, but the musicians always said that a tune changed every time it was played, and that was the \
point.

The doctor had practised in the town for thirty years. She knew every family and most of their illnesses, and she \
still made house calls on a bicycle when the weather allowed. Her advice was always the same: walk every day, eat \
what grows nearby, and do not worry about things you cannot change. People said that her advice was free but her \
patience was priceless.

At the end of the year the town held a festival on the longest night. Lanterns were hung along the harbour wall, \
the bakery made spiced bread, and the children carried candles in jars down to the water. Someone always made a \
speech about the old ships and the people who had sailed them, and then the music started, and the dancing went \
on until the lamps of the first fishing boats moved out again past the breakwater.
"""


def default_text(n_chars: int = 24000) -> str:
    """PROSE, then prose paragraphs of CPython's reference docs, up to n_chars."""
    import pydoc_data.topics

    docs = "\n\n".join(pydoc_data.topics.topics[key] for key in sorted(pydoc_data.topics.topics))
    paragraphs = [p for p in docs.split("\n\n")
                  if len(p) > 200 and p.count("  ") < 3 and not p.lstrip().startswith((">>>", "...", "*"))]
    return (PROSE + "\n" + "\n\n".join(paragraphs))[:n_chars]


def _requant_variants() -> list[tuple[str, bool]]:
    plain = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q3_K_M", "Q5_K_M", "Q6_K"]
    pure = ["Q2_K", "Q3_K_S", "Q4_K_M"]
    return [(name, False) for name in plain] + [(name, True) for name in pure]


@dataclass
class Row:
    name: str
    tokens: str = "-"
    logits: str = "-"              # prompt logit rows bit-identical to llama.cpp's
    greedy_prompt: str = "-"       # greedy agreement with llama.cpp reading every step as a prompt
    greedy: str = "-"
    greedy_self: str = "-"
    chat: str = "-"
    chat_self: str = "-"
    noise: float | None = None     # llama.cpp's own rms logit difference between its runs
    greedy_tie: bool = False       # the first greedy difference is at a near tie (both margins < noise)
    chat_tie: bool = False
    ppl_ours: float | None = None
    ppl_ref: float | None = None
    ppl_exact: float | None = None
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def diff(self) -> str:
        if self.ppl_ours is None or self.ppl_ref is None:
            return "-"
        return f"{100 * (self.ppl_ours / self.ppl_ref - 1):+.3f}"


def _err(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text if len(text) <= 100 else text[:97] + "..."


def compare_tokenization(ours: Llama, ref) -> tuple[str, list[str]]:
    same, total, bad = 0, 0, []
    for text in TOKENIZE_TEXTS:
        for special in (False, True):
            a = ours.tokenize(text.encode("utf-8"), add_bos=True, special=special)
            b = ref.tokenize(text.encode("utf-8"), add_bos=True, special=special)
            total += 1
            if a == b:
                same += 1
            else:
                bad.append(f"tokenize(special={special}) differs on {text[:30]!r}")
    return f"{same}/{total}", bad


def llama_cpp_greedy(ref, tokens: list[int], n_tokens: int) -> list[int]:
    out = []
    for token in ref.generate(tokens, temp=0.0, top_k=1, reset=True):
        out.append(token)
        if len(out) == n_tokens:
            break
    return out


def llama_cpp_prompt_greedy(ref, tokens: list[int], n_tokens: int) -> list[int]:
    """Greedy continuation in which llama.cpp reads the whole sequence as a prompt for every next token: its
    prompt arithmetic throughout (its usual one-token decode steps compute in other orders)."""
    out: list[int] = []
    for _ in range(n_tokens):
        ref.reset()
        ref.eval(tokens + out)
        out.append(int(np.argmax(ref.scores[len(tokens) + len(out) - 1])))
    return out


def leading_agreement(a, b) -> int:
    """How many leading items (tokens or characters) two sequences share."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def llama_cpp_alternatives(path: str, n_ctx: int, threads: int) -> dict[str, object]:
    """llama.cpp instances whose answers should equal the default's: repacked layouts off; micro-batch of 1."""
    import llama_cpp

    with llama_cpp_defaults("llama_model_default_params", use_extra_bufts=False):  # repacking off
        no_repack = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, verbose=False,
                                    n_threads=threads)
    ubatch1 = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=1, logits_all=True,
                              verbose=False, n_threads=threads)
    return {"repacking off": no_repack, "micro-batch 1": ubatch1}


def self_agreement(reference, alternatives: dict[str, object], run) -> tuple[int, str]:
    """(shortest leading agreement of run(alt) with `reference` over the alternatives, which one)."""
    worst, which = len(reference), "-"
    for label, alt in alternatives.items():
        n = leading_agreement(reference, run(alt))
        if n < worst:
            worst, which = n, label
    return worst, which


def llama_cpp_noise(ref, alternatives: dict[str, object], tokens: list[int]) -> float:
    """How far llama.cpp's logits move between its own runs: the largest rms difference (in logits) between
    the default run and an alternative on `tokens`."""
    ref.reset()
    ref.eval(tokens)
    base = np.array(ref.scores[: len(tokens)], dtype=np.float64)
    worst = 0.0
    for alt in alternatives.values():
        alt.reset()
        alt.eval(tokens)
        other = np.array(alt.scores[: len(tokens)], dtype=np.float64)
        worst = max(worst, float(np.sqrt(((other - base) ** 2).mean())))
    return worst


def greedy_divergence(ours: Llama, ref, tokens: list[int],
                      n_tokens: int) -> tuple[int, str, np.ndarray, tuple[float, float] | None, list[int]]:
    """Argmax-continue `tokens` on both sides for n_tokens: (identical leading tokens, explanation, our prompt
    logits, each side's margin at the first difference or None, our n_tokens tokens).

    The explanation gives, at the first difference, each side's logit margin of its own choice over the other's
    (a margin near 0 is a near tie that any rounding difference can flip).
    """
    theirs = llama_cpp_greedy(ref, tokens, n_tokens)
    model = ours.model
    cache = model.new_cache(len(tokens) + n_tokens)
    prompt_logits = model.prefill(tokens, cache, logits="all")
    mine, logits, same, why, margins = [], prompt_logits[-1], n_tokens, "", None
    for k in range(n_tokens):
        mine.append(int(np.argmax(logits)))
        if margins is None and mine[-1] != theirs[k]:
            ref_row = np.asarray(ref.scores[len(tokens) - 1 + k])
            same = k
            margins = (float(logits[mine[k]] - logits[theirs[k]]), float(ref_row[theirs[k]] - ref_row[mine[k]]))
        if k + 1 < n_tokens:
            logits = model.prefill([mine[-1]], cache)
    if margins is not None:
        why = (f"llama.cpp {ref.detokenize(theirs[same:same + 6])!r} vs pyllm {ref.detokenize(mine[same:same + 6])!r} "
               f"at token {same}; logit margin of each side's choice there: pyllm {margins[0]:.3f}, "
               f"llama.cpp {margins[1]:.3f}")
    return same, why, prompt_logits, margins, mine


def compare_greedy(ours: Llama, ref, alternatives: dict[str, object], n_tokens: int,
                   row: Row) -> tuple[str, str, list[str]]:
    tokens = ref.tokenize(PROMPT, add_bos=True)
    ref.reset()
    ref.eval(tokens)
    ref_logits = np.array(ref.scores[: len(tokens)], dtype=np.float32)
    same, why, got, margins, ours_tokens = greedy_divergence(ours, ref, tokens, n_tokens)
    row.noise = llama_cpp_noise(ref, alternatives, tokens)
    row.greedy_tie = margins is not None and max(margins) < row.noise
    row.logits = f"{int((got.view(np.uint32) == ref_logits.view(np.uint32)).all(axis=1).sum())}/{len(tokens)}"
    rel_rms = float(np.sqrt(((got - ref_logits) ** 2).mean() / (ref_logits**2).mean()))
    agree = float(np.mean(got.argmax(-1) == ref_logits.argmax(-1)))
    notes = [f"prompt logits rel rms {rel_rms:.2e}, argmax agree {agree:.0%}; llama.cpp's own logit noise "
             f"(rms, default vs alternatives) {row.noise:.3f}"]
    if why:
        notes.append("greedy: " + why)
    theirs = llama_cpp_greedy(ref, tokens, n_tokens)
    row.greedy_prompt = f"{leading_agreement(ours_tokens, llama_cpp_prompt_greedy(ref, tokens, n_tokens))}/{n_tokens}"
    own, which = self_agreement(theirs, alternatives, lambda alt: llama_cpp_greedy(alt, tokens, n_tokens))
    if own < n_tokens:
        notes.append(f"greedy: llama.cpp with {which} agrees with its default run for {own}/{n_tokens} tokens")
    return f"{same}/{n_tokens}", f"{own}/{n_tokens}", notes


def llama_cpp_chat(ref, n_tokens: int) -> str:
    ref.reset()
    return ref.create_chat_completion(CHAT, temperature=0, max_tokens=n_tokens)["choices"][0]["message"]["content"]


def compare_chat(ours: Llama, ref, alternatives: dict[str, object], n_tokens: int,
                 row: Row) -> tuple[str, str, list[str]]:
    if "tokenizer.chat_template" not in ours.metadata:
        return "-", "-", []
    a = ours.create_chat_completion(CHAT, temperature=0, max_tokens=n_tokens)["choices"][0]["message"]["content"]
    b = llama_cpp_chat(ref, n_tokens)
    own, which = self_agreement(b, alternatives, lambda alt: llama_cpp_chat(alt, n_tokens))
    own_text = "yes" if own == len(b) else f"no @{own} ({which})"
    if a == b:
        return "yes", own_text, []
    at = leading_agreement(a, b)
    notes = [f"chat: llama.cpp {b[at:at + 30]!r} vs pyllm {a[at:at + 30]!r} at char {at}"]
    # same prompt tokens? then the difference is in the forward pass: show where and how close the call was
    prompt = ours.tokenize(ours.apply_chat_template(CHAT).encode("utf-8"), add_bos=True, special=True)
    if len(prompt) > 1 and prompt[0] == prompt[1] == ours.token_bos():
        prompt = prompt[1:]  # the template wrote BOS itself
    theirs_prompt = list(ref.input_ids[: len(prompt)])
    if theirs_prompt != prompt:
        notes.append(f"chat prompt tokens differ: llama.cpp {theirs_prompt[:8]}... vs pyllm {prompt[:8]}...")
    else:
        same, why, _, margins, _ = greedy_divergence(ours, ref, prompt, n_tokens)
        row.chat_tie = margins is not None and row.noise is not None and max(margins) < row.noise
        notes.append(f"chat prompt tokens identical ({len(prompt)}); token-level: " + (why or "no difference"))
    return f"no @{at}", own_text, notes


def llama_cpp_perplexity(ref, text: str, n_ctx: int) -> tuple[float, int]:
    """llama-perplexity's protocol on llama.cpp's logits (an independent implementation of the scoring)."""
    import llama_cpp

    tokens = ref.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(ref.model)))
    n_chunks = len(tokens) // n_ctx
    first = n_ctx // 2
    total, count = 0.0, 0
    for c in range(n_chunks):
        chunk = tokens[c * n_ctx:(c + 1) * n_ctx]
        if add_bos:
            chunk[0] = ref.token_bos()
        ref.reset()
        ref.eval(chunk)
        logits = np.asarray(ref.scores[first:n_ctx - 1], dtype=np.float64)
        top = logits.max(axis=1)
        log_z = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
        total += float((log_z - logits[np.arange(len(logits)), chunk[first + 1:]]).sum())
        count += len(logits)
    return math.exp(total / count), len(tokens)


def compare(name: str, path: str, args: argparse.Namespace, text: str) -> Row:
    import llama_cpp

    row = Row(name)
    started = time.perf_counter()
    ref_ctx = max(256, args.n_ctx, len(PROMPT) + args.tokens)
    ref = llama_cpp.Llama(model_path=path, n_ctx=ref_ctx, n_batch=ref_ctx, logits_all=True, verbose=False,
                          n_threads=args.threads)
    n_ref_tokens = None
    try:
        row.ppl_ref, n_ref_tokens = llama_cpp_perplexity(ref, text, args.n_ctx)
    except Exception as exc:  # noqa: BLE001 - any failure goes into the table
        row.errors.append(f"llama.cpp perplexity: {_err(exc)}")
    try:
        ours = Llama(path, n_ctx=ref_ctx, n_threads=args.threads)
    except Exception as exc:  # noqa: BLE001
        row.errors.append(f"pyllm cannot load: {_err(exc)}")
        try:
            row.tokens, bad = compare_tokenization(Llama(path, vocab_only=True), ref)
            row.notes += bad
        except Exception as exc2:  # noqa: BLE001
            row.errors.append(f"tokenization: {_err(exc2)}")
        return row
    try:
        row.tokens, notes = compare_tokenization(ours, ref)
        row.notes += notes
    except Exception as exc:  # noqa: BLE001
        row.tokens = "error"
        row.errors.append(f"tokens: {_err(exc)}")
    alternatives = llama_cpp_alternatives(path, ref_ctx, args.threads)
    for attr, step in [("greedy", compare_greedy), ("chat", compare_chat)]:
        try:
            value, own, notes = step(ours, ref, alternatives, args.tokens, row)
            setattr(row, attr, value)
            setattr(row, attr + "_self", own)
            row.notes += notes
        except Exception as exc:  # noqa: BLE001
            setattr(row, attr, "error")
            row.errors.append(f"{attr}: {_err(exc)}")
    del alternatives
    try:
        result = perplexity(ours, text, args.n_ctx)
        row.ppl_ours = result.ppl
        if n_ref_tokens is not None and result.n_tokens != n_ref_tokens:
            row.errors.append(f"perplexity text: {result.n_tokens} tokens in pyllm, {n_ref_tokens} in llama.cpp")
    except Exception as exc:  # noqa: BLE001
        row.errors.append(f"pyllm perplexity: {_err(exc)}")
    if args.exact:
        try:
            row.ppl_exact = exact_perplexity(Path(path), args, text)
        except Exception as exc:  # noqa: BLE001
            row.errors.append(f"exact perplexity: {_err(exc)}")
    row.notes.append(f"{time.perf_counter() - started:.0f} s")
    return row


def exact_perplexity(path: Path, args: argparse.Namespace, text: str) -> float:
    """llama.cpp's perplexity on an F32 copy of the file (its weights dequantized, nothing else rounded to 8 bits)."""
    import llama_cpp

    args.requant_dir.mkdir(parents=True, exist_ok=True)
    f32 = args.requant_dir / f"{path.stem}.exact-f32.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.nthread = args.threads
    try:
        with _stderr_to(f32.with_suffix(".log")):
            rc = llama_cpp.llama_model_quantize(str(path).encode(), str(f32).encode(), ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize to F32 failed ({rc})")
        ref = llama_cpp.Llama(model_path=str(f32), n_ctx=args.n_ctx, n_batch=args.n_ctx, logits_all=True,
                              verbose=False, n_threads=args.threads)
        return llama_cpp_perplexity(ref, text, args.n_ctx)[0]
    finally:
        f32.unlink(missing_ok=True)


@contextlib.contextmanager
def _stderr_to(path: Path):
    """Send file descriptor 2 (where C code logs) to `path` for the duration."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def requantize(src: Path, out_dir: Path, threads: int) -> list[tuple[str, Path | None, str]]:
    """(variant, path or None, note) for every variant, quantized by llama.cpp from `src` (reused if present)."""
    import llama_cpp

    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for variant, pure in _requant_variants():
        label = variant + (" pure" if pure else "")
        dst = out_dir / f"{src.stem}.{variant}{'-pure' if pure else ''}.gguf"
        if not dst.exists():
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{variant}")
            params.allow_requantize = True
            params.pure = pure
            params.nthread = threads
            tmp = dst.with_suffix(".partial")
            started = time.perf_counter()
            with _stderr_to(dst.with_suffix(".log")):  # llama.cpp's quantizer log, one line per fallback
                rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
            if rc != 0:
                made.append((label, None, f"llama_model_quantize failed ({rc}), see {dst.with_suffix('.log')}"))
                continue
            os.replace(tmp, dst)
            print(f"  quantized {label} in {time.perf_counter() - started:.0f} s", flush=True)
        log = dst.with_suffix(".log")
        fallbacks = log.read_text(errors="replace").count("falling back") if log.exists() else 0
        with GGUFFile(dst) as f:
            types = Counter(t.type_name for t in f.tensors.values())
        note = "types " + ", ".join(f"{k} x{v}" for k, v in types.most_common())
        if fallbacks:
            note += f" ({fallbacks} tensors fell back to another type: rows not a multiple of 256)"
        made.append((label, dst, note))
    return made


def print_row(row: Row) -> None:
    ppl = (f"ppl pyllm {row.ppl_ours:.4f}" if row.ppl_ours else "ppl pyllm -") + \
          (f", llama.cpp {row.ppl_ref:.4f}" if row.ppl_ref else ", llama.cpp -") + f" ({row.diff} %)" + \
          (f", exact weights {row.ppl_exact:.4f}" if row.ppl_exact else "")
    print(f"{row.name}: tokens {row.tokens}, prompt logits identical {row.logits}, "
          f"greedy {row.greedy} (llama.cpp self {row.greedy_self}, llama.cpp prompt path {row.greedy_prompt}), "
          f"chat {row.chat} (llama.cpp self {row.chat_self}), {ppl}", flush=True)
    for note in row.errors + row.notes:
        print(f"    {note}", flush=True)


def _count(fraction: str) -> int | None:
    """'12/64' -> 12; anything else (a dash, an error) -> None."""
    head = fraction.split("/")[0]
    return int(head) if head.isdigit() else None


def verdict(r: Row) -> str:
    """pass when every check holds: tokens all equal; greedy and chat identical, or at least as close to llama.cpp's
    default run as llama.cpp's own alternatives are (or, for greedy, identical to llama.cpp's prompt-path run);
    perplexity within 0.5%."""
    failed = []
    tokens = r.tokens.split("/")
    if len(tokens) != 2 or tokens[0] != tokens[1]:
        failed.append("tokens")
    ours, own, prompt_path = _count(r.greedy), _count(r.greedy_self), _count(r.greedy_prompt)
    exact = prompt_path is not None and r.greedy_prompt.split("/")[0] == r.greedy_prompt.split("/")[1]
    if ours is None or own is None or (ours < own and not r.greedy_tie and not exact):  # n/n is never below own
        failed.append("greedy")
    if r.chat not in ("yes", "-"):
        ours_at = int(r.chat.split("@")[1])
        own_at = int(r.chat_self.split("@")[1].split()[0]) if "@" in r.chat_self else None
        if (own_at is None or ours_at < own_at) and not r.chat_tie:
            failed.append("chat")
    if r.ppl_ours is None or r.ppl_ref is None or abs(r.ppl_ours / r.ppl_ref - 1) >= 0.005:
        failed.append("ppl")
    return "pass" if not failed else "FAIL " + ",".join(failed)


def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    headers = ["model/variant", "tokens equal", "prompt logits identical", f"greedy identical n/{args.tokens}",
               "llama.cpp self", "greedy vs llama.cpp prompt path",
               "chat identical", "llama.cpp self", "llama.cpp noise", "ppl pyllm", "ppl llama.cpp", "diff %"] + \
        (["ppl exact weights"] if args.exact else []) + ["verdict", "note"]
    body = []
    for r in rows:
        exact = [f"{r.ppl_exact:.4f}" if r.ppl_exact else "-"] if args.exact else []
        body.append([r.name, r.tokens, r.logits, r.greedy + (" (tie)" if r.greedy_tie else ""), r.greedy_self,
                     r.greedy_prompt,
                     r.chat + (" (tie)" if r.chat_tie else ""), r.chat_self,
                     f"{r.noise:.3f}" if r.noise is not None else "-",
                     f"{r.ppl_ours:.4f}" if r.ppl_ours else "-", f"{r.ppl_ref:.4f}" if r.ppl_ref else "-", r.diff,
                     *exact, verdict(r), "; ".join(r.errors)])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(headers)]
    print()
    print(f"perplexity: n_ctx {args.n_ctx}, {'--text ' + args.text if args.text else 'the default text'}")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for b in body:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help="paths or catalogue names")
    parser.add_argument("--tokens", type=int, default=64, help="greedy/chat tokens (default 64)")
    parser.add_argument("--n-ctx", type=int, default=128, help="perplexity chunk size (default 128)")
    parser.add_argument("--text", help="perplexity text file (default: the built-in prose)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requantize", action="store_true",
                        help="also compare llama.cpp-made variants of the gemma3-270m file")
    parser.add_argument("--requant-dir", type=Path, default=Path("/tmp/pyllm-requant"))
    parser.add_argument("--exact", action="store_true",
                        help="also llama.cpp's perplexity on an F32 dequantization of each file (the weights' own "
                             "perplexity, without 8-bit activations): which side is closer to it")
    args = parser.parse_args()
    if not args.models and not args.requantize:
        parser.error("give at least one MODEL, or --requantize")
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # quiet llama.cpp's own log
    text = Path(args.text).read_text(encoding="utf-8") if args.text else default_text()

    import llama_cpp
    features = llama_cpp.llama_print_system_info().decode().strip()
    build = "AVX-512" if "AVX512 = 1" in features else "AVX2" if "AVX2 = 1" in features else "non-x86 or pre-AVX2"
    print(f"llama.cpp {llama_cpp.__version__}, its {build} build ({features}); pyllm follows the AVX2 build's "
          "arithmetic, which the AVX-512 build's exp, softmax sums and float dots differ from", flush=True)
    started = time.perf_counter()
    rows = []
    for model in args.models:
        path = catalogue.resolve(model)
        row = compare(path.name, str(path), args, text)
        print_row(row)
        rows.append(row)
    if args.requantize:
        src = catalogue.resolve("gemma3-270m")
        print(f"requantizing {src.name} into {args.requant_dir} ...", flush=True)
        for label, path, note in requantize(src, args.requant_dir, args.threads):
            if path is None:
                row = Row(f"gemma3 {label}", errors=[note])
            else:
                row = compare(f"gemma3 {label}", str(path), args, text)
                row.notes.insert(0, note)
            print_row(row)
            rows.append(row)
    print_table(rows, args)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
