"""A fuzzer for loading models: mutated GGUF files, each read here and loaded and run in a worker process.

    python -m tests.fuzz.gguf_fuzz --files 20000 --minutes 15 --seed 1 [--keep DIR] [--sanitized build/asan-py]

(from the repository root; --sanitized runs the worker on the ASan + UBSan build of `make test-asan-py`, where
a sanitizer's report ends it: a crash). Each file is one seed model with one to three mutations:

- bytes: bit flips, bytes set, runs inserted or deleted, truncation (mostly in the header);
- fields: a length, count, value type, element type, dimension, tensor type or offset field of the header
  set to a lie (0, off by one, huge, a negative number read as u64);
- metadata (written with gguf.GGUFWriter): a hyperparameter or tokenizer key given a nonsense value or a
  value of another type, or dropped;
- tensors (gguf.GGUFWriter): a tensor dropped, renamed, shortened, widened, transposed, of another type, a
  layer too many, a vocabulary of another size, NaN or infinity in its values.

The seeds are tiny random models of every architecture (tests/fixture_models' weights: narrow ones with a
vocabulary that covers every byte, SentencePiece and BPE, and two of the fixture models themselves).

Every file is opened by GGUFFile in this process, then its path goes over a pipe to a long-lived worker that
loads it with Llama (as `pyllm run` does) and generates one token from the engine. The worker answers with
the outcome; one that dies is a crash (its signal), one that misses the per-file deadline a hang: either way
it is replaced. Outcomes:

    ran         loaded, generated a token
    error       refused with a one-line message: GGUFError while loading, any ValueError once loaded
    crash       the worker died (a signal, or an exit)
    hang        no answer before the deadline
    unexpected  any other exception, or an error message of several lines
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # fixture_models, when run as a module from the repository root

OUTCOMES = ("ran", "error", "crash", "hang", "unexpected")
BAD_OUTCOMES = ("crash", "hang", "unexpected")

# ---------------------------------------------------------------------------------------------------------
# The worker: load, generate one token, report.
# ---------------------------------------------------------------------------------------------------------

# The most memory a worker may map: a file that makes the loader allocate in proportion to a lying field
# then fails with MemoryError (an unexpected outcome) instead of taking the machine down.
WORKER_ADDRESS_SPACE = 8 << 30


def _one_line(exc: BaseException) -> bool:
    message = str(exc)
    return bool(message) and "\n" not in message


def try_file(path: str) -> dict[str, Any]:
    """Load `path` as `pyllm run` does and generate one token; the outcome as a dict."""
    from pyllm import Llama
    from pyllm.gguf import GGUFError

    phase = "load"
    try:
        llm = Llama(path, n_ctx=32, n_threads=1)
        phase = "run"
        try:
            bos = llm.token_bos()
            prompt = [bos if bos is not None else 0] + [t % llm.n_vocab() for t in (3, 5, 7)]
            out = llm.create_completion(prompt, max_tokens=1, temperature=0.0)
            out["choices"][0]["text"].encode("utf-8", "surrogatepass")
            try:  # a vocabulary may lack what a text needs: a clean refusal, not a failure to run
                llm.tokenize(b"hi there", add_bos=True)
            except ValueError as exc:
                if not _one_line(exc):
                    raise
        finally:
            llm.close()
        return {"outcome": "ran"}
    except Exception as exc:  # the outcome is the point: every exception is reported, none hidden
        clean = isinstance(exc, GGUFError) if phase == "load" else isinstance(exc, ValueError)
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return {"outcome": "error" if clean and _one_line(exc) else "unexpected", "phase": phase,
                "type": type(exc).__name__, "message": str(exc)[:300], "at": f"{where.filename}:{where.lineno}"}


def worker_main(sanitized: Path | None) -> None:
    """Read paths from stdin, one a line; answer each with a JSON line on the original stdout."""
    from pyllm import _pyllm_c

    if sanitized is None:  # (AddressSanitizer reserves terabytes of address space, and limits memory itself)
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_ADDRESS_SPACE, WORKER_ADDRESS_SPACE))
    elif Path(_pyllm_c.__file__).resolve().parent != sanitized.resolve() / "pyllm":
        sys.exit(f"the worker imported {_pyllm_c.__file__}, not the sanitized build in {sanitized}")
    logging.disable(logging.CRITICAL)  # the loader's warnings about odd vocabularies are expected here
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to the worker's log, not into the answers
    for line in sys.stdin:
        answers.write(json.dumps(try_file(line.rstrip("\n"))) + "\n")


class Worker:
    """A worker process fed paths over a pipe, replaced when it dies or hangs. With `sanitized` (a directory
    that `make test-asan-py` built: pyllm with its C core under ASan + UBSan) the worker runs that build, and a
    sanitizer's report ends it: a crash."""

    def __init__(self, log_path: Path, sanitized: Path | None = None) -> None:
        self.log_path = log_path
        self.sanitized = sanitized
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]  # this checkout's pyllm, not an installed one
        args = [sys.executable, __file__, "--worker"]
        env = dict(os.environ)
        if self.sanitized is not None:
            paths.insert(0, str(self.sanitized))
            args += ["--sanitized", str(self.sanitized)]
            libasan = subprocess.run(["cc", "-print-file-name=libasan.so"], capture_output=True, text=True,
                                     check=True).stdout.strip()
            env.update(LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0:hard_rss_limit_mb=8192",
                       UBSAN_OPTIONS="print_stacktrace=1")
        env["PYTHONPATH"] = os.pathsep.join(paths)
        with open(self.log_path, "a") as log:
            return subprocess.Popen(args, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=log, text=True, bufsize=1)

    def run(self, path: Path, deadline: float) -> dict[str, Any]:
        if self.proc is None:
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(f"{path}\n")
            proc.stdin.flush()
        except BrokenPipeError:
            return self._died()
        ready, _, _ = select.select([proc.stdout], [], [], deadline)
        if not ready:
            self.stop()
            return {"outcome": "hang", "message": f"no answer in {deadline:.0f} s"}
        line = proc.stdout.readline()
        if not line:
            return self._died()
        return json.loads(line)

    def _died(self) -> dict[str, Any]:
        assert self.proc is not None
        code = self.proc.wait()
        self.proc = None
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        return {"outcome": "crash", "message": f"the worker died: {how}; log: {self.log_path}"}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


# ---------------------------------------------------------------------------------------------------------
# Seeds: models as recipes (metadata and tensors) that gguf.GGUFWriter writes.
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Recipe:
    """A GGUF file's content: key -> (value, value type, element type), name -> (data, raw type or None)."""
    kvs: dict[str, tuple[Any, Any, Any]]
    tensors: dict[str, tuple[np.ndarray, Any]]

    def copy(self) -> Recipe:
        return Recipe(dict(self.kvs), dict(self.tensors))

    def write(self, path: Path) -> None:
        import gguf

        arch = self.kvs.get("general.architecture", ("llama",))[0]
        w = gguf.GGUFWriter(str(path), arch if isinstance(arch, str) else "llama")  # writes general.architecture
        for key, (value, vtype, sub_type) in self.kvs.items():
            if key != "general.architecture" or not isinstance(value, str):
                w.add_key_value(key, value, vtype, sub_type=sub_type)
        for name, (data, raw_type) in self.tensors.items():
            w.add_tensor(name, data, raw_dtype=raw_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def _spm_vocab() -> tuple[list[str], list[float], list[int]]:
    pieces = ["▁", "h", "i", "t", "e", "r", "▁h", "hi", "▁hi", "th", "▁th", "er", "ere", "▁there"]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    return tokens, scores, [2, 3, 3] + [6] * 256 + [1] * len(pieces)


def _bpe_vocab() -> tuple[list[str], list[str]]:
    from pyllm.text.tokenizer import _BYTE_CHARS

    merges = ["h i", "Ġ t", "h e", "Ġt he", "r e", "Ġthe re", "Ġ h", "Ġh i"]
    return [*_BYTE_CHARS, *(m.replace(" ", "") for m in merges), "<|end|>", "<|start|>"], merges


def small_model(arch: str, weight_type: Any, bpe: bool, seed: int, n_embd: int = 64, n_ff: int = 96,
                head_dim: int = 16) -> Recipe:
    """A two-layer model of `arch` with 4 heads (2 kv heads), every matrix of `weight_type`, norms F32."""
    from fixture_models import Bytes, random_tensor
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFValueType as V

    from pyllm.arch import FAMILIES

    fam = FAMILIES[arch]
    rng = Bytes(seed)
    n_head, n_head_kv, n_layer = 4, 2, 2
    kvs: dict[str, tuple[Any, Any, Any]] = {"general.architecture": (arch, V.STRING, None)}

    def kv(key: str, value: Any, vtype: Any, sub_type: Any = None) -> None:
        kvs[key] = (value, vtype, sub_type)

    kv(f"{arch}.context_length", 64, V.UINT32)
    kv(f"{arch}.embedding_length", n_embd, V.UINT32)
    kv(f"{arch}.block_count", n_layer, V.UINT32)
    kv(f"{arch}.feed_forward_length", n_ff, V.UINT32)
    kv(f"{arch}.attention.head_count", n_head, V.UINT32)
    kv(f"{arch}.attention.head_count_kv", n_head_kv, V.UINT32)
    kv(f"{arch}.attention.key_length", head_dim, V.UINT32)
    kv(f"{arch}.attention.value_length", head_dim, V.UINT32)
    kv(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6, V.FLOAT32)
    kv(f"{arch}.rope.freq_base", 10000.0, V.FLOAT32)
    if fam.swa_pattern:
        kv(f"{arch}.attention.sliding_window", 4, V.UINT32)
    if bpe:
        tokens, merges = _bpe_vocab()
        kv("tokenizer.ggml.model", "gpt2", V.STRING)
        kv("tokenizer.ggml.pre", "gpt-2", V.STRING)
        kv("tokenizer.ggml.tokens", tokens, V.ARRAY, V.STRING)
        kv("tokenizer.ggml.merges", merges, V.ARRAY, V.STRING)
        kv("tokenizer.ggml.token_type", [1] * (len(tokens) - 2) + [3, 3], V.ARRAY, V.INT32)
        kv("tokenizer.ggml.eos_token_id", len(tokens) - 2, V.UINT32)
    else:
        tokens, scores, types = _spm_vocab()
        kv("tokenizer.ggml.model", "llama", V.STRING)
        kv("tokenizer.ggml.tokens", tokens, V.ARRAY, V.STRING)
        kv("tokenizer.ggml.scores", scores, V.ARRAY, V.FLOAT32)
        kv("tokenizer.ggml.token_type", types, V.ARRAY, V.INT32)
        kv("tokenizer.ggml.bos_token_id", 1, V.UINT32)
        kv("tokenizer.ggml.eos_token_id", 2, V.UINT32)
    kv("tokenizer.chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}", V.STRING)
    n_vocab = len(tokens)
    tensors: dict[str, tuple[np.ndarray, Any]] = {}

    def matrix(name: str, rows: int, cols: int, tensor_type: Any = weight_type) -> None:
        data = random_tensor(rng, (rows, cols), tensor_type, 0.1)
        tensors[name] = (data, None if tensor_type in (Q.F32, Q.F16) else tensor_type)
        if tensor_type == Q.BF16:
            tensors[name] = (data.view(np.uint8), tensor_type)

    def vector(name: str, n: int, center: float) -> None:
        tensors[name] = (np.float32(center) + np.float32(0.1) * rng.uniform((n,)), None)

    matrix("token_embd.weight", n_vocab, n_embd, Q.Q8_0 if weight_type not in (Q.F32, Q.F16) else weight_type)
    vector("output_norm.weight", n_embd, 1.0)
    if arch != "gemma3":
        matrix("output.weight", n_vocab, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        for name in ("attn_norm", "ffn_norm") + (("post_attention_norm", "post_ffw_norm") if fam.post_norms else ()):
            vector(p + name + ".weight", n_embd, 1.0)
        matrix(p + "attn_q.weight", n_head * head_dim, n_embd)
        matrix(p + "attn_k.weight", n_head_kv * head_dim, n_embd)
        matrix(p + "attn_v.weight", n_head_kv * head_dim, n_embd)
        matrix(p + "attn_output.weight", n_embd, n_head * head_dim)
        matrix(p + "ffn_gate.weight", n_ff, n_embd)
        matrix(p + "ffn_up.weight", n_ff, n_embd)
        matrix(p + "ffn_down.weight", n_embd, n_ff)
        if fam.qkv_bias:
            vector(p + "attn_q.bias", n_head * head_dim, 0.0)
            vector(p + "attn_k.bias", n_head_kv * head_dim, 0.0)
            vector(p + "attn_v.bias", n_head_kv * head_dim, 0.0)
        if fam.qk_norm:
            vector(p + "attn_q_norm.weight", head_dim, 1.0)
            vector(p + "attn_k_norm.weight", head_dim, 1.0)
    return Recipe(kvs, tensors)


def recipe_of_file(path: Path) -> Recipe:
    """Any GGUF file as a recipe (its metadata and tensors as gguf.GGUFReader reads them)."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFValueType as V

    reader = gguf.GGUFReader(path)
    kvs: dict[str, tuple[Any, Any, Any]] = {}
    for f in reader.fields.values():
        if f.name.startswith("GGUF."):
            continue
        vtype = f.types[0]
        kvs[f.name] = (f.contents(), vtype, f.types[-1] if vtype == V.ARRAY else None)
    tensors = {}
    for t in reader.tensors:
        data = np.array(t.data)
        tensors[t.name] = (data, None if t.tensor_type in (Q.F32, Q.F16) else t.tensor_type)
        if t.tensor_type == Q.BF16:
            tensors[t.name] = (data.view(np.uint8), Q.BF16)
    return Recipe(kvs, tensors)


@dataclass
class Seed:
    name: str
    recipe: Recipe
    data: bytes = b""
    slots: list[tuple[int, int, str, int]] = field(default_factory=list)  # (offset, size, kind, value)
    header_end: int = 0


def header_slots(path: Path) -> tuple[list[tuple[int, int, str, int]], int]:
    """The header's numeric fields (offset, size, kind, value) as gguf.GGUFReader finds them, and the header's
    end (the tensor data's offset)."""
    import gguf
    from gguf import GGUFValueType as V

    reader = gguf.GGUFReader(path)
    base = reader.data.ctypes.data
    slots = [(4, 4, "version", 3), (8, 8, "tensor_count", len(reader.tensors)),
             (16, 8, "kv_count", len(reader.fields) - 3)]

    def at(part: np.ndarray) -> int:
        return part.ctypes.data - base

    for f in reader.fields.values():
        if f.name.startswith("GGUF."):
            continue
        parts = f.parts
        slots.append((at(parts[0]), 8, "key_length", int(parts[0][0])))
        slots.append((at(parts[2]), 4, "value_type", int(parts[2][0])))
        if f.types[0] == V.STRING:
            slots.append((at(parts[3]), 8, "string_length", int(parts[3][0])))
        elif f.types[0] == V.ARRAY:
            slots.append((at(parts[3]), 4, "element_type", int(parts[3][0])))
            slots.append((at(parts[4]), 8, "array_count", int(parts[4][0])))
            if f.types[-1] == V.STRING:  # a few element lengths: the first, some middle ones, the last
                lengths = parts[5::2]
                for j in sorted({0, len(lengths) // 3, len(lengths) // 2, len(lengths) - 1}):
                    if 0 <= j < len(lengths):
                        slots.append((at(lengths[j]), 8, "string_length", int(lengths[j][0])))
        elif len(parts) > 3:
            size = parts[3].nbytes
            if size in (4, 8):
                slots.append((at(parts[3]), size, "scalar", int(parts[3].view(f"<u{size}")[0])))
    for t in reader.tensors:
        parts = t.field.parts
        slots.append((at(parts[0]), 8, "name_length", int(parts[0][0])))
        slots.append((at(parts[2]), 4, "n_dims", int(parts[2][0])))
        for d in range(len(parts[3])):
            slots.append((at(parts[3]) + 8 * d, 8, "dim", int(parts[3][d])))
        slots.append((at(parts[4]), 4, "tensor_type", int(parts[4][0])))
        slots.append((at(parts[5]), 8, "tensor_offset", int(parts[5][0])))
    return slots, reader.data_offset


def make_seeds(work: Path) -> list[Seed]:
    """The seed models, written once under `work`, with their bytes and header fields."""
    from fixture_models import write_fixture_model
    from gguf import GGMLQuantizationType as Q

    specs: list[tuple[str, Callable[[], Recipe]]] = [
        ("llama-q8_0-spm", lambda: small_model("llama", Q.Q8_0, False, 1)),
        ("llama-q4_0-bpe", lambda: small_model("llama", Q.Q4_0, True, 2)),
        ("qwen2-q5_0-bpe", lambda: small_model("qwen2", Q.Q5_0, True, 3)),
        ("qwen3-q4_1-spm", lambda: small_model("qwen3", Q.Q4_1, False, 4)),
        ("gemma3-q5_1-spm", lambda: small_model("gemma3", Q.Q5_1, False, 5)),
        ("llama-f16-spm", lambda: small_model("llama", Q.F16, False, 6)),
        ("gemma3-f32-bpe", lambda: small_model("gemma3", Q.F32, True, 7)),
        ("qwen2-bf16-spm", lambda: small_model("qwen2", Q.BF16, False, 8)),
        ("qwen3-q4_k-bpe", lambda: small_model("qwen3", Q.Q4_K, True, 9, 256, 256, 64)),
        ("gemma3-q6_k-spm", lambda: small_model("gemma3", Q.Q6_K, False, 10, 256, 256, 64)),
    ]
    for arch, weight_type in (("llama", Q.Q4_1), ("gemma3", Q.Q4_K)):
        path = work / f"fixture-{arch}.gguf"
        write_fixture_model(path, arch, weight_type)
        specs.append((f"fixture-{arch}-{weight_type.name.lower()}", lambda path=path: recipe_of_file(path)))
    seeds = []
    for name, build in specs:
        seed = Seed(name, build())
        path = work / f"seed-{name}.gguf"
        seed.recipe.write(path)
        seed.data = path.read_bytes()
        seed.slots, seed.header_end = header_slots(path)
        seeds.append(seed)
    return seeds


# ---------------------------------------------------------------------------------------------------------
# Mutations
# ---------------------------------------------------------------------------------------------------------

_U64 = 1 << 64


def lie_values(value: int, bits: int) -> list[int]:
    """Lies about an unsigned field that holds `value`."""
    top = (1 << bits) - 1
    lies = [0, 1, 2, value - 1, value + 1, 2 * value, value // 2, value + 8, 1 << (bits - 1), top, top - 7,
            (1 << 31), (1 << 31) - 1, (1 << 32) - 1, 255, 65535]
    return [v & top for v in lies]


class Mutator:
    """Random mutations of seeds, deterministic for a seed of the generator."""

    def __init__(self, rng: np.random.Generator, seeds: list[Seed]) -> None:
        self.rng = rng
        self.seeds = seeds
        self.failures: list[str] = []  # the mutator's own bugs (a combination of lies it mishandled), by traceback

    def pick(self, items: list[Any]) -> Any:
        return items[int(self.rng.integers(len(items)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def file(self) -> tuple[bytes, str]:
        """One mutated file: its bytes and what was done to them."""
        seed = self.pick(self.seeds)
        kind = self.rng.random()
        if kind < 0.45:
            recipe, what = seed.recipe.copy(), []
            for _ in range(1 + int(self.rng.integers(2))):
                lie = self.pick([self.metadata_lie, self.metadata_lie, self.type_swap, self.tensor_lie,
                                 self.tensor_lie])
                try:
                    what.append(lie(recipe))
                except Exception:  # the fuzzer's bug, not pyllm's: recorded (the CI test asserts none), skipped
                    self.failures.append(traceback.format_exc(limit=-3))
                    return self.file()
            with tempfile.NamedTemporaryFile(suffix=".gguf") as tmp:
                try:
                    recipe.write(Path(tmp.name))
                except (ValueError, TypeError, OverflowError, struct.error):
                    return self.file()  # a lie gguf.GGUFWriter will not write (an empty array): another one
                data = Path(tmp.name).read_bytes()
            if self.chance(0.15):
                data, byte_what = self.byte_mutation(data, len(data))
                what.append(byte_what)
            return data, f"{seed.name}: " + "; ".join(what)
        data, what = seed.data, []
        for _ in range(1 + int(self.rng.integers(3))):
            if self.chance(0.6):
                data, one = self.field_lie(seed, data)
            else:
                data, one = self.byte_mutation(data, seed.header_end)
            what.append(one)
        return data, f"{seed.name}: " + "; ".join(what)

    # -- bytes --

    def byte_mutation(self, data: bytes, header_end: int) -> tuple[bytes, str]:
        if not data:
            return b"GGUF", "refilled"
        out = bytearray(data)
        end = min(header_end if self.chance(0.8) else len(out), len(out))
        pos = int(self.rng.integers(end))
        op = self.pick(["flip", "set", "insert", "delete", "truncate", "word", "poison"])
        if op == "flip":
            out[pos] ^= 1 << int(self.rng.integers(8))
        elif op == "set":
            out[pos] = self.pick([0, 0xFF, 0x7F, 0x80, int(self.rng.integers(256))])
        elif op == "insert":
            out[pos:pos] = self.rng.integers(0, 256, int(self.rng.integers(1, 17)), dtype=np.uint8).tobytes()
        elif op == "delete":
            del out[pos:pos + int(self.rng.integers(1, 17))]
        elif op == "truncate":
            del out[pos:]
        elif op == "word":
            size = self.pick([4, 8])
            out[pos:pos + size] = self.pick(lie_values(0, 8 * size)).to_bytes(size, "little")
        else:  # NaN, infinity or huge values over a run of tensor data
            pos = int(self.rng.integers(header_end, max(len(out), header_end + 1)))
            pattern = self.pick([b"\xff\xff", b"\x00\x7c", b"\x00\x00\x80\x7f", b"\x7f\x7f"])
            run = pattern * int(self.rng.integers(1, 64))
            out[pos:pos + len(run)] = run
            return bytes(out[:len(data)]), f"poison at {pos}"
        return bytes(out), f"{op} at {pos}"

    def field_lie(self, seed: Seed, data: bytes) -> tuple[bytes, str]:
        offset, size, kind, value = self.pick(seed.slots)
        if kind in ("value_type", "element_type"):
            lie = self.pick([*range(13), 13, 255, (1 << 32) - 1])
        elif kind == "tensor_type":
            lie = self.pick([*range(42), 99, (1 << 32) - 1])
        elif kind == "n_dims":
            lie = self.pick([0, 1, 2, 3, 4, 5, 255, (1 << 32) - 1])
        elif kind == "tensor_offset":
            lie = self.pick([0, value + 32, value - 32, value + 1, value * 2, (1 << 63), _U64 - 32]) % _U64
        else:
            lie = self.pick(lie_values(value, 8 * size))
        out = bytearray(data)
        if offset + size <= len(out):
            out[offset:offset + size] = lie.to_bytes(size, "little")
        return bytes(out), f"{kind} at {offset}: {value} -> {lie}"

    # -- metadata --

    def interesting_value(self, current: Any) -> tuple[Any, Any, Any]:
        """A (value, value type, element type) that lies: nonsense numbers of every type, strings, arrays."""
        from gguf import GGUFValueType as V

        ints = [0, 1, 2, 3, 7, -1, -2**31, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, -2**63, 2**64 - 1]
        if isinstance(current, int) and not isinstance(current, bool):
            ints += [current - 1, current + 1, current * 2, current // 2, current * 3 + 1]
        choice = self.rng.random()
        if choice < 0.5:
            value = self.pick([v for v in ints if -2**63 <= v < 2**64])  # what some GGUF integer type holds
            fits = [t for t, lo, hi in ((V.UINT8, 0, 255), (V.INT8, -128, 127), (V.UINT16, 0, 65535),
                                        (V.INT16, -32768, 32767), (V.UINT32, 0, 2**32 - 1),
                                        (V.INT32, -2**31, 2**31 - 1), (V.UINT64, 0, 2**64 - 1),
                                        (V.INT64, -2**63, 2**63 - 1)) if lo <= value <= hi]
            return value, self.pick(fits), None
        if choice < 0.7:
            value = self.pick([0.0, -0.0, -1.0, 0.5, 1e-30, 1e30, 3.4e38, math.nan, math.inf, -math.inf])
            return value, self.pick([V.FLOAT32, V.FLOAT64]), None
        if choice < 0.8:
            return self.pick([True, False]), V.BOOL, None
        if choice < 0.9:
            return self.pick(["", "abc", "linear", "yarn", "llama", "gpt2", "\u2581", "x" * 300]), V.STRING, None
        arrays = [([1, 2, 3], V.INT32), ([], V.INT32), (["a", "b"], V.STRING), ([], V.STRING),
                  ([0.5, math.nan], V.FLOAT32), ([True], V.BOOL)]
        value, sub = self.pick(arrays)
        return value, V.ARRAY, sub

    def metadata_lie(self, recipe: Recipe) -> str:
        from gguf import GGUFValueType as V

        arch = recipe.kvs.get("general.architecture", ("llama",))[0]
        hyper = [f"{arch}.{k}" for k in (
            "context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "attention.key_length", "attention.value_length",
            "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.dimension_count", "rope.scaling.type",
            "rope.scaling.factor", "attention.sliding_window")]
        tokenizer = ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                     "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
                     "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token",
                     "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template",
                     "general.architecture", "general.name", "general.alignment"]
        key = self.pick(hyper if self.chance(0.6) else tokenizer)
        current = recipe.kvs.get(key, (None, None, None))
        if self.chance(0.1):
            recipe.kvs.pop(key, None)
            return f"drop {key}"
        if current[1] == V.ARRAY and self.chance(0.6):
            return self.array_lie(recipe, key)
        if key == "general.alignment":
            value = self.pick([0, 1, 3, 8, 64, 2**31, 2**32 - 1])
            recipe.kvs[key] = (value, V.UINT32, None)
            return f"{key} = {value}"
        recipe.kvs[key] = self.interesting_value(current[0])
        return f"{key} = {recipe.kvs[key][0]!r:.40} ({recipe.kvs[key][1].name})"

    def array_lie(self, recipe: Recipe, key: str) -> str:
        """An array of another length, with a repeated, empty or odd element, or elements of another type."""
        from gguf import GGUFValueType as V

        values, vtype, sub = recipe.kvs[key]
        values = list(values)
        op = self.pick(["shorter", "longer", "repeat", "empty-element", "retype", "nan", "empty"])
        if op == "shorter" and values:
            values = values[:int(self.rng.integers(len(values)))]
        elif op == "longer":
            values = values + [values[-1] if values else 0] * int(self.rng.integers(1, 40))
            if sub == V.STRING:
                values = values[:len(values) - 1] + [f"extra{i}" for i in range(1)]
        elif op == "repeat" and len(values) > 1:
            values[-1] = values[0]
        elif op == "empty-element" and values and sub == V.STRING:
            values[int(self.rng.integers(len(values)))] = self.pick(["", " ", "a b c", "\u2581\u2581", "<0xZZ>"])
        elif op == "retype":
            if sub == V.STRING:
                values, sub = list(range(len(values))), V.INT32
            else:
                values, sub = [str(v) for v in values], V.STRING
        elif op == "nan" and sub in (V.FLOAT32, V.INT32):
            values = [math.nan if sub == V.FLOAT32 else -1] * len(values)
        elif op == "empty":
            values = []
        recipe.kvs[key] = (values, vtype, sub)
        return f"{key}: {op}"

    def type_swap(self, recipe: Recipe) -> str:
        """An existing key's value stored as another value type."""
        from gguf import GGUFValueType as V

        key = self.pick(sorted(recipe.kvs))
        value, vtype, sub = recipe.kvs[key]
        target = self.pick(["int", "float", "string", "bool", "array"])
        if target == "int":
            new = (len(value) if isinstance(value, list | str) else int(value) if not
                   (isinstance(value, float) and not math.isfinite(value)) else 0, V.INT32, None)
            if not -2**31 <= new[0] < 2**31:
                new = (new[0] % 2**31, V.INT32, None)
        elif target == "float":
            new = (float(len(value)) if isinstance(value, list | str) else float(value), V.FLOAT32, None)
        elif target == "string":
            new = (str(value)[:200], V.STRING, None)
        elif target == "bool":
            new = (bool(value), V.BOOL, None)
        elif vtype == V.ARRAY:
            new = (value[0] if value else 0, sub if value else V.INT32, None)
            if new[1] == V.ARRAY:
                new = (0, V.INT32, None)
        else:
            new = ([value], V.ARRAY, vtype)
        recipe.kvs[key] = new
        return f"{key}: {vtype.name} -> {new[1].name}"

    # -- tensors --

    def tensor_lie(self, recipe: Recipe) -> str:
        from fixture_models import BLOCKS, Bytes, random_tensor
        from gguf import GGMLQuantizationType as Q

        names = sorted(recipe.tensors)
        name = self.pick(names)
        data, raw = recipe.tensors[name]
        ttype = Q.F32 if raw is None and data.dtype == np.float32 else Q.F16 if raw is None else raw
        rng = Bytes(int(self.rng.integers(1 << 30)))
        op = self.pick(["drop", "rename", "resize-vector", "retype", "transpose", "resize-matrix", "extra-layer",
                        "vocab", "trailing-one", "extra-tensor"])
        if op == "drop":
            del recipe.tensors[name]
        elif op == "rename":
            new = self.pick([name.replace("blk.0.", "blk.9."), name + ".x", "blk.1." + name, name.replace("q", "k")])
            del recipe.tensors[name]
            recipe.tensors.setdefault(new, (data, raw))
        elif op == "resize-vector":
            vectors = [n for n in names if recipe.tensors[n][0].ndim == 1 and recipe.tensors[n][1] is None]
            if not vectors:
                return "no vector to resize"
            name = self.pick(vectors)
            vec = recipe.tensors[name][0]
            n = self.pick([1, len(vec) - 1, len(vec) // 2, len(vec) + 1, 2 * len(vec), 32])
            recipe.tensors[name] = (np.resize(vec, max(n, 1)).astype(vec.dtype), None)
        elif op == "retype":
            shape = self._elements_shape(data, ttype)
            new_type = self.pick([Q.F32, Q.F16, Q.BF16, *BLOCKS])
            block = BLOCKS[new_type][0] if new_type in BLOCKS else 1
            if shape[-1] % block:
                return f"{name}: retype to {new_type.name} skipped"
            blocks = random_tensor(rng, (math.prod(shape[:-1]), shape[-1]), new_type, 0.1)
            if new_type in (Q.F32, Q.F16):
                recipe.tensors[name] = (blocks.reshape(shape), None)
            else:
                recipe.tensors[name] = (blocks.view(np.uint8), new_type)
            return f"{name}: {ttype.name} -> {new_type.name}"
        elif op == "transpose":
            shape = self._elements_shape(data, ttype)
            if len(shape) == 2:
                self._replace(recipe, name, ttype, (shape[1], shape[0]), rng)
        elif op == "resize-matrix":
            shape = list(self._elements_shape(data, ttype))
            axis = int(self.rng.integers(len(shape)))
            shape[axis] = max(1, shape[axis] + self.pick([-32, -16, -1, 1, 16, 32, shape[axis]]))
            self._replace(recipe, name, ttype, tuple(shape), rng)
        elif op == "extra-layer":
            arch = recipe.kvs.get("general.architecture", ("llama",))[0]
            n_layer = recipe.kvs.get(f"{arch}.block_count", (2,))[0] if isinstance(arch, str) else 2
            for n in names:
                if n.startswith("blk.0."):
                    recipe.tensors[f"blk.{n_layer}." + n[len("blk.0."):]] = recipe.tensors[n]
        elif op == "vocab":
            delta = self.pick([-1, 1, -16, 16])
            for n in ("token_embd.weight", "output.weight"):
                if n in recipe.tensors:
                    d, r = recipe.tensors[n]
                    t = Q.F32 if r is None and d.dtype == np.float32 else Q.F16 if r is None else r
                    shape = self._elements_shape(d, t)
                    rows = math.prod(shape[:-1])  # a lie before may have reshaped it (trailing-one)
                    self._replace(recipe, n, t, (max(1, rows + delta), shape[-1]), rng)
            return f"vocab rows {delta:+d}"
        elif op == "trailing-one":
            if raw is None:
                recipe.tensors[name] = (data.reshape((1,) * int(self.rng.integers(1, 3)) + data.shape), None)
        else:
            recipe.tensors[self.pick(["rope_freqs.weight", "blk.0.extra.weight", "output.bias"])] = (
                np.ones(self.pick([1, 16, 64]), np.float32), None)
        return f"{name}: {op}"

    @staticmethod
    def _elements_shape(data: np.ndarray, ttype: Any) -> tuple[int, ...]:
        """The numpy shape in elements of a recipe tensor (quantized data is bytes)."""
        import gguf

        if data.dtype == np.uint8:
            block, size = gguf.GGML_QUANT_SIZES[ttype]
            return data.shape[:-1] + (data.shape[-1] // size * block,)
        return data.shape

    @staticmethod
    def _replace(recipe: Recipe, name: str, ttype: Any, shape: tuple[int, ...], rng: Any) -> None:
        from fixture_models import BLOCKS, random_tensor
        from gguf import GGMLQuantizationType as Q

        block = BLOCKS[ttype][0] if ttype in BLOCKS else 1
        if shape[-1] % block:
            return
        values = random_tensor(rng, (math.prod(shape[:-1]), shape[-1]), ttype, 0.1)
        if ttype in (Q.F32, Q.F16):
            recipe.tensors[name] = (values.reshape(shape), None)
        else:
            recipe.tensors[name] = (values.view(np.uint8), ttype)


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Report:
    files: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    error_types: Counter[str] = field(default_factory=Counter)
    reader_errors: int = 0
    mutator_failures: list[str] = field(default_factory=list)  # see Mutator.failures
    bad: list[dict[str, Any]] = field(default_factory=list)   # the crashes, hangs and unexpected ones
    seconds: float = 0.0

    def summary(self) -> str:
        counts = ", ".join(f"{name} {self.outcomes[name]}" for name in OUTCOMES)
        return (f"{self.files} files in {self.seconds:.0f} s: {counts} (the reader alone refused "
                f"{self.reader_errors}); errors by type: {dict(self.error_types.most_common())}; "
                f"mutator failures {len(self.mutator_failures)}")


def read_in_process(path: Path) -> dict[str, Any]:
    """The reader on its own: GGUFError or a file that parses."""
    from pyllm.gguf import GGUFError, GGUFFile

    try:
        with GGUFFile(path):
            return {"outcome": "ran"}
    except GGUFError as exc:
        return {"outcome": "error" if _one_line(exc) else "unexpected", "type": "GGUFError", "message": str(exc)}
    except Exception as exc:  # the outcome is the point: every exception is reported, none hidden
        return {"outcome": "unexpected", "phase": "reader", "type": type(exc).__name__, "message": str(exc)[:300]}


def fuzz(files: int, seed: int = 0, minutes: float | None = None, deadline: float = 20.0,
         keep: Path | None = None, log: Callable[[str], None] | None = None,
         show: tuple[str, ...] = BAD_OUTCOMES, sanitized: Path | None = None) -> Report:
    """Try `files` mutated files (or as many as fit in `minutes`); the bad ones are copied into `keep`, and each
    file whose outcome is in `show` is logged. `sanitized`: the worker runs that sanitized build (see Worker)."""
    logging.getLogger("gguf").setLevel(logging.ERROR)  # GGUFWriter warns of the keys the lies overwrite
    report = Report()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gguf-fuzz-") as tmp:
        work = Path(tmp)
        mutator = Mutator(np.random.default_rng(seed), make_seeds(work))
        worker = Worker(work / "worker.log", sanitized)
        path = work / "fuzz.gguf"
        try:
            for i in range(files):
                if minutes is not None and time.monotonic() - start > 60 * minutes:
                    break
                data, what = mutator.file()
                path.write_bytes(data)
                read = read_in_process(path)
                result = worker.run(path, deadline)
                report.files += 1
                report.reader_errors += read["outcome"] == "error"
                if read["outcome"] == "unexpected":
                    result = read
                report.outcomes[result["outcome"]] += 1
                if result["outcome"] == "error":
                    report.error_types[result["type"]] += 1
                if result["outcome"] in BAD_OUTCOMES:
                    result.update(file=i, mutation=what)
                    report.bad.append(result)
                    if keep is not None:
                        keep.mkdir(parents=True, exist_ok=True)
                        (keep / f"{result['outcome']}-{i}.gguf").write_bytes(data)
                if log and result["outcome"] in show:
                    log(f"file {i} ({what}): {json.dumps(result)}")
                if log and (i + 1) % 1000 == 0 and i + 1 < files:  # (the last summary is the caller's)
                    report.seconds = time.monotonic() - start
                    log(report.summary())
        finally:
            worker.stop()
            report.mutator_failures = mutator.failures
    report.seconds = time.monotonic() - start
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000, help="files to try (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="the mutations' random seed")
    parser.add_argument("--minutes", type=float, default=None, help="stop after this long")
    parser.add_argument("--deadline", type=float, default=20.0, help="seconds a file may take before it is a hang")
    parser.add_argument("--keep", type=Path, default=None, help="copy each crash, hang or unexpected file here")
    parser.add_argument("--show", action="append", choices=OUTCOMES, default=None,
                        help="log each file with this outcome (default: crash, hang, unexpected)")
    parser.add_argument("--sanitized", type=Path, default=None,
                        help="the worker runs this sanitized build of pyllm (make test-asan-py: build/asan-py)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(args.sanitized)
        return 0
    report = fuzz(args.files, args.seed, args.minutes, args.deadline, args.keep,
                  log=lambda line: print(line, flush=True), show=tuple(args.show or BAD_OUTCOMES),
                  sanitized=args.sanitized)
    for failure in sorted(set(report.mutator_failures))[:5]:
        print(f"mutator failure:\n{failure}")
    print(report.summary())
    return 1 if any(report.outcomes[o] for o in BAD_OUTCOMES) else 0


if __name__ == "__main__":
    sys.exit(main())
