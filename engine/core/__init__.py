"""Deciding what runs each step: requests, scheduler, KV-cache blocks (ints and lists, no arrays)."""
