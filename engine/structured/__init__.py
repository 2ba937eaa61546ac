"""Structured outputs (JSON schema, regex, choice, grammar) through xgrammar and llguidance."""
