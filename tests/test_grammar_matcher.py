"""Token masks: the fast matcher (trie walk, transition table, canonical partial characters, mask cache)
held to the reference matcher (every token's bytes decoded by Python's codec and run through the grammar)
on random walks over SmolLM2's vocabulary and over a byte vocabulary; the trie itself; the sampler hook."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pyllm.gguf import GGUFFile
from pyllm.grammar import (
    JSON_VALUE_GBNF,
    GrammarError,
    GrammarMatcher,
    GrammarMatchError,
    ReferenceMatcher,
    VocabIndex,
    compile_gbnf,
    schema_to_gbnf,
)
from pyllm.grammar.gbnf import parse_gbnf
from pyllm.sampling import Sampler, SamplingError, SamplingParams
from pyllm.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(smollm2_path) -> Tokenizer:
    with GGUFFile(smollm2_path) as f:
        return Tokenizer.from_gguf(f)


@pytest.fixture(scope="module")
def vocab(tokenizer) -> VocabIndex:
    return VocabIndex.for_tokenizer(tokenizer)


def _ends_mid_character(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.reason == "unexpected end of data"
    return False


def _walk_and_compare(grammar_text: str, vocab: VocabIndex, steps: int, seed: int) -> int:
    """Advance a fast and a reference matcher by the same random allowed tokens, comparing every mask; tokens
    that end inside a character are picked half the time. Returns how many partial-character states were met."""
    rng = random.Random(seed)
    grammar = compile_gbnf(grammar_text)
    fast, ref = GrammarMatcher(grammar, vocab), ReferenceMatcher(grammar, vocab)
    partial_states = 0
    for _ in range(steps):
        allowed = fast.allowed_ids()
        np.testing.assert_array_equal(allowed, ref.allowed_ids())
        assert fast.can_end == ref.can_end
        choices = [int(t) for t in allowed if vocab.pieces[t] is not None]
        if not choices:
            break
        split = [t for t in choices if _ends_mid_character(vocab.pieces[t])]
        token = rng.choice(split if split and rng.random() < 0.5 else choices)
        fast.accept(token)
        ref.accept(token)
        partial_states += bool(ref.pending)
    return partial_states


# ---- the trie ---------------------------------------------------------------------------------------


def test_the_trie_holds_every_token_at_the_node_its_bytes_lead_to(vocab: VocabIndex) -> None:
    prefixes = {p[:k] for p in vocab.pieces if p is not None for k in range(1, len(p) + 1)}
    assert vocab.n_nodes == len(prefixes) + 1                     # the root and one node per distinct prefix
    rng = random.Random(0)
    for t in rng.sample([t for t, p in enumerate(vocab.pieces) if p is not None], 2000):
        node = 0
        for depth, b in enumerate(vocab.pieces[t], start=1):
            lo = int(vocab.first_child[node])
            kids = vocab.node_byte[lo:lo + int(vocab.n_child[node])]
            assert np.all(np.diff(kids) > 0)                      # children sorted by byte
            child = lo + int(np.searchsorted(kids, b))
            assert vocab.node_byte[child] == b and vocab.parent[child] == node
            assert vocab.level_start[depth] <= child < vocab.level_start[depth + 1]
            node = child
        assert vocab.token_node[t] == node
        assert t in vocab.tok_ids[vocab.tok_start[node]:vocab.tok_start[node + 1]]
    # special tokens are not in the trie, end-of-generation ones are kept apart
    assert all(vocab.pieces[t] is None for t in vocab.eog_ids)


# ---- fast masks against the reference --------------------------------------------------------------

WALK_GRAMMARS = {
    "json": JSON_VALUE_GBNF,
    "schema": schema_to_gbnf({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "id": {"type": "string", "format": "uuid"},
        "n": {"type": "integer", "minimum": -40, "maximum": 1200}, "code": {"type": "string",
                                                                         "pattern": "^[A-Z]{2}[0-9]+$"}},
        "required": ["name", "n"]}),
    "scripts": r'root ::= ([一-鿿]+ "。" | [α-ω]{2,4} " " | "😀"+ | [^\x00-\x7F]{1,3} "!")+ "."',
    "arith": 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"',
}


@pytest.mark.parametrize("name", list(WALK_GRAMMARS))
def test_fast_masks_equal_the_reference_on_random_walks(name: str, vocab: VocabIndex) -> None:
    partial = sum(_walk_and_compare(WALK_GRAMMARS[name], vocab, steps=7, seed=s) for s in range(2))
    if name == "scripts":
        assert partial > 0  # the walk went through characters split across tokens


BYTE_GRAMMARS = [
    # class bounds at odd places, near the UTF-8 length bounds and the surrogates
    r'root ::= ([\u0080-\u00ff\u07ff\u0800\ud7ff\ue000-\ue0ff\U00010000-\U0001ffff\U0010ffff] | "a")+ "."',
    r'root ::= ([^\x00-\u07ff] | [\u4e00-\u4e0f] "!" | "é")+ "."',
    r'root ::= ("é" [一-鿿] "😀" | [\U0001f600-\U0001f64f]{2} | .)+ "."',
    r'root ::= ([\ud800-\ue0ff] | [\U00100000-\U0010ffff] | "a")+ "."',   # surrogates are no characters
]


@pytest.mark.parametrize("grammar_text", BYTE_GRAMMARS)
def test_partial_characters_on_a_vocabulary_of_single_bytes(grammar_text: str) -> None:
    """With one token per byte every character is split, every partial state is met, and the masks are small
    enough to compare on long walks."""
    vocab = VocabIndex([bytes([b]) for b in range(256)] + [b""], eog_ids=[256])
    grammar = compile_gbnf(grammar_text)
    rng = random.Random(7)
    for _ in range(6):
        fast, ref = GrammarMatcher(grammar, vocab), ReferenceMatcher(grammar, vocab)
        for _ in range(60):
            allowed = fast.allowed_ids()
            np.testing.assert_array_equal(allowed, ref.allowed_ids())
            bytes_allowed = [int(t) for t in allowed if t < 256]
            if not bytes_allowed:                                  # only the end is left
                break
            token = rng.choice(bytes_allowed)
            fast.accept(token)
            ref.accept(token)


def test_a_table_that_starts_again_leaves_every_matcher_where_it_was() -> None:
    """Past MAX_STATES the automaton empties its table; matchers made before find their states by key."""
    vocab = VocabIndex([bytes([b]) for b in range(256)] + [b"", b"ab", "é".encode()], eog_ids=[256])
    grammar = parse_gbnf(BYTE_GRAMMARS[2])                          # its own automaton, not the shared one
    fast = [GrammarMatcher(grammar, vocab) for _ in range(3)]
    fast[0]._auto.MAX_STATES = 6
    refs = [ReferenceMatcher(grammar, vocab) for _ in range(3)]
    rng = random.Random(3)
    epochs = set()
    for _ in range(40):
        for f, r in zip(fast, refs, strict=True):
            allowed = f.allowed_ids()
            np.testing.assert_array_equal(allowed, r.allowed_ids())
            token = rng.choice([int(t) for t in allowed if vocab.pieces[t] is not None and t != ord(".")])
            f.accept(token)
            r.accept(token)
        epochs.add(fast[0]._auto.epoch)
    assert len(epochs) > 3


def test_a_string_interior_is_one_state_whatever_its_text(vocab: VocabIndex, tokenizer: Tokenizer) -> None:
    """Inside a JSON string the stack set does not change, and partial characters collapse to their segment:
    text of every script reaches a handful of states, so the masks come from the cache."""
    grammar = compile_gbnf(JSON_VALUE_GBNF)
    m = GrammarMatcher(grammar, vocab)
    m.accept_bytes(b'{"k": "')
    states = set()
    text = "plain words, 日本語のテキスト, émoji 😀🎉, Ελληνικά, العربية " * 3
    for token in tokenizer.encode(text, add_bos=False):
        m.accept(token)
        states.add(m.state_key)
    assert len(states) <= 8, len(states)
    entry = m._entry()
    assert m._entry() is entry                                     # a repeated state is a cache hit


def test_few_fitting_tokens_never_scan_the_vocabulary(vocab: VocabIndex) -> None:
    grammar = compile_gbnf('root ::= "{\\"name\\": \\"" [a-z]+ "\\"}"')
    m = GrammarMatcher(grammar, vocab)
    auto = m._auto
    before = auto.lookups
    ids = m.allowed_ids()
    visited = auto.lookups - before
    assert set(ids.tolist()) == {t for t, p in enumerate(vocab.pieces) if p and b'{"name": "'.startswith(p)}
    assert visited < vocab.n_nodes // 50, visited


# ---- the matcher's API ------------------------------------------------------------------------------


def test_yes_or_no_allows_exactly_the_prefixes_then_only_the_end(vocab: VocabIndex, tokenizer: Tokenizer) -> None:
    grammar = compile_gbnf('root ::= "yes" | "no"')
    m = GrammarMatcher(grammar, vocab)

    def prefixes(*words: bytes) -> set[int]:
        return {t for t, p in enumerate(vocab.pieces) if p and any(w.startswith(p) for w in words)}

    assert set(m.allowed_ids().tolist()) == prefixes(b"yes", b"no")
    assert not m.can_end and not m.is_complete
    y = tokenizer.encode("y", add_bos=False)
    assert len(y) == 1
    m.accept(y[0])
    assert set(m.allowed_ids().tolist()) == prefixes(b"es")
    copy = m.copy()
    with pytest.raises(GrammarMatchError):
        m.accept(tokenizer.encode("no", add_bos=False)[0])
    m.accept_bytes(b"es")
    assert m.can_end and m.is_complete
    assert set(m.allowed_ids().tolist()) == set(vocab.eog_ids.tolist())
    assert not copy.can_end                                        # the copy stayed where it was
    m.accept(int(vocab.eog_ids[0]))
    assert not m.allowed().any()


def test_mask_logits_leaves_allowed_logits_and_ends_only_when_the_grammar_can() -> None:
    vocab = VocabIndex([b"a", b"b", b"ab", b"", b"ba"], eog_ids=[3])
    m = GrammarMatcher(compile_gbnf('root ::= "a"+'), vocab)
    logits = np.arange(5, dtype=np.float32)
    x = logits.copy()
    m.mask_logits(x)
    np.testing.assert_array_equal(x, [0, -np.inf, -np.inf, -np.inf, -np.inf])
    m.accept(0)
    x = np.append(logits, 7).astype(np.float32)                    # a padded logits row: the padding is banned
    m.mask_logits(x)
    np.testing.assert_array_equal(x, [0, -np.inf, -np.inf, 3, -np.inf, -np.inf])
    dead = GrammarMatcher(compile_gbnf('root ::= "c"'), vocab)
    with pytest.raises(GrammarError, match="no token"):
        dead.mask_logits(logits.copy())


def test_the_sampler_draws_only_allowed_tokens_and_keeps_the_raw_logits() -> None:
    vocab = VocabIndex([b"a", b"b", b"ab", b"", b"ba", b"c"], eog_ids=[3])
    grammar = compile_gbnf('root ::= ("a" | "b")+ "c"')
    rng = np.random.default_rng(0)
    for seed in range(20):
        params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed, grammar=grammar)
        sampler, m = Sampler(params), GrammarMatcher(grammar, vocab)
        for _ in range(8):
            logits = rng.normal(size=6).astype(np.float32)
            logits[5] -= 3
            raw = logits.copy()
            kept = np.isfinite(sampler.process(logits, (), m))
            np.testing.assert_array_equal(kept, m.allowed())
            token = sampler.sample(logits, (), m)
            np.testing.assert_array_equal(logits, raw)             # logprobs still see the model's logits
            assert m.allowed()[token]
            if token == 3:
                break
            m.accept(token)
    greedy = Sampler(SamplingParams(temperature=0, grammar=grammar))
    logits = np.array([0, 0, 0, 9, 9, 1], dtype=np.float32)       # the EOG and "ba" are best, "ba" fits
    assert greedy.sample(logits, (), GrammarMatcher(grammar, vocab)) == 4


def test_a_bad_grammar_is_a_sampling_error_naming_grammar() -> None:
    with pytest.raises(SamplingError) as info:
        SamplingParams(grammar='root ::= "a"\nx ::= [b-')
    assert info.value.param == "grammar" and str(info.value) == "line 2, column 7: unterminated character class"
    with pytest.raises(SamplingError) as info:
        SamplingParams(grammar="root ::= undefined")
    assert info.value.param == "grammar" and "line 1, column 10: undefined rule 'undefined'" in str(info.value)
    with pytest.raises(TypeError) as info:
        SamplingParams(grammar=42)
    assert info.value.param == "grammar"
    assert SamplingParams(grammar='root ::= "x"').grammar is compile_gbnf('root ::= "x"')
