"""Token masks for a grammar: which tokens may come next, fast on large vocabularies.

    vocab = VocabIndex.for_tokenizer(tokenizer)        # once per tokenizer (~1 s for 151k tokens)
    m = GrammarMatcher(grammar, vocab)                 # one per sequence; m.copy() is cheap
    m.mask_logits(logits)                              # disallowed tokens -> -inf (EOG only when m.can_end)
    m.accept(token)                                    # advance; GrammarMatchError if it was not allowed

**States.** A grammar state is the set of pushdown stacks (see gbnf.py) plus, when the text so far ends
inside a multi-byte UTF-8 character, that partial character. Grammars match code points; tokens are
bytes, and a token may end (or start) in the middle of a character. A partial character is kept as its
bits so far, and it survives only if some stack could take some code point that starts with those bytes.
Once its remaining bytes can no longer matter (every code point it could still become falls in the same
*segment*: between two consecutive range bounds of the classes the stacks wait on) it is replaced by the
segment's first code point, so the thousands of CJK prefixes inside a JSON string are one state, not
thousands. Every state is interned to an integer.

**Transitions.** A table ``(states, 256) int32`` holds the state after each byte (DEAD: the byte cannot
come next; UNKNOWN: not computed yet). A new state's row starts DEAD for every byte that cannot begin
a character its stacks wait on, so only plausible bytes ever cost a Python step; the table is shared by
every matcher of the same grammar and vocabulary, so each (state, byte) step is computed once.

**Masks.** The vocabulary's byte strings form a trie (`VocabIndex`, nodes in breadth-first order, every
node's children contiguous). The allowed tokens of a state are found by walking the trie one level at a
time alongside the table, in numpy: the children of the live nodes, their states looked up in the
table, dead ones dropped with their whole subtrees. A state where few tokens fit costs a few small
array operations per level; no step scans the whole vocabulary. The result is cached per state (an LRU
bounded in bytes), so a repeated state (the inside of a string) costs a dict lookup.

`ReferenceMatcher` is the slow, obviously correct path: for every token it decodes the pending bytes
and the token's bytes with Python's UTF-8 codec and runs them through the grammar one code point at a
time. The tests hold the fast masks to it.

Special (control) tokens and tokens that render as no bytes are never allowed; end-of-generation tokens
are allowed exactly when the grammar has matched a whole `root` (and no character is half-written).
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .gbnf import MAX_CODE_POINT, Grammar, GrammarError

__all__ = ["GrammarMatchError", "GrammarMatcher", "ReferenceMatcher", "VocabIndex"]

# Transition table entries: state 0 is the dead state (its row is all DEAD, so dead nodes stay dead when a
# whole trie level is looked up at once); UNKNOWN marks a step not computed yet.
DEAD, UNKNOWN = 0, -1

# UTF-8: the length of the character a lead byte starts (0: not a lead byte), the smallest code point
# of each length (shorter encodings are overlong), and the second bytes allowed after the four lead bytes
# whose second byte is restricted (overlongs, surrogates, beyond U+10FFFF).
_LENGTH = bytes([1] * 0x80 + [0] * 0x42 + [2] * 0x1E + [3] * 0x10 + [4] * 0x05 + [0] * 0x0B)
_MIN_CP = (0, 0, 0x80, 0x800, 0x10000)
_SECOND_BYTE = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}
_LEAD_MARK = (0, 0, 0xC0, 0xE0, 0xF0)


class GrammarMatchError(ValueError):
    """A token the grammar does not allow here was accepted."""


def _lead_byte(cp: int) -> int:
    return chr(cp).encode("utf-8", "surrogatepass")[0]


def _class_lead_bytes(ranges: Iterable[tuple[int, int]]) -> np.ndarray:
    """(256,) bool: the first UTF-8 bytes of the code points in `ranges` (lead bytes are monotonic in the code
    point, so a range's leads are one interval)."""
    out = np.zeros(256, dtype=bool)
    for lo, hi in ranges:
        out[_lead_byte(lo):_lead_byte(hi) + 1] = True
    return out


# ---- the vocabulary trie ------------------------------------------------------------------------------


class VocabIndex:
    """A tokenizer's vocabulary as bytes and as a trie, built once per tokenizer.

    Arrays (N = trie nodes, node 0 the root, breadth-first so that every node's children are contiguous
    and sorted by byte):
        first_child (N,) int32   index of the node's first child
        n_child     (N,) int32   how many children
        parent      (N,) int32   the node's parent (root: 0)
        node_byte   (N,) int32   the byte on the edge into the node (root: 0)
        level_start (D+2,) int64 the nodes of depth d are level_start[d]:level_start[d+1] (D the deepest)
        tok_start   (N+1,) int32 tokens ending at node n are tok_ids[tok_start[n]:tok_start[n+1]]
        tok_ids     (T,) int32   the trie's tokens grouped by node
        token_node  (V,) int64   each token's node; N (one past the last node) for tokens not in the trie
    `pieces[t]` is token t's bytes, None for a token never allowed by a grammar (control, unknown, or empty);
    `eog_ids` the end-of-generation tokens (allowed when the grammar can end).
    """

    _cache: weakref.WeakKeyDictionary[Any, VocabIndex] = weakref.WeakKeyDictionary()
    _cache_lock = threading.Lock()

    def __init__(self, pieces: Sequence[bytes | None], eog_ids: Iterable[int]) -> None:
        self.n_vocab = len(pieces)
        self.eog_ids = np.array(sorted(set(eog_ids)), dtype=np.int64)
        self.pieces: list[bytes | None] = [p if p else None for p in pieces]
        for t in self.eog_ids.tolist():
            self.pieces[t] = None
        self._build_trie()

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> VocabIndex:
        """The index of a tokenizer (pyllm.text.tokenizer.Tokenizer, or anything with n_vocab, token_to_piece and
        is_eog), built on first use and kept while the tokenizer lives."""
        with cls._cache_lock:
            index = cls._cache.get(tokenizer)
            if index is None:
                index = cls._cache[tokenizer] = cls.from_tokenizer(tokenizer)
            return index

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> VocabIndex:
        n = tokenizer.n_vocab
        # token_to_piece without `special` renders control and unknown tokens as b"": never allowed
        pieces = [tokenizer.token_to_piece(t) for t in range(n)]
        eog = getattr(tokenizer, "eog_ids", None)
        if eog is None:
            eog = [t for t in range(n) if tokenizer.is_eog(t)]
        return cls(pieces, eog)

    def _build_trie(self) -> None:
        """Level by level: the nodes of depth L are the distinct (parent node, byte L) pairs of the tokens at
        least L bytes long; np.unique numbers them sorted by parent then byte, hence breadth-first."""
        ids = np.array([t for t, p in enumerate(self.pieces) if p is not None], dtype=np.int64)
        lengths = np.array([len(self.pieces[t]) for t in ids.tolist()], dtype=np.int64)  # type: ignore[arg-type]
        flat = np.frombuffer(b"".join(self.pieces[t] for t in ids.tolist()), dtype=np.uint8)  # type: ignore[misc]
        offsets = np.zeros(ids.shape[0], dtype=np.int64)
        if ids.shape[0]:
            offsets[1:] = np.cumsum(lengths)[:-1]
        node = np.zeros(ids.shape[0], dtype=np.int64)       # each token's node at the current depth
        parents, edge_bytes = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
        n_nodes = 1
        active = np.arange(ids.shape[0])
        depth = 0
        while active.shape[0]:
            depth += 1
            active = active[lengths[active] >= depth]
            if not active.shape[0]:
                break
            key = node[active] * 256 + flat[offsets[active] + depth - 1]
            uniq, inverse = np.unique(key, return_inverse=True)
            node[active] = n_nodes + inverse
            parents.append(uniq // 256)
            edge_bytes.append(uniq % 256)
            n_nodes += uniq.shape[0]
        parent = np.concatenate(parents)
        self.n_nodes = n_nodes
        self.parent = parent.astype(np.int32)
        self.node_byte = np.concatenate(edge_bytes).astype(np.int32)
        self.level_start = np.cumsum([0] + [p.shape[0] for p in parents] + [0])
        self.n_child = np.bincount(parent[1:], minlength=n_nodes).astype(np.int32)
        # parents are non-decreasing along the node order, so a node's children start where its id first appears
        self.first_child = (np.searchsorted(parent[1:], np.arange(n_nodes), side="left") + 1).astype(np.int32)
        self.max_depth = len(parents) - 1
        order = np.argsort(node, kind="stable")
        self.tok_ids = ids[order].astype(np.int32)
        self.tok_start = np.searchsorted(node[order], np.arange(n_nodes + 1), side="left").astype(np.int32)
        self.token_node = np.full(self.n_vocab, n_nodes, dtype=np.int64)
        self.token_node[ids] = node

    def __repr__(self) -> str:
        return f"VocabIndex({self.n_vocab} tokens, {self.n_nodes} trie nodes, depth {self.max_depth})"


# ---- the automaton: interned states, the byte transition table, the mask cache ----------------------

# A partial character: ("x", bits so far, bytes still to come, its length) exactly, or ("c", code point,
# bytes still to come) once only its segment matters (the code point stands for the segment).
Partial = tuple
State = tuple  # (stacks: frozenset of tuples, partial or None)


class _MaskEntry:
    """A cached mask: `ids` are the allowed tokens (allow=True) or the banned ones (allow=False), whichever list
    is shorter, sorted; `n_allowed` counts the allowed trie tokens (EOG aside)."""
    __slots__ = ("allow", "ids", "n_allowed")

    def __init__(self, allow: bool, ids: np.ndarray, n_allowed: int) -> None:
        self.allow, self.ids, self.n_allowed = allow, ids, n_allowed


class _Automaton:
    """One grammar over one vocabulary: the states met so far, the transition table, the masks. Shared by
    all matchers of the pair (and so across requests that reuse a compiled grammar); thread-safe."""

    MASK_CACHE_BYTES = 64 << 20  # per grammar and vocabulary; the oldest masks go first
    # The table takes 1 KiB a state: past this many states it starts again (empty), the matchers finding
    # their states again by their keys (an epoch tells them). Also keeps state * 256 within int32.
    MAX_STATES = 1 << 17

    def __init__(self, grammar: Grammar, vocab: VocabIndex) -> None:
        self.grammar = grammar
        self.vocab = vocab
        self._lock = threading.RLock()
        self._class_leads = [_class_lead_bytes(c.ranges) for c in grammar.classes]
        self._leads_memo: dict[frozenset[int], np.ndarray] = {}
        self._bounds_memo: dict[frozenset[int], list[int]] = {}
        self.lookups = 0                  # (trie node, state) pairs looked up by mask walks: their whole cost
        self.epoch = -1
        self._reset()

    def _reset(self) -> None:
        self.epoch += 1
        self._states: list[State] = [(frozenset(), None)]   # state 0: dead, every byte leads back to it
        self._ids: dict[State, int] = {}
        self._table = np.empty((64, 256), dtype=np.int32)
        self._table[0] = DEAD
        self._masks: OrderedDict[int, _MaskEntry] = OrderedDict()
        self._mask_bytes = 0
        self.initial = self._intern((self.grammar.initial, None))

    def resolve(self, key: State, sid: int, epoch: int) -> int:
        """The id of state `key` now (`sid` if the table has not started again since `epoch`); call with the lock
        held. The entry points of the matchers come here first, so a restart never happens inside a walk."""
        if len(self._states) > self.MAX_STATES:
            self._reset()
        return sid if epoch == self.epoch else self._intern(key)

    # -- states --

    def state(self, sid: int) -> State:
        return self._states[sid]

    @property
    def n_states(self) -> int:
        return len(self._states)

    def _intern(self, key: State) -> int:
        sid = self._ids.get(key)
        if sid is not None:
            return sid
        sid = len(self._states)
        self._states.append(key)
        self._ids[key] = sid
        if sid == self._table.shape[0]:
            grown = np.empty((2 * sid, 256), dtype=np.int32)
            grown[:sid] = self._table
            self._table = grown
        stacks, partial = key
        row = self._table[sid]
        if partial is not None:
            row.fill(DEAD)
            row[0x80:0xC0] = UNKNOWN
        else:
            row[:] = np.where(self._lead_bytes(stacks), UNKNOWN, DEAD)
        return sid

    def _top_classes(self, stacks: frozenset[tuple[int, ...]]) -> frozenset[int]:
        args = self.grammar.args
        return frozenset(args[s[-1]] for s in stacks if s)

    def _lead_bytes(self, stacks: frozenset[tuple[int, ...]]) -> np.ndarray:
        """(256,) bool: the bytes that can start a character some stack waits on."""
        tops = self._top_classes(stacks)
        leads = self._leads_memo.get(tops)
        if leads is None:
            leads = np.zeros(256, dtype=bool)
            for c in tops:
                leads |= self._class_leads[c]
            self._leads_memo[tops] = leads
        return leads

    def _segment(self, stacks: frozenset[tuple[int, ...]], lo: int, hi: int) -> int | None:
        """The first code point of the segment holding all of [lo, hi], or None when [lo, hi] straddles a bound
        of the classes the stacks wait on. Any code point of a segment is in the same classes, so it can stand
        for the character still being written (whose remaining bytes can only make a valid one: the restricted
        second bytes are checked before)."""
        tops = self._top_classes(stacks)
        bounds = self._bounds_memo.get(tops)
        if bounds is None:
            edges = set()
            for c in tops:
                for a, b in self.grammar.classes[c].ranges:
                    edges.add(a)
                    edges.add(b + 1)
            bounds = self._bounds_memo[tops] = sorted(edges)
        i = bisect.bisect_right(bounds, lo)          # bounds[i] is the first bound above lo
        if i < len(bounds) and bounds[i] <= hi:
            return None
        return bounds[i - 1] if i > 0 else 0

    # -- one byte --

    def step(self, sid: int, byte: int) -> int:
        """The state after `byte` (DEAD if it cannot come next), through the table (call with the lock held)."""
        nxt = int(self._table[sid, byte])
        if nxt == UNKNOWN:
            nxt = self._step(sid, byte)
            self._table[sid, byte] = nxt
        return nxt

    def _step(self, sid: int, b: int) -> int:
        stacks, partial = self._states[sid]
        g = self.grammar
        if partial is None:
            n = _LENGTH[b]
            if n == 1:
                nxt = g.accept_char(stacks, b)
                return self._intern((nxt, None)) if nxt else DEAD
            if n == 0:
                return DEAD
            return self._partial(stacks, b & (0x7F >> n), n - 1, n)
        if not 0x80 <= b <= 0xBF:
            return DEAD
        if partial[0] == "c":
            _, cp, rem = partial
            if rem > 1:
                return self._intern((stacks, ("c", cp, rem - 1)))
        else:
            _, value, rem, n = partial
            if rem == n - 1:                          # the first continuation byte: some leads restrict it
                allowed = _SECOND_BYTE.get(_LEAD_MARK[n] | value)
                if allowed is not None and not allowed[0] <= b <= allowed[1]:
                    return DEAD
            value = (value << 6) | (b & 0x3F)
            if rem > 1:
                return self._partial(stacks, value, rem - 1, n)
            cp = value
        nxt = g.accept_char(stacks, cp)
        return self._intern((nxt, None)) if nxt else DEAD

    def _partial(self, stacks: frozenset[tuple[int, ...]], value: int, rem: int, n: int) -> int:
        """The state inside a character of n bytes with `rem` still to come and bits `value` so far."""
        lo = max(value << (6 * rem), _MIN_CP[n])
        hi = min((value << (6 * rem)) | ((1 << (6 * rem)) - 1), MAX_CODE_POINT)
        lead_only = rem == n - 1
        if lead_only and (_LEAD_MARK[n] | value) == 0xED:
            hi = min(hi, 0xD7FF)                      # the rest of ED's range is surrogates
        if lo > hi or not self.grammar.accepts_some(stacks, lo, hi):
            return DEAD
        if not (lead_only and (_LEAD_MARK[n] | value) in _SECOND_BYTE):  # no restricted byte still to come
            cp = self._segment(stacks, lo, hi)
            if cp is not None:
                return self._intern((stacks, ("c", cp, rem)))
        return self._intern((stacks, ("x", value, rem, n)))

    def run(self, sid: int, data: bytes) -> int:
        """The state after `data` (DEAD as soon as a byte cannot come next; call with the lock held)."""
        for b in data:
            sid = self.step(sid, b)
            if sid == DEAD:
                break
        return sid

    # -- masks --

    def mask(self, sid: int) -> _MaskEntry:
        """The mask of state `sid`, from the cache or walked (call with the lock held)."""
        with self._lock:
            entry = self._masks.get(sid)
            if entry is not None:
                self._masks.move_to_end(sid)
                return entry
            allowed = self._walk(sid)
            n = self.vocab.n_vocab
            if allowed.dtype == np.bool_:
                n_allowed = int(np.count_nonzero(allowed))
                allow = n_allowed * 2 <= n
                entry = _MaskEntry(allow, np.flatnonzero(allowed if allow else ~allowed).astype(np.int32), n_allowed)
            elif allowed.shape[0] * 2 <= n:
                entry = _MaskEntry(True, allowed, allowed.shape[0])
            else:
                keep = np.ones(n, dtype=bool)
                keep[allowed] = False
                entry = _MaskEntry(False, np.flatnonzero(keep).astype(np.int32), allowed.shape[0])
            self._masks[sid] = entry
            self._mask_bytes += entry.ids.nbytes + 64
            while self._mask_bytes > self.MASK_CACHE_BYTES and len(self._masks) > 1:
                _, old = self._masks.popitem(last=False)
                self._mask_bytes -= old.ids.nbytes + 64
        return entry

    def _lookup(self, states: np.ndarray, edge_bytes: np.ndarray) -> np.ndarray:
        """The table's entries for (state, byte) pairs, computing the UNKNOWN ones."""
        flat = states * 256                        # int32: the table holds far fewer than 2**23 states
        flat += edge_bytes
        self.lookups += flat.shape[0]
        nxt = np.take(self._table.ravel(), flat)
        if nxt.min() < 0:                          # some UNKNOWN
            unknown = nxt == UNKNOWN
            todo = flat[unknown]
            for key in np.unique(todo).tolist():
                s, b = divmod(key, 256)
                r = self._step(s, b)                # may grow the table: store after
                self._table[s, b] = r
            nxt[unknown] = np.take(self._table.ravel(), todo)
        return nxt

    def _walk(self, sid: int) -> np.ndarray:
        """The tokens allowed in state `sid`: the trie walked one depth at a time beside the transition table.

        A depth is done sparsely (the children of the live nodes only) while few nodes live, densely (every
        node of the depth, its parent's state gathered; dead parents lead to DEAD) when most do. Returns
        the sorted allowed ids when every depth was sparse, else an (n_vocab,) bool mask."""
        v = self.vocab
        node_state = np.zeros(v.n_nodes + 1, dtype=np.int32)  # the last slot: tokens not in the trie
        node_state[0] = sid
        level = v.level_start
        nodes = np.zeros(1, dtype=np.int64)                   # the live nodes of the previous depth (sparse)
        states = np.full(1, sid, dtype=np.int32)
        dense = went_dense = False
        live: list[np.ndarray] = []
        for depth in range(1, v.max_depth + 1):
            lo, hi = int(level[depth]), int(level[depth + 1])
            if not dense:
                counts = v.n_child[nodes]
                total = int(counts.sum())
                if total == 0:
                    break
                if total * 4 < hi - lo:
                    ends = np.cumsum(counts)
                    child = np.arange(total, dtype=np.int64) + np.repeat(v.first_child[nodes] - (ends - counts),
                                                                         counts)
                    nxt = self._lookup(np.repeat(states, counts), v.node_byte[child])
                    ok = nxt != DEAD
                    nodes, states = child[ok], nxt[ok]
                    if not nodes.shape[0]:
                        break
                    node_state[nodes] = states
                    live.append(nodes)
                    continue
            dense = went_dense = True
            nxt = self._lookup(node_state[v.parent[lo:hi]], v.node_byte[lo:hi])
            node_state[lo:hi] = nxt
            n_live = int(np.count_nonzero(nxt))
            if n_live == 0:
                break
            if n_live * 16 < int(level[depth + 2]) - hi:   # few live: the next depth goes sparse
                dense = False
                nodes = np.flatnonzero(nxt) + lo
                states = nxt[nodes - lo]
        if went_dense:
            return node_state[v.token_node] != DEAD
        if not live:
            return np.empty(0, dtype=np.int32)
        alive = np.concatenate(live)
        start = v.tok_start[alive]
        counts = v.tok_start[alive + 1] - start
        sel = counts > 0
        start, counts = start[sel], counts[sel]
        ends = np.cumsum(counts)
        idx = np.arange(int(ends[-1]) if ends.shape[0] else 0, dtype=np.int64) + np.repeat(start - (ends - counts),
                                                                                            counts)
        return np.sort(v.tok_ids[idx])

_automata: weakref.WeakKeyDictionary[Grammar, weakref.WeakKeyDictionary[VocabIndex, _Automaton]] = \
    weakref.WeakKeyDictionary()
_automata_lock = threading.Lock()


def _automaton(grammar: Grammar, vocab: VocabIndex) -> _Automaton:
    with _automata_lock:
        per_vocab = _automata.get(grammar)
        if per_vocab is None:
            per_vocab = _automata[grammar] = weakref.WeakKeyDictionary()
        auto = per_vocab.get(vocab)
        if auto is None:
            auto = per_vocab[vocab] = _Automaton(grammar, vocab)
        return auto


# ---- the matcher ----------------------------------------------------------------------------------------


class GrammarMatcher:
    """One sequence's position in a grammar: which tokens may come next, and advancing by a token.

    Cheap to copy (a state id and its key); every matcher of the same (grammar, vocabulary) shares one
    automaton, so a mask computed for one sequence serves every later sequence that reaches the same state.
    """

    __slots__ = ("_auto", "_sid", "_epoch", "_key", "_ended")

    def __init__(self, grammar: Grammar, vocab: VocabIndex) -> None:
        auto = self._auto = _automaton(grammar, vocab)
        with auto._lock:
            self._sid, self._epoch = auto.initial, auto.epoch
            self._key = auto.state(self._sid)
        self._ended = False

    def copy(self) -> GrammarMatcher:
        other = object.__new__(GrammarMatcher)
        other._auto, other._sid, other._epoch, other._key, other._ended = (self._auto, self._sid, self._epoch,
                                                                             self._key, self._ended)
        return other

    @property
    def grammar(self) -> Grammar:
        return self._auto.grammar

    @property
    def vocab(self) -> VocabIndex:
        return self._auto.vocab

    @property
    def state_key(self) -> State:
        """The canonical state (the stack set and the partial character): equal keys give equal masks."""
        return self._key

    @property
    def can_end(self) -> bool:
        """Whether an end-of-generation token may come now: a whole `root` matched, no character half-written."""
        stacks, partial = self._key
        return partial is None and () in stacks and not self._ended

    @property
    def is_complete(self) -> bool:
        """Whether nothing but the end may come: the grammar has matched and cannot go on (or it has ended)."""
        stacks, partial = self._key
        return self._ended or (partial is None and stacks == frozenset(((),)))

    def _entry(self) -> _MaskEntry:
        auto = self._auto
        with auto._lock:
            self._sid, self._epoch = auto.resolve(self._key, self._sid, self._epoch), auto.epoch
            return auto.mask(self._sid)

    def _run(self, data: bytes) -> bool:
        auto = self._auto
        with auto._lock:
            sid = auto.run(auto.resolve(self._key, self._sid, self._epoch), data)
            if sid == DEAD:
                return False
            self._sid, self._epoch, self._key = sid, auto.epoch, auto.state(sid)
        return True

    def allowed(self, out: np.ndarray | None = None) -> np.ndarray:
        """(n_vocab,) bool: the tokens that may come next (into `out` if given)."""
        n = self.vocab.n_vocab
        if out is None:
            out = np.empty(n, dtype=bool)
        if self._ended:
            out.fill(False)
            return out
        entry = self._entry()
        out.fill(not entry.allow)
        out[entry.ids] = entry.allow
        out[self.vocab.eog_ids] = self.can_end
        return out

    def allowed_ids(self) -> np.ndarray:
        """The sorted ids of the tokens that may come next."""
        return np.flatnonzero(self.allowed()).astype(np.int64)

    def mask_logits(self, logits: np.ndarray) -> None:
        """Set the logits (float32, (n,) with n >= n_vocab) of the tokens that may not come next to -inf, in place.
        Raises GrammarError when no token may come next."""
        if self._ended:
            raise GrammarError("the grammar has ended: no token may come next")
        entry = self._entry()
        vocab = self.vocab
        can_end = self.can_end
        if entry.n_allowed == 0 and not can_end:
            raise GrammarError("no token of the vocabulary can continue the grammar here")
        n = vocab.n_vocab
        if logits.shape[0] < n:
            raise GrammarError(f"the logits have {logits.shape[0]} entries, the grammar's vocabulary {n}")
        eog = vocab.eog_ids
        saved = logits[eog] if can_end else None
        if entry.allow:
            vals = logits[entry.ids]
            logits.fill(-np.inf)
            logits[entry.ids] = vals
        else:
            logits[entry.ids] = -np.inf
            logits[n:] = -np.inf
        if saved is not None:
            logits[eog] = saved

    def accept(self, token: int) -> None:
        """Advance by one token; GrammarMatchError if the grammar does not allow it here."""
        vocab = self.vocab
        if not 0 <= token < vocab.n_vocab:
            raise GrammarMatchError(f"token {token} is outside the vocabulary")
        piece = vocab.pieces[token]
        if piece is None:
            if token in vocab.eog_ids and self.can_end:
                self._ended = True
                return
            raise GrammarMatchError(f"token {token} (special or empty) is not allowed by the grammar here")
        if self._ended:
            raise GrammarMatchError("the grammar has ended")
        if not self._run(piece):
            raise GrammarMatchError(f"token {token} ({piece!r}) is not allowed by the grammar here")

    def accept_bytes(self, data: bytes) -> None:
        """Advance by raw bytes (text already written, such as a forced prefix)."""
        if self._ended or not self._run(data):
            raise GrammarMatchError(f"{data!r} is not allowed by the grammar here")


# ---- the reference ------------------------------------------------------------------------------------

_PREFIX_RANGES: dict[bytes, tuple[int, int]] | None = None


def _prefix_ranges() -> dict[bytes, tuple[int, int]]:
    """Every proper prefix of a valid UTF-8 character -> the (lowest, highest) code point it can start, by
    encoding every code point (UTF-8 keeps code point order, so each prefix's code points are one run)."""
    global _PREFIX_RANGES
    if _PREFIX_RANGES is None:
        table: dict[bytes, tuple[int, int]] = {}
        for cp in range(0x80, MAX_CODE_POINT + 1):
            if 0xD800 <= cp <= 0xDFFF:
                continue
            e = chr(cp).encode("utf-8")
            for k in range(1, len(e)):
                p = e[:k]
                old = table.get(p)
                table[p] = (cp, cp) if old is None else (old[0], cp)
        _PREFIX_RANGES = table
    return _PREFIX_RANGES


class ReferenceMatcher:
    """The slow, obviously correct matcher: a set of stacks and the bytes of a half-written character; a
    token is allowed when its bytes, decoded by Python's UTF-8 codec after the pending ones, run through the
    grammar one code point at a time (a character left incomplete must be a valid prefix that some stack can
    still take)."""

    def __init__(self, grammar: Grammar, vocab: VocabIndex) -> None:
        self.grammar = grammar
        self.vocab = vocab
        self.stacks = grammar.initial
        self.pending = b""
        self._memo: dict[tuple[frozenset, int], frozenset] = {}
        self._prefixes = _prefix_ranges()

    def _char(self, stacks: frozenset, cp: int) -> frozenset:
        key = (stacks, cp)
        out = self._memo.get(key)
        if out is None:
            out = self._memo[key] = self.grammar.accept_char(stacks, cp)
        return out

    def _run(self, data: bytes) -> tuple[frozenset, bytes] | None:
        stacks, buf, i = self.stacks, self.pending + data, 0
        while i < len(buf):
            lead = buf[i]
            n = 1 if lead < 0x80 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else \
                4 if lead >> 3 == 0b11110 else 0
            if n == 0:
                return None
            if i + n > len(buf):                      # a character left incomplete
                rng = self._prefixes.get(buf[i:])
                if rng is None or not self.grammar.accepts_some(stacks, *rng):
                    return None
                return stacks, buf[i:]
            try:
                ch = buf[i:i + n].decode("utf-8")
            except UnicodeDecodeError:
                return None
            stacks = self._char(stacks, ord(ch))
            if not stacks:
                return None
            i += n
        return stacks, b""

    @property
    def can_end(self) -> bool:
        return not self.pending and () in self.stacks

    def allowed_ids(self) -> np.ndarray:
        ids = [t for t, piece in enumerate(self.vocab.pieces) if piece is not None and self._run(piece) is not None]
        if self.can_end:
            ids.extend(self.vocab.eog_ids.tolist())
        return np.array(sorted(ids), dtype=np.int64)

    def accept(self, token: int) -> None:
        piece = self.vocab.pieces[token]
        result = self._run(piece) if piece is not None else None
        if result is None:
            raise GrammarMatchError(f"token {token} is not allowed here")
        self.stacks, self.pending = result
