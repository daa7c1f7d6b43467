"""The HTTP server, for real: uvicorn on a free loopback port, spoken to with the official `openai`
client and with raw HTTP. Batching must not change answers; a client that goes away frees its
sequence; a shared prompt prefix is reused."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
import uvicorn

from pyllm.llama import Llama
from pyllm.serve import server as server_module
from pyllm.serve.server import create_app, header_timeout_protocol

API_KEY = "test-key"
MODEL = "smollm2"
CATALOGUE_NAME = "smollm2-135m-instruct"  # the name the server was started by, answered to as well
N_CTX = 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    def __init__(self, llm: Llama, api_key: str | None, header_seconds: float = 10.0) -> None:
        self.port = _free_port()
        app = create_app(llm, model_name=MODEL, api_key=api_key, other_names=(CATALOGUE_NAME,))
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                http=header_timeout_protocol(header_seconds))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def llm(smollm2_path) -> Llama:
    model = Llama(str(smollm2_path), n_ctx=N_CTX, n_threads=2, n_parallel=4, prefill_chunk=64)
    yield model
    model.close()


@pytest.fixture(scope="module")
def server(llm: Llama):
    s = _Server(llm, API_KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: _Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _post(server: _Server, path: str, body: object, key: str | None = API_KEY, raw: bytes | None = None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(server.url + path, content=content, headers=headers, timeout=120)


def _metric(server: _Server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_openai_client_completions_and_chat(client: openai.OpenAI, llm: Llama) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]

    out = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert out.choices[0].text == " Paris.\n\n"                      # the same as the Python API (and llama.cpp)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 4

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=8)
    alone = llm.create_chat_completion(messages, temperature=0, max_tokens=8)
    assert chat.choices[0].message.content == alone["choices"][0]["message"]["content"]
    assert chat.choices[0].message.role == "assistant"

    pieces = []
    stream = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=8, stream=True,
                                            stream_options={"include_usage": True})
    finish, usage = None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == chat.choices[0].message.content
    assert finish == "length" and usage is not None and usage.completion_tokens == 8


def test_openai_client_errors(server: _Server, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL, prompt="hi", temperature=-1)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-nothing", prompt="hi")
    by_catalogue_name = client.completions.create(model=CATALOGUE_NAME, prompt="hi", max_tokens=1)
    assert by_catalogue_name.model == MODEL and [m.id for m in client.models.list()] == [MODEL]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()


@pytest.mark.parametrize(("body", "raw", "status", "param"), [
    (None, b"{not json", 400, None),
    (None, b"[1, 2]", 400, None),
    ({"prompt": "hi", "temperature": "hot"}, None, 400, "temperature"),
    ({"prompt": "hi", "max_tokens": "many"}, None, 400, "max_tokens"),
    ({"prompt": "hi", "max_tokens": N_CTX}, None, 400, "max_tokens"),
    ({"prompt": "hi", "top_k": -3}, None, 400, "top_k"),
    ({"prompt": "hi", "n": 17}, None, 400, "n"),
    ({"prompt": "hi", "n": 0}, None, 400, "n"),
    ({"prompt": "hi", "logit_bias": {"999999": 1}}, None, 400, "logit_bias"),  # past the vocabulary
    ({"prompt": "hi", "model": "nope"}, None, 404, "model"),
    ({"prompt": [N_CTX * 1000]}, None, 400, "prompt"),
    ({"prompt": [1] * (N_CTX + 5)}, None, 400, "prompt"),
    ({}, None, 400, "prompt"),
    # JSON types are OpenAI's, strictly: no strings for numbers, no booleans for numbers or numbers for booleans
    ({"prompt": "hi", "max_tokens": "10"}, None, 400, "max_tokens"),
    ({"prompt": "hi", "temperature": True}, None, 400, "temperature"),
    ({"prompt": "hi", "stream": "yes"}, None, 400, "stream"),
    ({"prompt": "hi", "echo": 1}, None, 400, "echo"),
    ({"prompt": "hi", "logit_bias": {"abc": 1}}, None, 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"1.5": 1}}, None, 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"": 1}}, None, 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"\u0663": 1}}, None, 400, "logit_bias"),  # an Arabic 3 is not token 3
    ({"prompt": "hi", "logit_bias": {"\ud800": 1}}, None, 400, "logit_bias"),
    ({"prompt": "a \ud800 b"}, None, 400, "prompt"),                          # a lone surrogate is not text
    ({"prompt": "hi", "stop": ["\udfff"]}, None, 400, "stop[0]"),
    (None, b'{"prompt": ' + b"[" * 1000 + b"]" * 1000 + b"}", 400, None),  # nested 1000 deep
    (None, b"[" * 100_000 + b"]" * 100_000, 400, None),
    # what is not supported yet is refused by name, never ignored
    ({"prompt": "hi", "tools": [{"type": "function", "function": {"name": "f"}}]}, None, 400, "tools"),
    ({"prompt": "hi", "tool_choice": "required"}, None, 400, "tool_choice"),
    ({"prompt": "hi", "functions": [{"name": "f"}]}, None, 400, "functions"),
    # constraints the validation layer refuses, named as the Python API names them
    ({"prompt": "hi", "response_format": {"type": "xml"}}, None, 400, "response_format"),
    ({"prompt": "hi", "response_format": "json"}, None, 400, "response_format"),
    ({"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "patternProperties": {"^a": {}}}}}}, None, 400, "response_format"),
    ({"prompt": "hi", "grammar": "root ::= nope"}, None, 400, "grammar"),
    ({"prompt": "hi", "grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, None, 400, "grammar"),
    ({"prompt": "hi", "suffix": "x"}, None, 400, "suffix"),
])
def test_bad_completion_requests_get_a_4xx_naming_the_field(server: _Server, body, raw, status, param) -> None:
    response = _post(server, "/v1/completions", body, raw=raw)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error"


def test_bad_chat_requests_and_auth(server: _Server) -> None:
    response = _post(server, "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages.0.role"
    response = _post(server, "/v1/chat/completions", {"messages": []})
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
    for key in (None, "wrong"):
        response = _post(server, "/v1/completions", {"prompt": "hi"}, key=key)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}  # open without a key


@pytest.fixture(scope="module")
def quick_server(smollm2_path):
    """A server on one thread for the tests that generate tens of tokens: on a shared two-core machine two threads
    that wait for each other at every barrier run many times slower (the answers are the same)."""
    model = Llama(str(smollm2_path), n_ctx=N_CTX, n_threads=1, n_parallel=2, prefill_chunk=64)
    s = _Server(model, API_KEY)
    yield s
    s.stop()
    model.close()


@pytest.fixture(scope="module")
def quick_client(quick_server: _Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=quick_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                              "population": {"type": "integer", "minimum": 0}},
               "required": ["city", "population"], "additionalProperties": False}


def test_response_formats_and_grammars_constrain_the_output(quick_client: openai.OpenAI,
                                                             quick_server: _Server) -> None:
    client, server = quick_client, quick_server
    messages = [{"role": "user", "content": "What country is Paris in? Answer in JSON."}]
    out = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=40,
                                         response_format={"type": "json_object"})
    assert out.choices[0].finish_reason == "stop", out.choices[0].message.content
    assert isinstance(json.loads(out.choices[0].message.content), dict)

    schema_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}}
    out = client.chat.completions.create(model=MODEL, messages=messages, temperature=0.8, seed=1, max_tokens=40,
                                         response_format=schema_format)
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), CITY_SCHEMA)
    stream = client.chat.completions.create(model=MODEL, messages=messages, temperature=0.8, seed=1, max_tokens=40,
                                            response_format=schema_format, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == out.choices[0].message.content

    text = client.completions.create(model=MODEL, prompt="The population of Paris, as JSON:", max_tokens=40,
                                     temperature=0, extra_body={"response_format": schema_format}).choices[0].text
    jsonschema.validate(json.loads(text), CITY_SCHEMA)
    response = _post(server, "/v1/completions", {"prompt": "Is the sea salty?", "grammar": 'root ::= "yes" | "no"',
                                                 "max_tokens": 8})
    assert response.json()["choices"][0]["text"] in ("yes", "no")

    response = _post(server, "/v1/chat/completions", {"messages": messages, "response_format": {
        "type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "integer", "minimum": "one"}}}})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "response_format" and "minimum" in error["message"]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                   "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


def test_tool_calls_through_the_openai_client(quick_client: openai.OpenAI, quick_server: _Server) -> None:
    client, server = quick_client, quick_server
    # SmolLM2's template knows nothing of tools: they go in as a system message, the call is forced by a grammar
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, ADD], tool_choice="required",
                                         temperature=0.8, seed=2, max_tokens=64)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    schema = {"get_weather": WEATHER, "add": ADD}[call.function.name]["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)

    # the call and its result in the history; the answer is text (a named choice's grammar: tests/test_tools.py)
    history = [*messages, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 22, "sky": "sunny"}'}]
    final = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER, ADD], tool_choice="none",
                                           temperature=0, max_tokens=8)
    assert isinstance(final.choices[0].message.content, str) and not final.choices[0].message.tool_calls

    # streamed: the same call, sent whole in one delta.tool_calls, finish_reason "tool_calls", no text
    stream = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, ADD],
                                            tool_choice="required", temperature=0.8, seed=2, max_tokens=64,
                                            stream=True)
    deltas = [(c.choices[0].delta, c.choices[0].finish_reason) for c in stream if c.choices]
    streamed_calls = [tc for delta, _ in deltas for tc in (delta.tool_calls or [])]
    assert [tc.function.name for tc in streamed_calls] == [call.function.name]
    assert [tc.function.arguments for tc in streamed_calls] == [call.function.arguments]
    assert streamed_calls[0].index == 0 and streamed_calls[0].id.startswith("call_")
    assert deltas[-1][1] == "tool_calls" and not "".join(d.content or "" for d, _ in deltas).strip()

    for body, param in [({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
                         "tool_choice"),
                        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
                        ({"tool_choice": "required"}, "tool_choice")]:
        response = _post(server, "/v1/chat/completions", {"messages": messages, **body})
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_the_older_functions_api_through_the_openai_client(quick_client: openai.OpenAI,
                                                          quick_server: _Server) -> None:
    """functions / function_call: a named function is called with arguments valid for its parameters, as
    message.function_call (finish_reason "function_call"), streamed as delta.function_call; the call and a
    "function" message with its result in the history get a text answer."""
    client, functions = quick_client, [WEATHER["function"], ADD["function"]]
    messages = [{"role": "user", "content": "What is 2 plus 3?"}]
    out = client.chat.completions.create(model=MODEL, messages=messages, functions=functions,
                                         function_call={"name": "add"}, temperature=0.8, seed=3, max_tokens=48)
    choice = out.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None, choice
    call = choice.message.function_call
    assert call.name == "add"
    jsonschema.validate(json.loads(call.arguments), ADD["function"]["parameters"])
    history = [*messages, {"role": "assistant", "content": None, "function_call": {"name": "add",
                                                                                    "arguments": call.arguments}},
               {"role": "function", "name": "add", "content": "5"}]
    final = client.chat.completions.create(model=MODEL, messages=history, functions=functions, function_call="none",
                                           temperature=0, max_tokens=8)
    assert isinstance(final.choices[0].message.content, str) and final.choices[0].finish_reason != "function_call"
    stream = client.chat.completions.create(model=MODEL, messages=messages, functions=functions,
                                            function_call={"name": "add"}, temperature=0.8, seed=3, max_tokens=48,
                                            stream=True)
    deltas = [(c.choices[0].delta, c.choices[0].finish_reason) for c in stream if c.choices]
    calls = [d.function_call for d, _ in deltas if d.function_call]
    assert [(c.name, c.arguments) for c in calls] == [("add", call.arguments)] and deltas[-1][1] == "function_call"
    for body, param in [({"functions": functions, "tools": [ADD]}, "functions"),
                        ({"function_call": "auto"}, "function_call"),
                        ({"functions": functions, "function_call": "required"}, "function_call")]:
        response = _post(quick_server, "/v1/chat/completions", {"messages": messages, **body})
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_tokenize_detokenize_and_metrics(server: _Server, llm: Llama) -> None:
    tokens = _post(server, "/tokenize", {"content": "Hello world"}).json()["tokens"]
    assert tokens == llm.tokenize(b"Hello world", add_bos=False)
    assert _post(server, "/detokenize", {"tokens": tokens}).json() == {"content": "Hello world"}
    text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    for name in ("pyllm_http_requests_total", "pyllm_time_to_first_token_seconds_bucket",
                 "pyllm_time_per_output_token_seconds_count", "pyllm_requests_queued", "pyllm_prefix_cache_hits_total"):
        assert name in text


PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "List three colours:",
           "The quick brown fox", "Water boils at", "My favourite book is", "In 1969, astronauts"]


def _stream_text(client: openai.OpenAI, prompt: str, max_tokens: int) -> str:
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True)
    return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)


def test_concurrent_streams_give_the_answers_each_gives_alone(client: openai.OpenAI) -> None:
    alone = [client.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0).choices[0].text
             for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: _stream_text(client, p, 12), PROMPTS))
    assert together == alone


def test_a_client_that_goes_away_frees_its_sequence(server: _Server, llm: Llama) -> None:
    cancelled_before = _metric(server, 'pyllm_requests_finished_total{reason="cancelled"}')
    no_end = {str(t): -100 for t in llm.tokenizer.eog_ids}  # so that only the client can end it
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 500, "temperature": 0, "stream": True,
            "logit_bias": no_end}
    with httpx.stream("POST", server.url + "/v1/completions", json=body,
                      headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # generating
    deadline = time.monotonic() + 30
    while _metric(server, 'pyllm_requests_finished_total{reason="cancelled"}') <= cancelled_before:
        assert time.monotonic() < deadline, "the abandoned request kept its sequence"
        time.sleep(0.1)
    assert _metric(server, "pyllm_sequences_active") == 0


def test_a_shared_prompt_prefix_is_reused(client: openai.OpenAI) -> None:
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly and politely." for i in range(50))
    first = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=2, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "What is two plus two?"}])
    second = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=2, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}])
    assert first.usage.prompt_tokens > 400
    assert second.usage.prompt_tokens_details.cached_tokens >= 390


def test_a_full_queue_answers_503(smollm2_path) -> None:
    """One slot, no queue: a request is served while the slot is free and refused with a JSON 503 while a
    stream holds it."""
    llm = Llama(str(smollm2_path), n_ctx=64, n_threads=1, max_queued=0)
    s = _Server(llm, None)
    try:
        body = {"prompt": "hi", "max_tokens": 2}
        assert httpx.post(s.url + "/v1/completions", json=body, timeout=30).status_code == 200
        streaming = {"prompt": "hi", "max_tokens": 60, "stream": True,
                     "logit_bias": {str(t): -100 for t in llm.tokenizer.eog_ids}}
        with httpx.stream("POST", s.url + "/v1/completions", json=streaming, timeout=30) as stream:
            lines = stream.iter_lines()  # kept: a dropped iterator closes the stream, which frees the slot
            next(lines)                  # the stream holds the slot now
            response = httpx.post(s.url + "/v1/completions", json=body, timeout=30)
        assert response.status_code == 503 and response.json()["error"]["code"] == "server_busy"
    finally:
        s.stop()
        llm.close()


def test_text_that_is_not_unicode_and_oversized_bodies_are_refused(server: _Server) -> None:
    response = _post(server, "/tokenize", None, raw=b'{"content": "x\\ud800"}')
    assert response.status_code == 400 and response.json()["error"]["param"] == "content"
    chat = {"messages": [{"role": "user", "content": "\ud800"}]}
    response = _post(server, "/v1/chat/completions", chat)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages[0].content"
    big = json.dumps({"prompt": "x" * (9 << 20)}).encode()  # over the 8 MiB default
    response = _post(server, "/v1/completions", None, raw=big)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: the limit holds on the bytes that arrive
        for _ in range(10):
            yield b"x" * (1 << 20)
    response = httpx.post(server.url + "/tokenize", content=chunks(), timeout=60,
                          headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 413
    assert _post(server, "/tokenize", {"content": "still here"}).status_code == 200


def test_health_answers_fast_while_a_big_request_is_tokenized(server: _Server) -> None:
    """Tokenizing runs off the event loop: /health answers within 100 ms while 2 MB of text is tokenized."""
    import random

    rng = random.Random(5)
    text = "".join(rng.choice("abcdefghij klmnop,.\n") for _ in range(2 << 20))
    result: dict[str, object] = {}
    worker = threading.Thread(target=lambda: result.update(r=_post(server, "/tokenize", {"content": text})))
    worker.start()
    latencies = []
    time.sleep(0.3)  # the body is in: tokenizing now
    while worker.is_alive() and len(latencies) < 40:
        start = time.perf_counter()
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        latencies.append(time.perf_counter() - start)
        time.sleep(0.05)
    worker.join()
    assert result["r"].status_code == 200 and len(latencies) >= 5, "the tokenization ended too soon to measure"
    assert sorted(latencies)[len(latencies) // 2] < 0.1 and max(latencies) < 1.0, latencies


@pytest.fixture(scope="module")
def open_server(llm: Llama):
    """The server without an API key: the Host and Origin checks apply."""
    s = _Server(llm, None)
    yield s
    s.stop()


@pytest.mark.parametrize(("headers", "status"), [
    ({}, 200),
    ({"Host": "localhost:1234"}, 200),
    ({"Host": "[::1]:8080"}, 200),
    ({"Host": "192.168.1.20"}, 200),
    ({"Host": "attacker.example:8080"}, 403),                 # DNS rebinding: a name that is not ours
    ({"Origin": "http://localhost:3000"}, 200),               # a page of a local app
    ({"Origin": "https://attacker.example"}, 403),            # a web page posting to 127.0.0.1
    ({"Origin": "http://203.0.113.7"}, 403),
])
def test_without_a_key_only_this_machine_is_answered(open_server: _Server, headers, status) -> None:
    response = httpx.post(open_server.url + "/v1/completions", content=b'{"prompt": "hi", "max_tokens": 1}',
                          headers={"Content-Type": "text/plain", **headers}, timeout=60)
    assert response.status_code == status, response.text
    if status == 403:
        assert response.json()["error"]["code"] in ("forbidden_host", "forbidden_origin")


def test_a_hostile_chat_template_fails_its_request_and_the_server_goes_on(llm: Llama, open_server: _Server) -> None:
    saved = llm.metadata.get("tokenizer.chat_template")
    llm.metadata["tokenizer.chat_template"] = "{% for i in range(10**5) %}{% for j in range(10**5) %}{% endfor %}" \
                                              "{% endfor %}"
    try:
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(httpx.post, open_server.url + "/v1/chat/completions", json=chat, timeout=60)
            time.sleep(0.5)
            other = httpx.post(open_server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                               timeout=60)
            assert other.status_code == 200  # served while the template spins
            response = pending.result()
        assert response.status_code == 400 and "did not finish rendering" in response.json()["error"]["message"]
    finally:
        llm.metadata["tokenizer.chat_template"] = saved


def test_an_engine_that_fails_fails_its_requests_and_health(smollm2_path, monkeypatch) -> None:
    """An error in the scheduler: the waiting request gets a JSON 503 naming it (never a hang), /health says 503,
    later requests get 503 at once."""
    llm = Llama(str(smollm2_path), n_ctx=64, n_threads=1)

    def broken_step() -> None:
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(llm.engine, "_step", broken_step)
    s = _Server(llm, None)
    try:
        response = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
        assert response.status_code == 503 and "scheduler bug" in response.json()["error"]["message"]
        health = httpx.get(s.url + "/health", timeout=10)
        assert health.status_code == 503 and "scheduler bug" in health.json()["error"]
        again = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
        assert again.status_code == 503 and again.json()["error"]["code"] == "engine_failed"
    finally:
        s.stop()
        llm.close()


def test_slow_clients_are_cut_off(smollm2_path, monkeypatch) -> None:
    """A client that trickles its headers is disconnected after the header timeout, one that trickles its body gets
    408; neither holds the server up for the others."""
    monkeypatch.setattr(server_module, "BODY_SECONDS", 1.0)
    llm = Llama(str(smollm2_path), n_ctx=64, n_threads=1)
    s = _Server(llm, None, header_seconds=1.0)
    try:
        slow_headers = socket.create_connection(("127.0.0.1", s.port))
        slow_headers.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        slow_body = socket.create_connection(("127.0.0.1", s.port))
        slow_body.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200
        start = time.monotonic()
        slow_headers.settimeout(10)
        assert slow_headers.recv(1024) == b""  # closed by the server
        assert 0.5 < time.monotonic() - start < 5
        slow_body.settimeout(10)
        assert b" 408 " in slow_body.recv(4096).split(b"\r\n")[0] + b" "
        slow_headers.close()
        slow_body.close()
    finally:
        s.stop()
        llm.close()


def test_the_cli_server_logs_requests_refuses_a_busy_port_and_stops_on_sigterm(smollm2_path, tmp_path) -> None:
    """`pyllm serve`: one log line per request; a second server on the same port is one error line before any
    banner; SIGTERM ends a running stream with an error event and the process within seconds, having written its
    prefix cache to --cache-dir."""
    import signal
    import subprocess
    import sys

    port = _free_port()
    command = [sys.executable, "-m", "pyllm.cli", "serve", str(smollm2_path), "--port", str(port), "-c", "256",
               "-t", "1", "--cache-dir", str(tmp_path / "prefixes")]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
        busy = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert busy.returncode == 1 and "pyllm serve:" not in busy.stderr
        assert busy.stderr.strip() == f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"
        assert httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
        body = {"prompt": "Once", "max_tokens": 200, "stream": True, "logit_bias": {"0": -100, "2": -100}}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: {")
            server.send_signal(signal.SIGTERM)
            rest = list(lines)
        assert any("shut down" in line for line in rest)
        server.wait(timeout=15)
    finally:
        server.kill()
        log = server.stderr.read()
    assert "POST /v1/completions 200 prompt=1 cached=0 generated=2 ttft=" in log
    assert f"cached prompt prefixes written to {tmp_path / 'prefixes'}" in log
    assert list((tmp_path / "prefixes").glob("*.pyllm-prefix"))


def test_logprobs_and_n_through_the_openai_client(quick_client: openai.OpenAI, quick_server: _Server) -> None:
    client, server = quick_client, quick_server
    messages = [{"role": "user", "content": "Name a colour."}]
    out = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=5, logprobs=True,
                                         top_logprobs=3)
    content = out.choices[0].logprobs.content
    assert content and len(content) == out.usage.completion_tokens
    assert "".join(e.token for e in content) == out.choices[0].message.content
    assert all(len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in content)
    assert bytes(content[0].bytes).decode() == content[0].token
    streamed = [e for c in client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=5,
                                                            logprobs=True, top_logprobs=3, stream=True)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]

    many = client.chat.completions.create(model=MODEL, messages=messages, temperature=1.0, max_tokens=6, n=2, seed=5)
    assert [c.index for c in many.choices] == [0, 1]
    again = client.chat.completions.create(model=MODEL, messages=messages, temperature=1.0, max_tokens=6, n=2, seed=5)
    assert [c.message.content for c in again.choices] == [c.message.content for c in many.choices]
    texts = {0: "", 1: ""}
    usage = None
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, temperature=1.0, max_tokens=6, n=2,
                                                seed=5, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert [texts[0], texts[1]] == [c.message.content for c in many.choices]
    assert usage is not None and usage.prompt_tokens == many.usage.prompt_tokens
    assert usage.completion_tokens == many.usage.completion_tokens

    response = _post(server, "/v1/completions", {"prompt": "Red, green and", "max_tokens": 4, "temperature": 0,
                                                  "logprobs": 2, "n": 2})
    body = response.json()
    assert response.status_code == 200, body
    assert [c["index"] for c in body["choices"]] == [0, 1] and body["choices"][0]["text"] == body["choices"][1]["text"]
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["text_offset"]) == len(lp["token_logprobs"]) == 4
    assert body["usage"]["completion_tokens"] == 8
