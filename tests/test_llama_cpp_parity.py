"""llama-cpp-python's `Llama` as its callers use it: the constructor's arguments (honoured, accepted without
effect, or refused by name), n_ctx() and the other small methods, from_pretrained, and the low-level
eval / sample / generate on a context of the Llama's own."""

from __future__ import annotations

import numpy as np
import pytest

from pyllm import catalogue
from pyllm.llama import Llama
from pyllm.model import ContextFullError
from pyllm.params import ParamError
from pyllm.sampling import SamplingParams

PROMPT = b"The capital of France is"


@pytest.fixture(scope="module")
def llm(smollm2_path) -> Llama:
    return Llama(str(smollm2_path), n_ctx=96, n_threads=2, n_batch=8, logits_all=True)


def test_the_arguments_llama_cpp_python_callers_pass_are_accepted(smollm2_path, capsys) -> None:
    llm = Llama(str(smollm2_path), n_ctx=64, n_threads=1, n_batch=32, n_ubatch=16, n_threads_batch=2,
                logits_all=False, chat_format="chatml", embedding=False, n_gpu_layers=-1, use_mmap=False,
                use_mlock=False, seed=-1, verbose=True, rope_freq_base=0.0, rope_freq_scale=0.0, flash_attn=True,
                last_n_tokens_size=32, numa=False, offload_kqv=True, type_k=1, type_v=None, main_gpu=0,
                tensor_split=None, pooling_type=-1, vocab_only=True)
    err = capsys.readouterr().err
    assert err.count("n_gpu_layers=-1") == 1 and "CPU" in err  # said once, not raised
    assert (llm.prefill_chunk, llm.n_batch, llm.seed, llm.chat_format) == (16, 16, None, "chatml")
    assert (llm.n_ctx(), llm.n_embd(), llm.n_vocab(), llm.token_nl()) == (64, 576, 49152, 198)
    assert llm.detokenize([llm.token_nl()]) == b"\n"
    assert Llama(str(smollm2_path), vocab_only=True, chat_format="chat_template.default").chat_format
    quiet = Llama(str(smollm2_path), vocab_only=True, n_gpu_layers=99)
    assert quiet.n_gpu_layers == 99 and capsys.readouterr().err == ""


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"chat_format": "llama-3"}, "chat_format"),        # the file writes ChatML, not Llama 3's format
    ({"chat_format": "alpaca"}, "chat_format"),
    ({"type_k": 10}, "type_k"),                          # Q2_K: not a cache type (llama.cpp's list)
    ({"type_v": 0}, "type_v"),                           # F32: llama.cpp has it, pyllm's cache does not
    ({"type_v": "q9_0"}, "type_v"),
    ({"kv_overrides": {"llama.context_length": 8}}, "kv_overrides"),
    ({"lora_path": "adapter.gguf"}, "lora_path"),
    ({"chat_handler": object()}, "chat_handler"),
    ({"n_batch": 0}, "n_batch"),
    ({"n_ubatch": 16, "prefill_chunk": 32}, "prefill_chunk"),
    ({"rope_freq_base": -1.0}, "rope_freq_base"),
    ({"n_gpu_layers": -2}, "n_gpu_layers"),
    ({"pooling_type": 4}, "pooling_type"),               # rank pooling
    ({"flash_attn": "yes"}, "flash_attn"),
])
def test_what_pyllm_cannot_honour_is_refused_by_name(smollm2_path, kwargs, param) -> None:
    with pytest.raises(ParamError) as info:
        Llama(str(smollm2_path), vocab_only=True, **kwargs)
    assert info.value.param == param and param in str(info.value)


def test_an_unknown_keyword_is_a_type_error(smollm2_path) -> None:
    with pytest.raises(TypeError, match="n_gpu_layer") as info:
        Llama(str(smollm2_path), vocab_only=True, n_gpu_layer=1)
    assert not isinstance(info.value, ParamError)


def test_rope_overrides_are_honoured(llm: Llama, smollm2_path) -> None:
    tokens = llm.tokenize(PROMPT)
    base = llm.model.config.rope_base
    same = Llama(str(smollm2_path), n_ctx=16, n_threads=2, rope_freq_base=base, rope_freq_scale=1.0)
    assert np.array_equal(same.logits(tokens), llm.logits(tokens))
    other = Llama(str(smollm2_path), n_ctx=16, n_threads=2, rope_freq_scale=0.5)
    assert not np.array_equal(other.logits(tokens), llm.logits(tokens))
    assert other.model_identity() != same.model_identity()  # a saved state knows the positions it was read at


def test_from_pretrained_loads_local_files_and_the_catalogue_only(smollm2_path) -> None:
    assert Llama.from_pretrained(str(smollm2_path), vocab_only=True).model_path == str(smollm2_path)
    folder = Llama.from_pretrained(str(smollm2_path.parent), smollm2_path.name, vocab_only=True)
    assert folder.model_path == str(smollm2_path)
    # a hub repository and the catalogue's file name: the catalogue's copy
    hub = Llama.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", smollm2_path.name, vocab_only=True)
    assert hub.model_path == str(catalogue.local_path(catalogue.SMALL_MODEL))
    assert Llama.from_pretrained(catalogue.SMALL_MODEL, vocab_only=True).n_vocab() == 49152
    with pytest.raises(ValueError, match="no models from Hugging Face") as info:
        Llama.from_pretrained("Qwen/Qwen2-0.5B-Instruct-GGUF", "*q8_0.gguf")
    assert catalogue.SMALL_MODEL in str(info.value)


def test_eval_keeps_the_logits_bit_for_bit(llm: Llama, smollm2_path) -> None:
    tokens = llm.tokenize(PROMPT + b" a city of many bridges and")  # 13 tokens over chunks of n_batch=8
    llm.reset()
    llm.eval(tokens[:3])
    llm.eval(tokens[3:])
    want = llm.logits(tokens)
    assert llm.n_tokens == len(tokens) and llm.input_ids.shape == (96,)
    assert llm._input_ids.tolist() == list(llm.eval_tokens) == tokens
    assert np.array_equal(llm.scores, want) and np.array_equal(np.asarray(llm.eval_logits), want)
    last_only = Llama(str(smollm2_path), n_ctx=32, n_threads=2)
    last_only.eval(tokens)
    assert last_only.scores.shape == (1, llm.n_vocab()) and np.array_equal(last_only.scores[0], want[-1])
    assert len(last_only.eval_logits) == 1
    with pytest.raises(ParamError, match="idx"):
        last_only.sample(idx=0)
    assert llm.sample(temp=0, idx=2) == int(np.argmax(want[2]))
    llm.reset()
    assert llm.n_tokens == 0 and llm.scores.shape == (0, llm.n_vocab())
    with pytest.raises(ContextFullError):
        last_only.eval([1] * 30)


def test_greedy_generate_gives_the_completions_tokens(llm: Llama) -> None:
    tokens = llm.tokenize(PROMPT)
    completion = [step.token for step in llm.submit(tokens, SamplingParams(temperature=0), 10)]
    text = llm.create_completion(tokens, max_tokens=10, temperature=0)["choices"][0]["text"]

    def first(n: int, generator) -> list[int]:
        out = []
        for token in generator:
            out.append(token)
            if len(out) == n:
                break
        return out

    got = first(10, llm.generate(tokens, top_k=1, top_p=0.9, temp=0.0, repeat_penalty=1.0))
    assert got == completion and llm.detokenize(got).decode() == text
    assert llm.n_tokens == len(tokens) + 9  # the last token yielded is not read yet
    # again: the context already holds the prompt (and more), which is kept, not read again
    assert first(4, llm.generate(tokens, temp=0.0)) == completion[:4]
    # reset=False: the tokens continue the context
    llm.reset()
    llm.eval(tokens[:2])
    assert first(3, llm.generate(tokens[2:], temp=0.0, reset=False)) == completion[:3]
    # tokens sent in are read after the yielded one
    gen = llm.generate(tokens, temp=0.0)
    assert next(gen) == completion[0]
    forced = gen.send(llm.tokenize(b" Lyon", add_bos=False))
    assert llm._input_ids.tolist()[-2:] == [completion[0], *llm.tokenize(b" Lyon", add_bos=False)][-2:]
    assert forced == llm.sample(temp=0)
    gen.close()


def test_sampling_is_seeded_and_its_settings_checked(llm: Llama) -> None:
    tokens = llm.tokenize(PROMPT)
    llm.reset()
    llm.eval(tokens)
    draws = []
    for _ in range(2):
        llm.set_seed(11)
        draws.append([llm.sample(temp=1.5, top_k=0, top_p=1.0, min_p=0.0) for _ in range(6)])
    assert draws[0] == draws[1] and len(set(draws[0])) > 1
    banned = draws[0][0]

    def ban(input_ids, scores):
        scores[banned] = -np.inf
        return scores

    llm.set_seed(11)
    assert banned not in [llm.sample(temp=1.5, top_k=0, top_p=1.0, min_p=0.0, logits_processor=[ban])
                          for _ in range(6)]
    for kwargs, param in (({"mirostat_mode": 2}, "mirostat_mode"), ({"tfs_z": 0.9}, "tfs_z"),
                          ({"temp": -1}, "temperature"), ({"logits_processor": [1]}, "logits_processor")):
        with pytest.raises(ParamError) as info:
            llm.sample(**kwargs)
        assert info.value.param == param


def test_generate_follows_a_grammar_and_stopping_criteria(llm: Llama) -> None:
    prompt = llm.tokenize(b"Is Paris in France? Answer:")
    out = []
    for token in llm.generate(prompt, temp=0.7, grammar='root ::= " yes" | " no"'):
        if token == llm.token_eos() or len(out) == 8:
            break
        out.append(token)
    assert llm.detokenize(out) in (b" yes", b" no")
    seen = []

    def stop(input_ids, logits) -> bool:
        seen.append(len(input_ids))
        return len(input_ids) >= len(prompt) + 2

    assert len(list(llm.generate(prompt, temp=0.0, stopping_criteria=[stop]))) == 2
    assert seen == [len(prompt), len(prompt) + 1, len(prompt) + 2]
