"""Tokenizers (GGUF metadata or HF folders), incremental detokenizing, chat templates."""
