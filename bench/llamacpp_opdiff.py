"""Op by op against llama.cpp: which step of a forward pass computes different bits.

    python bench/llamacpp_opdiff.py MODEL [--tokens 1,504,3458] [--layer 0]

Runs the tokens through llama.cpp (llama-cpp-python) with an eval callback that copies every
intermediate tensor of one layer, then feeds each step's llama.cpp input to pyllm's kernel for
that step and compares the outputs bit for bit: the share of identical floats and the largest
relative difference. A step at 100% computes exactly what llama.cpp computes; one below it rounds
differently (a different summation order, a fused multiply-add, an approximate exp...), which
is where pyllm's numbers part from llama.cpp's. Llama-family files (llama, qwen2) only: the
tensor names follow llama.cpp's llama graph. Needs llama-cpp-python; not run in CI.
"""

from __future__ import annotations

import argparse
import ctypes

import numpy as np
from llamacpp_params import llama_cpp_defaults

from pyllm import catalogue, kernels
from pyllm.gguf import GGUFFile
from pyllm.model import Model


class GGMLTensor(ctypes.Structure):
    """struct ggml_tensor of llama-cpp-python 0.3.36's ggml (GGML_MAX_DIMS 4, 64 bytes of op params,
    GGML_MAX_SRC 10, GGML_MAX_NAME 64)."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def capture(path: str, tokens: list[int], layer: int, threads: int) -> dict[str, list[np.ndarray]]:
    """llama.cpp's float tensors named '<step>-<layer>' (and the output's), in the order computed."""
    import llama_cpp

    got: dict[str, list[np.ndarray]] = {}

    def on_tensor(pointer, ask, _user):
        t = ctypes.cast(pointer, ctypes.POINTER(GGMLTensor)).contents
        name = t.name.decode(errors="replace")
        wanted = name.endswith(f"-{layer}") or name.startswith("result")
        if ask or not wanted or t.type not in (0, 1) or not t.data:  # F32 and F16 only
            return wanted if ask else True
        dtype = np.float32 if t.type == 0 else np.float16
        raw = (ctypes.c_char * (t.nb[3] * t.ne[3])).from_address(t.data)
        array = np.lib.stride_tricks.as_strided(np.frombuffer(raw, dtype=dtype), shape=list(t.ne)[::-1],
                                                strides=list(t.nb)[::-1])
        got.setdefault(name, []).append(array.copy())
        return True

    callback = llama_cpp.ggml_backend_sched_eval_callback(on_tensor)
    with llama_cpp_defaults("llama_context_default_params", cb_eval=callback):
        ref = llama_cpp.Llama(model_path=path, n_ctx=256, n_batch=256, logits_all=True, verbose=False,
                              n_threads=threads)
        ref.eval(tokens)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--tokens", default="1,504,3458,282,4649,314", help="comma-separated token ids")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    path = str(catalogue.resolve(args.model))
    tokens = [int(t) for t in args.tokens.split(",")]
    got = capture(path, tokens, args.layer, args.threads)
    model = Model(GGUFFile(path), n_threads=args.threads)
    cfg, layer, n = model.config, model.weights.layers[args.layer], len(tokens)

    def theirs(step: str, index: int = 0, suffix: bool = True) -> np.ndarray:
        return got[f"{step}-{args.layer}" if suffix else step][index].reshape(n, -1).astype(np.float32)

    def compare(label: str, mine, reference) -> None:
        """mine, reference: arrays, or callables giving them (a step llama.cpp did not name is skipped)."""
        try:
            mine, reference = (a() if callable(a) else a for a in (mine, reference))
        except KeyError as exc:
            print(f"{label:34s} not captured ({exc})")
            return
        mine = np.ascontiguousarray(mine, np.float32).reshape(reference.shape)
        same = float(np.mean(mine.view(np.uint32) == reference.view(np.uint32)))
        rel = float(np.abs(mine - reference).max() / (np.abs(reference).max() + 1e-30))
        print(f"{label:34s} bit-identical {same:7.2%}   largest relative difference {rel:.2e}")

    positions = np.arange(n, dtype=np.int32)
    base, scale = cfg.layer_rope(args.layer)
    x = theirs("attn_norm")
    if args.layer == 0:  # its input is the embedding (other layers' inputs are not captured)
        compare("rms_norm * weight (attn_norm)",
                kernels.rms_norm(model.embed(np.array(tokens)), layer.attn_norm, cfg.norm_eps), x)
    compare("matmul attn_q", layer.wq.matrix(x, args.threads), theirs("Qcur", 0))
    compare("matmul attn_k", layer.wk.matrix(x, args.threads), theirs("Kcur", 0))
    compare("matmul attn_v", layer.wv.matrix(x, args.threads), theirs("Vcur", 0))
    q = theirs("Qcur", -2).reshape(n, cfg.n_head, cfg.head_dim).copy()  # the last step before rope (bias added)
    kernels.rope(q, positions, cfg.n_rot, base, scale, cfg.family.rope_neox)
    compare("rope", q, theirs("Qcur", -1))
    q_roped = theirs("Qcur", -1).reshape(n, cfg.n_head, cfg.head_dim)
    k = theirs("Kcur", -1).reshape(n, cfg.n_head_kv, cfg.head_dim)
    v = theirs("Vcur", -1).reshape(n, cfg.n_head_kv, cfg.head_dim_v)
    attention = kernels.attention(np.ascontiguousarray(q_roped), k.astype(np.float16), v.astype(np.float16),
                                  positions, positions, cfg.attn_scale)
    compare("attention (half-precision cache)", attention.transpose(1, 0, 2), got[f"kqv-{args.layer}"][0][0])
    compare("matmul attn_output", lambda: layer.wo.matrix(theirs("kqv_out"), args.threads),
            lambda: theirs("attn_out"))
    compare("rms_norm * weight (ffn_norm)", lambda: kernels.rms_norm(theirs("ffn_inp"), layer.ffn_norm, cfg.norm_eps),
            lambda: theirs("ffn_norm"))
    h = theirs("ffn_norm")
    compare("matmul ffn_gate", layer.w_gate.matrix(h, args.threads), theirs("ffn_gate"))
    compare("matmul ffn_up", layer.w_up.matrix(h, args.threads), theirs("ffn_up"))
    compare(f"{cfg.family.activation} gating", kernels.gated_activation(theirs("ffn_gate"), theirs("ffn_up"),
                                                                       cfg.family.activation),
            theirs("ffn_swiglu" if cfg.family.activation == "silu" else "ffn_geglu"))
    compare("matmul ffn_down", layer.w_down.matrix(theirs("ffn_swiglu" if cfg.family.activation == "silu"
                                                          else "ffn_geglu"), args.threads), theirs("ffn_out"))
    compare("matmul output", model.weights.output.matrix(theirs("result_norm", suffix=False), args.threads),
            theirs("result_output", suffix=False))


if __name__ == "__main__":
    main()
