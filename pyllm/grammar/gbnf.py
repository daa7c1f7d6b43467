"""GBNF, llama.cpp's grammar notation: the parser, and the compiled grammar with its pushdown semantics.

    root   ::= answer "."            # `root` is where a match starts
    answer ::= "yes" | "no" | [0-9]{1,3} (" " [a-z]+)?

Syntax (as llama.cpp's grammar parser reads it): a rule is ``name ::= alternatives`` and ends at the end
of its line (inside parentheses, and after ``|``, a rule may go on over several lines; so may a line that
starts with ``|``). Items: string literals ``"..."``, character classes ``[a-z0-9_]`` and ``[^...]``,
``.`` (any character), rule names, groups ``( ... )``; each may be followed by ``*`` ``+`` ``?`` ``{m}``
``{m,}`` ``{m,n}``. Escapes in literals and classes: ``\\n \\r \\t \\\\ \\" \\[ \\] \\- \\xHH \\uHHHH
\\UHHHHHHHH``. ``#`` starts a comment. Names are letters, digits, ``-`` (and ``_``, which llama.cpp
does not accept). Grammars match Unicode code points, not bytes.

Compilation lowers the text to llama.cpp's form: every rule a list of alternatives, each a sequence of
elements (a character class or a reference to a rule); groups become rules of their own, and repetitions
become right-recursive rules (``S{2,4}`` -> ``S S S'``, ``S' ::= S S'' |``, ``S'' ::= S |``). A grammar
that refers to an undefined rule, has no ``root`` or is left-recursive (a rule that can reach itself
without consuming a character, which a pushdown parser would expand forever) is refused with a
`GrammarError` that gives the line and column.

The meaning of a compiled grammar is llama.cpp's set of pushdown stacks. A stack is a tuple of
element positions, the last one the next element to match; every stack in a set is *expanded*: its top
is a character class (or the stack is empty: the grammar has matched a whole ``root``). `Grammar.advance`
expands a stack, `Grammar.accept_char` consumes one code point from a set of stacks. A position whose
element is the last of its alternative is never pushed (tail calls), so right recursion does not grow the
stacks; the set of stacks is deduplicated and capped (`MAX_STACKS`), so an ambiguous grammar cannot make
a step take unbounded time.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ..params import ParamError

__all__ = ["Grammar", "GrammarError", "CharClass", "parse_gbnf", "MAX_CODE_POINT"]

MAX_CODE_POINT = 0x10FFFF
# The most elements (characters, references) the lowered grammar may have: repetition counts multiply
# the size of what they repeat, and a small text must not become a huge grammar.
MAX_ELEMENTS = 1 << 20
MAX_REPEAT = 10_000           # the largest m or n in {m,n}
MAX_STACKS = 4096             # the most stacks one state may hold (an ambiguous grammar's bound)

# element kinds
END, CHAR, REF = 0, 1, 2


class GrammarError(ParamError):
    """A grammar (or JSON schema) that cannot be compiled, or a state it cannot go on from. One line; for a
    GBNF text it says where (line and column). A ParamError: the API reports it as a bad `param`."""

    def __init__(self, message: str, param: str | None = "grammar", line: int | None = None,
                 column: int | None = None) -> None:
        where = f"line {line}, column {column}: " if line is not None else ""
        super().__init__(f"{where}{message}", param)
        self.line = line
        self.column = column


@dataclass(frozen=True)
class CharClass:
    """A set of code points: sorted, disjoint, non-adjacent inclusive ranges (negation already applied)."""
    ranges: tuple[tuple[int, int], ...]
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", tuple(lo for lo, _ in self.ranges))

    @staticmethod
    def of(ranges: list[tuple[int, int]], negated: bool = False) -> CharClass:
        merged: list[list[int]] = []
        for lo, hi in sorted(ranges):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        if negated:
            out, nxt = [], 0
            for lo, hi in merged:
                if lo > nxt:
                    out.append((nxt, lo - 1))
                nxt = hi + 1
            if nxt <= MAX_CODE_POINT:
                out.append((nxt, MAX_CODE_POINT))
            return CharClass(tuple(out))
        return CharClass(tuple((lo, hi) for lo, hi in merged))

    def __contains__(self, cp: int) -> bool:
        i = bisect.bisect_right(self._starts, cp) - 1
        return i >= 0 and cp <= self.ranges[i][1]

    def intersects(self, lo: int, hi: int) -> bool:
        """Whether some code point in [lo, hi] is in the class."""
        i = bisect.bisect_right(self._starts, hi) - 1  # the last range starting at or below hi
        return i >= 0 and self.ranges[i][1] >= lo


# ---- the parser: text -> rules of alternatives of items ------------------------------------------------

# An item of a sequence: ("char", CharClass) | ("ref", name, offset) | ("group", alternatives)
#                        | ("repeat", item, min, max or None)
Item = tuple
Alternatives = list[list[Item]]


def _is_name_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c in "-_")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.rules: dict[str, Alternatives] = {}
        self.defined_at: dict[str, int] = {}
        self.refs: list[tuple[str, int]] = []   # every reference and where it is, to report undefined ones

    # -- positions and errors --

    def where(self, pos: int) -> tuple[int, int]:
        line = self.text.count("\n", 0, pos) + 1
        return line, pos - (self.text.rfind("\n", 0, pos) + 1) + 1

    def error(self, message: str, pos: int | None = None) -> GrammarError:
        line, column = self.where(self.pos if pos is None else pos)
        return GrammarError(message, line=line, column=column)

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.text[i] if i < len(self.text) else ""

    def skip_space(self, newlines: bool) -> None:
        """Spaces, tabs and comments; newlines too when `newlines`."""
        text, n = self.text, len(self.text)
        while self.pos < n:
            c = text[self.pos]
            if c in " \t" or (newlines and c in "\r\n"):
                self.pos += 1
            elif c == "#":
                while self.pos < n and text[self.pos] not in "\r\n":
                    self.pos += 1
            else:
                break

    def continues_with_bar(self) -> bool:
        """At a line end: whether the next line that holds anything starts with `|` (the rule goes on)."""
        save = self.pos
        self.skip_space(True)
        if self.peek() == "|":
            return True
        self.pos = save
        return False

    # -- grammar --

    def parse(self) -> dict[str, Alternatives]:
        self.skip_space(True)
        while self.pos < len(self.text):
            self.parse_rule()
        for name, pos in self.refs:
            if name not in self.rules:
                raise self.error(f"undefined rule {name!r}", pos)
        if "root" not in self.rules:
            raise GrammarError("the grammar has no 'root' rule (the rule a match starts from)")
        return self.rules

    def parse_rule(self) -> None:
        start = self.pos
        name = self.parse_name()
        self.skip_space(False)
        if not self.text.startswith("::=", self.pos):
            raise self.error(f"expected '::=' after the rule name {name!r}")
        if name in self.rules:
            line, _ = self.where(self.defined_at[name])
            raise self.error(f"rule {name!r} is defined twice (first on line {line})", start)
        self.pos += 3
        self.skip_space(True)
        self.defined_at[name] = start
        self.rules[name] = self.parse_alternatives(nested=False)
        c = self.peek()
        if c in ("\r", "\n"):
            self.skip_space(True)
        elif c:
            raise self.error(f"unexpected {c!r}: expected a newline or the end of the rule {name!r}")

    def parse_name(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and _is_name_char(self.text[self.pos]):
            self.pos += 1
        if self.pos == start:
            found = repr(self.peek()) if self.peek() else "the end of the text"
            raise self.error(f"expected a rule name, found {found}")
        return self.text[start:self.pos]

    def parse_alternatives(self, nested: bool) -> Alternatives:
        alternatives = [self.parse_sequence(nested)]
        while self.peek() == "|" or (not nested and self.peek() in ("\r", "\n") and self.continues_with_bar()):
            self.pos += 1
            self.skip_space(True)
            alternatives.append(self.parse_sequence(nested))
        return alternatives

    def parse_sequence(self, nested: bool) -> list[Item]:
        seq: list[Item] = []
        while True:
            c = self.peek()
            start = self.pos
            if c == '"':
                self.pos += 1
                chars = []
                while self.peek() != '"':
                    if not self.peek():
                        raise self.error("unterminated string literal", start)
                    chars.append(self.parse_char())
                self.pos += 1
                seq.append(("lit", tuple(chars)))
            elif c == "[":
                seq.append(("char", self.parse_class()))
            elif c == ".":
                self.pos += 1
                seq.append(("char", CharClass(((0, MAX_CODE_POINT),))))
            elif c == "(":
                self.pos += 1
                self.skip_space(True)
                alternatives = self.parse_alternatives(nested=True)
                if self.peek() != ")":
                    raise self.error("expected ')' to close the group", start) if not self.peek() else \
                        self.error(f"unexpected {self.peek()!r}: expected ')'")
                self.pos += 1
                seq.append(("group", alternatives))
            elif c and _is_name_char(c):
                name = self.parse_name()
                self.skip_space(nested)
                if self.text.startswith("::=", self.pos):
                    raise self.error(f"unexpected '::=' after {name!r}: a rule must start on a new line", start)
                self.refs.append((name, start))
                seq.append(("ref", name, start))
                continue
            elif c in ("*", "+", "?", "{"):
                if not seq:
                    raise self.error(f"{c!r} has nothing before it to repeat")
                lo, hi = self.parse_repetition()
                seq[-1] = ("repeat", seq[-1], lo, hi)
            elif c in ("<", "!") and (c == "<" or self.peek(1) == "<"):
                raise self.error("token references (<...>) are not supported")
            else:
                return seq
            self.skip_space(nested)

    def parse_repetition(self) -> tuple[int, int | None]:
        c = self.peek()
        self.pos += 1
        if c == "*":
            return 0, None
        if c == "+":
            return 1, None
        if c == "?":
            return 0, 1
        self.skip_space(True)
        lo = self.parse_int()
        self.skip_space(True)
        hi: int | None = lo
        if self.peek() == ",":
            self.pos += 1
            self.skip_space(True)
            hi = self.parse_int() if self.peek().isdigit() else None
            self.skip_space(True)
        if self.peek() != "}":
            raise self.error("expected '}' to close the repetition {m,n}")
        self.pos += 1
        if hi is not None and hi < lo:
            raise self.error(f"repetition {{{lo},{hi}}}: the maximum is below the minimum")
        return lo, hi

    def parse_int(self) -> int:
        start = self.pos
        while self.peek().isascii() and self.peek().isdigit():
            self.pos += 1
        if self.pos == start:
            raise self.error("expected an integer")
        value = int(self.text[start:self.pos])
        if value > MAX_REPEAT:
            raise self.error(f"repetition count {value} is over the limit of {MAX_REPEAT}", start)
        return value

    def parse_char(self) -> int:
        """One character of a literal or class, escapes decoded."""
        start = self.pos
        c = self.peek()
        if c != "\\":
            self.pos += 1
            return ord(c)
        e = self.peek(1)
        simple = {"n": 10, "r": 13, "t": 9, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}
        if e in simple:
            self.pos += 2
            return simple[e]
        size = {"x": 2, "u": 4, "U": 8}.get(e)
        if size is None:
            raise self.error(f"unknown escape '\\{e}'" if e else "unterminated escape", start)
        digits = self.text[self.pos + 2:self.pos + 2 + size]
        if len(digits) != size or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise self.error(f"'\\{e}' needs {size} hex digits", start)
        value = int(digits, 16)
        if value > MAX_CODE_POINT:
            raise self.error(f"'\\{e}{digits}' is beyond the last Unicode code point", start)
        self.pos += 2 + size
        return value

    def parse_class(self) -> CharClass:
        start = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        while self.peek() != "]":
            if not self.peek():
                raise self.error("unterminated character class", start)
            lo = self.parse_char()
            hi = lo
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                at = self.pos
                hi = self.parse_char()
                if hi < lo:
                    raise self.error(f"character range {chr(lo)!r}-{chr(hi)!r} is reversed", at)
            ranges.append((lo, hi))
        self.pos += 1
        return CharClass.of(ranges, negated)


# ---- lowering: items -> flat elements --------------------------------------------------------------


class _Lowering:
    """Rules of items -> llama.cpp's flat form. `elems[p]` is (kind, arg): (CHAR, class index), (REF, rule id)
    or (END, 0) closing an alternative; rule r's alternatives start at `alts[r]`."""

    def __init__(self, rules: dict[str, Alternatives], parser: _Parser) -> None:
        self.parser = parser
        self.names: list[str] = list(rules)
        self.ids = {name: i for i, name in enumerate(self.names)}
        self.owner: list[str] = list(rules)           # the user's rule each rule was made for (for errors)
        self.bodies: list[list[list[tuple[int, int]]] | None] = [None] * len(rules)
        self.classes: list[CharClass] = []
        self.class_ids: dict[CharClass, int] = {}
        self.size = 0
        for name, alternatives in rules.items():
            self.bodies[self.ids[name]] = [self.sequence(seq, name) for seq in alternatives]

    def new_rule(self, owner: str, body: list[list[tuple[int, int]]] | None = None) -> int:
        rid = len(self.names)
        self.names.append(f"{owner}_{rid}")
        self.owner.append(owner)
        self.bodies.append(body)
        return rid

    def char(self, cls: CharClass) -> tuple[int, int]:
        i = self.class_ids.get(cls)
        if i is None:
            i = self.class_ids[cls] = len(self.classes)
            self.classes.append(cls)
        return (CHAR, i)

    def grow(self, n: int) -> None:
        self.size += n
        if self.size > MAX_ELEMENTS:
            raise GrammarError(f"the grammar is too large once its repetitions are expanded (over {MAX_ELEMENTS} "
                               "elements)")

    def sequence(self, seq: list[Item], owner: str) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for item in seq:
            out.extend(self.item(item, owner))
        self.grow(len(out) + 1)
        return out

    def item(self, item: Item, owner: str) -> list[tuple[int, int]]:
        kind = item[0]
        if kind == "lit":
            return [self.char(CharClass(((cp, cp),))) for cp in item[1]]
        if kind == "char":
            return [self.char(item[1])]
        if kind == "ref":
            return [(REF, self.ids[item[1]])]
        if kind == "group":
            alternatives = item[1]
            if len(alternatives) == 1:
                return self.sequence(alternatives[0], owner)
            rid = self.new_rule(owner)
            self.bodies[rid] = [self.sequence(seq, owner) for seq in alternatives]
            return [(REF, rid)]
        assert kind == "repeat"
        _, inner, lo, hi = item
        unit = self.item(inner, owner)
        self.grow(len(unit) * max(lo, hi or 1, 1))
        out = unit * lo
        if hi is None:                       # S' ::= S S' |
            rid = self.new_rule(owner)
            self.bodies[rid] = [unit + [(REF, rid)], []]
            out.append((REF, rid))
        elif hi > lo:                        # S'(1) ::= S | ;  S'(k) ::= S S'(k-1) |
            rid = self.new_rule(owner, [list(unit), []])
            for _ in range(hi - lo - 1):
                rid = self.new_rule(owner, [unit + [(REF, rid)], []])
            out.append((REF, rid))
        return out


class Grammar:
    """A compiled grammar: flat elements, character classes, and the pushdown-stack semantics.

    Vocabulary-independent and immutable once built (its memo tables only cache pure functions), so
    one Grammar serves any number of sequences and tokenizers. `text` is the GBNF it was compiled from.
    """

    def __init__(self, text: str) -> None:
        parser = _Parser(text)
        rules = parser.parse()
        low = _Lowering(rules, parser)
        self.text = text
        self.rule_names = low.names
        self.classes = low.classes
        # the flat arrays: rule r's alternatives start at alts[r]; each alternative ends with an END
        kinds: list[int] = []
        args: list[int] = []
        self.alts: list[tuple[int, ...]] = []
        for body in low.bodies:
            assert body is not None
            starts = []
            for seq in body:
                starts.append(len(kinds))
                for kind, arg in seq:
                    kinds.append(kind)
                    args.append(arg)
                kinds.append(END)
                args.append(0)
            self.alts.append(tuple(starts))
        # the start: a reference to root, then END
        self._start_pos = len(kinds)
        kinds += [REF, END]
        args += [low.ids["root"], 0]
        self.kinds = kinds
        self.args = args
        self._check_left_recursion(low, parser)
        self._advance_memo: dict[tuple[int, ...], frozenset[tuple[int, ...]]] = {}
        self._ascii = [bytes(1 if cp in c else 0 for cp in range(128)) for c in self.classes]
        self.initial = self.advance((self._start_pos,))

    def __repr__(self) -> str:
        return f"Grammar({len(self.rule_names)} rules, {len(self.kinds)} elements)"

    # -- checks --

    def _check_left_recursion(self, low: _Lowering, parser: _Parser) -> None:
        """Refuse a rule that can reach itself before consuming a character (llama.cpp refuses these too)."""
        n = len(self.alts)
        nullable = [False] * n
        changed = True
        while changed:
            changed = False
            for r in range(n):
                if nullable[r]:
                    continue
                for a in self.alts[r]:
                    p = a
                    while self.kinds[p] == REF and nullable[self.args[p]]:
                        p += 1
                    if self.kinds[p] == END:
                        nullable[r] = changed = True
                        break
        first: list[set[int]] = [set() for _ in range(n)]   # rules reachable at the start of r
        for r in range(n):
            for a in self.alts[r]:
                p = a
                while self.kinds[p] == REF:
                    first[r].add(self.args[p])
                    if not nullable[self.args[p]]:
                        break
                    p += 1
        state = [0] * n  # 0 new, 1 on the DFS path, 2 done

        def visit(r: int) -> None:
            stack = [(r, iter(first[r]))]
            state[r] = 1
            while stack:
                node, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    state[node] = 2
                    stack.pop()
                elif state[nxt] == 1:
                    name = low.owner[nxt]
                    pos = parser.defined_at.get(name)
                    line, column = parser.where(pos) if pos is not None else (None, None)
                    raise GrammarError(f"rule {name!r} is left-recursive: it can reach itself without consuming a "
                                       "character (a repetition of something that can be empty does too)",
                                       line=line, column=column)
                elif state[nxt] == 0:
                    state[nxt] = 1
                    stack.append((nxt, iter(first[nxt])))

        for r in range(n):
            if state[r] == 0:
                visit(r)

    # -- pushdown semantics --

    def advance(self, stack: tuple[int, ...]) -> frozenset[tuple[int, ...]]:
        """The expanded stacks of `stack`: a rule reference at the top is replaced by each of the rule's
        alternatives (below it, the element after the reference, unless the reference ended its alternative),
        until every top is a character class or the stack is empty."""
        kinds = self.kinds
        if not stack or kinds[stack[-1]] == CHAR:
            return frozenset((stack,))
        memo = self._advance_memo.get(stack)
        if memo is not None:
            return memo
        out: set[tuple[int, ...]] = set()
        seen: set[tuple[int, ...]] = set()
        todo = [stack]
        while todo:                             # a worklist, not recursion: chains of empty rules can be long
            st = todo.pop()
            if not st or kinds[st[-1]] == CHAR:
                out.add(st)
                continue
            if st in seen:
                continue
            seen.add(st)
            if len(seen) > 8 * MAX_STACKS or len(out) > MAX_STACKS:
                raise GrammarError(f"the grammar is too ambiguous here: over {MAX_STACKS} parses at once")
            top = st[-1]
            rest = st[:-1] + (top + 1,) if kinds[top + 1] != END else st[:-1]
            for a in self.alts[self.args[top]]:
                todo.append(rest + (a,) if kinds[a] != END else rest)
        result = frozenset(out)
        if len(self._advance_memo) > 1 << 18:   # a bound on memory; the entries are cheap to recompute
            self._advance_memo.clear()
        self._advance_memo[stack] = result
        return result

    def matches(self, pos: int, cp: int) -> bool:
        """Whether the character class at stack position `pos` holds code point `cp`."""
        if cp < 128:
            return self._ascii[self.args[pos]][cp] == 1
        return cp in self.classes[self.args[pos]]

    def accept_char(self, stacks: frozenset[tuple[int, ...]], cp: int) -> frozenset[tuple[int, ...]]:
        """The stacks after consuming code point `cp` (empty: `cp` cannot come next)."""
        out: set[tuple[int, ...]] = set()
        kinds = self.kinds
        for stack in stacks:
            if stack and self.matches(stack[-1], cp):
                nxt = stack[-1] + 1
                out |= self.advance(stack[:-1] + (nxt,) if kinds[nxt] != END else stack[:-1])
        if len(out) > MAX_STACKS:
            raise GrammarError(f"the grammar is too ambiguous here: over {MAX_STACKS} parses at once")
        return frozenset(out)

    def accepts_some(self, stacks: frozenset[tuple[int, ...]], lo: int, hi: int) -> bool:
        """Whether some stack can consume some code point in [lo, hi] (a partial UTF-8 character's range)."""
        return any(stack and self.classes[self.args[stack[-1]]].intersects(lo, hi) for stack in stacks)

    @staticmethod
    def can_end(stacks: frozenset[tuple[int, ...]]) -> bool:
        """Whether a whole `root` has been matched (the empty stack is among the parses)."""
        return () in stacks

    def fullmatch(self, text: str) -> bool:
        """Whether the grammar matches all of `text` (a plain check, for tests and callers)."""
        stacks = self.initial
        for ch in text:
            stacks = self.accept_char(stacks, ord(ch))
            if not stacks:
                return False
        return self.can_end(stacks)


def parse_gbnf(text: str) -> Grammar:
    """Compile GBNF text (GrammarError, with line and column, when it cannot be)."""
    if not isinstance(text, str):
        raise GrammarError(f"a grammar must be GBNF text (a string), not {type(text).__name__}")
    return Grammar(text)
