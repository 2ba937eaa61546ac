"""The Responses API's request body (POST /v1/responses, stateless) and its items as chat messages."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field

from engine.entrypoints.server.protocol import FunctionDefinition, _Body, arguments_object
from engine.sample.sampling import SamplingParams
from engine.structured.params import StructuredOutputsParams


class InputText(_Body):
    type: Literal["input_text", "output_text"]
    text: str


class MessageItem(_Body):
    type: Optional[Literal["message"]] = None
    role: Literal["user", "assistant", "system", "developer"]
    content: Union[str, list[InputText]]


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: Optional[str] = None


class FunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: str
    output: str


class ReasoningText(_Body):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_Body):
    type: Literal["reasoning"]
    id: Optional[str] = None
    summary: list[dict[str, Any]] = []
    content: Optional[list[ReasoningText]] = None


# items with a type literal first: a message item may leave its type out
InputItem = Annotated[Union[FunctionCallItem, FunctionCallOutputItem, ReasoningItem, MessageItem],
                      Field(union_mode="left_to_right")]


class FunctionTool(FunctionDefinition):
    type: Literal["function"]


class NamedFunction(_Body):
    type: Literal["function"]
    name: str


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None
    description: Optional[str] = None


class TextConfig(_Body):
    format: Optional[TextFormat] = None


class ReasoningConfig(_Body):
    effort: Optional[Literal["minimal", "low", "medium", "high"]] = None
    summary: Optional[Literal["auto", "concise", "detailed"]] = None


class ResponsesRequest(_Body):
    model: Optional[str] = None
    input: Union[str, list[InputItem]]
    instructions: Optional[str] = None
    tools: Optional[list[FunctionTool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedFunction]] = None
    parallel_tool_calls: Optional[bool] = True
    max_output_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    stream: Optional[bool] = False
    store: Optional[bool] = None
    previous_response_id: Optional[str] = None
    reasoning: Optional[ReasoningConfig] = None
    text: Optional[TextConfig] = None
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    seed: Optional[int] = Field(None, ge=-1)
    chat_template_kwargs: Optional[dict[str, Any]] = None  # vLLM's extra, as in chat completions (enable_thinking)

    def check_stateless(self) -> None:
        """This server keeps no responses: ValueError for what would need one."""
        if self.store:
            raise ValueError("store: this server keeps no responses; send store: false (or leave it out)")
        if self.previous_response_id is not None:
            raise ValueError("previous_response_id: this server keeps no responses; send the whole conversation "
                             "as input items")

    def to_sampling_params(self) -> SamplingParams:
        return SamplingParams(max_tokens=self.max_output_tokens,
                              temperature=1.0 if self.temperature is None else self.temperature,
                              top_p=1.0 if self.top_p is None else self.top_p, seed=self.seed,
                              structured_outputs=self._structured_outputs())

    def _structured_outputs(self) -> Optional[StructuredOutputsParams]:
        fmt = self.text.format if self.text is not None else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if fmt.schema_ is None:
            raise ValueError("text.format.schema is required with type json_schema")
        return StructuredOutputsParams(json=fmt.schema_)

    def template_kwargs(self) -> Optional[dict[str, Any]]:
        kwargs = dict(self.chat_template_kwargs or {})
        if self.reasoning is not None and self.reasoning.effort is not None:
            kwargs["reasoning_effort"] = self.reasoning.effort  # gpt-oss's template reads it
        return kwargs or None

    def openai_tools(self) -> Optional[list[dict]]:
        if self.tools is None:
            return None
        return [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
                for t in self.tools]

    def openai_tool_choice(self):
        c = self.tool_choice
        return {"type": "function", "function": {"name": c.name}} if isinstance(c, NamedFunction) else c

    def messages(self) -> list[dict]:
        """instructions and input items -> chat-template messages: function calls join the assistant turn before
        them, their outputs become tool messages, reasoning items the assistant's reasoning."""
        out: list[dict] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            return out + [{"role": "user", "content": self.input}]
        for item in self.input:
            if isinstance(item, MessageItem):
                text = item.content if isinstance(item.content, str) else "".join(p.text for p in item.content)
                role = "system" if item.role == "developer" else item.role
                out.append({"role": role, "content": text})
            elif isinstance(item, FunctionCallItem):
                if not out or out[-1]["role"] != "assistant":
                    out.append({"role": "assistant", "content": ""})
                out[-1].setdefault("tool_calls", []).append(
                    {"id": item.call_id, "type": "function",
                     "function": {"name": item.name, "arguments": arguments_object(item.arguments)}})
            elif isinstance(item, FunctionCallOutputItem):
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
            else:
                text = "".join(c.text for c in item.content or [])
                out.append({"role": "assistant", "content": "", "reasoning": text, "reasoning_content": text})
        return _merge_assistant_turns(out)


def _merge_assistant_turns(messages: list[dict]) -> list[dict]:
    """A reasoning item, the message and the calls after it are one assistant turn."""
    out: list[dict] = []
    for m in messages:
        if out and m["role"] == "assistant" and out[-1]["role"] == "assistant" and "tool_calls" not in out[-1]:
            prev = out[-1]
            merged = {**prev, **{k: v for k, v in m.items() if k != "content"}}
            merged["content"] = prev.get("content", "") + m.get("content", "")
            out[-1] = merged
        else:
            out.append(m)
    return out
