"""Pooling models' endpoints (runner="pooling"): vLLM's /pooling (the pooled output as it is), OpenAI's /v1/embeddings
(strings or token ids in, one vector per input, as floats or base64: little-endian float32, what the openai SDK asks
for by default), and vLLM's /score and /rerank (Jina's and Cohere's shape), scored as vLLM scores: the cosine of the
two texts' vectors with an embedding model, a cross-encoder's score of the two joined."""
from __future__ import annotations

import base64
import time
import uuid

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from engine.entrypoints.server import openapi
from engine.entrypoints.server.errors import bad_request
from engine.entrypoints.server.protocol import (ClassificationRequest, EmbeddingRequest, PoolingRequest, RerankRequest,
                                               ScoreRequest)
from engine.entrypoints.server.responses import (ClassificationResponse, EmbeddingResponse, PoolingResponse,
                                                 RerankResponse, ScoreResponse)
from engine.entrypoints.server.serving import add_requests, collect, state_of, unless_disconnected
from engine.pooling.params import PoolingParams
from engine.pooling.score import cosine, cross_encoder_input, is_cross_encoder, pair_up

router = APIRouter()


@router.post("/v1/embeddings", response_model=EmbeddingResponse,
             responses=openapi.errors(*openapi.GENERATION_ERRORS))
async def create_embedding(body: EmbeddingRequest, request: Request):
    return await _pool_inputs(body, request, "embed", "embd", "embedding")


@router.post("/pooling", response_model=PoolingResponse, responses=openapi.errors(*openapi.GENERATION_ERRORS))
async def create_pooling(body: PoolingRequest, request: Request):
    """vLLM's /pooling: each input's pooled output as it is (its embedding, or its class probabilities)."""
    pooling = state_of(request).engine.engine.pooling
    task = body.task or ("classify" if pooling is not None and pooling.classifier is not None else "embed")
    return await _pool_inputs(body, request, task, "pool", "pooling")


async def _pool_inputs(body: EmbeddingRequest, request: Request, task: str, prefix: str, kind: str):
    """One pooled vector per input of body, in the response shape of `kind` (embedding, or vLLM's pooling)."""
    st = state_of(request)
    model = st.check_model(body.model)
    try:
        params = PoolingParams(dimensions=body.dimensions, normalize=body.normalize, task=task)
    except ValueError as e:
        raise bad_request(str(e), "dimensions") from e
    prompts = await _inputs(st, body)
    rid = f"{prefix}-{uuid.uuid4().hex}"
    vecs = await pooled(request, st, rid, prompts, params, model)
    if vecs is None:
        return Response(status_code=499)
    key = "embedding" if kind == "embedding" else "data"
    data = [{"object": kind, "index": i, key: _encode(v, body.encoding_format)} for i, v in enumerate(vecs)]
    n = sum(len(ids) for _, ids in prompts)
    return {"id": rid, "object": "list", "created": int(time.time()), "model": model, "data": data,
            "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}}


async def _inputs(st, body: EmbeddingRequest) -> list[tuple[None, list[int]]]:
    """input's four forms -> [(None, token ids)], cut to the last truncate_prompt_tokens tokens when asked."""
    return await _token_ids(st, body.input, body.add_special_tokens, body.truncate_prompt_tokens, "input")


async def _token_ids(st, x, special: bool, k, field: str) -> list[tuple[None, list[int]]]:
    if isinstance(x, str):
        x = [x]
    if not x:
        raise bad_request(f"{field} must not be empty", field)
    if isinstance(x[0], str):
        ids = await st.off_loop(lambda: [st.tokenizer.encode(t, add_special_tokens=special) for t in x])
    elif isinstance(x[0], int):
        ids = [list(x)]
    else:
        ids = [list(p) for p in x]
    if k is not None:
        k = st.max_model_len if k == -1 else k
        ids = [p[-k:] if k else [] for p in ids]
    for p in ids:
        if not p:
            raise bad_request(f"an input of {field} is empty", field)
    return [(None, p) for p in ids]


async def pooled(request: Request, st, rid: str, prompts, params: PoolingParams,
                 model: str | None = None) -> list[np.ndarray] | None:
    """Each prompt's pooled output, the prompts run as one engine request each (None: the client left); model: the
    served name asked for (a LoRA adapter's runs with it)."""
    added, streams = await unless_disconnected(request, add_requests(st, rid, prompts, params, model))
    if not added:
        return None
    completed, finals = await unless_disconnected(request, collect(streams))
    return [out.pooled for out in finals] if completed else None


@router.post("/score", response_model=ScoreResponse, responses=openapi.errors(*openapi.GENERATION_ERRORS))
@router.post("/v1/score", response_model=ScoreResponse, responses=openapi.errors(*openapi.GENERATION_ERRORS))
async def create_score(body: ScoreRequest, request: Request):
    st = state_of(request)
    model = st.check_model(body.model)
    cross = is_cross_encoder(st.engine.engine.pooling)
    first, second = await _sides(st, cross, body.truncate_prompt_tokens, (body.text_1, "text_1"),
                                 (body.text_2, "text_2"))
    try:
        pairs = pair_up(first, second)
    except ValueError as e:
        raise bad_request(str(e), "text_1") from e
    rid = f"score-{uuid.uuid4().hex}"
    scores, tokens = await _pair_scores(request, st, rid, first, second, pairs, model, cross)
    if scores is None:
        return Response(status_code=499)
    data = [{"index": n, "object": "score", "score": v} for n, v in enumerate(scores)]
    return {"id": rid, "object": "list", "created": int(time.time()), "model": model,
            "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}


@router.post("/rerank", response_model=RerankResponse, responses=openapi.errors(*openapi.GENERATION_ERRORS))
@router.post("/v1/rerank", response_model=RerankResponse, responses=openapi.errors(*openapi.GENERATION_ERRORS))
@router.post("/v2/rerank", response_model=RerankResponse, responses=openapi.errors(*openapi.GENERATION_ERRORS))
async def create_rerank(body: RerankRequest, request: Request):
    st = state_of(request)
    model = st.check_model(body.model)
    cross = is_cross_encoder(st.engine.engine.pooling)
    query, docs = await _sides(st, cross, body.truncate_prompt_tokens, (body.query, "query"),
                               (body.documents, "documents"))
    rid = f"rerank-{uuid.uuid4().hex}"
    scores, tokens = await _pair_scores(request, st, rid, query, docs, [(0, j) for j in range(len(docs))], model,
                                        cross)
    if scores is None:
        return Response(status_code=499)
    order = sorted(range(len(docs)), key=lambda i: -scores[i])[:body.top_n or None]
    results = [{"index": i, "relevance_score": scores[i],
                "document": {"text": body.documents[i]} if body.return_documents else None} for i in order]
    return {"id": rid, "model": model, "usage": {"total_tokens": tokens}, "results": results}


async def _sides(st, cross: bool, truncate, first, second) -> tuple[list, list]:
    """The two sides of a score ((input, field) each): texts where the tokenizer's pair template joins them, else
    [(None, token ids)] (a cross-encoder's second side without special tokens, cut to truncate's last tokens)."""
    if _pair_template(st, cross, truncate):
        return _texts(*first), _texts(*second)
    return (await _token_ids(st, first[0], True, truncate, first[1]),
            await _token_ids(st, second[0], not cross, truncate, second[1]))


def _pair_template(st, cross: bool, truncate) -> bool:
    """Whether a cross-encoder's pairs go through the tokenizer's pair template (a model with token types: BERT's);
    truncate_prompt_tokens is refused there (the template would have to cut the pair, not one side)."""
    if not cross or not st.engine.engine.config.type_vocab_size:
        return False
    if truncate is not None:
        raise bad_request("truncate_prompt_tokens is not supported for this cross-encoder: its tokenizer joins each "
                          "pair with its template", "truncate_prompt_tokens")
    return True


def _texts(x, field: str) -> list[str]:
    texts = [x] if isinstance(x, str) else list(x)
    if not texts or not all(texts):
        raise bad_request(f"{field} must hold non-empty texts", field)
    return texts


async def _pair_scores(request: Request, st, rid: str, first, second, pairs, model, cross: bool):
    """(each pair's score or None when the client left, prompt tokens run). An embedding model: the cosine of the two
    texts' vectors, each text run once. A cross-encoder: its one-label probability over each pair, run once: texts
    (first, second: strings) joined by the tokenizer's pair template with their token types, or token ids ((None,
    ids) entries) the second's after the first's."""
    if cross and first and isinstance(first[0], str):
        tok, types = st.tokenizer, st.engine.engine.config.type_vocab_size
        prompts = await st.off_loop(lambda: [cross_encoder_input(tok, types, first[i], second[j]) for i, j in pairs])
        joined = [(None, p["prompt_token_ids"], p["token_type_ids"]) for p in prompts]
        probs = await pooled(request, st, rid, joined, PoolingParams(task="classify"), model)
        return (None if probs is None else [float(p[0]) for p in probs]), sum(len(ids) for _, ids, _ in joined)
    if cross:
        joined = [(None, first[i][1] + second[j][1]) for i, j in pairs]
        probs = await pooled(request, st, rid, joined, PoolingParams(task="classify"), model)
        return (None if probs is None else [float(p[0]) for p in probs]), sum(len(ids) for _, ids in joined)
    vecs = await pooled(request, st, rid, first + second, PoolingParams(normalize=True), model)
    scores = None if vecs is None else [cosine(vecs[i], vecs[len(first) + j]) for i, j in pairs]
    return scores, sum(len(ids) for _, ids in first + second)


@router.post("/classify", response_model=ClassificationResponse,
             responses=openapi.errors(*openapi.GENERATION_ERRORS))
@router.post("/v1/classify", response_model=ClassificationResponse,
             responses=openapi.errors(*openapi.GENERATION_ERRORS))
async def create_classification(body: ClassificationRequest, request: Request):
    st = state_of(request)
    model = st.check_model(body.model)
    prompts = await _token_ids(st, body.input, True, body.truncate_prompt_tokens, "input")
    rid = f"classify-{uuid.uuid4().hex}"
    probs = await pooled(request, st, rid, prompts, PoolingParams(task="classify"), model)
    if probs is None:
        return Response(status_code=499)
    labels = st.engine.engine.pooling.class_labels
    data = []
    for i, p in enumerate(probs):
        best = int(np.argmax(p))
        data.append({"index": i, "label": labels[best] if best < len(labels) else None,
                     "probs": [float(x) for x in p], "num_classes": len(p)})
    n = sum(len(ids) for _, ids in prompts)
    return {"id": rid, "object": "list", "created": int(time.time()), "model": model, "data": data,
            "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}}


def _encode(vec: np.ndarray, fmt: str):
    if fmt == "base64":
        return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")
    return [float(v) for v in vec]
