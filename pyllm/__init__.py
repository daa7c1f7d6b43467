"""pyllm: CPU-first quantized LLM inference on GGUF models."""

__version__ = "0.1.0"

from .llama import Llama  # noqa: E402

__all__ = ["Llama"]
