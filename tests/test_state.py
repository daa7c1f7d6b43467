"""Saved state: save_state/load_state and session files give a continuation identical to never saving
(the same tokens, bit-identical logits); a file from another model, truncated or damaged is refused with
a ParamError saying which."""

from __future__ import annotations

import dataclasses
import struct
import time

import numpy as np
import pytest

from pyllm.llama import Llama
from pyllm.params import ParamError
from pyllm.state import LlamaState

DOC = (b"The lighthouse keeper kept a log of every ship that passed the rocks. In spring the fishing boats came "
       b"north, in summer the ferries, and in autumn the storms kept everyone in the harbour. ") * 3
QUESTION = b" In one word, what did the keeper keep?"


@pytest.fixture(scope="module")
def llm(smollm2_path):
    model = Llama(str(smollm2_path), n_ctx=512, n_threads=1, prefill_chunk=64)
    yield model
    model.close()


@pytest.fixture(scope="module")
def doc_state(llm: Llama) -> tuple[list[int], list[int], LlamaState, dict]:
    """(the document's tokens, the question's, the state after reading the document, the answer never saved)."""
    doc, question = llm.tokenize(DOC), llm.tokenize(QUESTION, add_bos=False)
    llm.reset()
    want = llm.create_completion(doc + question, max_tokens=8, temperature=0, logprobs=2)
    llm.reset()
    llm.create_completion(doc, max_tokens=1, temperature=0)  # the document, read once
    return doc, question, llm.save_state(), want


def _continue(llm: Llama, doc: list[int], question: list[int]) -> dict:
    out = llm.create_completion(doc + question, max_tokens=8, temperature=0, logprobs=2)
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == len(doc)  # the document was not read again
    return out


def test_a_loaded_state_continues_as_never_saving(llm: Llama, doc_state) -> None:
    doc, question, state, want = doc_state
    assert state.tokens == doc and state.n_tokens == len(doc) and state.model == llm.model_identity()
    llm.reset()
    llm.load_state(state)
    got = _continue(llm, doc, question)
    assert got["choices"] == want["choices"]  # the same tokens, the same logprobs to the bit


def test_logits_after_a_loaded_state_are_bit_identical(llm: Llama, doc_state) -> None:
    doc, question, state, _ = doc_state
    model = llm.model
    cache = model.new_cache(llm.n_ctx(), llm.prefill_chunk)
    LlamaState.from_bytes(state.to_bytes()).into_cache(cache)
    after = model.prefill(question, cache, logits="all")
    fresh = model.prefill(doc + question, model.new_cache(llm.n_ctx(), llm.prefill_chunk), logits="all")
    np.testing.assert_array_equal(after, fresh[len(doc):])


def test_a_session_file_survives_a_restart(llm: Llama, doc_state, tmp_path, smollm2_path) -> None:
    doc, question, state, want = doc_state
    llm.reset()
    llm.load_state(state)
    llm.create_completion(doc, max_tokens=1, temperature=0)  # the context is the document again
    path = tmp_path / "doc.pyllm"
    llm.save_session(path)
    # another Llama (a restarted program), with another context size: the state is placed by position
    with Llama(str(smollm2_path), n_ctx=384, n_threads=1, prefill_chunk=32) as other:
        started = time.perf_counter()
        loaded = other.load_session(path)
        elapsed = time.perf_counter() - started
        assert loaded.tokens == doc
        assert _continue(other, doc, question)["choices"] == want["choices"]
    print(f"load_session of {len(doc)} tokens ({path.stat().st_size} bytes): {1e3 * elapsed:.1f} ms")
    assert elapsed < 1.0


def test_damaged_truncated_and_foreign_files_are_refused(llm: Llama, doc_state, tmp_path) -> None:
    _, _, state, _ = doc_state
    data = state.to_bytes()
    path = tmp_path / "s.pyllm"

    def refused(raw: bytes, message: str) -> None:
        path.write_bytes(raw)
        with pytest.raises(ParamError, match=message) as err:
            llm.load_session(path)
        assert err.value.param == "path"

    for cut in (0, 5, 12, 40, len(data) // 2, len(data) - 1):
        refused(data[:cut], "truncated|bad magic" if cut < 8 else "truncated")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x10
    refused(bytes(flipped), "damaged: its checksum")
    refused(data + b"x", "damaged")
    refused(b"GGUF" + data[4:], "not a pyllm session file")
    refused(data[:8] + struct.pack("<I", 99) + data[12:], "version 99")
    header = bytearray(data)
    header[20:24] = b"\xff\xfe\xfd\xfc"
    refused(bytes(header), "damaged")
    with pytest.raises(ParamError, match="cannot read"):
        llm.load_session(tmp_path / "missing.pyllm")
    # another model's state: refused by its identity, file or not
    foreign = dataclasses.replace(state, model="0" * 64)
    with pytest.raises(ParamError, match="another model file") as err:
        llm.load_state(foreign)
    assert err.value.param == "state"
    foreign.save(path)
    with pytest.raises(ParamError, match="another model file"):
        llm.load_session(path)
    with pytest.raises(TypeError, match="LlamaState"):
        llm.load_state({"tokens": []})


def test_a_state_must_fit_the_context(doc_state, smollm2_path) -> None:
    _, _, state, _ = doc_state
    with Llama(str(smollm2_path), n_ctx=64, n_threads=1) as small:
        with pytest.raises(ParamError, match="context holds 64"):
            small.load_state(state)
        with pytest.raises(ValueError, match="no context yet"):
            small.save_state()


def test_sliding_window_rings_are_saved_and_placed_again(gemma_path) -> None:
    """Gemma 3's sliding-window layers keep a ring: a prompt longer than the window wraps it, and the state goes
    into a ring of another size (another prefill_chunk)."""
    text = b" ".join(f"item {i}: {i * 7 % 13}.".encode() for i in range(80))
    with Llama(str(gemma_path), n_ctx=1024, n_threads=1, prefill_chunk=64) as llm:
        doc = llm.tokenize(text)
        assert 600 < len(doc) < 900, len(doc)
        question = llm.tokenize(b" The next item is", add_bos=False)
        want = llm.create_completion(doc + question, max_tokens=4, temperature=0, logprobs=1)
        llm.reset()
        llm.create_completion(doc, max_tokens=1, temperature=0)
        data = llm.save_state().to_bytes()
    with Llama(str(gemma_path), n_ctx=1024, n_threads=1, prefill_chunk=32) as other:
        other.load_state(LlamaState.from_bytes(data))
        got = other.create_completion(doc + question, max_tokens=4, temperature=0, logprobs=1)
        assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == len(doc)
        assert got["choices"] == want["choices"]


def test_the_prefix_cache_survives_a_restart(llm: Llama, doc_state, tmp_path, smollm2_path, gemma_path) -> None:
    """save_prefix_cache / load_prefix_cache (the server's --cache-dir): a restarted Llama reads the document's
    prefix from the folder, answers as never saving, and counts the document as cached; another model's file in
    the folder is skipped with its reason."""
    doc, question, state, want = doc_state
    llm.reset()
    llm.load_state(state)
    assert llm.save_prefix_cache(tmp_path) == 1
    with Llama(str(gemma_path), n_ctx=64, n_threads=1) as gemma:
        gemma.create_completion("Hello", max_tokens=1, temperature=0)
        gemma.save_prefix_cache(tmp_path / "gemma")
    (tmp_path / "gemma" / "0000.pyllm-prefix").rename(tmp_path / "0001.pyllm-prefix")
    with Llama(str(smollm2_path), n_ctx=512, n_threads=1, prefill_chunk=64) as other:
        loaded, refused = other.load_prefix_cache(tmp_path)
        assert loaded == 1 and len(refused) == 1 and "another model" in refused[0]
        got = other.create_completion(doc + question, max_tokens=8, temperature=0, logprobs=2)
        assert got["choices"] == want["choices"]
        assert got["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(doc) - 1
