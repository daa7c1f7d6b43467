"""Fuzzing the API: random values of every type in every field, through the Python API and over HTTP.

The property: a bad value is a ParamError naming a real argument (over HTTP: a 4xx JSON error), a good one an
answer; never another exception, a 500, a plain-text body or a hang. Fixed seeds (derandomized), a few hundred
cases each, so CI runs the same cases every time.
"""

from __future__ import annotations

import inspect
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_server import _Server

from pyllm.llama import Llama
from pyllm.params import ParamError

_scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70), st.integers(min_value=-3, max_value=40),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=-2, max_value=2),
    st.text(max_size=12), st.sampled_from(["", "\ud800", "\u0663", "1.5", "7", " 7", "-1", "abc", "1e3"]),
)
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=6), st.sampled_from(["1", "\u0663", "-2"])),
                                                 inner, max_size=3)), max_leaves=8)

COMPLETION_ARGS = [name for name in inspect.signature(Llama.create_completion).parameters
                   if name not in ("self", "prompt")]
CHAT_ARGS = [name for name in inspect.signature(Llama.create_chat_completion).parameters
             if name not in ("self", "messages")]
GOOD_MESSAGES = [{"role": "user", "content": "Hi"}]


def _short(max_tokens: object) -> object:
    """Keep a valid max_tokens short (the fuzz is about values, not about generating long answers)."""
    return 3 if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 3 else max_tokens


@pytest.fixture(scope="module")
def llm(smollm2_path) -> Llama:
    model = Llama(str(smollm2_path), n_ctx=128, n_threads=2, n_parallel=2)
    yield model
    model.close()


def _call_and_check(call, arg_names: list[str]) -> None:
    try:
        result = call()
    except ParamError as exc:
        assert exc.param is not None and str(exc) and "\n" not in str(exc)
        assert exc.param.split("[")[0].split(".")[0] in arg_names + ["prompt", "messages"], exc.param
        return
    if not isinstance(result, dict):
        list(result)  # a stream: read it to the end


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(prompt=st.one_of(st.just("Hi"), st.text(max_size=20), _values),
       kwargs=st.dictionaries(st.sampled_from(COMPLETION_ARGS), _values, max_size=4))
def test_python_completion_arguments(llm: Llama, prompt, kwargs) -> None:
    if "max_tokens" in kwargs:
        kwargs["max_tokens"] = _short(kwargs["max_tokens"])
    else:
        kwargs["max_tokens"] = 2
    _call_and_check(lambda: llm.create_completion(prompt, **kwargs), COMPLETION_ARGS)


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(messages=st.one_of(st.just(GOOD_MESSAGES), _values,
                          st.lists(st.dictionaries(st.sampled_from(["role", "content", "name"]), _values), max_size=3)),
       kwargs=st.dictionaries(st.sampled_from(CHAT_ARGS), _values, max_size=4))
def test_python_chat_arguments(llm: Llama, messages, kwargs) -> None:
    kwargs["max_tokens"] = _short(kwargs.get("max_tokens", 2))
    _call_and_check(lambda: llm.create_chat_completion(messages, **kwargs), CHAT_ARGS)


@pytest.fixture(scope="module")
def server(llm: Llama):
    s = _Server(llm, None)
    yield s
    s.stop()


FIELDS = {
    "/v1/completions": ["prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "typical_p", "stop",
                        "seed", "logit_bias", "logprobs", "echo", "stream", "n", "model", "suffix", "presence_penalty",
                        "frequency_penalty", "repeat_penalty", "stream_options", "tools", "response_format"],
    "/v1/chat/completions": ["messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop",
                             "seed", "logit_bias", "logprobs", "top_logprobs", "stream", "n", "model", "tools",
                             "tool_choice", "response_format"],
    "/tokenize": ["content", "add_special", "parse_special"],
    "/detokenize": ["tokens"],
}
BASES = {"/v1/completions": {"prompt": "Hi", "max_tokens": 2},
         "/v1/chat/completions": {"messages": GOOD_MESSAGES, "max_tokens": 2},
         "/tokenize": {"content": "Hi"}, "/detokenize": {"tokens": [1, 2]}}


def _json_safe(value: object) -> bool:
    """Whether json.dumps writes it (NaN and infinities are written, as Python's json does, and must be refused)."""
    try:
        json.dumps(value)
    except (ValueError, TypeError):
        return False
    return True


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(sorted(FIELDS)), data=st.data())
def test_http_bodies(server: _Server, path: str, data) -> None:
    body = dict(BASES[path])
    for name in data.draw(st.lists(st.sampled_from(FIELDS[path]), max_size=3, unique=True)):
        body[name] = data.draw(_values)
    if "max_tokens" in body:
        body["max_tokens"] = _short(body["max_tokens"])
    if body.get("stream") is True:
        body["stream"] = False  # the streamed form of the same fields is the same code after the first chunk
    raw = json.dumps(body).encode() if _json_safe(body) else b"{}"
    response = httpx.post(server.url + path, content=raw, timeout=60)
    assert response.headers["content-type"].startswith("application/json"), response.text[:200]
    payload = response.json()
    if response.status_code == 200:
        return
    assert response.status_code in (400, 404), (response.status_code, payload)
    error = payload["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    param = error["param"]
    assert param is None or param.split("[")[0].split(".")[0] in FIELDS[path] + ["text"], (param, body)
