"""The Python API (llama-cpp-python's shapes) and the CLI, on the default chat model.

Expected greedy texts were produced by llama.cpp (llama-cpp-python 0.3.36) on the same file.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pyllm.cli import main
from pyllm.llama import Llama
from pyllm.model import ContextFullError
from pyllm.params import ParamError


@pytest.fixture(scope="module")
def llm(smollm2_path) -> Llama:
    return Llama(str(smollm2_path), n_ctx=256, n_threads=2)


def test_greedy_completion_matches_llama_cpp(llm: Llama) -> None:
    out = llm.create_completion("The capital of France is", max_tokens=4, temperature=0)
    assert out["object"] == "text_completion"
    assert out["choices"][0]["text"] == " Paris.\n\n"
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9,
                            "prompt_tokens_details": {"cached_tokens": 0}}


def test_chat_prompt_tokens_and_first_words_match_llama_cpp(llm: Llama) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = llm.apply_chat_template(messages)
    assert prompt.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    tokens = llm.tokenize(prompt.encode(), special=True)
    assert len(tokens) == 37 and tokens[:3] == [1, 9690, 198]
    reply = llm.create_chat_completion(messages, temperature=0, max_tokens=8)
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["content"].startswith("L'Étoile, la")


def test_stream_chunks_join_to_the_plain_answer(llm: Llama) -> None:
    messages = [{"role": "user", "content": "Name three colors."}]
    plain = llm.create_chat_completion(messages, temperature=0, max_tokens=8)["choices"][0]["message"]["content"]
    chunks = list(llm.create_chat_completion(messages, temperature=0, max_tokens=8, stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == plain
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_polled_stream_gives_the_iterated_chunks(llm: Llama) -> None:
    """poll() (an event loop's way to read a stream) takes the chunks ready now: [] before the engine has any,
    None at the end, woken by Request.on_event; together the same chunks as iterating, a stop string's cut
    included, and a chat stream's role chunk first."""
    import threading

    for kwargs in ({"prompt": "The capital of France is", "stop": ["."]}, {"prompt": "Once upon a time"}):
        want = [c["choices"][0] for c in llm.create_completion(**kwargs, max_tokens=12, temperature=0, stream=True)]
        stream = llm.create_completion(**kwargs, max_tokens=12, temperature=0, stream=True)
        arrived = threading.Event()
        stream.request.on_event = arrived.set
        got: list = []
        while (ready := stream.poll()) is not None:
            if not ready:
                assert arrived.wait(30), "no event came"
                arrived.clear()
            got += [c["choices"][0] for c in ready]
        assert got == want
    chat = llm.create_chat_completion([{"role": "user", "content": "Hi"}], temperature=0, max_tokens=3, stream=True)
    chunks: list = []
    while (ready := chat.poll()) is not None:
        chunks += ready
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"} and chunks[-1]["choices"][0]["finish_reason"]


def test_stop_strings_cut_the_text(llm: Llama) -> None:
    out = llm.create_completion("The capital of France is", max_tokens=8, temperature=0, stop=["."])
    assert out["choices"][0]["text"] == " Paris"
    assert out["choices"][0]["finish_reason"] == "stop"


def test_seeded_sampling_is_reproducible(llm: Llama) -> None:
    a = llm.create_completion("Once upon a time", max_tokens=8, temperature=1.0, seed=7)
    b = llm.create_completion("Once upon a time", max_tokens=8, temperature=1.0, seed=7)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


def test_a_cached_prefix_gives_the_same_answer_as_a_fresh_start(llm: Llama, smollm2_path) -> None:
    tokens = llm.tokenize(b"Hello there, how are you")
    all_logits = llm.logits(tokens)
    assert all_logits.shape == (len(tokens), llm.n_vocab())
    llm.reset()
    first = llm.create_completion(tokens, max_tokens=2, temperature=0)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    longer = tokens + [tokens[-1], tokens[1]]
    again = llm.create_completion(longer, max_tokens=4, temperature=0, logprobs=3)  # continues the cached prompt
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == len(tokens)
    fresh = Llama(str(smollm2_path), n_ctx=256, n_threads=2).create_completion(longer, max_tokens=4, temperature=0,
                                                                               logprobs=3)
    assert fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["choices"][0]["text"] == fresh["choices"][0]["text"]
    assert again["choices"][0]["logprobs"] == fresh["choices"][0]["logprobs"]  # the same floats, bit for bit


def test_bad_inputs_raise_clear_errors(llm: Llama) -> None:
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.create_completion([], max_tokens=1)
    with pytest.raises(ContextFullError, match="context holds 256"):
        llm.create_completion([1] * 300, max_tokens=1)
    with pytest.raises(ValueError, match="temperature"):
        llm.create_completion("hi", temperature=-1)
    with pytest.raises(ValueError, match="unknown catalogue model 'nope'"):
        Llama.from_catalogue("nope")
    # bytes that are not UTF-8 still tokenize (as llama.cpp does) and round-trip
    raw = b"caf\xe9 \xff\xfe ok"
    ids = llm.tokenize(raw, add_bos=False)
    assert ids and llm.detokenize(ids) == raw.decode("utf-8", "replace").encode()


def test_cli_commands(smollm2_path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0
    for command in ("chat", "run", "info", "tokenize", "pull", "list", "serve", "bench", "perplexity"):
        assert command in result.output
    result = runner.invoke(main, ["info", str(smollm2_path), "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["architecture"] == "llama"
    result = runner.invoke(main, ["tokenize", str(smollm2_path), "<|im_start|>user", "--json"])
    assert result.exit_code == 0 and json.loads(result.output) == [1, 4093]
    result = runner.invoke(main, ["run", str(smollm2_path), "The capital of France is", "--temp", "0", "-n", "4"])
    assert result.exit_code == 0 and result.output == " Paris.\n\n\n"
    result = runner.invoke(main, ["chat", str(smollm2_path), "--temp", "0", "-n", "3"], input="Hi\n/reset\n/exit\n")
    assert result.exit_code == 0 and "(conversation cleared)" in result.output
    result = runner.invoke(main, ["run", "no-such-model", "x"])
    assert result.exit_code != 0 and "not a catalogue name" in result.output
    result = runner.invoke(main, ["run", str(smollm2_path), "x", "--bogus"])
    assert result.exit_code == 2 and "No such option" in result.output


def test_generation_continues_past_the_context_by_shifting(smollm2_path) -> None:
    small = Llama(str(smollm2_path), n_ctx=64, n_threads=2)
    no_end = {t: float("-inf") for t in small.tokenizer.eog_ids}  # so it cannot stop early
    out = small.create_completion("Once upon a time", max_tokens=3 * 64, temperature=0.8, seed=3, logit_bias=no_end)
    assert out["usage"]["completion_tokens"] == 3 * 64
    assert out["choices"][0]["finish_reason"] == "length"
    assert len(small.engine.prefix_cache) == 0  # a shifted cache is no prompt's prefix: not kept for reuse


def test_bench_prints_llama_bench_records(smollm2_path) -> None:
    args = ["bench", str(smollm2_path), "-p", "8", "-n", "4", "-t", "1", "-r", "2", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    records = json.loads(result.output)
    assert [(r["n_prompt"], r["n_gen"], r["n_threads"]) for r in records] == [(8, 0, 1), (0, 4, 1)]
    for r in records:
        assert len(r["samples_ts"]) == 2 and r["avg_ts"] > 0 and r["stddev_ts"] >= 0
    bad = CliRunner().invoke(main, ["bench", str(smollm2_path), "-t", "two"])
    assert bad.exit_code == 2 and "comma-separated" in bad.output


def test_a_dropped_stream_stops_generating(llm: Llama) -> None:
    import gc
    import time

    stream = llm.create_completion("Once upon a time", max_tokens=200, temperature=0, stream=True,
                                   logit_bias={t: float("-inf") for t in llm.tokenizer.eog_ids})
    request = stream.request
    del stream
    gc.collect()
    deadline = time.monotonic() + 30
    while request.finish_reason is None:
        assert time.monotonic() < deadline, "the dropped stream kept generating"
        time.sleep(0.05)
    assert request.finish_reason == "cancelled" and request.n_generated < 200


@pytest.mark.parametrize(("call", "kind", "param"), [
    (lambda llm: llm.create_completion("hi", stop=5), TypeError, "stop"),
    (lambda llm: llm.create_completion("hi", stop=[None]), TypeError, "stop[0]"),
    (lambda llm: llm.create_completion("hi", max_tokens="5"), TypeError, "max_tokens"),
    (lambda llm: llm.create_completion("hi", max_tokens=True), TypeError, "max_tokens"),
    (lambda llm: llm.create_completion("hi", temperature="0.5"), TypeError, "temperature"),
    (lambda llm: llm.create_completion("hi", logit_bias="x"), TypeError, "logit_bias"),
    (lambda llm: llm.create_completion("hi", logit_bias={"abc": 1}), ValueError, "logit_bias"),
    (lambda llm: llm.create_completion("hi", logit_bias={"1.5": 1}), ValueError, "logit_bias"),
    (lambda llm: llm.create_completion("hi", logit_bias={"": 1}), ValueError, "logit_bias"),
    (lambda llm: llm.create_completion("hi", logit_bias={"\u0663": 1}), ValueError, "logit_bias"),  # Arabic 3
    (lambda llm: llm.create_completion("hi", stream="yes"), TypeError, "stream"),
    (lambda llm: llm.create_completion("hi", logprobs="3"), TypeError, "logprobs"),
    (lambda llm: llm.create_completion("a \ud800 b"), ValueError, "prompt"),
    (lambda llm: llm.create_completion([1, -4]), ValueError, "prompt"),
    (lambda llm: llm.create_completion("hi", suffix="x"), ValueError, "suffix"),
    (lambda llm: llm.create_chat_completion([{"role": "user", "content": "hi"}], top_logprobs="x"), TypeError,
     "top_logprobs"),
    (lambda llm: llm.create_chat_completion([{"role": "user", "content": "\ud800"}]), ValueError,
     "messages[0].content"),
    (lambda llm: llm.create_chat_completion([{"role": "user"}]), ValueError, "messages"),
    (lambda llm: llm.create_chat_completion("hello"), ValueError, "messages"),
    (lambda llm: llm.tokenize(5), TypeError, "text"),
    (lambda llm: llm.detokenize([10**9]), ValueError, "tokens"),
])
def test_every_bad_argument_is_named(llm: Llama, call, kind, param) -> None:
    """A bad argument raises a ValueError or TypeError (ParamError) whose `param` and message name it, before any
    work starts; never a raw TypeError/AttributeError from deep inside."""
    with pytest.raises(kind) as info:
        call(llm)
    assert isinstance(info.value, ParamError) and info.value.param == param
    assert param.split("[")[0] in str(info.value)


def test_impossible_sizes_are_refused_up_front_with_the_memory_they_need(smollm2_path) -> None:
    with pytest.raises(ParamError, match=r"n_ctx=100000000 needs 2\.\d TiB of memory") as info:
        Llama(str(smollm2_path), n_ctx=10**8)
    assert info.value.param == "n_ctx"
    with pytest.raises(ParamError, match="x 64 sequences") as info:
        Llama(str(smollm2_path), n_ctx=2**20, n_parallel=64)
    for kwargs, param in (({"n_threads": 0}, "n_threads"), ({"n_threads": 10**6}, "n_threads"),
                          ({"n_parallel": 0}, "n_parallel"), ({"n_ctx": -1}, "n_ctx"), ({"n_ctx": "4096"}, "n_ctx"),
                          ({"prefill_chunk": 0}, "prefill_chunk"), ({"seed": -2}, "seed")):
        with pytest.raises(ParamError) as info:
            Llama(str(smollm2_path), **kwargs)
        assert info.value.param == param


@pytest.mark.parametrize(("template", "message"), [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "did not finish rendering"),
    # sized at render time: a literal product is folded when jinja compiles, and that alone can take seconds
    ("{{ 'x' * (messages|length * 10**10) }}", "out of memory"),
    ("{{ 'x' * (messages|length * 10**8) }}", "characters"),
])
def test_a_hostile_chat_template_fails_its_request_in_bounded_time(llm: Llama, template, message) -> None:
    """The chat template is code from the model file: a render that loops, or builds a huge string, is stopped
    (the worker killed, or its memory capped) and the chat gets a one-line error; the next render works."""
    import time

    saved = llm.metadata.get("tokenizer.chat_template")
    llm.metadata["tokenizer.chat_template"] = template
    try:
        start = time.monotonic()
        with pytest.raises(ParamError, match=message) as info:
            llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=1)
        assert info.value.param == "messages" and time.monotonic() - start < 10
    finally:
        llm.metadata["tokenizer.chat_template"] = saved
    assert llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=1, temperature=0)["choices"]
