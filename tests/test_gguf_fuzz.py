"""The loader fuzzer (tests/fuzz/gguf_fuzz.py) at CI size: a few thousand mutated GGUF files, each read in this
process and loaded and run (one token) in a worker process, with no crash, hang or unexpected exception."""

from __future__ import annotations

import json
from pathlib import Path

from fuzz.gguf_fuzz import BAD_OUTCOMES, fuzz

FILES = 2500


def test_mutated_files_run_or_are_refused_cleanly(tmp_path: Path) -> None:
    report = fuzz(FILES, seed=20250601, keep=tmp_path / "bad")
    bad = "\n".join(json.dumps(b) for b in report.bad[:10])
    assert not any(report.outcomes[o] for o in BAD_OUTCOMES), f"{report.summary()}\n{bad}"
    assert report.files == FILES
    assert not report.mutator_failures, report.mutator_failures[0]
    # both sides of the loader are reached: files that load and run, and files refused past the reader
    assert report.outcomes["ran"] >= FILES // 20, report.summary()
    assert report.outcomes["error"] - report.reader_errors >= FILES // 5, report.summary()
