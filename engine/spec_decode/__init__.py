"""Speculative decoding: proposers guess the next tokens, one batched step checks them all."""
