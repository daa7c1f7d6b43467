"""Sentence embeddings against llama.cpp's (tests/data/llamacpp_embeddings.json, recorded by
bench/record_llamacpp_embeddings.py from llama-server on the same files), and through the HTTP server with the
official `openai` client."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import openai
import pytest
from test_server import API_KEY, _post, _Server

from pyllm import Llama
from pyllm.embeddings import Pooling, declared_pooling
from pyllm.params import ParamError

RECORDED = json.loads((Path(__file__).parent / "data" / "llamacpp_embeddings.json").read_text())


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def smollm2(smollm2_path) -> Llama:
    llm = Llama(str(smollm2_path), n_ctx=256, n_threads=2, embedding=True)
    yield llm
    llm.close()


@pytest.mark.parametrize("pooling", list(Pooling))
@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma3-270m"])
def test_embeddings_are_llamacpps(name: str, pooling: Pooling, smollm2_path, gemma_path) -> None:
    """Each text's vector against llama-server's, pooled the same way: cosine >= 0.9999 (in practice the
    difference is the pooling's float order), the same token count, unit length."""
    path = smollm2_path if name.startswith("smollm2") else gemma_path
    want = RECORDED["models"][name][pooling.value]
    with Llama(str(path), n_ctx=256, n_threads=2, pooling_type=pooling.value) as llm:
        got, count = llm.embed(RECORDED["texts"], return_count=True)
    assert count == want["prompt_tokens"]
    for text, vector, reference in zip(RECORDED["texts"], got, want["vectors"], strict=True):
        assert len(vector) == len(reference)
        assert cosine(vector, reference) >= 0.9999, text
        assert abs(np.linalg.norm(vector) - 1.0) < 1e-6


def test_embed_shapes_and_choices(smollm2: Llama) -> None:
    """One input gives one vector, a list a list; tokens embed as their text does; a batch is its items alone;
    normalize=False keeps the length; an input past n_ctx is cut (truncate) or refused; bad inputs name `input`."""
    text = "The capital of France is Paris."
    one = smollm2.embed(text)
    assert isinstance(one, list) and isinstance(one[0], float)
    assert smollm2.embed(smollm2.tokenize(text.encode())) == one
    both = smollm2.embed(["Hello world", text])
    assert both[1] == one and both[0] == smollm2.embed("Hello world")
    raw = np.asarray(smollm2.embed(text, normalize=False))
    assert np.linalg.norm(raw) > 1.5 and cosine(raw, one) > 0.999999
    long_text = "word " * 400
    assert len(smollm2.embed(long_text)) == len(one)
    with pytest.raises(ParamError, match="exceed the context"):
        smollm2.embed(long_text, truncate=False)
    for bad in ([], "", [""], 5, [1.5], [[1, 2], "x", None]):
        with pytest.raises(ParamError) as info:
            smollm2.embed(bad)
        assert info.value.param.startswith("input")
    with pytest.raises(ParamError, match="pooling_type"):
        Llama(smollm2.model_path, pooling_type="max", vocab_only=True)
    response = smollm2.create_embedding(["a", "b"])
    assert [d["index"] for d in response["data"]] == [0, 1] and response["object"] == "list"
    assert response["usage"]["prompt_tokens"] == len(smollm2.tokenize(b"a")) + len(smollm2.tokenize(b"b"))


def test_declared_pooling_is_the_files() -> None:
    assert declared_pooling({"general.architecture": "bert", "bert.pooling_type": 2}) == Pooling.CLS
    assert declared_pooling({"general.architecture": "qwen2", "qwen2.pooling_type": 3}) == Pooling.LAST
    assert declared_pooling({"general.architecture": "llama"}) == Pooling.MEAN  # a generative model's file
    assert declared_pooling({"general.architecture": "llama", "llama.pooling_type": 0}) == Pooling.MEAN


def test_embeddings_over_http(smollm2: Llama) -> None:
    """POST /v1/embeddings through the openai client: the Python API's vectors, base64 too; 400s name the field."""
    server = _Server(smollm2, API_KEY)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
        texts = ["Hello world", "The capital of France is Paris."]
        response = client.embeddings.create(model="default", input=texts)
        assert [item.embedding for item in response.data] == smollm2.embed(texts)
        assert response.usage.prompt_tokens == sum(len(smollm2.tokenize(t.encode())) for t in texts)
        encoded = _post(server, "/v1/embeddings", {"input": texts[1], "encoding_format": "base64"}).json()
        decoded = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), "<f4")
        np.testing.assert_array_equal(decoded, np.asarray(smollm2.embed(texts[1]), np.float32))
        for body, param in (({"input": "x", "dimensions": 8}, "dimensions"), ({"input": []}, "input"),
                            ({"input": "x", "encoding_format": "int8"}, "encoding_format"), ({}, "input"),
                            ({"input": [1, 10**9]}, "input")):
            reply = _post(server, "/v1/embeddings", body)
            assert reply.status_code == 400, body
            assert (reply.json()["error"]["param"] or "").startswith(param), (body, reply.json())
    finally:
        server.stop()


def test_embeddings_share_the_engines_steps_with_generations(smollm2_path) -> None:
    """Inputs embedded while a generation runs are read in the engine's steps, beside it and each other (two
    slots, a 16-token prefill chunk: several steps each): every vector is the bits of that input's hidden states
    computed alone, and the generation's tokens are those it gets alone."""
    import threading

    from pyllm.embeddings import pool
    from pyllm.serve.engine import Request

    texts = ["The cat sat on the mat and looked at the birds outside.", "Quantized matrix multiplication",
             "A third sentence, long enough to take a few chunks of sixteen tokens when it is read."]
    llm = Llama(str(smollm2_path), n_ctx=256, n_threads=2, n_parallel=2, prefill_chunk=16)
    assert llm.model is not None
    alone = [pool(llm.model.hidden_states(llm.tokenize(t.encode()), llm.model.new_cache(256, 16)), llm.pooling,
                  True) for t in texts]
    want = llm.create_completion("Once upon a time", max_tokens=24, temperature=0)["choices"][0]["text"]
    seen: list[Request] = []
    submit = llm.engine.submit_embedding
    llm.engine.submit_embedding = lambda tokens: seen.append(submit(tokens)) or seen[-1]  # type: ignore[method-assign]
    generated: list[str] = []
    worker = threading.Thread(target=lambda: generated.append(
        llm.create_completion("Once upon a time", max_tokens=24, temperature=0)["choices"][0]["text"]))
    worker.start()
    vectors = llm.embed(texts)
    worker.join()
    assert len(seen) == 3 and all(r.finish_reason == "stop" for r in seen)
    for got, ref in zip(vectors, alone, strict=True):
        np.testing.assert_array_equal(np.asarray(got, np.float32).view(np.uint32),
                                      ref.astype(np.float32).view(np.uint32))
    assert generated == [want]
    llm.close()
