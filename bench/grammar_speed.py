"""Grammar masking speed on a large vocabulary, and decode speed with and without a JSON schema, beside llama.cpp.

    python bench/grammar_speed.py [--model PATH] [--runs 3] [--decode 96] [--llamacpp DIR] [--only masks|decode]

Masks: the JSON text of INSTANCE (a value valid under SCHEMA) is tokenized, and both matchers follow that
token sequence (teacher forcing, so both see the same states): for every token, the time to compute the mask
over the whole vocabulary and apply it to a logits row, then the time to advance by the token.
  * pyllm, cold: a freshly compiled grammar, every state met for the first time (a first request with a new
    schema); warm: a second request with the same schema (the compiled grammar is cached by its text, so
    its states, transitions and masks are reused); other: the same schema, a different instance (new
    values: partly new states).
  * llama.cpp: `llama_sampler_apply` of its grammar sampler over the whole vocabulary, in a small C program
    built against the vendored libllama (bench/llamacpp_grammar_mask.c) on the same GBNF text. llama-server
    applies it after sampling only when the sampled token breaks the grammar (then resamples), so this is
    its cost on those tokens; every token costs it the same again, there is no cache.
The allowed sets of the two are compared at every step, and every difference is classified: llama.cpp also
allows the control tokens whose text fits (such as "<|fim_prefix|>" inside a string) and the byte tokens
that can never be UTF-8 (0xF5-0xFF), which pyllm never allows; any other difference would be a bug.

Decode: a chat request asking for an order, `max_tokens` tokens at temperature 0, on pyllm (Llama,
response_format json_schema) and on llama-server (/completion with the same prompt text and `json_schema`,
which llama.cpp converts with its own converter), each without the schema too (end-of-generation banned,
so all of them generate the same number of tokens); runs alternate, medians reported. Not run in CI.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyllm import Llama  # noqa: E402
from pyllm.gguf import GGUFFile  # noqa: E402
from pyllm.grammar import GrammarMatcher, VocabIndex, schema_to_gbnf  # noqa: E402
from pyllm.grammar.gbnf import parse_gbnf  # noqa: E402
from pyllm.text.tokenizer import Tokenizer  # noqa: E402

DEFAULT_MODEL = "/work/main/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DEFAULT_LLAMACPP = "/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp"

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "customer": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                                      "email": {"type": "string", "format": "email"},
                                                      "vip": {"type": "boolean"}},
                     "required": ["name", "email"]},
        "items": {"type": "array", "minItems": 1, "maxItems": 10,
                  "items": {"type": "object",
                            "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                                           "qty": {"type": "integer", "minimum": 1, "maximum": 100},
                                           "price": {"type": "number"}},
                            "required": ["sku", "qty", "price"]}},
        "status": {"enum": ["pending", "paid", "shipped", "cancelled"]},
        "created": {"type": "string", "format": "date-time"},
        "notes": {"type": "string"},
    },
    "required": ["id", "customer", "items", "status", "created"],
}

INSTANCE = {
    "id": "0f8c2d4e-9b1a-4c3e-8d7f-6a5b4c3d2e1f",
    "customer": {"name": "Zoë Müller-Łukasiewicz", "email": "zoe.muller@example.co.uk", "vip": True},
    "items": [{"sku": "ABC-1234", "qty": 2, "price": 19.99}, {"sku": "XYZ-0042", "qty": 1, "price": 5},
              {"sku": "QRS-7777", "qty": 12, "price": 0.5}],
    "status": "paid",
    "created": "2024-02-29T13:45:00Z",
    "notes": "Leave at the door — ring twice. 谢谢! Fragile: glassware 🍷🍷, handle with care.",
}

OTHER_INSTANCE = {
    "id": "a1b2c3d4-e5f6-4789-abcd-ef0123456789",
    "customer": {"name": "Kenji Tanaka", "email": "kenji@example.jp"},
    "items": [{"sku": "LMN-0001", "qty": 100, "price": 1234.5}],
    "status": "shipped",
    "created": "2023-11-05T08:00:00+09:00",
}

PROMPT = ("Write a JSON order for a customer who bought three items, following this schema: " + json.dumps(SCHEMA))


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ---- masks ------------------------------------------------------------------------------------------


def mask_pyllm(grammar, vocab: VocabIndex, ids: list[int]) -> tuple[list[float], list[float], list[np.ndarray]]:
    """Per token: ms to compute and apply the mask to a logits row, ms to advance, the allowed ids."""
    m = GrammarMatcher(grammar, vocab)
    x = np.zeros(vocab.n_vocab, dtype=np.float32)
    mask_ms, accept_ms, allowed = [], [], []
    for t in ids:
        x.fill(0.0)
        t0 = time.perf_counter()
        m.mask_logits(x)
        t1 = time.perf_counter()
        m.accept(t)
        t2 = time.perf_counter()
        mask_ms.append(1e3 * (t1 - t0))
        accept_ms.append(1e3 * (t2 - t1))
        allowed.append(np.flatnonzero(np.isfinite(x)))
    return mask_ms, accept_ms, allowed


def classify_differences(ours: list[np.ndarray], masks_file: Path, n_vocab: int,
                         tokenizer: Tokenizer) -> dict[str, int]:
    """Token ids allowed by one side only, summed over the steps and sorted into kinds."""
    kinds = {"control tokens (llama.cpp only)": 0, "never-UTF-8 bytes (llama.cpp only)": 0, "other": 0}
    for step, line in zip(ours, masks_file.read_text().splitlines(), strict=True):
        sign, *rest = line.split()
        listed = np.array([int(t) for t in rest], dtype=np.int64)
        theirs = np.zeros(n_vocab, dtype=bool)
        theirs[listed] = True
        if sign == "-":
            theirs = ~theirs
        mine = np.zeros(n_vocab, dtype=bool)
        mine[step] = True
        for t in np.flatnonzero(theirs != mine).tolist():
            piece = tokenizer.token_to_piece(t)
            if theirs[t] and tokenizer.is_control(t):
                kinds["control tokens (llama.cpp only)"] += 1
            elif theirs[t] and len(piece) == 1 and piece[0] >= 0xF5:
                kinds["never-UTF-8 bytes (llama.cpp only)"] += 1
            else:
                kinds["other"] += 1
    return kinds


def build_harness(llamacpp: Path, work: Path) -> Path:
    exe = work / "llamacpp_grammar_mask"
    src = Path(__file__).resolve().parent / "llamacpp_grammar_mask.c"
    lib = llamacpp / "build" / "bin"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(src), f"-I{llamacpp / 'include'}",
                    f"-I{llamacpp / 'ggml' / 'include'}", f"-L{lib}", "-lllama", f"-Wl,-rpath,{lib}", "-lm"],
                   check=True)
    return exe


def mask_llamacpp(exe: Path, model: str, gbnf: str, ids: list[int], work: Path,
                  masks: Path | None = None) -> list[float]:
    (work / "g.gbnf").write_text(gbnf)
    (work / "ids.txt").write_text("\n".join(map(str, ids)))
    cmd = [str(exe), model, str(work / "g.gbnf"), str(work / "ids.txt")] + ([str(masks)] if masks else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [float(line.split()[0]) for line in out.strip().splitlines()]


# ---- decode -----------------------------------------------------------------------------------------


def decode_pyllm(llm: Llama, messages: list[dict], n: int, schema: dict | None) -> tuple[float, int]:
    kwargs: dict = {}
    if schema is not None:
        kwargs["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
    else:
        kwargs["logit_bias"] = {t: float("-inf") for t in llm.tokenizer.eog_ids}
    llm.reset()
    result = llm.create_chat_completion(messages, temperature=0, max_tokens=n, **kwargs)
    t = result["timings"]
    return 1e3 * (t["predicted_n"] - 1) / t["predicted_ms"], t["predicted_n"]


def start_llama_server(binary: Path, model: str, threads: int) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(binary), "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", "1",
                             "-c", "4096", "-t", str(threads), "-tb", str(threads), "--log-disable"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc, port
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError("llama-server exited")
        time.sleep(0.25)
    proc.kill()
    raise RuntimeError("llama-server did not become healthy")


def decode_llamacpp(port: int, prompt: str, n: int, schema: dict | None) -> tuple[float, int]:
    body: dict = {"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": False}
    if schema is not None:
        body["json_schema"] = schema
    else:
        body["ignore_eos"] = True
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    t = json.loads(c.getresponse().read())["timings"]
    return t["predicted_per_second"], t["predicted_n"]


# ---- main -------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--decode", type=int, default=96, help="tokens per decode run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llamacpp", default=DEFAULT_LLAMACPP, help="llama.cpp source tree with build/bin")
    ap.add_argument("--only", choices=["masks", "decode"], help="one half of the benchmark")
    args = ap.parse_args()
    llamacpp = Path(args.llamacpp)
    have_llamacpp = (llamacpp / "build" / "bin" / "libllama.so").exists()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"# {Path(args.model).name}, {os.cpu_count()} cores ({cpu}), {args.threads} threads")

    with GGUFFile(args.model) as f:
        tokenizer = Tokenizer.from_gguf(f)
    gbnf = schema_to_gbnf(SCHEMA)
    text = json.dumps(INSTANCE, ensure_ascii=False, indent=2)
    other = json.dumps(OTHER_INSTANCE, ensure_ascii=False, indent=2)
    ids = tokenizer.encode(text, add_bos=False)
    other_ids = tokenizer.encode(other, add_bos=False)
    print(f"vocabulary {tokenizer.n_vocab} tokens; instance {len(text)} characters, {len(ids)} tokens; "
          f"grammar {len(gbnf.splitlines())} rules")

    if args.only != "decode":
        masks(args, tokenizer, gbnf, ids, other_ids, llamacpp if have_llamacpp else None)
    if args.only != "masks":
        decode(args, llamacpp if have_llamacpp else None)


def masks(args: argparse.Namespace, tokenizer: Tokenizer, gbnf: str, ids: list[int], other_ids: list[int],
          llamacpp: Path | None) -> None:
    build_s, vocab = [], None
    cold, warm, other_ms, accept, lc = [], [], [], [], []
    pyllm_allowed: list[np.ndarray] = []
    kinds: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        exe = build_harness(llamacpp, work) if llamacpp is not None else None
        for _ in range(args.runs):
            t = time.perf_counter()
            vocab = VocabIndex.from_tokenizer(tokenizer)
            build_s.append(time.perf_counter() - t)
            grammar = parse_gbnf(gbnf)                               # a fresh grammar: nothing cached
            c_ms, a_ms, pyllm_allowed = mask_pyllm(grammar, vocab, ids)
            w_ms, _, _ = mask_pyllm(grammar, vocab, ids)
            o_ms, _, _ = mask_pyllm(grammar, vocab, other_ids)
            cold.append(statistics.fmean(c_ms))
            warm.append(statistics.fmean(w_ms))
            other_ms.append(statistics.fmean(o_ms))
            accept.append(statistics.fmean(a_ms))
            if exe is not None:
                lc.append(statistics.fmean(mask_llamacpp(exe, args.model, gbnf, ids, work)))
        if exe is not None:                                          # the masks themselves, once, untimed
            mask_llamacpp(exe, args.model, gbnf, ids, work, work / "masks.txt")
            kinds = classify_differences(pyllm_allowed, work / "masks.txt", tokenizer.n_vocab, tokenizer)
    print(f"\nvocabulary index (trie of {vocab.n_nodes} nodes): built in {build_s[0]:.2f} s the first time (the "
          f"tokenizer decodes every piece), {median(build_s[1:] or build_s):.2f} s again")
    print("\nmask per token, ms (mean over the sequence; median of runs):")
    print(f"  pyllm cold (new schema)        {median(cold):8.2f}")
    print(f"  pyllm warm (same schema again) {median(warm):8.3f}")
    print(f"  pyllm other instance           {median(other_ms):8.2f}")
    print(f"  pyllm advance by the token     {median(accept):8.3f}")
    if lc:
        print(f"  llama.cpp llama_sampler_apply  {median(lc):8.2f}")
        print(f"  allowed sets over {len(ids)} steps, tokens on one side only: "
              + "; ".join(f"{k} {v}" for k, v in kinds.items()))



def decode(args: argparse.Namespace, llamacpp: Path | None) -> None:
    llm = Llama(args.model, n_ctx=2048, n_threads=args.threads)
    messages = [{"role": "user", "content": PROMPT}]
    prompt_text = llm.apply_chat_template(messages)
    server = port = None
    if llamacpp is not None:
        server, port = start_llama_server(llamacpp / "build" / "bin" / "llama-server", args.model, args.threads)
    results: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    try:
        for r in range(args.runs):
            order = ["pyllm", "llama.cpp"] if r % 2 == 0 else ["llama.cpp", "pyllm"]
            for who in order:
                if who == "llama.cpp" and port is None:
                    continue
                for schema in ((None, SCHEMA) if r % 2 == 0 else (SCHEMA, None)):
                    key = f"{who} {'schema' if schema else 'free'}"
                    if who == "pyllm":
                        tps, n = decode_pyllm(llm, messages, args.decode, schema)
                    else:
                        tps, n = decode_llamacpp(port, prompt_text, args.decode, schema)
                    results.setdefault(key, []).append(tps)
                    counts[key] = n
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        llm.close()
    print(f"\ndecode tok/s, temperature 0, up to {args.decode} tokens (median of {args.runs}, runs alternating):")
    for key, values in results.items():
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(f"  {key:20s} {median(values):7.2f}   ({counts[key]} tokens; runs {runs})")


if __name__ == "__main__":
    main()
