"""Compare pyllm's tokenizer with llama.cpp's (through llama-cpp-python) on many strings.

    python bench/compare_tokenizer.py [MODEL.gguf ...] [--random N] [--emit]

For every model: token ids for varied text (code, emoji, CJK, whitespace runs, special-token
texts, invalid UTF-8 and seeded random mixes) with add_bos/special on and off; the piece of
every token id (special on and off); llama_detokenize of every encoded text (with and without
remove_special / unparse_special); the end-of-generation set and the special ids. Prints one
line per check and exits 1 on any difference. `--emit` prints (text, ids) cases to paste into
tests. llama.cpp is only an oracle here: it is never needed by pyllm or its tests.
"""

from __future__ import annotations

import argparse
import ctypes
import random
import re
import sys
import time
from pathlib import Path

import llama_cpp

from pyllm.gguf import GGUFFile
from pyllm.text.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
VOCAB = ROOT.parent / "shared" / "vocab"
DEFAULT_MODELS = [
    ROOT / "models" / "gemma-3-270m-q4_k_m.gguf",
    ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
    ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    VOCAB / "ggml-vocab-llama-spm.gguf",
    VOCAB / "ggml-vocab-gpt-2.gguf",
    VOCAB / "ggml-vocab-llama-bpe.gguf",
]

FIXED_TEXTS: list[str | bytes] = [
    "",
    " ",
    "  ",
    "Hello world",
    " Hello world",
    "Hello, world! How are you ?",
    "I'm sure it's fine, isn't it? They'll say 'RE' and we'VE gone.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }\r\n\r\n",
    "\t\tindented\twith tabs\n\n\n\n   trailing   ",
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "Emoji: 😀🎉👩‍👩‍👧‍👦 🇫🇷 🦙🦙 ✅",
    "Numbers 1 12 123 1234 12345 3.14159 1,000,000 ١٢٣ ①②③",
    "Ünïcödé àçcénts: café naïve façade Ωmega ß ſ İstanbul",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<s>[INST] text [/INST]</s>",
    "<bos><eos><pad><unk> <mask> [multimodal] <unused0> <unused99>",
    "<table><tr><td>cell</td></tr></table> <h1>Title</h1> <b>bold</b>",
    "<|endoftext|><fim_prefix>a<fim_suffix>b<fim_middle>",
    "a\u00a0b\u2003c\u3000d\u2028e\u0085f\x1cg\x1fh\x0bi\x0cj",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "    leading spaces\n        more\n",
    "trailing spaces    ",
    "\n",
    "\n\n\n",
    "a" * 300,
    "ab" * 200 + " " + "xyz" * 100,
    "x" * 50 + "🦙" * 20,
    "http://example.com/path?query=1&b=2#frag user@example.com",
    "Ⅻ ⅞ ½ ² ³ ¹ ⁴ 𝟘𝟙𝟚 𝐀𝐁𝐂 𝔸𝔹",
    "\u0915\u094d\u0937 हिन्दी ภาษาไทย العربية עברית",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'Ve 'LL 'D '",
    "  ?  !  .  ,  ' s ' re",
    b"invalid \xff\xfe bytes \xc3( \xe2\x82 end",
    b"\xed\xa0\x80 surrogate \xc0\x80 overlong \xf8\x88\x80\x80 five-byte form",
    b"truncated at the end \xe6\x97",
    b"\x80\x81 leading continuation",
    b"mixed \xf0\x9f\x98 emoji cut \xf0\x9f\x98\x80 whole",
]


def random_texts(n: int, specials: list[str], seed: int = 1234) -> list[str | bytes]:
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n\r  \n\n",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "éàüößçñøåæœ",
        "日本語中文한국어ひらがなカタカナ",
        "😀🎉🦙✅🚀😶‍🌫️👍🏽",
        "абвгдежзийклмнопрстуфхцчшщъыьэюя",
        "\u00a0\u2003\u3000\u200b\u200d\ufeff\u0301\u0308",
        "αβγδεζηθικλμνξοπρστυφχψω",
    ]
    out: list[str | bytes] = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 30)):
            r = rng.random()
            if r < 0.05 and specials:
                parts.append(rng.choice(specials))
            elif r < 0.1:
                parts.append(" " * rng.randint(1, 8))
            else:
                pool = rng.choice(pools)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
        text = "".join(parts)
        if rng.random() < 0.15:
            data = bytearray(text.encode())
            for _ in range(rng.randint(1, 3)):
                data.insert(rng.randint(0, len(data)), rng.randint(0x80, 0xFF))
            out.append(bytes(data))
        else:
            out.append(text)
    return out


def aborts_llama_bpe(data: bytes) -> bool:
    """Whether llama.cpp's BPE path would abort on `data`: a four-byte form above U+10FFFF
    (lead byte 0xF4..0xF7 with three continuation bytes) decodes to a code point it cannot encode."""
    return re.search(rb"(?:\xf4[\x90-\xbf]|[\xf5-\xf7][\x80-\xbf])[\x80-\xbf]{2}", data) is not None


class Oracle:
    """llama.cpp's vocabulary through llama-cpp-python's low-level API."""

    def __init__(self, path: Path) -> None:
        self.llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = self.llm._model.vocab
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, data: bytes, add_special: bool, special: bool) -> list[int]:
        return self.llm.tokenize(data, add_bos=add_special, special=special)

    def piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 256, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 16 * len(ids)
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), buf, size, remove_special, unparse_special)
        if n < 0:
            size = -n
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), buf, size, remove_special, unparse_special)
        return buf.raw[:n]


def compare(path: Path, n_random: int, emit: bool, quick: bool = False) -> int:
    print(f"== {path.name}")
    oracle = Oracle(path)
    t0 = time.perf_counter()
    tok = Tokenizer.from_gguf(GGUFFile(path))
    print(f"   pyllm tokenizer built in {time.perf_counter() - t0:.3f} s: {tok!r}")
    failures = 0

    def check(label: str, ok: bool, detail: str = "") -> None:
        nonlocal failures
        if not ok:
            failures += 1
            if failures <= 25:
                print(f"   DIFF {label}: {detail}")

    # special ids, flags, EOG set, attributes and pieces of every token
    v = oracle.vocab
    check("n_vocab", oracle.n_vocab == tok.n_vocab, f"{oracle.n_vocab} vs {tok.n_vocab}")
    for name, fn, mine in (
        ("bos", llama_cpp.llama_vocab_bos, tok.bos_id), ("eos", llama_cpp.llama_vocab_eos, tok.eos_id),
        ("eot", llama_cpp.llama_vocab_eot, tok.eot_id), ("pad", llama_cpp.llama_vocab_pad, tok.pad_id),
        ("fim_pre", llama_cpp.llama_vocab_fim_pre, tok.fim_pre_id),
        ("fim_pad", llama_cpp.llama_vocab_fim_pad, tok.fim_pad_id),
        ("fim_rep", llama_cpp.llama_vocab_fim_rep, tok.fim_rep_id),
    ):
        theirs = fn(v)
        check(f"{name}_id", (None if theirs < 0 else theirs) == mine, f"llama.cpp {theirs}, pyllm {mine}")
    check("add_bos", bool(llama_cpp.llama_vocab_get_add_bos(v)) == tok.add_bos)
    check("add_eos", bool(llama_cpp.llama_vocab_get_add_eos(v)) == tok.add_eos)
    eog = {i for i in range(oracle.n_vocab) if llama_cpp.llama_vocab_is_eog(v, i)}
    check("eog set", eog == set(tok.eog_ids), f"llama.cpp {sorted(eog)[:20]}, pyllm {sorted(tok.eog_ids)[:20]}")
    n_attr = n_piece = 0
    for i in range(0 if quick else oracle.n_vocab):
        attr = llama_cpp.llama_vocab_get_attr(v, i)
        if attr != int(tok.token_attr(i)):
            n_attr += 1
            check(f"attr {i}", False, f"{tok.token_text(i)!r}: llama.cpp {attr}, pyllm {int(tok.token_attr(i))}")
        for special in (False, True):
            a, b = oracle.piece(i, special), tok.token_to_piece(i, special)
            if a != b:
                n_piece += 1
                check(f"piece {i} special={special}", False, f"llama.cpp {a!r}, pyllm {b!r}")
    if not quick:
        print(f"   token attributes: {oracle.n_vocab - n_attr}/{oracle.n_vocab} equal; "
              f"pieces: {2 * oracle.n_vocab - n_piece}/{2 * oracle.n_vocab} equal")

    specials = [tok.token_text(i) for i in range(tok.n_vocab) if int(tok.token_attr(i)) & (8 | 16 | 1)]
    texts = FIXED_TEXTS + random_texts(n_random, specials[:200])
    n_enc = n_dec = n_cases = 0
    t_mine = t_theirs = 0.0
    for text in texts:
        data = text if isinstance(text, bytes) else text.encode()
        if not tok.is_spm and aborts_llama_bpe(data):
            continue
        for add_special in (False, True):
            for special in (False, True):
                n_cases += 1
                t = time.perf_counter()
                want = oracle.tokenize(data, add_special, special)
                t_theirs += time.perf_counter() - t
                t = time.perf_counter()
                got = tok.encode(text, add_bos=add_special, special=special)
                t_mine += time.perf_counter() - t
                if got != want:
                    n_enc += 1
                    check("encode", False, f"{text!r:.80} add_bos={add_special} special={special}\n"
                          f"        llama.cpp {want[:24]}\n        pyllm     {got[:24]}")
                if emit and not add_special and len(want) <= 40:
                    print(f"    ({text!r}, {special}, {want}),")
                for remove_special in (False, True):
                    for unparse in (False, True):
                        a = oracle.detokenize(want, remove_special, unparse)
                        b = tok.decode(want, special=unparse, remove_special=remove_special)
                        if a != b:
                            n_dec += 1
                            check("decode", False,
                                  f"{want[:16]} rs={remove_special} us={unparse}: {a!r:.80} vs {b!r:.80}")
                        s = tok.stream(special=unparse, remove_special=remove_special)
                        streamed = "".join(s.feed(t) for t in want) + s.flush()
                        if streamed != b.decode("utf-8", "replace"):
                            n_dec += 1
                            check("stream", False, f"{want[:16]}: {streamed!r:.60} vs {b!r:.60}")
    print(f"   encode: {n_cases - n_enc}/{n_cases} equal ({len(texts)} texts x add_bos x special); "
          f"decode+stream: {8 * n_cases - n_dec}/{8 * n_cases} equal")
    print(f"   encode time: pyllm {t_mine:.3f} s, llama.cpp {t_theirs:.3f} s")
    print(f"   {'OK' if failures == 0 else f'{failures} differences'}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--random", type=int, default=300, help="random texts per model (default 300)")
    parser.add_argument("--emit", action="store_true", help="print (text, special, ids) cases")
    parser.add_argument("--quick", action="store_true", help="skip the per-token attribute and piece checks")
    args = parser.parse_args()
    models = args.models or [p for p in DEFAULT_MODELS if p.exists()]
    failures = sum(compare(p, args.random, args.emit, args.quick) for p in models)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
