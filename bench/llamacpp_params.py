"""Set fields of the parameter structs llama-cpp-python's `Llama` builds from llama.cpp's defaults.

`Llama` takes no argument for some of llama.cpp's settings (repacked weight layouts, an eval callback).
This context manager swaps the bindings' default-params factory for one that sets them:

    with llama_cpp_defaults("llama_model_default_params", use_extra_bufts=False):
        ref = llama_cpp.Llama(model_path=path)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def llama_cpp_defaults(factory: str, **fields: object) -> Iterator[None]:
    """factory: "llama_model_default_params" or "llama_context_default_params"; fields: struct fields to set."""
    import llama_cpp.llama as bindings

    default_params = getattr(bindings.llama_cpp, factory)

    def params():
        p = default_params()
        for name, value in fields.items():
            setattr(p, name, value)
        return p

    setattr(bindings.llama_cpp, factory, params)
    try:
        yield
    finally:
        setattr(bindings.llama_cpp, factory, default_params)
