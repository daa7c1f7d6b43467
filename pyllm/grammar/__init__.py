"""Constrained decoding: GBNF grammars and JSON schemas turned into token masks for the sampler.

    from pyllm import Llama
    from pyllm.grammar import LlamaGrammar
    llm.create_completion(prompt, grammar='root ::= "yes" | "no"')
    llm.create_completion(prompt, grammar=LlamaGrammar.from_json_schema('{"type": "array", "maxItems": 3}'))
    llm.create_chat_completion(messages, response_format={"type": "json_object"})

Layers: gbnf.py parses llama.cpp's grammar notation into a `Grammar` (rules and their pushdown-stack
meaning); json_schema.py writes GBNF for a JSON schema; matcher.py finds the tokens a grammar allows
next (a vocabulary trie walked beside a byte transition table, masks cached per state). The sampler
sets the other tokens' logits to -inf before its chain; the engine advances each sequence's matcher
by the token it draws and ends the sequence when the grammar is complete.

Compiled grammars are cached by their text (`compile_gbnf`), so the requests that share a grammar (the
same schema sent again) share its states, transitions and masks.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from typing import Any

from ..params import ParamError, ParamTypeError
from .gbnf import Grammar, GrammarError, parse_gbnf
from .json_schema import JSON_OBJECT_GBNF, JSON_VALUE_GBNF, schema_to_gbnf
from .matcher import GrammarMatcher, GrammarMatchError, ReferenceMatcher, VocabIndex

__all__ = ["Grammar", "GrammarError", "GrammarMatchError", "GrammarMatcher", "JSON_OBJECT_GBNF", "JSON_VALUE_GBNF",
           "LlamaGrammar", "ReferenceMatcher", "VocabIndex", "as_grammar", "compile_gbnf",
           "response_format_grammar", "schema_to_gbnf"]


@functools.lru_cache(maxsize=16)
def _compile(text: str) -> Grammar:
    return parse_gbnf(text)


def compile_gbnf(text: str, param: str = "grammar") -> Grammar:
    """The compiled grammar of GBNF `text`, shared with earlier calls that gave the same text."""
    try:
        return _compile(text)
    except GrammarError as exc:
        if exc.param == param:
            raise
        raise GrammarError(str(exc), param) from None


class LlamaGrammar:
    """A grammar as llama-cpp-python's `LlamaGrammar` makes them: from GBNF text, a file, or a JSON schema."""

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar

    @property
    def _grammar(self) -> str:  # llama-cpp-python keeps the GBNF text here
        return self.grammar.text

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        return cls(compile_gbnf(grammar))

    @classmethod
    def from_file(cls, file: str | os.PathLike[str], verbose: bool = True) -> LlamaGrammar:
        with open(file, encoding="utf-8") as f:
            return cls.from_string(f.read(), verbose)

    @classmethod
    def from_json_schema(cls, json_schema: str | Mapping[str, Any] | bool, verbose: bool = True) -> LlamaGrammar:
        """From a JSON schema (JSON text, as llama-cpp-python takes it, or the parsed schema)."""
        return cls(compile_gbnf(schema_to_gbnf(json_schema)))

    def __repr__(self) -> str:
        return f"LlamaGrammar({self.grammar!r})"


def as_grammar(value: Any, param: str = "grammar") -> Grammar | None:
    """`grammar=`: None, GBNF text, a LlamaGrammar or a compiled Grammar -> the compiled Grammar."""
    if value is None or isinstance(value, Grammar):
        return value
    if isinstance(value, LlamaGrammar):
        return value.grammar
    if isinstance(value, str):
        return compile_gbnf(value, param)
    raise ParamTypeError(f"{param} must be GBNF text or a LlamaGrammar, not {type(value).__name__}", param)


def response_format_grammar(value: Any, param: str = "response_format") -> Grammar | None:
    """The grammar of an OpenAI-style `response_format`: {"type": "text"} (none), {"type": "json_object"} (any
    JSON object; llama-cpp-python's optional "schema" narrows it), or {"type": "json_schema", "json_schema":
    {"schema": {...}}}."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ParamTypeError(f"{param} must be an object such as {{\"type\": \"json_object\"}}, not "
                             f"{type(value).__name__}", param)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = value.get("schema")
        text = JSON_OBJECT_GBNF if schema is None else schema_to_gbnf(schema, param)
    elif kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise ParamError(f'{param}: "json_schema" must be an object with a "schema"', param)
        text = schema_to_gbnf(spec["schema"], param)
    else:
        raise ParamError(f"{param}.type must be 'text', 'json_object' or 'json_schema', not "
                         f"{json.dumps(kind) if isinstance(kind, str) else kind!r}"[:200], param)
    return compile_gbnf(text, param)
