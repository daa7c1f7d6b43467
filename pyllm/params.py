"""Checks for the values callers pass to the public API (`Llama`, the engine, the server).

Each check takes the argument's public name and raises `ParamError` (a ValueError) or
`ParamTypeError` (also a TypeError) naming it; the server turns either into a 400 whose
`param` is that name. The inner layers (engine, model, C core) trust what passed here and
only assert their own invariants.

    max_tokens = integer("max_tokens", max_tokens, minimum=0, optional=True)
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any

_DIGITS = re.compile(r"[0-9]+")  # ASCII only: int() also reads other scripts' digits ("٣" is 3)


class ParamError(ValueError):
    """A bad argument value. `param` names it as the API calls it; `code` is an OpenAI-style error code."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class ParamTypeError(ParamError, TypeError):
    """An argument of the wrong type."""


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def integer(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None,
            optional: bool = False) -> int | None:
    """`value` as an int (not a bool, not a str), within [minimum, maximum]."""
    if value is None and optional:
        return None
    if not is_int(value):
        raise ParamTypeError(f"{name} must be an integer, not {_type_name(value)} {value!r}"[:200], name)
    value = int(value)
    if minimum is not None and value < minimum:
        raise ParamError(f"{name} must be >= {minimum}, not {value}", name)
    if maximum is not None and value > maximum:
        raise ParamError(f"{name} must be <= {maximum}, not {value}", name)
    return value


def number(name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
           above: bool = False) -> float:
    """`value` as a finite float (an int or float, not a bool), within [minimum, maximum] ((minimum, ...] with
    `above`)."""
    if not is_real(value):
        raise ParamTypeError(f"{name} must be a number, not {_type_name(value)} {value!r}"[:200], name)
    v = float(value)
    if not math.isfinite(v):
        raise ParamError(f"{name} must be a finite number, not {v}", name)
    if minimum is not None and (v <= minimum if above else v < minimum):
        raise ParamError(f"{name} must be {'>' if above else '>='} {minimum:g}, not {v:g}", name)
    if maximum is not None and v > maximum:
        raise ParamError(f"{name} must be <= {maximum:g}, not {v:g}", name)
    return v


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ParamTypeError(f"{name} must be true or false, not {_type_name(value)} {value!r}"[:200], name)
    return value


def only(name: str, value: Any, allowed: Sequence[Any], why: str) -> Any:
    """An argument pyllm accepts at the values in `allowed` alone (llama-cpp-python's defaults, say): any other is
    a ParamError naming it and saying `why`."""
    if not any(value is a or (type(value) is type(a) and value == a) or (is_real(value) and is_real(a) and value == a)
               for a in allowed):
        raise ParamError(f"{name}={value!r} is not supported: {why}"[:300], name)
    return value


def text(name: str, value: Any) -> str:
    """A str that encodes as UTF-8 (a JSON string may carry a lone surrogate such as "\\ud800", which does not)."""
    if not isinstance(value, str):
        raise ParamTypeError(f"{name} must be a string, not {_type_name(value)}", name)
    utf8(name, value)
    return value


def utf8(name: str, value: str) -> bytes:
    """The UTF-8 bytes of `value`, or a ParamError naming where it is not text."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ParamError(f"{name} is not valid Unicode text: a lone surrogate {value[exc.start]!r} at character "
                         f"{exc.start}", name) from None


def stop_strings(value: Any) -> list[str]:
    """`stop`: None, a string, or a list of strings (empty ones are dropped)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    elif not isinstance(value, Sequence) or isinstance(value, bytes):
        raise ParamTypeError(f"stop must be a string or a list of strings, not {_type_name(value)}", "stop")
    stops = []
    for i, stop in enumerate(value):
        stops.append(text(f"stop[{i}]", stop))
    return [s for s in stops if s]


def token_id(name: str, key: Any, n_vocab: int | None = None) -> int:
    """A token id: an int, or (as JSON objects carry them) a string of ASCII digits."""
    if isinstance(key, str) and _DIGITS.fullmatch(key):
        token = int(key)
    elif is_int(key) and key >= 0:
        token = int(key)
    else:
        raise ParamError(f"{name} key {key!r} is not a token id (an integer >= 0)"[:200], name)
    if n_vocab is not None and token >= n_vocab:
        raise ParamError(f"{name} token {token} is outside the vocabulary (n_vocab={n_vocab})", name)
    return token


def logit_bias(value: Any, n_vocab: int | None = None) -> dict[int, float] | None:
    """`logit_bias`: token id -> a finite bias, or -inf to ban the token."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ParamTypeError(f"logit_bias must be a dict of token id -> bias, not {_type_name(value)}", "logit_bias")
    bias: dict[int, float] = {}
    for key, v in value.items():
        token = token_id("logit_bias", key, n_vocab)
        if not is_real(v) or math.isnan(float(v)) or float(v) == math.inf:
            raise ParamError(f"logit_bias[{token}] must be a finite number or -inf, not {v!r}"[:200], "logit_bias")
        bias[token] = float(v)
    return bias or None


def token_ids(name: str, value: Any, n_vocab: int) -> list[int]:
    """A non-empty list of token ids in [0, n_vocab)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ParamTypeError(f"{name} must be a list of token ids, not {_type_name(value)}", name)
    ids = []
    for t in value:
        if not is_int(t) or not 0 <= t < n_vocab:
            raise ParamError(f"{name}: token ids must be integers in [0, {n_vocab}), not {t!r}"[:200], name)
        ids.append(int(t))
    return ids


def grammar(value: Any, name: str = "grammar") -> Any:
    """`grammar`: None, GBNF text, a LlamaGrammar or a compiled pyllm.grammar.Grammar -> the compiled Grammar
    (a bad grammar is a GrammarError, a ParamError naming `name`, that says where)."""
    if value is None:
        return None
    from .grammar import as_grammar  # here, not at the top: pyllm.grammar imports this module

    return as_grammar(value, name)



def constraint(grammar_value: Any, response_format: Any) -> Any:
    """`grammar` and `response_format` (OpenAI's: {"type": "text" | "json_object" | "json_schema", ...}) -> the
    compiled pyllm.grammar.Grammar the output must match, or None. One of them at most may constrain."""
    from .grammar import response_format_grammar

    by_format = response_format_grammar(response_format)
    if by_format is not None and grammar_value is not None:
        raise ParamError("give response_format or grammar, not both", "grammar")
    return by_format if by_format is not None else grammar(grammar_value)
