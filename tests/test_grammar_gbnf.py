"""The GBNF parser and the pushdown grammar: the errors and where they point, and the language a grammar
matches against Python's `re` on random regular grammars (an independent matcher of the same strings)."""

from __future__ import annotations

import random
import re

import pytest

from pyllm.grammar import GrammarError, compile_gbnf
from pyllm.grammar.gbnf import CharClass, parse_gbnf
from pyllm.params import ParamError

JSON_GBNF = r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
'''


def test_a_multi_line_json_grammar_matches_json_and_nothing_else() -> None:
    g = parse_gbnf(JSON_GBNF)
    for text in ['{}', '{"a": 1}', '{"a": [1, -2.5e3, {"b": null}], "c": "x\\n\\u00e9"}', '{"k": true}\n']:
        assert g.fullmatch(text), text
    for text in ['', '[1]', '{"a" 1}', '{"a": 01x}', '{"a": "\\q"}', '{"a": 1}}', '{"a": "\x01"}']:
        assert not g.fullmatch(text), text


@pytest.mark.parametrize("text, line, column, words", [
    ('root ::= foo', 1, 10, "undefined rule 'foo'"),
    ('root ::= "a"\nx ::= "b" | y', 2, 13, "undefined rule 'y'"),
    ('root ::= "abc', 1, 10, "unterminated string"),
    ('root ::= [a-', 1, 10, "unterminated character class"),
    ('root ::= [z-a]', 1, 13, "reversed"),
    ('root "a"', 1, 6, "expected '::='"),
    ('root ::= "a" )', 1, 14, "expected a newline"),
    ('root ::= ("a"', 1, 10, "')'"),
    ('root ::= "\\q"', 1, 11, "unknown escape"),
    ('root ::= "\\x4"', 1, 11, "2 hex digits"),
    ('root ::= "a"{3,1}', 1, 18, "below the minimum"),
    ('root ::= "a"{x}', 1, 14, "expected an integer"),
    ('root ::= * "a"', 1, 10, "nothing before it"),
    ('root ::= "a"\nroot ::= "b"', 2, 1, "defined twice"),
    ('root ::= "a"\n\n  b ::= c ::= "d"', 3, 9, "must start on a new line"),
    ('root ::= x "a"\nx ::= "" root', 1, 1, "left-recursive"),
    ('root ::= "a" | expr\nexpr ::= expr "+" "1" | "1"', 2, 1, "'expr' is left-recursive"),
    ('root ::= ("")* "a"', 1, 1, "left-recursive"),
    ('root ::= <[1234]>', 1, 10, "token references"),
    ('root ::= "a"{20000}', 1, 14, "over the limit"),
])
def test_a_bad_grammar_is_one_line_that_says_where(text: str, line: int, column: int, words: str) -> None:
    with pytest.raises(GrammarError) as info:
        parse_gbnf(text)
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert words in str(err)
    assert str(err).startswith(f"line {line}, column {column}: ")
    assert "\n" not in str(err)
    assert isinstance(err, ParamError) and err.param == "grammar"


def test_a_grammar_without_root_and_a_huge_one_are_refused() -> None:
    with pytest.raises(GrammarError, match="no 'root' rule"):
        parse_gbnf('answer ::= "yes"')
    with pytest.raises(GrammarError, match="too large"):
        parse_gbnf('root ::= "abcdefghij"{5000}{5000}')
    with pytest.raises(GrammarError, match="too ambiguous"):   # every split of the a's is a parse
        parse_gbnf('root ::= (("a"{0,100}){0,100}){0,100}')


def test_escapes_classes_and_repetitions_mean_what_llama_cpp_says() -> None:
    g = parse_gbnf(r'root ::= "\x41\u00e9\U0001F600\t\"\\" [\]\-a] [^a-z] . "x"{2} "y"{1,} "z"{0,2} "ab"*')
    assert g.fullmatch('Aé😀\t"\\]Q\nxxyzz')
    assert g.fullmatch('Aé😀\t"\\-!éxxyyyzabab')      # "ab"* repeats the whole literal
    assert g.fullmatch('Aé😀\t"\\aQ\nxxyzz')
    assert not g.fullmatch('Aé😀\t"\\bQ\nxxyzz')       # b is not in [\]\-a]
    assert not g.fullmatch('Aé😀\t"\\]q\nxxyzz')       # 'q' is in a-z
    assert not g.fullmatch('Aé😀\t"\\]Q\nxxyzzz')      # at most two z
    assert not g.fullmatch('Aé😀\t"\\]Q\nxxzz')        # at least one y
    assert not g.fullmatch('Aé😀\t"\\]Q\nxxyzaba')     # "ab"* never ends inside "ab"


def test_comments_newlines_in_groups_and_continuation_bars() -> None:
    g = parse_gbnf('# a comment\nroot ::= (\n  "a" # first\n  | "b"\n) tail\n\ntail ::= "!"\n  | "?"  # or\n')
    assert [t for t in ("a!", "b?", "a?", "c!", "a") if g.fullmatch(t)] == ["a!", "b?", "a?"]


def test_char_class_membership_and_intersection() -> None:
    c = CharClass.of([(ord("a"), ord("f")), (ord("c"), ord("k")), (0x4E00, 0x9FFF)], negated=False)
    assert c.ranges == ((0x61, 0x6B), (0x4E00, 0x9FFF))
    assert "k" and ord("k") in c and ord("l") not in c and 0x4E00 in c and 0xA000 not in c
    assert c.intersects(0x6C, 0x4E00) and not c.intersects(0x6C, 0x4DFF) and c.intersects(0, 0x61)
    neg = CharClass.of([(0, 0x60), (0x6C, 0x10FFFF)], negated=True)
    assert neg.ranges == ((0x61, 0x6B),)


def test_compiled_grammars_are_shared_by_text() -> None:
    assert compile_gbnf('root ::= "x"') is compile_gbnf('root ::= "x"')


# ---- random regular grammars against Python's re ---------------------------------------------------

ALPHABET = "abcé"


def _random_regular(rng: random.Random, depth: int = 0) -> tuple[str, str, bool]:
    """A random regular expression as (GBNF, Python regex, whether it matches the empty string). An unbounded
    repetition of something that can be empty is left out: GBNF refuses it as left recursion."""
    kind = rng.choice(["lit", "class", "nclass", "any"] if depth > 2 else
                      ["lit", "class", "seq", "seq", "alt", "rep", "rep", "nclass"])
    if kind == "lit":
        s = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 2)))
        return '"' + s + '"', "(?:" + re.escape(s) + ")", False
    if kind in ("class", "nclass"):
        chars = sorted(set(rng.choice(ALPHABET) for _ in range(rng.randint(1, 3))))
        neg = "^" if kind == "nclass" else ""
        return f"[{neg}{''.join(chars)}]", f"[{neg}{''.join(chars)}]", False
    if kind == "any":
        return ".", "(?s:.)", False
    if kind == "seq":
        parts = [_random_regular(rng, depth + 1) for _ in range(rng.randint(2, 3))]
        return " ".join(p[0] for p in parts), "".join(p[1] for p in parts), all(p[2] for p in parts)
    if kind == "alt":
        parts = [_random_regular(rng, depth + 1) for _ in range(rng.randint(2, 3))]
        return ("(" + " | ".join(p[0] for p in parts) + ")", "(?:" + "|".join(p[1] for p in parts) + ")",
                any(p[2] for p in parts))
    inner_g, inner_r, empty = _random_regular(rng, depth + 1)
    op = rng.choice(["*", "+", "?", "{2}", "{1,3}", "{0,2}", "{2,}"])
    if empty and op in ("*", "+", "{2,}"):
        op = "{0,2}"
    return f"({inner_g}){op}", f"(?:{inner_r}){op}", empty or op in ("*", "?", "{0,2}")


def test_random_regular_grammars_match_what_python_re_matches() -> None:
    rng = random.Random(1234)
    checked = 0
    for _ in range(150):
        gbnf, regex, _ = _random_regular(rng)
        g = parse_gbnf(f"root ::= {gbnf}\n")
        pattern = re.compile(regex)
        strings = {"".join(rng.choice(ALPHABET + "x") for _ in range(rng.randint(0, 6))) for _ in range(60)}
        # and strings that match, from Python's side: a few random members are likely among short ones
        for s in strings:
            assert g.fullmatch(s) == bool(pattern.fullmatch(s)), (gbnf, regex, s)
            checked += 1
    assert checked > 5000
