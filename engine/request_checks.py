"""A prompt in any of its forms -> token ids, and the checks a request passes before the engine queues it.

Pure functions of load-time facts (vocabulary size, max_model_len), so callers on any thread can run them.
"""
from __future__ import annotations

from typing import Optional, Union

import numpy as np

from engine.sample.sampling import SamplingParams

PromptType = Union[str, dict, list]


def encode_prompt(tokenizer, prompt: PromptType) -> tuple[Optional[str], list[int]]:
    """(text or None, token ids) of a string, a list of token ids, or a {"prompt" | "prompt_token_ids"} dict."""
    if isinstance(prompt, str):
        return prompt, tokenizer.encode(prompt)
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
        if "prompt" in prompt:
            return prompt["prompt"], tokenizer.encode(prompt["prompt"])
        raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, (int, np.integer)) for t in prompt):
        return None, [int(t) for t in prompt]
    raise TypeError(f"prompt must be a string, a list of token ids or a dict, got {type(prompt).__name__}")


def token_type_ids(prompt: PromptType, num_ids: int, num_types: int) -> tuple[int, ...]:
    """A {"prompt_token_ids", "token_type_ids"} prompt's token types (vLLM's TokensPrompt), checked against the model's
    number of types; () where the prompt gives none."""
    types = prompt.get("token_type_ids") if isinstance(prompt, dict) else None
    if types is None:
        return ()
    if not num_types:
        raise ValueError("token_type_ids are for models with token types (BERT's segment embeddings); this model has "
                         "none")
    if "prompt_token_ids" not in prompt:
        raise ValueError("token_type_ids go with prompt_token_ids")
    types = [int(t) for t in types]
    if len(types) != num_ids:
        raise ValueError(f"token_type_ids has {len(types)} entries for {num_ids} prompt tokens")
    if any(not 0 <= t < num_types for t in types):
        raise ValueError(f"token_type_ids must lie in [0, {num_types})")
    return tuple(types)


def validate_request(prompt_token_ids: list[int], params: SamplingParams, vocab_size: int,
                     max_model_len: int) -> None:
    """Raises ValueError / TypeError for a request the engine cannot run: an empty or too long prompt, token
    ids outside the vocabulary (prompt, stop_token_ids, logit_bias), top_k above the vocabulary."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
    ids = prompt_token_ids
    if not ids:
        raise ValueError("the prompt is empty")
    if len(ids) > max_model_len:
        raise ValueError(f"the prompt has {len(ids)} tokens, more than max_model_len ({max_model_len})")
    bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, (int, np.integer))
                or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt token id {bad!r} is outside the vocabulary (size {vocab_size})")
    params.verify_token_ids(vocab_size)
