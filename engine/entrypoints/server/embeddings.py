"""OpenAI's /v1/embeddings for pooling models (runner="pooling"): strings or token ids in, one vector per input, as
floats or base64 (little-endian float32, what the openai SDK asks for by default)."""
from __future__ import annotations

import base64
import time
import uuid

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from engine.entrypoints.server import openapi
from engine.entrypoints.server.errors import bad_request
from engine.entrypoints.server.protocol import EmbeddingRequest
from engine.entrypoints.server.responses import EmbeddingResponse
from engine.entrypoints.server.serving import add_requests, collect, state_of, unless_disconnected
from engine.pooling.params import PoolingParams

router = APIRouter()


@router.post("/v1/embeddings", response_model=EmbeddingResponse,
             responses=openapi.errors(*openapi.GENERATION_ERRORS))
async def create_embedding(body: EmbeddingRequest, request: Request):
    st = state_of(request)
    model = st.check_model(body.model)
    try:
        params = PoolingParams(dimensions=body.dimensions, normalize=body.normalize)
    except ValueError as e:
        raise bad_request(str(e), "dimensions") from e
    prompts = await _inputs(st, body)
    rid = f"embd-{uuid.uuid4().hex}"
    added, streams = await unless_disconnected(request, add_requests(st, rid, prompts, params))
    if not added:
        return Response(status_code=499)
    completed, finals = await unless_disconnected(request, collect(streams))
    if not completed:
        return Response(status_code=499)
    data = [{"object": "embedding", "index": i, "embedding": _encode(out.pooled, body.encoding_format)}
            for i, out in enumerate(finals)]
    n = sum(len(ids) for _, ids in prompts)
    return {"id": rid, "object": "list", "created": int(time.time()), "model": model, "data": data,
            "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}}


async def _inputs(st, body: EmbeddingRequest) -> list[tuple[None, list[int]]]:
    """input's four forms -> [(None, token ids)], cut to the last truncate_prompt_tokens tokens when asked."""
    x = body.input
    if isinstance(x, str):
        x = [x]
    if not x:
        raise bad_request("input must not be empty", "input")
    if isinstance(x[0], str):
        special = body.add_special_tokens
        ids = await st.off_loop(lambda: [st.tokenizer.encode(t, add_special_tokens=special) for t in x])
    elif isinstance(x[0], int):
        ids = [list(x)]
    else:
        ids = [list(p) for p in x]
    k = body.truncate_prompt_tokens
    if k is not None:
        k = st.max_model_len if k == -1 else k
        ids = [p[-k:] if k else [] for p in ids]
    for p in ids:
        if not p:
            raise bad_request("an input is empty", "input")
    return [(None, p) for p in ids]


def _encode(vec: np.ndarray, fmt: str):
    if fmt == "base64":
        return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")
    return [float(v) for v in vec]
