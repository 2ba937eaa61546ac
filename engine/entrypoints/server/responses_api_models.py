"""Response bodies of POST /v1/responses (the response object, its output items and stream events), for the
OpenAPI document and the schemathesis test."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, Field, RootModel

from engine.entrypoints.server.responses import ErrorResponse


class OutputText(BaseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class ReasoningTextOut(BaseModel):
    type: Literal["reasoning_text"]
    text: str


class OutputMessage(BaseModel):
    type: Literal["message"]
    id: str
    role: Literal["assistant"]
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class OutputReasoning(BaseModel):
    type: Literal["reasoning"]
    id: str
    summary: list[Any]
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[ReasoningTextOut]


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = Annotated[Union[OutputMessage, OutputReasoning, OutputFunctionCall], Field(discriminator="type")]


class ResponseUsage(BaseModel):
    input_tokens: int = Field(ge=0)
    input_tokens_details: dict[str, int]
    output_tokens: int = Field(ge=0)
    output_tokens_details: dict[str, int]
    total_tokens: int = Field(ge=0)


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    model: str
    output: list[OutputItem]
    incomplete_details: Optional[dict[str, str]]
    error: None
    instructions: Optional[str]
    max_output_tokens: Optional[int]
    parallel_tool_calls: bool
    temperature: float
    top_p: float
    tool_choice: Union[str, dict[str, Any]]
    tools: list[dict[str, Any]]
    text: dict[str, Any]
    reasoning: Optional[dict[str, Any]]
    store: bool
    metadata: dict[str, str]
    truncation: str
    usage: Optional[ResponseUsage]


class _Event(BaseModel):
    sequence_number: int = Field(ge=0)


class ResponseLifecycle(_Event):
    type: Literal["response.created", "response.in_progress", "response.completed", "response.incomplete"]
    response: ResponseObject


class ItemEvent(_Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int = Field(ge=0)
    item: OutputItem


class PartEvent(_Event):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int = Field(ge=0)
    content_index: int = Field(ge=0)
    part: OutputText


class TextDeltaEvent(_Event):
    type: Literal["response.output_text.delta", "response.reasoning_text.delta",
                  "response.function_call_arguments.delta"]
    item_id: str
    output_index: int = Field(ge=0)
    content_index: Optional[int] = None
    delta: str
    logprobs: Optional[list[Any]] = None


class TextDoneEvent(_Event):
    type: Literal["response.output_text.done", "response.reasoning_text.done"]
    item_id: str
    output_index: int = Field(ge=0)
    content_index: int = Field(ge=0)
    text: str
    logprobs: Optional[list[Any]] = None


class ArgumentsDoneEvent(_Event):
    type: Literal["response.function_call_arguments.done"]
    item_id: str
    output_index: int = Field(ge=0)
    name: str
    arguments: str


class ResponseStreamEvent(RootModel):
    """The `data:` of one event of a streamed /v1/responses (its `event:` line repeats the type)."""
    root: Union[ResponseLifecycle, ItemEvent, PartEvent, TextDeltaEvent, TextDoneEvent, ArgumentsDoneEvent,
                ErrorResponse]
