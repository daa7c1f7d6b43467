"""Fuzzers: `python -m tests.fuzz.gguf_fuzz --help` (from the repository root)."""
