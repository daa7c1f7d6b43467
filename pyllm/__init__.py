"""pyllm: CPU-first quantized LLM inference on GGUF models."""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

__all__ = ["Llama", "LlamaGrammar", "LlamaState"]

if TYPE_CHECKING:
    from .grammar import LlamaGrammar
    from .llama import Llama
    from .state import LlamaState


def __getattr__(name: str):
    """`pyllm.Llama` on first use: `pyllm bench` and the kernels need none of its modules (the engine, the chat
    templates' jinja2), and each one loaded is resident memory a benchmark's peak RSS counts."""
    if name == "Llama":
        from .llama import Llama

        globals()["Llama"] = Llama
        return Llama
    if name == "LlamaGrammar":
        from .grammar import LlamaGrammar

        globals()["LlamaGrammar"] = LlamaGrammar
        return LlamaGrammar
    if name == "LlamaState":
        from .state import LlamaState

        globals()["LlamaState"] = LlamaState
        return LlamaState
    raise AttributeError(f"module 'pyllm' has no attribute {name!r}")
