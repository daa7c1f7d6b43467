"""Constrained generation on SmolLM2: sampled JSON parses and validates against its schema (jsonschema, formats
checked) for twenty schemas over several seeds at temperature 0.8; a yes/no grammar answers yes or no; a
constrained sequence's tokens do not depend on the batch around it or on the thread count."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from jsonschema import Draft202012Validator
from test_grammar_json_schema import SCHEMAS

from pyllm import Llama, LlamaGrammar
from pyllm.grammar import compile_gbnf, schema_to_gbnf
from pyllm.params import ParamError
from pyllm.sampling import SamplingParams
from pyllm.serve.engine import Engine

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def llm(smollm2_path) -> Llama:
    # one thread: these tests are about the grammar, and on a shared two-core machine two threads that wait for
    # each other at every barrier run many times slower; the last test checks a second thread changes nothing
    return Llama(str(smollm2_path), n_ctx=768, n_threads=1, n_parallel=4)


def _messages(schema: dict) -> list[dict]:
    return [{"role": "system", "content": "You reply with JSON only."},
            {"role": "user", "content": f"Give an example JSON value for this JSON schema: {json.dumps(schema)}"}]


def test_schema_outputs_parse_and_validate_at_temperature_08(llm: Llama) -> None:
    assert len(SCHEMAS) == 20
    jobs = [(i, seed) for i in range(len(SCHEMAS)) for seed in SEEDS]

    def ask(job: tuple[int, int]) -> dict:
        i, seed = job
        return llm.create_chat_completion(_messages(SCHEMAS[i]), temperature=0.8, seed=seed, max_tokens=160,
                                          response_format={"type": "json_schema",
                                                           "json_schema": {"schema": SCHEMAS[i]}})

    with ThreadPoolExecutor(llm.n_parallel) as pool:               # four at a time: the engine batches them
        results = list(pool.map(ask, jobs))
    for (i, seed), result in zip(jobs, results, strict=True):
        choice = result["choices"][0]
        text = choice["message"]["content"]
        assert choice["finish_reason"] == "stop", (i, seed, text)    # finished, not cut at max_tokens
        instance = json.loads(text)
        validator = Draft202012Validator(SCHEMAS[i], format_checker=Draft202012Validator.FORMAT_CHECKER)
        errors = [e.message for e in validator.iter_errors(instance)]
        assert not errors, (i, seed, text, errors)


def test_json_object_mode_gives_an_object(llm: Llama) -> None:
    result = llm.create_chat_completion([{"role": "user", "content": "Describe a cat in JSON."}], temperature=0.8,
                                        seed=3, max_tokens=48, response_format={"type": "json_object"})
    text = result["choices"][0]["message"]["content"]
    assert text.lstrip().startswith("{")
    if result["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict)


def test_a_yes_no_grammar_answers_yes_or_no(llm: Llama) -> None:
    answers = set()
    for seed in range(6):
        result = llm.create_completion("Q: Is the sea salty? Answer yes or no.\nA: ", grammar='root ::= "yes" | "no"',
                                       temperature=0.8, seed=seed, max_tokens=8)
        choice = result["choices"][0]
        assert choice["text"] in ("yes", "no") and choice["finish_reason"] == "stop", choice
        assert result["usage"]["completion_tokens"] <= 3
        answers.add(choice["text"])
    chat = llm.create_chat_completion([{"role": "user", "content": "Is fire cold?"}], grammar='root ::= "yes" | "no"',
                                      temperature=0.8, seed=1)
    assert chat["choices"][0]["message"]["content"] in ("yes", "no")


def test_llama_grammar_objects_streams_and_errors(llm: Llama, tmp_path) -> None:
    grammar = LlamaGrammar.from_json_schema(json.dumps(SCHEMAS[1]))
    result = llm.create_completion("The answer, as JSON:", grammar=grammar, temperature=0.8, seed=4, max_tokens=40)
    assert json.loads(result["choices"][0]["text"])["answer"] in ("yes", "no")
    path = tmp_path / "digit.gbnf"
    path.write_text('root ::= "a" [0-9] # a letter and a digit\n')
    chunks = list(llm.create_completion("Pick:", grammar=LlamaGrammar.from_file(path), stream=True, max_tokens=9,
                                        temperature=0.8, seed=2))
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert re.fullmatch("a[0-9]", text) and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    messages = [{"role": "user", "content": "Hi"}]
    for call, param in [(lambda: llm.create_completion("x", grammar="root ::= nope"), "grammar"),
                        (lambda: llm.create_completion("x", grammar=b"root"), "grammar"),
                        (lambda: llm.create_chat_completion(messages, grammar='root ::= "a"',
                                                            response_format={"type": "json_object"}), "grammar"),
                        (lambda: llm.create_chat_completion(messages, response_format={
                            "type": "json_schema", "json_schema": {"schema": {"not": {}}}}), "response_format")]:
        with pytest.raises(ParamError) as info:
            call()
        assert info.value.param == param, str(info.value)


def test_a_constrained_sequence_is_the_same_alone_in_a_batch_and_on_two_threads(llm: Llama, smollm2_path) -> None:
    tok = llm.tokenizer
    grammar = compile_gbnf(schema_to_gbnf(SCHEMAS[14]))
    params = SamplingParams(temperature=0.8, seed=11, grammar=grammar)
    prompt = llm.tokenize_chat(_messages(SCHEMAS[14]))

    def run(engine: Engine, prompt: list[int], params: SamplingParams, n: int = 80) -> list[int]:
        return [step.token for step in engine.submit(prompt, params, n)]

    alone_engine = Engine(llm.model, tok, n_ctx=768, n_parallel=1, cache_bytes=0)
    alone = run(alone_engine, prompt, params)
    alone_engine.close()
    assert json.loads(tok.decode(alone))                             # a whole answer, not a stub

    # three slots, prompts read 5 rows a step: the constrained sequence shares its steps with a prompt being
    # read, another constrained sequence and a free one, at different points of theirs
    engine = Engine(llm.model, tok, n_ctx=768, n_parallel=3, prefill_chunk=5, cache_bytes=0)
    others = [(llm.tokenize_chat(_messages(SCHEMAS[3])), SamplingParams(temperature=0.8, seed=2,
                                                                       grammar=compile_gbnf(schema_to_gbnf(SCHEMAS[3])))),
              (tok.encode("Once upon a time", add_bos=True), SamplingParams(temperature=0.8, seed=5))]
    results: dict[str, list[int]] = {}
    threads = [threading.Thread(target=lambda k=k, p=p, s=s: results.__setitem__(k, run(engine, p, s)))
               for k, (p, s) in enumerate(others)]
    for t in threads:
        t.start()
    results["mine"] = run(engine, prompt, params)
    for t in threads:
        t.join()
    engine.close()
    assert results["mine"] == alone

    two_threads = Llama(str(smollm2_path), n_ctx=768, n_threads=2)
    try:
        assert run(two_threads.engine, prompt, params, 16) == alone[:16]   # a prefix: two threads run slowly here
    finally:
        two_threads.close()
