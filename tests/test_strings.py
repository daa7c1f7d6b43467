"""`pyllm.strings.StringArray` and its C hash index, held to a dict and a list."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pyllm.strings import StringArray


def _random_strings(rng: random.Random, n: int) -> list[str]:
    alphabet = ["a", "b", "▁", "ü", "日", "😀", " ", "\n", "<", ">"]
    return ["".join(rng.choices(alphabet, k=rng.randint(0, 6))) for _ in range(n)]


@pytest.mark.parametrize("n", [0, 1, 7, 1000, 20000])
def test_find_and_first_repeat_agree_with_a_dict(n: int) -> None:
    rng = random.Random(n)
    strings = _random_strings(rng, n)  # short texts from a small alphabet: many repeats, "" among them
    array = StringArray.from_strings(strings)
    first: dict[str, int] = {}
    first_repeat = -1
    for i, s in enumerate(strings):
        if s in first and first_repeat < 0:
            first_repeat = i
        first.setdefault(s, i)
    assert len(array) == n
    assert list(array) == strings
    assert array == strings
    assert [array[i] for i in range(n)] == strings
    assert array.first_repeat() == first_repeat
    for s in [*strings[:3000], *_random_strings(rng, 3000), "never there", "ab" * 40]:
        assert array.find(s) == first.get(s, -1), s
        assert array.find(s.encode()) == first.get(s, -1), s
        assert (s in array) == (s in first)


def test_prefixes_and_bytes_are_told_apart() -> None:
    array = StringArray.from_strings(["ab", "a", "abc", "", "b\x00c", "b"])
    assert [array.find(s) for s in ["ab", "a", "abc", "", "b\x00c", "b", "b\x00", "abcd"]] == [0, 1, 2, 3, 4, 5, -1, -1]
    assert array.first_repeat() == -1
    assert array.find("\ud800") == -1  # a lone surrogate is no UTF-8 text
    assert array.raw(-1) == b"b" and array[1:3] == ["a", "abc"]
    with pytest.raises(IndexError):
        array[6]


def test_packed_offsets_are_checked() -> None:
    StringArray(b"abc", np.array([0, 1, 3]))
    for offsets in ([1, 3], [0, 2], [0, 2, 1, 3], []):
        with pytest.raises(ValueError, match="offsets"):
            StringArray(b"abc", np.array(offsets, np.int64))
