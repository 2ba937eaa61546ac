"""The sampling fields the scheduler and the KV manager read, without a model, and a request built on them."""
from dataclasses import dataclass

from engine.core.request import Request


@dataclass
class SP:
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list | None = None
    n: int = 1
    prompt_logprobs: int | None = None


def req(rid, tokens, **sp):
    return Request(rid, tokens, SP(**sp), max_model_len=1024)
