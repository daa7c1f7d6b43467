"""Text: tokenizers (SentencePiece-style and byte-level BPE with their pre-tokenizers) and chat templates."""
