"""Pooling models: embeddings from a model's final hidden states (vLLM's runner="pooling")."""
