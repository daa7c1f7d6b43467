"""Logprobs in OpenAI's shapes and n > 1 choices, through the Python API (the server's side is in
test_server.py): values against the model's own logits, offsets against the text, choices against runs
of one choice each."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pyllm.llama import Llama
from pyllm.params import ParamError

PROMPT = "The three primary colours are"


@pytest.fixture(scope="module")
def llm(smollm2_path):
    # four slots: the choices of one prompt run together, the followers sharing the leader's prefill
    model = Llama(str(smollm2_path), n_ctx=256, n_threads=1, n_parallel=4, prefill_chunk=64)
    yield model
    model.close()


def _log_softmax64(x: np.ndarray) -> np.ndarray:
    """Written out here, in float64, independently of pyllm.sampling."""
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def _greedy_reference(llm: Llama, prompt: list[int], n: int) -> list[tuple[int, np.ndarray]]:
    """(token, log-softmax of the logits it was taken from) for n greedy steps, straight from the Model."""
    model = llm.model
    cache = model.new_cache(llm.n_ctx())
    logits = model.prefill(prompt, cache)
    out = []
    for _ in range(n):
        token = int(np.argmax(logits))
        out.append((token, _log_softmax64(logits)))
        logits = model.prefill([token], cache)
    return out


def test_completion_logprobs_are_the_log_softmax_of_the_models_logits(llm: Llama) -> None:
    prompt = llm.tokenize(PROMPT.encode())
    out = llm.create_completion(prompt, max_tokens=8, temperature=0, logprobs=3)
    choice = out["choices"][0]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    n = len(lp["tokens"])
    assert n == out["usage"]["completion_tokens"] == 8
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    reference = _greedy_reference(llm, prompt, n)
    for i, (token, ref) in enumerate(reference):
        piece = llm.tokenizer.token_to_piece(token).decode("utf-8", "replace")
        assert lp["tokens"][i] == piece
        assert lp["token_logprobs"][i] == pytest.approx(ref[token], abs=1e-5)
        top_ids = np.argsort(-ref, kind="stable")[:3]
        want = {llm.tokenizer.token_to_piece(int(t)).decode("utf-8", "replace"): ref[t] for t in top_ids}
        assert list(lp["top_logprobs"][i]) == list(want)  # likeliest first
        for text, value in want.items():
            assert lp["top_logprobs"][i][text] == pytest.approx(value, abs=1e-5)
    # each token's text is where its offset says
    text = choice["text"]
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    for token, offset in zip(lp["tokens"], lp["text_offset"], strict=True):
        assert text[offset:offset + len(token)] == token


def test_offsets_count_the_echoed_prompt_and_stop_strings_cut_the_tokens(llm: Llama) -> None:
    out = llm.create_completion(PROMPT, max_tokens=8, temperature=0, logprobs=0, echo=True)
    choice = out["choices"][0]
    lp = choice["logprobs"]
    n_prompt = len(lp["tokens"]) - out["usage"]["completion_tokens"]  # the echoed prompt's tokens come first
    assert lp["text_offset"][n_prompt] == len(PROMPT) and all(top == {} for top in lp["top_logprobs"][1:])
    for token, offset in zip(lp["tokens"], lp["text_offset"], strict=True):
        assert choice["text"][offset:offset + len(token)] == token
    full = llm.create_completion(PROMPT, max_tokens=8, temperature=0, logprobs=1)["choices"][0]
    stop = full["logprobs"]["tokens"][3]
    cut = llm.create_completion(PROMPT, max_tokens=8, temperature=0, logprobs=1, stop=[stop])["choices"][0]
    assert cut["finish_reason"] == "stop" and full["text"].startswith(cut["text"])
    # the tokens whose text is inside the stop string are left out with it
    assert cut["logprobs"]["tokens"] == full["logprobs"]["tokens"][:3]
    streamed = [c["choices"][0]["logprobs"] for c in llm.create_completion(PROMPT, max_tokens=8, temperature=0,
                                                                          logprobs=1, stop=[stop], stream=True)]
    assert sum((lp["tokens"] for lp in streamed if lp), []) == cut["logprobs"]["tokens"]
    assert sum((lp["text_offset"] for lp in streamed if lp), []) == cut["logprobs"]["text_offset"]


def test_chat_logprobs_in_openais_shape_streamed_or_not(llm: Llama) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    out = llm.create_chat_completion(messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"]
    assert "".join(e["token"] for e in content) == out["choices"][0]["message"]["content"]
    prompt = llm.tokenize_chat(messages)
    for entry, (token, ref) in zip(content, _greedy_reference(llm, prompt, len(content)), strict=True):
        assert bytes(entry["bytes"]) == llm.tokenizer.token_to_piece(token)
        assert entry["logprob"] == pytest.approx(ref[token], abs=1e-5)
        assert [bytes(t["bytes"]) for t in entry["top_logprobs"]] == \
            [llm.tokenizer.token_to_piece(int(t)) for t in np.argsort(-ref, kind="stable")[:2]]
        assert set(entry["top_logprobs"][0]) == {"token", "logprob", "bytes"}
    chunks = list(llm.create_chat_completion(messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2,
                                             stream=True))
    streamed = [e for c in chunks if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content
    plain = llm.create_chat_completion(messages, max_tokens=2, temperature=0)
    assert plain["choices"][0]["logprobs"] is None
    with pytest.raises(ParamError) as err:
        llm.create_chat_completion(messages, logprobs=True, top_logprobs=21)
    assert err.value.param == "top_logprobs"


def test_n_choices_are_seeded_runs_sharing_one_prefill(llm: Llama) -> None:
    engine = llm.engine
    llm.reset()
    cached_before = engine.metrics.cached_prompt_tokens.value()
    out = llm.create_completion(PROMPT, max_tokens=8, temperature=1.0, seed=11, n=3, logprobs=0)
    n_prompt = out["usage"]["prompt_tokens"]
    assert n_prompt == len(llm.tokenize(PROMPT.encode()))
    # the followers took the leader's cache: the prompt was read once
    assert engine.metrics.cached_prompt_tokens.value() - cached_before == 2 * n_prompt
    choices = out["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert len({c["text"] for c in choices}) > 1
    assert out["usage"]["completion_tokens"] == sum(len(c["logprobs"]["tokens"]) for c in choices)
    assert out["usage"]["total_tokens"] == n_prompt + out["usage"]["completion_tokens"]
    again = llm.create_completion(PROMPT, max_tokens=8, temperature=1.0, seed=11, n=3, logprobs=0)
    assert again["choices"] == choices
    # choice i is what one choice with seed 11 + i gives
    for i, choice in enumerate(choices):
        alone = llm.create_completion(PROMPT, max_tokens=8, temperature=1.0, seed=11 + i, logprobs=0)
        assert alone["choices"][0]["text"] == choice["text"]
        assert alone["choices"][0]["logprobs"] == choice["logprobs"]


def test_n_choices_one_slot_at_a_time(smollm2_path) -> None:
    with Llama(str(smollm2_path), n_ctx=256, n_threads=1, n_parallel=1) as one:
        out = one.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=5, temperature=1.0,
                                         seed=4, n=2)
        assert [c["index"] for c in out["choices"]] == [0, 1]
        with Llama(str(smollm2_path), n_ctx=256, n_threads=1, n_parallel=2) as two:
            assert two.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=5, temperature=1.0,
                                              seed=4, n=2)["choices"] == out["choices"]


def test_n_choices_stream_with_their_index(llm: Llama) -> None:
    want = llm.create_completion(PROMPT, max_tokens=6, temperature=1.0, seed=3, n=2)
    texts = {0: "", 1: ""}
    finished = set()
    for chunk in llm.create_completion(PROMPT, max_tokens=6, temperature=1.0, seed=3, n=2, stream=True):
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"]:
            finished.add(choice["index"])
    assert finished == {0, 1} and [texts[0], texts[1]] == [c["text"] for c in want["choices"]]
    chat = list(llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=4, temperature=1.0,
                                           seed=3, n=2, stream=True))
    roles = [c["choices"][0]["index"] for c in chat if c["choices"][0]["delta"].get("role")]
    assert sorted(roles) == [0, 1]


@pytest.mark.parametrize("n", [0, 17, "2", 1.0])
def test_n_is_bounded(llm: Llama, n) -> None:
    with pytest.raises(ParamError) as err:
        llm.create_completion(PROMPT, max_tokens=1, n=n)
    assert err.value.param == "n"


def test_followers_read_the_prompt_themselves_when_their_leader_is_cancelled(llm: Llama) -> None:
    from pyllm.sampling import SamplingParams

    prompt = llm.tokenize((PROMPT + " and the sea is deep.").encode() * 6)
    params = [SamplingParams(temperature=1.0, seed=20 + i) for i in range(3)]

    def tokens(requests) -> list[list[int]]:
        return [[step.token for step in request] for request in requests]

    llm.reset()
    want = tokens(llm.engine.submit_group(prompt, params, 5))
    for wait in (False, True):  # the leader cancelled at once, and (most likely) once all three are admitted
        llm.reset()
        requests = llm.engine.submit_group(prompt, params, 5)
        deadline = time.monotonic() + 5
        while wait and llm.engine.n_active < 3 and time.monotonic() < deadline:
            time.sleep(0.0005)
        requests[0].cancel()
        assert tokens(requests[1:]) == want[1:]


def test_echo_scores_the_prompt_tokens(llm: Llama) -> None:
    """echo with logprobs: the prompt's tokens first (OpenAI's null for the first, each other one the log-softmax
    of the logits before it, read from an empty cache even when the prefix cache holds the prompt), then the
    completion's; streamed, the prompt's chunk carries them."""
    prompt = llm.tokenize(PROMPT.encode())
    skip = 1 if prompt[0] == llm.tokenizer.bos_id else 0
    logits = llm.logits(prompt)
    for _ in range(2):  # the second finds the prompt in the prefix cache
        out = llm.create_completion(PROMPT, max_tokens=3, temperature=0, logprobs=2, echo=True)
        lp = out["choices"][0]["logprobs"]
        n_prompt = len(prompt) - skip
        assert len(lp["tokens"]) == n_prompt + out["usage"]["completion_tokens"]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        for i in range(skip + 1, len(prompt)):
            ref = _log_softmax64(logits[i - 1])
            entry = i - skip
            assert lp["tokens"][entry] == llm.tokenizer.token_to_piece(prompt[i]).decode("utf-8", "replace")
            assert lp["token_logprobs"][entry] == pytest.approx(ref[prompt[i]], abs=1e-5)
            assert len(lp["top_logprobs"][entry]) <= 2
        text = out["choices"][0]["text"]
        assert text.startswith(PROMPT)
        for token, offset in zip(lp["tokens"], lp["text_offset"], strict=True):
            assert text[offset:offset + len(token)] == token
    chunks = list(llm.create_completion(PROMPT, max_tokens=3, temperature=0, logprobs=2, echo=True, stream=True))
    first = chunks[0]["choices"][0]
    assert first["text"] == PROMPT and first["logprobs"]["tokens"] == lp["tokens"][:n_prompt]
    assert first["logprobs"]["token_logprobs"] == lp["token_logprobs"][:n_prompt]
