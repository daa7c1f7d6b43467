"""pyllm: CPU-first quantized LLM inference on GGUF models."""

__version__ = "0.1.0"
