"""Anthropic usage reports the prefix cache: cache_read_input_tokens for hits, cache_creation_input_tokens for
the prompt's blocks computed and cached, input_tokens for the rest; streamed and not."""
from __future__ import annotations

import uuid

import anthropic
import pytest

from tests.engine.entrypoints.server.conftest import MODEL

BLOCK_SIZE = 16  # the server's --block-size (the default)


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0, timeout=60)


def _long_prompt() -> list[dict]:
    # A fresh prefix (nothing cached yet) of about 200 tokens.
    text = f"[{uuid.uuid4().hex}] " + "The quick brown fox jumps over the lazy dog. " * 20
    return [{"role": "user", "content": text}]


def _split(usage) -> tuple[int, int, int]:
    return usage.input_tokens, usage.cache_creation_input_tokens, usage.cache_read_input_tokens


def test_second_identical_prompt_reads_the_cache(client):
    msgs = _long_prompt()
    total = client.messages.count_tokens(model=MODEL, messages=msgs).input_tokens
    assert total > 8 * BLOCK_SIZE
    kw = dict(model=MODEL, max_tokens=2, messages=msgs, extra_body={"temperature": 0.0})
    first = _split(client.messages.create(**kw).usage)
    assert first == (total % BLOCK_SIZE, total - total % BLOCK_SIZE, 0)  # every full block written, none read
    second = _split(client.messages.create(**kw).usage)
    assert second[2] > 0 and second[2] % BLOCK_SIZE == 0 and sum(second) == total
    assert second[0] < BLOCK_SIZE  # only the last, partial block's tokens were neither read nor written


def test_streamed_usage_reports_the_cache(client):
    msgs = _long_prompt()
    total = client.messages.count_tokens(model=MODEL, messages=msgs).input_tokens
    kw = dict(model=MODEL, max_tokens=2, messages=msgs, extra_body={"temperature": 0.0})
    client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    start = next(e for e in events if e.type == "message_start").message.usage
    delta = next(e for e in events if e.type == "message_delta").usage
    assert start.cache_read_input_tokens > 0 and sum(_split(start)) == total
    assert (delta.input_tokens, delta.cache_creation_input_tokens, delta.cache_read_input_tokens) == _split(start)
    assert _split(final.usage) == _split(start) and final.usage.output_tokens == delta.output_tokens >= 1
