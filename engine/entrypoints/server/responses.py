"""Response bodies (pydantic) of the OpenAI, Anthropic and vLLM endpoints, for the OpenAPI document.

The handlers write their JSON directly; these models describe it, and the schemathesis test checks every
response against them (tests/engine/entrypoints/server/test_openapi_schemathesis.py).
"""
from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, Field, RootModel


# ---- errors ----
class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape (every path but /v1/messages)."""
    error: OpenAIErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Anthropic's error shape (/v1/messages and /v1/messages/count_tokens)."""
    type: Literal["error"]
    error: AnthropicErrorDetail


# ---- shared ----
StopReason = Optional[Union[int, str]]  # the stop string or token id that ended the output, else null


class Usage(BaseModel):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)


# ---- /v1/completions ----
class LegacyLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[Optional[float]]
    top_logprobs: list[Optional[dict[str, float]]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = Field(ge=0)
    text: str
    logprobs: Optional[LegacyLogprobs]
    finish_reason: Optional[str]
    stop_reason: StopReason = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunk(BaseModel):
    """One `data:` event of a streamed completion (the last, with stream_options.include_usage, has no
    choices and the usage)."""
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


# ---- /v1/chat/completions ----
class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class FunctionCallOut(BaseModel):
    name: str
    arguments: str  # the arguments object's JSON text


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCallOut


class ChatMessageOut(BaseModel):
    role: Literal["assistant"]
    content: Optional[str]  # null when the message only calls tools
    tool_calls: list[ToolCallOut] = []
    reasoning: Optional[str] = None  # with --reasoning-parser (reasoning_content: the same, older clients' name)
    reasoning_content: Optional[str] = None


class ChatChoice(BaseModel):
    index: int = Field(ge=0)
    message: ChatMessageOut
    logprobs: Optional[ChatLogprobs]
    finish_reason: Optional[str]
    stop_reason: StopReason = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionCallDelta(BaseModel):
    name: Optional[str] = None
    arguments: str


class ToolCallDelta(BaseModel):
    """A call's first delta has its id, type and name; the next ones more of its arguments."""
    index: int = Field(ge=0)
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: FunctionCallDelta


class ChatDelta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    reasoning: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCallDelta]] = None


class ChatChunkChoice(BaseModel):
    index: int = Field(ge=0)
    delta: ChatDelta
    logprobs: Optional[ChatLogprobs]
    finish_reason: Optional[str]
    stop_reason: StopReason = None


class ChatCompletionChunk(BaseModel):
    """One `data:` event of a streamed chat completion."""
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None


# ---- /v1/messages ----
class AnthropicUsage(BaseModel):
    input_tokens: int = Field(ge=0, description="Prompt tokens neither read from nor written to the prefix cache.")
    cache_creation_input_tokens: int = Field(ge=0, description="Prompt tokens whose KV blocks this request "
                                                               "computed and left in the prefix cache.")
    cache_read_input_tokens: int = Field(ge=0, description="Prompt tokens found in the prefix cache.")
    output_tokens: int = Field(ge=0)


class AnthropicTextOut(BaseModel):
    type: Literal["text"]
    text: str


class AnthropicThinkingOut(BaseModel):
    type: Literal["thinking"]
    thinking: str
    signature: str


class AnthropicToolUseOut(BaseModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict


AnthropicBlockOut = Annotated[Union[AnthropicTextOut, AnthropicThinkingOut, AnthropicToolUseOut],
                              Field(discriminator="type")]
AnthropicStop = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class MessagesResponse(BaseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[AnthropicBlockOut]
    stop_reason: Optional[AnthropicStop]
    stop_sequence: Optional[str]
    usage: AnthropicUsage


class MessageStart(BaseModel):
    type: Literal["message_start"]
    message: MessagesResponse  # no content and no stop_reason yet


class ContentBlockStart(BaseModel):
    type: Literal["content_block_start"]
    index: int = Field(ge=0)
    content_block: AnthropicBlockOut


class Ping(BaseModel):
    type: Literal["ping"]


class TextDelta(BaseModel):
    type: Literal["text_delta"]
    text: str


class ThinkingDelta(BaseModel):
    type: Literal["thinking_delta"]
    thinking: str


class InputJsonDelta(BaseModel):
    type: Literal["input_json_delta"]
    partial_json: str


class ContentBlockDelta(BaseModel):
    type: Literal["content_block_delta"]
    index: int = Field(ge=0)
    delta: Union[TextDelta, ThinkingDelta, InputJsonDelta] = Field(discriminator="type")


class ContentBlockStop(BaseModel):
    type: Literal["content_block_stop"]
    index: int = Field(ge=0)


class StopDelta(BaseModel):
    stop_reason: AnthropicStop
    stop_sequence: Optional[str]


class MessageDelta(BaseModel):
    type: Literal["message_delta"]
    delta: StopDelta
    usage: AnthropicUsage


class MessageStop(BaseModel):
    type: Literal["message_stop"]


class AnthropicStreamEvent(RootModel):
    """The `data:` of one event of a streamed /v1/messages (its `event:` line repeats the type)."""
    root: Union[MessageStart, ContentBlockStart, Ping, ContentBlockDelta, ContentBlockStop, MessageDelta,
                MessageStop, AnthropicErrorResponse] = Field(discriminator="type")


class CountTokensResponse(BaseModel):
    input_tokens: int = Field(ge=0)


# ---- vLLM's and the rest ----
class TokenizeResponse(BaseModel):
    count: int = Field(ge=0)
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]]


class DetokenizeResponse(BaseModel):
    prompt: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: Optional[str]
    parent: Optional[str]
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class VersionResponse(BaseModel):
    version: str


# ---- /v1/embeddings ----
class EmbeddingData(BaseModel):
    object: Literal["embedding"]
    index: int = Field(ge=0)
    embedding: Union[list[float], str]  # floats, or base64 of little-endian float32 bytes


class PoolingData(BaseModel):
    object: Literal["pooling"]
    index: int = Field(ge=0)
    data: Union[list[float], str]  # floats, or base64 of little-endian float32 bytes


class EmbeddingUsage(BaseModel):
    prompt_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    completion_tokens: int = Field(0, ge=0)


class EmbeddingResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[EmbeddingData]
    usage: EmbeddingUsage


class PoolingResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[PoolingData]
    usage: EmbeddingUsage


# ---- /score, /rerank ----
class ScoreData(BaseModel):
    index: int = Field(ge=0)
    object: Literal["score"]
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreData]
    usage: EmbeddingUsage


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int = Field(ge=0)
    document: Optional[RerankDocument] = None
    relevance_score: float


class RerankUsage(BaseModel):
    total_tokens: int = Field(ge=0)


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]



# ---- /classify ----
class ClassificationData(BaseModel):
    index: int = Field(ge=0)
    label: Optional[str]
    probs: list[float]
    num_classes: int = Field(ge=0)


class ClassificationResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ClassificationData]
    usage: EmbeddingUsage
