"""JSON Schema -> GBNF, in the shape llama.cpp's json-schema-to-grammar gives (rule names such as
``root``, ``root-name-kv``, ``space``, ``string``), and `JSON_OBJECT_GBNF` for ``json_object`` mode.

    gbnf = schema_to_gbnf({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}},
                           "required": ["n"]})

Every output the grammar admits validates against the schema (the tests check this with `jsonschema`),
so keywords that cannot be enforced are refused with a `GrammarError` naming them instead of ignored.

Supported:
  * type (object, array, string, number, integer, boolean, null, and lists of them); an empty schema
    or ``true`` is any JSON value;
  * objects: properties, required, additionalProperties (false, true or a schema; absent counts as false
    when properties are given, as in llama.cpp, and as true for a bare ``{"type": "object"}``). Required
    properties come first, in declared order, then any subset of the optional ones in declared order,
    then additional ones (whose names can be none of the declared ones); minProperties/maxProperties
    only when the required/declared properties already satisfy them;
  * arrays: items, prefixItems (or the older items-as-a-list / additionalItems), minItems, maxItems
    (with prefixItems and no items, exactly the prefix, as llama.cpp does);
  * enum, const (any JSON values);
  * strings: minLength/maxLength, pattern (a regex subset, below), format date, time, date-time
    (RFC 3339; only real dates: February 29 in leap years only), uuid, email (roughly: a dotted
    domain); other formats are annotations and are not enforced;
  * integers: minimum, maximum, exclusiveMinimum, exclusiveMaximum (exact digit-range grammars);
    numbers: integer-valued minimum/maximum (inclusive);
  * $ref to #/$defs/..., #/definitions/... or any local JSON pointer (recursion allowed); anyOf and
    oneOf (as alternatives: oneOf's exclusivity is not enforced); allOf (its parts merged: properties
    and required united, other keywords combined when they agree).
Refused: not, if/then/else, patternProperties, propertyNames, dependentRequired/Schemas,
unevaluated*, contains, uniqueItems: true, multipleOf, remote $refs, non-integer bounds on numbers.

Regex subset for ``pattern`` (a match anywhere in the string unless anchored with ^ and $):
literals and escapes (\\d \\w \\s, their ASCII complements \\D \\W \\S, \\n \\t \\xHH \\uHHHH, escaped
punctuation), classes [...] and [^...], ``.`` (anything but line breaks), groups (...) and (?:...),
alternation, and the quantifiers * + ? {m} {m,} {m,n} (lazy ones match the same strings).
Backreferences, lookaround, word boundaries, inline flags and anchors elsewhere are refused.

Whitespace between tokens is llama.cpp's bounded ``space`` rule (nothing, one space, or one or two
newlines and up to 20 spaces or tabs), so a model cannot loop on spaces.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .gbnf import MAX_CODE_POINT, GrammarError

__all__ = ["JSON_OBJECT_GBNF", "JSON_VALUE_GBNF", "schema_to_gbnf"]

_MAX_DIGITS = 16  # integral parts of at most 16 digits, as llama.cpp's `integral-part`

# name -> (body, the primitive rules it uses)
_PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "space": (r'| " " | "\n"{1,2} [ \t]{0,20}', ()),
    "boolean": (r'("true" | "false") space', ("space",)),
    "null": (r'"null" space', ("space",)),
    # a JSON string character: unescaped, or an escape (\u escapes of surrogates are left out, so that
    # every `char` is one code point of the decoded string and minLength/maxLength count right)
    "char": (r'[^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] '
             r'[0-9a-fA-F]{2}))', ()),
    "string": (r'"\"" char* "\"" space', ("char", "space")),
    "integral-part": (r'[0] | [1-9] [0-9]{0,15}', ()),
    "decimal-part": (r'[0-9]{1,16}', ()),
    "number": (r'("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space',
               ("integral-part", "decimal-part", "space")),
    "integer": (r'("-"? integral-part) space', ("integral-part", "space")),
    "value": (r'object | array | string | number | boolean | null',
              ("object", "array", "string", "number", "boolean", "null")),
    "object": (r'"{" space ( string ":" space value ("," space string ":" space value)* )? "}" space',
               ("string", "value", "space")),
    "array": (r'"[" space ( value ("," space value)* )? "]" space', ("value", "space")),
    "uuid": (r'"\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
             r'[0-9a-fA-F]{12} "\"" space', ("space",)),
    # a real calendar date: month lengths, and February 29 only in leap years (divisible by 4, and by 400
    # for a century); year 0000 is out (RFC 3339 allows it, Python's datetime does not)
    "date-year": (r'[1-9] [0-9]{3} | "0" [1-9] [0-9]{2} | "00" [1-9] [0-9] | "000" [1-9]', ()),
    "date-leap-year": (r'[0-9] [0-9] ("0" [48] | [2468] [048] | [13579] [26]) | ("0" [48] | [2468] [048] | '
                       r'[13579] [26]) "00"', ()),
    "date-day28": (r'"0" [1-9] | "1" [0-9] | "2" [0-8]', ()),
    "date": (r'date-year "-" (("01" | "03" | "05" | "07" | "08" | "10" | "12") "-" (date-day28 | "29" | "3" [01]) '
             r'| ("04" | "06" | "09" | "11") "-" (date-day28 | "29" | "30") | "02-" date-day28) '
             r'| date-leap-year "-02-29"', ("date-year", "date-leap-year", "date-day28")),
    "time": (r'([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] '
             r'([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])', ()),
    "date-string": (r'"\"" date "\"" space', ("date", "space")),
    "time-string": (r'"\"" time "\"" space', ("time", "space")),
    "date-time-string": (r'"\"" date "T" time "\"" space', ("date", "time", "space")),
    "email-string": (r'"\"" [a-zA-Z0-9_%+-] ([a-zA-Z0-9._%+-]{0,62} [a-zA-Z0-9_%+-])? "@" ([a-zA-Z0-9] '
                     r'[a-zA-Z0-9-]{0,20} ".")+ [a-zA-Z]{2,12} "\"" space', ("space",)),
}
_FORMATS = {"date": "date-string", "time": "time-string", "date-time": "date-time-string", "uuid": "uuid",
            "email": "email-string"}

_ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                "readOnly", "writeOnly", "$anchor", "contentMediaType", "contentEncoding", "$defs",
                "definitions", "format", "discriminator", "example", "$vocabulary"}
_REFUSED = {"not", "if", "then", "else", "patternProperties", "propertyNames", "dependentRequired",
            "dependentSchemas", "dependencies", "unevaluatedProperties", "unevaluatedItems", "contains",
            "minContains", "maxContains", "multipleOf", "$dynamicRef", "$recursiveRef"}
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


def _schema_error(message: str, param: str) -> GrammarError:
    return GrammarError(f"JSON schema: {message}", param)


# ---- GBNF text helpers ------------------------------------------------------------------------------

def _lit(text: str) -> str:
    """A GBNF string literal matching exactly `text`."""
    out = []
    for ch in text:
        cp = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif not ch.isprintable() and ch != " ":
            out.append(_escaped(cp))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _escaped(cp: int) -> str:
    return f"\\x{cp:02X}" if cp < 0x80 else f"\\u{cp:04X}" if cp <= 0xFFFF else f"\\U{cp:08X}"


def _class_char(cp: int) -> str:
    ch = chr(cp)
    return _escaped(cp) if ch in "]\\-^[" or not ch.isprintable() else ch


def _cls(ranges: list[tuple[int, int]]) -> str:
    """A GBNF character class of code point ranges."""
    parts = []
    for lo, hi in ranges:
        parts.append(_class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}")
    return "[" + "".join(parts) + "]"


def _group(expr: str) -> str:
    """`expr` as one item (parenthesized unless it already is one)."""
    if re.fullmatch(r'[A-Za-z0-9-]+|"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]', expr):
        return expr
    return f"({expr})"


def _repeat(expr: str, lo: int, hi: int | None) -> str:
    if hi == lo:
        return "" if lo == 0 else expr if lo == 1 else f"{_group(expr)}{{{lo}}}"
    if lo == 0 and hi == 1:
        return f"{_group(expr)}?"
    if hi is None:
        return f"{_group(expr)}*" if lo == 0 else f"{_group(expr)}+" if lo == 1 else f"{_group(expr)}{{{lo},}}"
    return f"{_group(expr)}{{{lo},{hi}}}"


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _normalize(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(a, b) for a, b in out]


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, nxt = [], 0
    for lo, hi in _normalize(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return out


def _intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for lo1, hi1 in a:
        for lo2, hi2 in b:
            lo, hi = max(lo1, lo2), min(hi1, hi2)
            if lo <= hi:
                out.append((lo, hi))
    return _normalize(out)


_SHORT_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
_PLAIN = [(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E), (0x80, MAX_CODE_POINT)]  # written as themselves


def _json_chars(ranges: list[tuple[int, int]]) -> str:
    """GBNF for one character of a JSON string's content whose decoded code point is in `ranges`: the plain
    ones as themselves, the others escaped."""
    alts = []
    plain = _intersect(ranges, _PLAIN)
    if plain:
        alts.append(_cls(plain))
    for lo, hi in _intersect(ranges, [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)]):
        for cp in range(lo, hi + 1):
            alts.append(_lit(_SHORT_ESCAPES.get(cp, f"\\u{cp:04x}")))
    if not alts:
        raise ValueError("an empty character set")
    return " | ".join(alts)


# ---- integer ranges ----------------------------------------------------------------------------------

def _digit_range(lo: str, hi: str) -> str:
    """GBNF for the digit strings of len(lo) == len(hi) between lo and hi (leading zeros allowed)."""
    if lo == hi:
        return _lit(lo) if lo else ""
    n = len(lo) - 1
    if lo[0] == hi[0]:
        return _join(_lit(lo[0]), _group(_digit_range(lo[1:], hi[1:])))
    alts = []
    first, last = int(lo[0]), int(hi[0])
    if lo[1:] != "0" * n:                      # lo's first digit with tails from lo's tail up
        alts.append(_join(_lit(lo[0]), _group(_digit_range(lo[1:], "9" * n))))
        first += 1
    tail_hi = None
    if hi[1:] != "9" * n:                      # hi's first digit with tails up to hi's tail
        tail_hi = _join(_lit(hi[0]), _group(_digit_range("0" * n, hi[1:])))
        last -= 1
    if first <= last:
        head = _lit(str(first)) if first == last else f"[{first}-{last}]"
        alts.append(_join(head, _repeat("[0-9]", n, n)))
    if tail_hi:
        alts.append(tail_hi)
    return " | ".join(alts)


def _uint_range(lo: int, hi: int | None) -> str:
    """GBNF for the decimal numerals (no leading zeros, at most 16 digits) of the integers in [lo, hi]."""
    alts = []
    top = len(str(hi)) if hi is not None else _MAX_DIGITS
    for digits in range(len(str(lo)), min(top, _MAX_DIGITS) + 1):
        a = max(lo, 10 ** (digits - 1) if digits > 1 else 0)
        b = 10 ** digits - 1 if hi is None else min(hi, 10 ** digits - 1)
        if a > b:
            continue
        if hi is None and a == 10 ** (digits - 1) and digits > 1:   # every longer length at once
            alts.append(_join("[1-9]", _repeat("[0-9]", digits - 1, _MAX_DIGITS - 1)))
            break
        alts.append(_digit_range(str(a), str(b)))
    return " | ".join(alts)


def _int_range(lo: int | None, hi: int | None, param: str) -> str:
    """GBNF for the integers in [lo, hi] (None: unbounded), written without leading zeros."""
    if lo is not None and hi is not None and lo > hi:
        raise _schema_error(f"no integer lies in [{lo}, {hi}]", param)
    limit = 10 ** _MAX_DIGITS - 1
    if (lo is not None and lo < -limit) or (hi is not None and hi > limit):
        raise _schema_error(f"integer bounds beyond {_MAX_DIGITS} digits are not supported", param)
    alts = []
    if lo is None or lo < 0:                          # the negative part: "-" and a magnitude
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        mag_hi = None if lo is None else -lo
        alts.append(_join('"-"', _group(_uint_range(mag_lo, mag_hi))))
    if hi is None or hi >= 0:
        alts.append(_uint_range(max(lo or 0, 0), hi))
    return " | ".join(alts)


def _number_range(lo: int | None, hi: int | None, param: str) -> str:
    """GBNF for decimal numbers (no exponent) in [lo, hi], for integer bounds: x = I.F lies in [I, I + 1), so an
    integral part I in [a, b - 1] may take any fraction and I = b only zeros."""
    if lo is not None and hi is not None and lo > hi:
        raise _schema_error(f"no number lies in [{lo}, {hi}]", param)
    frac = r'("." [0-9]{1,16})?'
    zeros = r'("." "0"{1,16})?'

    def magnitudes(a: int, b: int | None) -> list[str]:   # I.F in [a, b]
        if b is None:
            return [_join(_group(_int_range(a, None, param)), frac)]
        out = []
        if a <= b - 1:
            out.append(_join(_group(_int_range(a, b - 1, param)), frac))
        out.append(_join(_lit(str(b)), zeros))
        return out

    alts = []
    if lo is None or lo < 0:
        mag_lo = 0 if hi is None or hi >= 0 else -hi
        alts += [_join('"-"', _group(m)) for m in magnitudes(mag_lo, None if lo is None else -lo)]
    if hi is None or hi >= 0:
        alts += magnitudes(max(lo or 0, 0), hi)
    return " | ".join(alts)


# ---- regex patterns --------------------------------------------------------------------------------

_DIGIT = [(0x30, 0x39)]
_WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE_SET = [(0x09, 0x0D), (0x20, 0x20)]
_ASCII = [(0, 0x7F)]
# ECMA-262's '.' leaves out \n \r \u2028 \u2029 and Python's (which jsonschema uses) leaves out \n: the
# intersection satisfies both. \D \W \S are their ASCII complements for the same reason (Python's \d
# also matches other scripts' digits).
_DOT = _complement([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)])
_CLASS_ESCAPES = {"d": _DIGIT, "w": _WORD, "s": _SPACE_SET,
                  "D": _intersect(_complement(_DIGIT), _ASCII), "W": _intersect(_complement(_WORD), _ASCII),
                  "S": _intersect(_complement(_SPACE_SET), _ASCII)}
_CHAR_ESCAPES = {"n": 0x0A, "r": 0x0D, "t": 0x09, "f": 0x0C, "v": 0x0B, "0": 0x00}


class _Regex:
    """A regex (the subset in the module docstring) -> GBNF for the JSON string content it matches."""

    def __init__(self, pattern: str, param: str) -> None:
        self.p = pattern
        self.i = 0
        self.param = param

    def error(self, message: str) -> GrammarError:
        return _schema_error(f"pattern {self.p!r}: {message} (at character {self.i})", self.param)

    def peek(self) -> str:
        return self.p[self.i] if self.i < len(self.p) else ""

    def convert(self) -> str:
        """The content grammar (inside the quotes)."""
        anchored_start = self.p.startswith("^")
        if anchored_start:
            self.i = 1
        body = self.alternation()
        anchored_end = self.peek() == "$" and self.i == len(self.p) - 1
        if anchored_end:
            self.i += 1
        if self.i != len(self.p):
            raise self.error("'$' only at the end" if self.peek() == "$" else f"unexpected {self.peek()!r}")
        any_chars = "char*"
        return _join("" if anchored_start else any_chars, _group(body) if body else "",
                     "" if anchored_end else any_chars)

    def alternation(self) -> str:
        alts = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.sequence())
        if len(alts) > 1 and any(not a for a in alts):
            return " | ".join(a if a else '""' for a in alts)
        return " | ".join(alts)

    def sequence(self) -> str:
        items = []
        while self.peek() and self.peek() not in "|)":
            if self.peek() == "$" and self.i == len(self.p) - 1:
                break
            atom = self.atom()
            items.append(self.quantified(atom))
        return _join(*items)

    def quantified(self, atom: str) -> str:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{" and re.match(r"\{\d+(,\d*)?\}", self.p[self.i:]):
            m = re.match(r"\{(\d+)(,(\d*))?\}", self.p[self.i:])
            assert m is not None
            self.i += m.end()
            lo = int(m.group(1))
            hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
            if hi is not None and hi < lo:
                raise self.error(f"{{{lo},{hi}}}: the maximum is below the minimum")
            if max(lo, hi or 0) > 1000:
                raise self.error("repetition counts over 1000 are not supported")
        else:
            return atom
        if self.peek() == "?":                        # lazy: the same strings match
            self.i += 1
        elif self.peek() == "+":
            raise self.error("possessive quantifiers are not supported")
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and re.match(r"\{\d", self.p[self.i:])):
            raise self.error("a quantifier after a quantifier")
        return _repeat(atom, lo, hi)

    def atom(self) -> str:
        c = self.peek()
        if c == "(":
            self.i += 1
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.peek() == "?":
                raise self.error("lookaround, named groups and inline flags are not supported")
            body = self.alternation()
            if self.peek() != ")":
                raise self.error("missing ')'")
            self.i += 1
            return f"({body})" if body else '""'
        if c == "[":
            return _group(_json_chars(self.char_class()))
        if c == ".":
            self.i += 1
            return _group(_json_chars(_DOT))
        if c == "\\":
            return _group(_json_chars(self.escape(in_class=False)))
        if c in ("*", "+", "?") or (c == "{" and re.match(r"\{\d+(,\d*)?\}", self.p[self.i:])):
            raise self.error(f"{c!r} has nothing to repeat")
        if c == "^":
            raise self.error("'^' only at the start")
        if c == "$":
            raise self.error("'$' only at the end")
        self.i += 1
        return _group(_json_chars([(ord(c), ord(c))]))

    def escape(self, in_class: bool) -> list[tuple[int, int]]:
        self.i += 1
        e = self.peek()
        if not e:
            raise self.error("a pattern cannot end with '\\'")
        self.i += 1
        if e in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[e]
        if e in _CHAR_ESCAPES:
            return [(_CHAR_ESCAPES[e], _CHAR_ESCAPES[e])]
        if e == "b" and in_class:
            return [(0x08, 0x08)]
        if e in "xu":
            size = 2 if e == "x" else 4
            digits = self.p[self.i:self.i + size]
            if len(digits) != size or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"'\\{e}' needs {size} hex digits")
            self.i += size
            cp = int(digits, 16)
            return [(cp, cp)]
        if e.isalnum():
            raise self.error(f"'\\{e}' (backreferences, word boundaries, other escapes) is not supported")
        return [(ord(e), ord(e))]

    def char_class(self) -> list[tuple[int, int]]:
        self.i += 1
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        while self.peek() != "]":
            if not self.peek():
                raise self.error("missing ']'")
            lo_set = self.class_atom()
            if self.peek() == "-" and self.p[self.i + 1:self.i + 2] not in ("]", "") and len(lo_set) == 1 \
                    and lo_set[0][0] == lo_set[0][1]:
                self.i += 1
                hi_set = self.class_atom()
                if len(hi_set) != 1 or hi_set[0][0] != hi_set[0][1]:
                    raise self.error("a range must end with a single character")
                lo, hi = lo_set[0][0], hi_set[0][0]
                if hi < lo:
                    raise self.error("a reversed range")
                ranges.append((lo, hi))
            else:
                ranges.extend(lo_set)
        self.i += 1
        ranges = _normalize(ranges)
        result = _complement(ranges) if negated else ranges
        if not result:
            raise self.error("a class that matches nothing")
        return result

    def class_atom(self) -> list[tuple[int, int]]:
        if self.peek() == "\\":
            return self.escape(in_class=True)
        c = self.peek()
        self.i += 1
        return [(ord(c), ord(c))]


# ---- the converter ---------------------------------------------------------------------------------


def _rule_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9-]+", "-", text).strip("-") or "r"


class _Converter:
    def __init__(self, root: Any, param: str) -> None:
        self.root = root
        self.param = param
        self.rules: dict[str, str] = {}
        self.by_body: dict[str, str] = {}
        self.ref_names: dict[str, str] = {}

    def error(self, message: str) -> GrammarError:
        return _schema_error(message, self.param)

    # -- rules --

    def primitive(self, name: str) -> str:
        if name not in self.rules:
            body, deps = _PRIMITIVES[name]
            self.rules[name] = body
            for dep in deps:
                self.primitive(dep)
        return name

    def fresh(self, name: str) -> str:
        base = _rule_name(name)
        candidate, i = base, 1
        while candidate in self.rules or candidate in _PRIMITIVES or candidate == "root":
            candidate = f"{base}{i}"
            i += 1
        return candidate

    def add(self, name: str, body: str) -> str:
        """A rule named after `name` with `body` (an existing rule with the same body is reused)."""
        existing = self.by_body.get(body)
        if existing is not None:
            return existing
        name = self.fresh(name)
        self.rules[name] = body
        self.by_body[body] = name
        return name

    def gbnf(self) -> str:
        body = self.expr(self.root, "root")
        if "root" in self.rules:
            raise AssertionError("root defined twice")
        lines = [f"root ::= {body}"]
        lines += [f"{name} ::= {b}" for name, b in self.rules.items()]
        return "\n".join(lines) + "\n"

    # -- schemas --

    def resolve(self, ref: str) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise self.error(f"$ref {ref!r}: only references inside the schema (starting with '#') are supported")
        node = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise self.error(f"$ref {ref!r} points to nothing")
        return node

    def deref(self, schema: Any, seen: tuple[str, ...] = ()) -> Any:
        """`schema` with a top-level $ref replaced by its target (for merging)."""
        while isinstance(schema, dict) and "$ref" in schema:
            ref = schema["$ref"]
            if ref in seen:
                raise self.error(f"$ref {ref!r} refers to itself through allOf")
            seen = seen + (ref,)
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            target = self.resolve(ref)
            schema = self.merge([target, rest]) if _constraints(rest) else target
        return schema

    def ref_rule(self, ref: str) -> str:
        name = self.ref_names.get(ref)
        if name is None:
            target = self.resolve(ref)
            name = self.fresh(ref.rsplit("/", 1)[-1] if ref != "#" else "root-ref")
            self.ref_names[ref] = name
            self.rules[name] = ""                      # reserved: a recursive reference finds the name
            self.rules[name] = self.expr(target, name)
        return name

    def expr(self, schema: Any, name: str) -> str:
        """A GBNF expression for the JSON values `schema` admits (a rule name or an inline expression)."""
        if schema is True or schema == {}:
            return self.primitive("value")
        if schema is False:
            raise self.error(f"{name}: the schema `false` admits nothing")
        if not isinstance(schema, dict):
            raise self.error(f"{name}: a schema must be an object or a boolean, not {type(schema).__name__}")
        refused = sorted(k for k in schema if k in _REFUSED)
        if refused:
            raise self.error(f"{name}: {', '.join(refused)} {'is' if len(refused) == 1 else 'are'} not supported")
        if schema.get("uniqueItems") is True:
            raise self.error(f"{name}: uniqueItems: true is not supported")
        if "$ref" in schema:
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            if _constraints(rest):
                return self.expr(self.merge([self.resolve(schema["$ref"]), rest]), name)
            return self.ref_rule(schema["$ref"])
        if "allOf" in schema:
            parts = schema["allOf"]
            if not isinstance(parts, list) or not parts:
                raise self.error(f"{name}: allOf must be a non-empty list")
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            return self.expr(self.merge([*parts, rest]), name)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = schema[key]
                if not isinstance(options, list) or not options:
                    raise self.error(f"{name}: {key} must be a non-empty list")
                rest = {k: v for k, v in schema.items() if k != key}
                alts = []
                for i, option in enumerate(options):
                    option = self.merge([option, rest]) if _constraints(rest) else option
                    alts.append(self.add(f"{name}-{i}", self.expr(option, f"{name}-{i}")))
                return " | ".join(alts)
        if "const" in schema:
            return _join(_lit(self.dump(schema["const"])), self.primitive("space"))
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise self.error(f"{name}: enum must be a non-empty list")
            return _join(_group(" | ".join(_lit(self.dump(v)) for v in values)), self.primitive("space"))
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind:
                raise self.error(f"{name}: an empty type list admits nothing")
            alts = [self.add(f"{name}-{t}", self.expr({**schema, "type": t}, f"{name}-{t}")) for t in kind]
            return " | ".join(alts)
        if kind is None:
            kind = _implied_type(schema)
        if kind is None:
            return self.primitive("value")
        if kind not in _TYPES:
            raise self.error(f"{name}: unknown type {kind!r}")
        return getattr(self, f"type_{kind}")(schema, name)

    def dump(self, value: Any) -> str:
        try:
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise self.error(f"a value that is not JSON: {exc}") from None

    def merge(self, parts: list[Any]) -> dict[str, Any]:
        """One schema with the constraints of all `parts` (allOf)."""
        out: dict[str, Any] = {}
        for part in parts:
            part = self.deref(part)
            if part is True:
                continue
            if not isinstance(part, dict):
                raise self.error("allOf: a part that is not a schema object")
            if "allOf" in part:
                part = self.merge([*part["allOf"], {k: v for k, v in part.items() if k != "allOf"}])
            for key, value in part.items():
                if key in _ANNOTATIONS and key != "format":
                    continue
                if key not in out:
                    out[key] = value
                elif key == "properties":
                    props = dict(out[key])
                    for p, s in value.items():
                        props[p] = self.merge([props[p], s]) if p in props else s
                    out[key] = props
                elif key == "required":
                    out[key] = list(dict.fromkeys([*out[key], *value]))
                elif key == "type":
                    a = out[key] if isinstance(out[key], list) else [out[key]]
                    b = value if isinstance(value, list) else [value]
                    both = [t for t in a if t in b or (t == "integer" and "number" in b)]
                    both += [t for t in b if t == "integer" and "number" in a and t not in both]
                    if not both:
                        raise self.error(f"allOf: types {out[key]!r} and {value!r} have nothing in common")
                    out[key] = both[0] if len(both) == 1 else both
                elif key in ("minimum", "minLength", "minItems", "exclusiveMinimum"):
                    out[key] = max(out[key], value)
                elif key in ("maximum", "maxLength", "maxItems", "exclusiveMaximum"):
                    out[key] = min(out[key], value)
                elif key == "additionalProperties":
                    if value is False or out[key] is False:
                        out[key] = False
                    elif value is not True:
                        out[key] = value if out[key] is True else self.merge([out[key], value])
                elif out[key] != value:
                    raise self.error(f"allOf: cannot combine two different {key!r}")
        return out

    # -- the types --

    def type_null(self, schema: dict, name: str) -> str:
        return self.primitive("null")

    def type_boolean(self, schema: dict, name: str) -> str:
        return self.primitive("boolean")

    def bounds(self, schema: dict, name: str, integer: bool) -> tuple[int | None, int | None]:
        lo, hi = schema.get("minimum"), schema.get("maximum")
        xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        if xlo is True:                               # draft 4: a flag on minimum
            xlo, lo = lo, None
        if xhi is True:
            xhi, hi = hi, None
        xlo = None if xlo is False else xlo
        xhi = None if xhi is False else xhi
        for key, v in (("minimum", lo), ("maximum", hi), ("exclusiveMinimum", xlo), ("exclusiveMaximum", xhi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)):
                raise self.error(f"{name}: {key} must be a number")
        if integer:
            cands_lo = [math.ceil(lo)] if lo is not None else []
            cands_lo += [math.floor(xlo) + 1] if xlo is not None else []
            cands_hi = [math.floor(hi)] if hi is not None else []
            cands_hi += [math.ceil(xhi) - 1] if xhi is not None else []
            return (max(cands_lo) if cands_lo else None), (min(cands_hi) if cands_hi else None)
        if xlo is not None or xhi is not None:
            raise self.error(f"{name}: exclusiveMinimum/exclusiveMaximum are supported for integers only")
        for key, v in (("minimum", lo), ("maximum", hi)):
            if v is not None and v != int(v):
                raise self.error(f"{name}: a {key} that is not a whole number is supported for integers only")
        return (None if lo is None else int(lo)), (None if hi is None else int(hi))

    def type_integer(self, schema: dict, name: str) -> str:
        lo, hi = self.bounds(schema, name, integer=True)
        if lo is None and hi is None:
            return self.primitive("integer")
        return _join(_group(_int_range(lo, hi, self.param)), self.primitive("space"))

    def type_number(self, schema: dict, name: str) -> str:
        lo, hi = self.bounds(schema, name, integer=False)
        if lo is None and hi is None:
            return self.primitive("number")
        return _join(_group(_number_range(lo, hi, self.param)), self.primitive("space"))

    def type_string(self, schema: dict, name: str) -> str:
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        for key, v in (("minLength", lo), ("maxLength", hi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise self.error(f"{name}: {key} must be an integer >= 0")
        if hi is not None and hi < lo:
            raise self.error(f"{name}: maxLength is below minLength")
        if hi is not None and hi > 10_000:
            raise self.error(f"{name}: maxLength over 10000 is not supported")
        length_set = lo > 0 or hi is not None
        if "pattern" in schema:
            if length_set:
                raise self.error(f"{name}: pattern with minLength/maxLength is not supported")
            if not isinstance(schema["pattern"], str):
                raise self.error(f"{name}: pattern must be a string")
            self.primitive("char")
            content = _Regex(schema["pattern"], self.param).convert()
            return _join('"\\""', _group(content) if content else "", '"\\""', self.primitive("space"))
        fmt = schema.get("format")
        if fmt in _FORMATS:
            if length_set:
                raise self.error(f"{name}: format {fmt!r} with minLength/maxLength is not supported")
            return self.primitive(_FORMATS[fmt])
        if not length_set:
            return self.primitive("string")
        return _join('"\\""', _repeat(self.primitive("char"), lo, hi), '"\\""', self.primitive("space"))

    def type_array(self, schema: dict, name: str) -> str:
        items = schema.get("items")
        prefix = schema.get("prefixItems")
        if isinstance(items, list):                   # drafts before 2020-12: items as a tuple
            prefix, items = items, schema.get("additionalItems")
        prefix = prefix or []
        lo, hi = schema.get("minItems", 0), schema.get("maxItems")
        for key, v in (("minItems", lo), ("maxItems", hi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise self.error(f"{name}: {key} must be an integer >= 0")
        if hi is not None and hi > 1000:
            raise self.error(f"{name}: maxItems over 1000 is not supported")
        space = self.primitive("space")
        comma = _join('","', space)
        parts = [self.add(f"{name}-{i}", self.expr(s, f"{name}-{i}")) for i, s in enumerate(prefix)]
        if prefix and (items is None or items is False):
            if len(prefix) < lo or (hi is not None and hi < len(prefix)):
                raise self.error(f"{name}: minItems/maxItems conflict with the {len(prefix)} prefixItems")
            body = f" {comma} ".join(parts)
            return _join('"["', space, body, '"]"', space)
        if items is False:
            if lo > 0:
                raise self.error(f"{name}: items: false with minItems > 0 admits nothing")
            return _join('"["', space, '"]"', space)
        item = self.add(f"{name}-item", self.expr(True if items is None else items, f"{name}-item"))
        k = len(prefix)
        if hi is not None and hi < max(lo, k):
            raise self.error(f"{name}: maxItems is below minItems (or the prefixItems)")
        more_lo = max(lo - k, 0)
        more_hi = None if hi is None else hi - k
        if k:
            body = _join(f" {comma} ".join(parts), _repeat(_join(comma, item), more_lo, more_hi))
        elif more_hi == 0:
            body = ""
        elif more_lo >= 1:
            body = _join(item, _repeat(_join(comma, item), more_lo - 1, None if more_hi is None else more_hi - 1))
        else:
            body = f"({_join(item, _repeat(_join(comma, item), 0, None if more_hi is None else more_hi - 1))})?"
        return _join('"["', space, body, '"]"', space)

    def type_object(self, schema: dict, name: str) -> str:
        props = schema.get("properties") or {}
        if not isinstance(props, dict):
            raise self.error(f"{name}: properties must be an object")
        required = schema.get("required") or []
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise self.error(f"{name}: required must be a list of names")
        missing = [r for r in required if r not in props]
        extra_schema = schema.get("additionalProperties", None if props else True)
        if missing and extra_schema in (None, False):
            raise self.error(f"{name}: required {missing[0]!r} is not among the properties")
        if missing:                                   # required names the extras must supply: declare them
            props = {**props, **{r: (True if extra_schema is True else extra_schema) for r in missing}}
        n_props = len(props)
        if schema.get("minProperties", 0) > len(required):
            raise self.error(f"{name}: minProperties above the number of required properties is not supported")
        if "maxProperties" in schema and (extra_schema not in (None, False) or schema["maxProperties"] < n_props):
            raise self.error(f"{name}: maxProperties is supported only when it admits every declared property and "
                             "additionalProperties is false")
        if not props and extra_schema in (True, None):
            return self.primitive("object")
        space = self.primitive("space")
        comma = _join('","', space)
        kvs = {}
        for prop, sub in props.items():
            value = self.add(f"{name}-{prop}", self.expr(sub, f"{name}-{prop}"))
            kvs[prop] = self.add(f"{name}-{prop}-kv", _join(_lit(self.dump(prop)), space, '":"', space, value))
        extra = None
        if extra_schema not in (None, False):
            value = self.add(f"{name}-additional-value", self.expr(extra_schema, f"{name}-additional-value"))
            key = self.key_excluding(list(props), name)
            extra = self.add(f"{name}-additional-kv", _join(key, space, '":"', space, value))
        req = [kvs[p] for p in props if p in required]
        # after a property already written: any subset of the optional ones in declared order, each with its
        # comma, then any number of additional ones
        entries = [(kvs[p], False) for p in props if p not in required]
        if extra is not None:
            entries.append((extra, True))

        def tail(rest: list[tuple[str, bool]]) -> str:
            return " ".join(f"({comma} {kv})*" if many else f"({comma} {kv})?" for kv, many in rest)

        if req:
            body = _join(f" {comma} ".join(req), tail(entries))
        elif entries:                                 # no comma before the first one written
            alts = [_join(kv, tail(entries[i:] if many else entries[i + 1:])) for i, (kv, many) in enumerate(entries)]
            body = f"({self.add(f'{name}-props', ' | '.join(alts))})?"
        else:
            body = ""
        return _join('"{"', space, body, '"}"', space)

    def key_excluding(self, names: list[str], name: str) -> str:
        """A JSON object key that is none of `names`. Keys are written in an alphabet with one spelling per
        character (plain characters and the short escapes; no \\u escapes, no escaped '/'), so excluding
        the names' spellings excludes the names."""
        plain = r'[^"\\\x7F\x00-\x1F]'
        escapes = [_lit(e) for e in ('\\"', "\\\\", "\\b", "\\f", "\\n", "\\r", "\\t")]
        unit_any = self.add("key-char", " | ".join([plain, *escapes]))
        if not names:
            return _join('"\\""', f"{unit_any}*", '"\\""')

        def units(text: str) -> list[str]:   # each character of a name as its spelling in the key alphabet
            return [_SHORT_ESCAPES.get(ord(c), c) if ord(c) in _SHORT_ESCAPES or ord(c) < 0x20 else c
                    for c in text]

        trie: dict = {}
        for n in names:
            if any(ord(c) < 0x20 and ord(c) not in _SHORT_ESCAPES or ord(c) == 0x7F for c in n):
                continue                               # unspellable in the key alphabet: nothing to exclude
            node = trie
            for u in units(n):
                node = node.setdefault(u, {})
            node[None] = True
        counter = [0]

        def rule(node: dict) -> str:
            alts = []
            if None not in node:
                alts.append('""')                      # ending here spells no name
            children = [u for u in node if u is not None]
            for u in children:
                alts.append(_join(_lit(u), rule(node[u])))
            plain_children = [ord(u) for u in children if len(u) == 1]
            others = []
            rest_plain = _intersect(_complement([(c, c) for c in plain_children]),
                                    [(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E), (0x80, MAX_CODE_POINT)])
            if rest_plain:
                others.append(_cls(rest_plain))
            for esc in ('\\"', "\\\\", "\\b", "\\f", "\\n", "\\r", "\\t"):
                if esc not in children:
                    others.append(_lit(esc))
            if others:
                alts.append(_join(_group(" | ".join(others)), f"{unit_any}*"))
            counter[0] += 1
            return self.add(f"{name}-key-{counter[0]}", " | ".join(alts))

        return _join('"\\""', rule(trie), '"\\""')


def _constraints(schema: dict) -> bool:
    """Whether a schema object has keywords beyond annotations."""
    return any(k not in _ANNOTATIONS for k in schema)


def _implied_type(schema: dict) -> str | None:
    if any(k in schema for k in ("properties", "required", "additionalProperties", "minProperties",
                                 "maxProperties")):
        return "object"
    if any(k in schema for k in ("items", "prefixItems", "minItems", "maxItems", "additionalItems")):
        return "array"
    if any(k in schema for k in ("minLength", "maxLength", "pattern")) or schema.get("format") in _FORMATS:
        return "string"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return "number"
    return None


def schema_to_gbnf(schema: Any, param: str = "grammar") -> str:
    """GBNF text whose matches are JSON texts valid under `schema` (a dict, a bool, or JSON text)."""
    if isinstance(schema, str | bytes):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise _schema_error(f"not valid JSON: {exc}", param) from None
    try:
        return _Converter(schema, param).gbnf()
    except RecursionError:
        raise _schema_error("nested too deeply", param) from None


def _primitive_grammar(root: str) -> str:
    conv = _Converter({}, "grammar")
    conv.primitive(root)
    return f"root ::= {root}\n" + "".join(f"{n} ::= {b}\n" for n, b in conv.rules.items())


JSON_OBJECT_GBNF = _primitive_grammar("object")   # response_format {"type": "json_object"}
JSON_VALUE_GBNF = _primitive_grammar("value")
