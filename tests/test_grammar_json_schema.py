"""JSON Schema -> GBNF: every text the grammar admits validates (random derivations of the grammar checked by
`jsonschema` with its format checker), valid instances in the grammar's layout are admitted and invalid ones
refused, integer/number ranges and regex patterns match what Python computes, and unsupported keywords are
refused by name."""

from __future__ import annotations

import json
import random
import re

import pytest
from jsonschema import Draft202012Validator
from jsonschema.validators import validator_for

from pyllm.grammar import JSON_OBJECT_GBNF, GrammarError, compile_gbnf, response_format_grammar, schema_to_gbnf
from pyllm.grammar.gbnf import CHAR, END, Grammar
from pyllm.grammar.json_schema import _int_range, _number_range

# The twenty schemas of the generation test (test_grammar_generation.py): small, every string bounded, so a
# small model finishes them in a few dozen tokens.
SCHEMAS: list[dict] = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]},
    {"type": "array", "items": {"type": "integer", "minimum": -50, "maximum": 50}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": "string", "maxLength": 15}},
     "required": ["ok"]},
    {"type": "object", "properties": {"version": {"const": 2}, "kind": {"const": "event"}},
     "required": ["version", "kind"]},
    {"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                      "at": {"type": "string", "format": "time"}}, "required": ["day", "at"]},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}, "required": ["when"]},
    {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}}, "required": ["id"]},
    {"type": "object", "properties": {"email": {"type": "string", "format": "email"}}, "required": ["email"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"}},
     "required": ["code"]},
    {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                          "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                         "required": ["x", "y"]}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
     "required": ["a", "b"]},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 999},
                                                          {"type": "null"}, {"type": "boolean"}]}},
     "required": ["value"]},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["a"]},
               {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}]},
    {"type": "array", "prefixItems": [{"type": "string", "maxLength": 10},
                                      {"type": "integer", "minimum": 0, "maximum": 100}, {"type": "boolean"}]},
    {"type": "array", "minItems": 1, "maxItems": 3,
     "items": {"type": "object", "properties": {"k": {"enum": ["a", "b", "c"]},
                                                "n": {"type": "integer", "minimum": 1, "maximum": 5}},
               "required": ["k", "n"]}},
    {"type": "object", "properties": {"v": {"type": ["string", "null"], "maxLength": 8}}, "required": ["v"]},
    {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "integer", "minimum": 0, "maximum": 9},
                                      "c": {"enum": [1, 2, 3]}}, "additionalProperties": False},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["score"]},
    {"type": "object", "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 8}},
     "required": ["word"]},
    {"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 5},
                                      "m": {"enum": ["x", 1, None, True, {"k": [1]}]}},
     "required": ["n", "m"]},
]

# Wider schemas for the derivation test only (a model would take long to fill them).
EXTRA_SCHEMAS: list[dict] = [
    {},
    {"type": "object"},
    {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
     "additionalProperties": {"type": "number", "minimum": -3, "maximum": 3}},
    {"type": "object", "properties": {"name": {"type": "string"}, "names": {"type": "string"}, "nam": {}},
     "additionalProperties": {"type": "boolean"}},
    {"type": "object", "additionalProperties": {"type": "integer"}, "required": ["must"]},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                                         "kids": {"type": "array", "maxItems": 2,
                                                                  "items": {"$ref": "#/$defs/node"}}},
                        "required": ["v"]}}, "$ref": "#/$defs/node"},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
     "items": [{"type": "integer"}, {"type": "string", "pattern": r"^\d+\.\d*$"}],
     "additionalItems": {"type": "null"}, "maxItems": 4},
    {"type": "string", "pattern": r"ab|c[^x]?\s"},
    {"type": "string", "pattern": r'^(?:[a-c"\\]{2}|\u00e9+|\.)$'},
    {"type": ["number", "boolean"], "minimum": -7, "maximum": 12},
    {"oneOf": [{"const": {"deep": [1, "two", None]}}, {"type": "string", "format": "date"}]},
    {"type": "object", "properties": {"a": {"type": "integer"}},
     "allOf": [{"$ref": "#/$defs/b"}, {"properties": {"a": {"minimum": 3, "maximum": 4}}}],
     "$defs": {"b": {"properties": {"b": {"type": "string", "maxLength": 2}}, "required": ["b"]}}},
    {"type": "integer", "minimum": 1234567, "maximum": 1240000},
    {"type": "integer", "exclusiveMaximum": -99},
    {"type": "string", "format": "unknown-format", "maxLength": 3},
]



def _validator(schema: dict):
    cls = validator_for(schema, default=Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _min_lengths(g: Grammar) -> list[int]:
    """The shortest text each rule can derive (in characters), for ending a random derivation."""
    inf = 10**9
    best = [inf] * len(g.alts)
    changed = True
    while changed:
        changed = False
        for r, starts in enumerate(g.alts):
            for a in starts:
                total, p = 0, a
                while g.kinds[p] != END:
                    total += 1 if g.kinds[p] == CHAR else best[g.args[p]]
                    p += 1
                if total < best[r]:
                    best[r], changed = total, True
    return best


def _random_char(g: Grammar, cls_id: int, rng: random.Random) -> str:
    ranges = g.classes[cls_id].ranges
    ascii_ranges = [(lo, min(hi, 0x7E)) for lo, hi in ranges if lo <= 0x7E]
    pool = ascii_ranges if ascii_ranges and rng.random() < 0.8 else list(ranges)
    while True:
        lo, hi = rng.choice(pool)
        cp = rng.randint(lo, hi)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def derive(g: Grammar, rng: random.Random, max_depth: int = 12) -> str:
    """A random text of the grammar's language: random alternatives, the shortest ones once deep."""
    shortest = _min_lengths(g)
    out: list[str] = []

    def alt_length(a: int) -> int:
        total, p = 0, a
        while g.kinds[p] != END:
            total += 1 if g.kinds[p] == CHAR else shortest[g.args[p]]
            p += 1
        return total

    def expand(rule: int, depth: int) -> None:
        starts = g.alts[rule]
        a = rng.choice(starts) if depth < max_depth else min(starts, key=alt_length)
        p = a
        while g.kinds[p] != END:
            if g.kinds[p] == CHAR:
                out.append(_random_char(g, g.args[p], rng))
            else:
                expand(g.args[p], depth + 1)
            p += 1

    expand(g.args[g._start_pos], 0)
    return "".join(out)


@pytest.mark.parametrize("schema", SCHEMAS + EXTRA_SCHEMAS, ids=lambda s: json.dumps(s)[:60])
def test_every_derivation_of_the_grammar_validates(schema: dict) -> None:
    g = compile_gbnf(schema_to_gbnf(schema))
    validator = _validator(schema)
    rng = random.Random(json.dumps(schema))
    for _ in range(60):
        text = derive(g, rng)
        assert g.fullmatch(text), text                             # the derivation is in the language
        instance = json.loads(text)
        errors = list(validator.iter_errors(instance))
        assert not errors, (text, errors[0].message)


@pytest.mark.parametrize("schema, good, bad", [
    (SCHEMAS[0], [{"name": "Ann", "age": 0}, {"name": "é😀", "age": 120}],
     [{"name": "Ann"}, {"age": 3, "name": "Ann"}, {"name": "Ann", "age": 121}, {"name": "x" * 21, "age": 1},
      {"name": "Ann", "age": 1, "x": 1}, {"name": "Ann", "age": 1.5}]),
    (SCHEMAS[2], [[1, -50], [0, 0, 50, 1]], [[1], [1, 2, 3, 4, 5], [51, 1], [1.0, 2]]),
    (SCHEMAS[5], [{"day": "2024-02-29", "at": "23:59:59.5+05:30"}, {"day": "2000-02-29", "at": "00:00:00Z"}],
     [{"day": "2023-02-29", "at": "12:00:00Z"}, {"day": "1900-02-29", "at": "12:00:00Z"},
      {"day": "2024-04-31", "at": "12:00:00Z"}, {"day": "2024-01-01", "at": "24:00:00Z"},
      {"day": "2024-01-01", "at": "12:00:00"}]),
    (SCHEMAS[9], [{"code": "ABC-12"}, {"code": "XYZ-1234"}], [{"code": "AB-12"}, {"code": "ABC-12345"}]),
    (SCHEMAS[16], [{}, {"a": True}, {"b": 3, "c": 2}, {"a": False, "b": 0, "c": 1}],
     [{"b": 3, "a": True}, {"d": 1}, {"c": 4}]),
    (SCHEMAS[17], [{"score": 0}, {"score": 0.25}, {"score": 1}, {"score": 1.0}],
     [{"score": -0.5}, {"score": 1.5}, {"score": 2}]),
    (SCHEMAS[19], [{"n": -4, "m": "x"}, {"n": 4, "m": None}], [{"n": 5, "m": 1}, {"n": 0, "m": False}]),
    (EXTRA_SCHEMAS[3], [{"name": "a", "namex": True, "x": False}], [{"x": True, "names": "b"}, {"name": 1}]),
])
def test_valid_instances_are_admitted_and_invalid_ones_refused(schema: dict, good: list, bad: list) -> None:
    g = compile_gbnf(schema_to_gbnf(schema))
    validator = _validator(schema)
    for instance in good:
        assert validator.is_valid(instance), instance
        assert g.fullmatch(json.dumps(instance, ensure_ascii=False)), instance
    for instance in bad:
        assert not g.fullmatch(json.dumps(instance, ensure_ascii=False)), instance


def test_enum_and_const_values_are_written_compactly_and_keys_never_repeat() -> None:
    g = compile_gbnf(schema_to_gbnf(SCHEMAS[19]))
    assert g.fullmatch('{"n": 0, "m": {"k":[1]}}') and not g.fullmatch('{"n": 0, "m": {"k": [1]}}')
    g = compile_gbnf(schema_to_gbnf(EXTRA_SCHEMAS[3]))
    assert g.fullmatch('{"name": "a", "names": "b", "nam": 1, "namesake": true}')
    assert not g.fullmatch('{"name": "a", "names": "b", "name": true}')   # json.loads would keep the last one


def test_additional_keys_are_never_a_declared_name() -> None:
    """Escapes cannot spell a declared name another way: the key alphabet has one spelling per character."""
    schema = {"type": "object", "properties": {'a"b': {"type": "integer"}, "é": {"type": "integer"}},
              "additionalProperties": {"type": "null"}}
    g = compile_gbnf(schema_to_gbnf(schema))
    assert g.fullmatch('{"a\\"b": 1, "é": 2, "x": null}')
    for text in ['{"a\\"b": 1, "a\\"b": null}', '{"\\u00e9": null}', '{"a\\u0022b": null}', '{"\\u0078": null}']:
        assert not g.fullmatch(text), text


def test_integer_ranges_hold_exactly_their_integers() -> None:
    for lo, hi in [(0, 0), (-5, 5), (3, 117), (-1234, -17), (None, 10), (-10, None), (95, 1005), (7, 7), (0, None),
                   (None, -3), (100, 199), (1, 9999)]:
        g = compile_gbnf("root ::= " + _int_range(lo, hi, "x") + "\n")
        for v in range(-1500, 1500):
            assert g.fullmatch(str(v)) == ((lo is None or v >= lo) and (hi is None or v <= hi)), (lo, hi, v)
        assert not g.fullmatch("012") and not g.fullmatch("+1") and not g.fullmatch("-0")


def test_number_ranges_hold_their_numbers() -> None:
    rng = random.Random(5)
    for lo, hi in [(0, 1), (-3, 2), (-5, -2), (None, 3), (2, None), (0, 0)]:
        g = compile_gbnf("root ::= " + _number_range(lo, hi, "x") + "\n")
        for _ in range(2000):
            v = round(rng.uniform(-7, 7), rng.randint(0, 3))
            text = str(int(v)) if rng.random() < 0.3 else repr(v)
            inside = (lo is None or float(text) >= lo) and (hi is None or float(text) <= hi)
            if g.fullmatch(text):
                assert inside, (lo, hi, text)
            elif not text.startswith("-0"):                        # "-0.0" spells 0 and may be left out
                assert not inside, (lo, hi, text)


@pytest.mark.parametrize("pattern", [r"^[A-Z]{2,3}-\d+$", r"ab|cd", r"^(a|b)*c?$", r"x{2}y{0,2}$", r"^\w+@\w+\.com$",
                                     r"^[^a-c]+$", r"^.\.$", r"^a(?:bc)+?d", r"\s\S", r"^$"])
def test_patterns_match_what_python_re_searches(pattern: str) -> None:
    g = compile_gbnf(schema_to_gbnf({"type": "string", "pattern": pattern}))
    rng = random.Random(pattern)
    alphabet = "abcdxyzAB-09@.com _"
    rx = re.compile(pattern)
    matched = 0
    for _ in range(1500):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7)))
        want = rx.search(s) is not None
        matched += want
        assert g.fullmatch(json.dumps(s)) == want, (pattern, s)
    for s in ["AB-12", "ab", "aabbc", "xxyy", "w@a.com", "ZZZ", "é.", "abcbcd", " q", "", 'a"\\']:
        want = rx.search(s) is not None
        matched += want
        assert g.fullmatch(json.dumps(s, ensure_ascii=False)) == want, (pattern, s)
    assert matched > 0                                             # not a pattern nothing matches


@pytest.mark.parametrize("schema, words", [
    ({"not": {"type": "string"}}, "not is not supported"),
    ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "integer", "multipleOf": 3}, "multipleOf"),
    ({"type": "number", "minimum": 0.5}, "not a whole number"),
    ({"type": "number", "exclusiveMinimum": 0}, "integers only"),
    ({"type": "string", "pattern": "(a)\\1"}, "backreferences"),
    ({"type": "string", "pattern": "(?=a)"}, "lookaround"),
    ({"type": "string", "pattern": "a$b"}, "'$' only at the end"),
    ({"type": "string", "pattern": "[a-"}, "missing ']'"),
    ({"$ref": "https://example.com/s.json"}, "only references inside the schema"),
    ({"$ref": "#/$defs/missing"}, "points to nothing"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "no integer lies in [5, 4]"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"], "additionalProperties": False},
     "required 'b' is not among the properties"),
    ({"type": "array", "prefixItems": [{}, {}], "maxItems": 1}, "conflict with the 2 prefixItems"),
    ({"type": "spaceship"}, "unknown type 'spaceship'"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "nothing in common"),
    (False, "admits nothing"),
])
def test_unsupported_keywords_are_refused_by_name(schema, words: str) -> None:
    with pytest.raises(GrammarError) as info:
        schema_to_gbnf(schema, param="response_format")
    assert words in str(info.value) and str(info.value).startswith("JSON schema: ")
    assert info.value.param == "response_format"


def test_json_object_mode_and_response_formats() -> None:
    g = compile_gbnf(JSON_OBJECT_GBNF)
    assert g.fullmatch('{"a": [1, {"b": "c"}], "d": null}') and not g.fullmatch("[1]") and not g.fullmatch('"x"')
    assert response_format_grammar({"type": "json_object"}) is g
    assert response_format_grammar(None) is None and response_format_grammar({"type": "text"}) is None
    narrowed = response_format_grammar({"type": "json_object", "schema": {"type": "object", "required": ["a"],
                                                                          "properties": {"a": {"const": 1}}}})
    assert narrowed.fullmatch('{"a": 1}') and not narrowed.fullmatch('{}')
    by_schema = response_format_grammar({"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMAS[1]}})
    assert by_schema.fullmatch('{"answer": "no"}') and not by_schema.fullmatch('{"answer": "maybe"}')
    for bad, words in [({"type": "xml"}, "type must be"), ({"type": "json_schema"}, '"schema"'), ("json", "object")]:
        with pytest.raises(ValueError, match=words) as info:
            response_format_grammar(bad)
        assert info.value.param == "response_format"


def test_the_gbnf_is_llama_cpp_shaped() -> None:
    text = schema_to_gbnf(SCHEMAS[0])
    rules = dict(line.split(" ::= ", 1) for line in text.strip().split("\n"))
    assert rules["root"] == '"{" space root-name-kv "," space root-age-kv "}" space'
    assert rules["root-name-kv"] == '"\\"name\\"" space ":" space root-name'
    assert rules["space"] == '| " " | "\\n"{1,2} [ \\t]{0,20}'
    assert all(re.fullmatch(r"[a-zA-Z0-9-]+", name) for name in rules)   # names llama.cpp's parser reads
