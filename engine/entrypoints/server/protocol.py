"""Request bodies (pydantic) of the OpenAI, Anthropic and vLLM endpoints, and their SamplingParams.

Unknown fields are accepted and ignored (SDKs send fields a server may not know). Types and the value
ranges a field has on its own are declared here (they reach the OpenAPI document; FastAPI's 422 becomes a
400 in the API's shape), and floats must be finite (JSON's NaN and Infinity are refused); SamplingParams checks
the rest, with messages that name the field.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from engine.sample.sampling import SamplingParams
from engine.structured.params import StructuredOutputsParams

MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0  # OpenAI's documented range is [-100, 100]
MAX_SEED = 2**64 - 1  # seeds are unsigned 64-bit; -1 means none
TokenId = Annotated[int, Field(ge=0)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: Optional[bool] = True  # vLLM's default: asking for stream options asks for the usage
    continuous_usage_stats: Optional[bool] = False


class JsonSchemaFormat(_Body):
    name: Optional[str] = None
    description: Optional[str] = None
    # "schema" in JSON (pydantic reserves the name); the SDKs send strict: true with parse()
    json_schema: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(_Body):
    """OpenAI's response_format: text, json_object, or json_schema with its schema."""
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class _SamplingFields(_Body):
    """Fields shared by completions and chat completions (OpenAI's, then vLLM's extras)."""
    model: Optional[str] = None
    n: int = Field(1, ge=1)
    temperature: Optional[float] = Field(None, ge=0)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = Field(None, ge=-1, le=MAX_SEED)
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    presence_penalty: Optional[float] = Field(0.0, ge=-2, le=2)
    frequency_penalty: Optional[float] = Field(0.0, ge=-2, le=2)
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None
    # vLLM extras
    best_of: Optional[int] = Field(None, ge=1)
    top_k: Optional[int] = Field(None, ge=-1)  # -1 and 0: off
    min_p: Optional[float] = Field(None, ge=0, le=1)
    repetition_penalty: Optional[float] = Field(None, gt=0)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: Optional[list[TokenId]] = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    prompt_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[dict[str, Any]] = None  # vLLM's: StructuredOutputsParams's fields

    @field_validator("stream_options", mode="before")
    @classmethod
    def _stream_options_need_stream(cls, value, info: ValidationInfo):
        if value and not info.data.get("stream"):  # vLLM's rule (an empty object passes)
            raise ValueError("Stream options can only be defined when `stream=True`.")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_in_range(cls, value: Optional[dict[str, float]]) -> Optional[dict[str, float]]:
        for token, bias in (value or {}).items():
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise PydanticCustomError("logit_bias_range", "the bias of token {token} is {bias}; biases must be "
                                          "in [-{limit}, {limit}]", {"token": token, "bias": bias,
                                                                      "limit": f"{MAX_LOGIT_BIAS:g}"})
        return value

    def _sampling_params(self, max_tokens: Optional[int], logprobs: Optional[int],
                         prompt_logprobs: Optional[int]) -> SamplingParams:
        """Raises ValueError for out-of-range values (the message starts with the field name)."""
        return SamplingParams(
            n=self.n, best_of=self.best_of, temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=0 if self.top_k is None else self.top_k,
            min_p=0.0 if self.min_p is None else self.min_p,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0,
            seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos,
            max_tokens=max_tokens, min_tokens=self.min_tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            logit_bias=self.logit_bias, structured_outputs=self._structured_outputs())

    def _structured_outputs(self) -> Optional[StructuredOutputsParams]:
        """response_format or structured_outputs (not both) as StructuredOutputsParams; ValueError naming the field."""
        fmt, so = self.response_format, self.structured_outputs
        if fmt is not None and fmt.type != "text" and so is not None:
            raise ValueError("response_format and structured_outputs cannot both constrain the output; use one")
        if so is not None:
            unknown = sorted(set(so) - {f for f in StructuredOutputsParams.__dataclass_fields__ if f[0] != "_"})
            if unknown:
                raise ValueError(f"structured_outputs has no field {', '.join(unknown)}")
            return StructuredOutputsParams(**so)
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise ValueError("response_format.json_schema.schema is required with type json_schema")
        return StructuredOutputsParams(json=fmt.json_schema.json_schema)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


# ---- /v1/completions ----
class CompletionRequest(_SamplingFields):
    prompt: Union[list[list[int]], list[int], list[str], str]
    max_tokens: Optional[int] = Field(16, ge=1)
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: Optional[bool] = False
    suffix: Optional[str] = None

    def to_sampling_params(self) -> SamplingParams:
        prompt_lp = self.prompt_logprobs
        if self.echo and self.logprobs is not None:
            prompt_lp = max(self.logprobs, prompt_lp or 0)  # echoed prompt tokens carry logprobs too
        return self._sampling_params(self.max_tokens, self.logprobs, prompt_lp)


# ---- /v1/chat/completions ----
class TextPart(_Body):
    type: Literal["text"]
    text: str


class FunctionCall(_Body):
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends it


class MessageToolCall(_Body):
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: str  # any role goes to the chat template, which decides (vLLM's rule)
    content: Optional[Union[str, list[TextPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[MessageToolCall]] = None  # an assistant turn that called tools
    tool_call_id: Optional[str] = None  # a tool result: the call it answers
    reasoning: Optional[str] = None  # an assistant turn's reasoning (reasoning_content: older clients' name)
    reasoning_content: Optional[str] = None

    def to_template(self) -> dict[str, Any]:
        """The message as chat templates read it; tool call arguments as objects (vLLM's rule: templates such
        as Llama 3.1's and Qwen's iterate over them)."""
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": content_text(self.content)}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        reasoning = self.reasoning if self.reasoning is not None else self.reasoning_content
        if reasoning is not None:
            out["reasoning_content"] = out["reasoning"] = reasoning
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name,
                                               "arguments": arguments_object(c.function.arguments)}}
                                 for c in self.tool_calls]
        return out


def arguments_object(text: str) -> dict:
    """A tool call's arguments text -> the object (ValueError naming the problem); empty text is no arguments
    (vLLM's rule)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"messages: tool call arguments are not valid JSON: {e}") from None
    except RecursionError:
        raise ValueError("messages: tool call arguments are nested too deeply") from None
    if not isinstance(value, dict):
        raise ValueError("messages: tool call arguments must be a JSON object")
    return value


def object_schema(value: Optional[dict]) -> Optional[dict]:
    """A tool's parameters: a JSON schema whose properties (when given) are an object."""
    if value is not None and not isinstance(value.get("properties", {}), dict):
        raise ValueError("the tool's schema has properties that are not an object")
    return value


class FunctionDefinition(_Body):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None  # a JSON schema; none means no arguments
    strict: Optional[bool] = None

    _schema = field_validator("parameters")(classmethod(lambda cls, value: object_schema(value)))


class ChatTool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: FunctionName


class _ChatTemplateFields(_Body):
    """How messages are rendered (vLLM's fields, shared by chat completions and /tokenize)."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: Optional[str] = None  # used only with --trust-request-chat-template
    chat_template_kwargs: Optional[dict[str, Any]] = None

    @field_validator("continue_final_message")
    @classmethod
    def _not_with_generation_prompt(cls, value: bool, info: ValidationInfo) -> bool:
        """vLLM's rule: the final message is either continued or followed by a new assistant turn."""
        if value and info.data.get("add_generation_prompt"):
            raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        return value


class ChatCompletionRequest(_ChatTemplateFields, _SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: Optional[list[ChatTool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    parallel_tool_calls: Optional[bool] = True
    functions: Optional[Any] = None  # OpenAI's deprecated form: refused (use tools)
    function_call: Optional[Any] = None

    @property
    def requested_max_tokens(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def to_sampling_params(self) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs set to true")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self._sampling_params(self.requested_max_tokens, logprobs, self.prompt_logprobs)


# ---- /v1/messages (Anthropic) ----
class AnthropicTextBlock(_Body):
    type: Literal["text"]
    text: str


class AnthropicToolUseBlock(_Body):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class AnthropicToolResultBlock(_Body):
    type: Literal["tool_result"]
    tool_use_id: str
    content: Optional[Union[str, list[AnthropicTextBlock]]] = None
    is_error: Optional[bool] = None  # passed to the chat template with the tool message


class AnthropicThinkingBlock(_Body):
    type: Literal["thinking"]
    thinking: str
    signature: Optional[str] = None


AnthropicBlock = Annotated[Union[AnthropicTextBlock, AnthropicToolUseBlock, AnthropicToolResultBlock,
                                 AnthropicThinkingBlock], Field(discriminator="type")]


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: Union[str, list[AnthropicBlock]]


class AnthropicTool(_Body):
    type: Optional[Literal["custom"]] = None  # Anthropic's server tools (web search, ...) do not run here
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: Optional[str] = None
    input_schema: dict[str, Any]

    _schema = field_validator("input_schema")(classmethod(lambda cls, value: object_schema(value)))

    def to_openai(self) -> dict:
        fn = {"name": self.name, "parameters": self.input_schema}
        if self.description is not None:
            fn["description"] = self.description
        return {"type": "function", "function": fn}


class AnthropicToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[str] = None
    disable_parallel_tool_use: Optional[bool] = None

    def to_openai(self) -> Union[str, dict]:
        if self.type == "tool":
            if not self.name:
                raise ValueError('tool_choice: type "tool" needs the tool\'s name')
            return {"type": "function", "function": {"name": self.name}}
        return {"auto": "auto", "any": "required", "none": "none"}[self.type]


class AnthropicThinking(_Body):
    type: Literal["enabled", "disabled"]
    budget_tokens: Optional[int] = Field(None, ge=1024)  # Anthropic's minimum


class MessagesRequest(_Body):
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: Optional[Union[str, list[AnthropicTextBlock]]] = None
    stop_sequences: Optional[list[str]] = None
    temperature: Optional[float] = Field(None, ge=0, le=1)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    top_k: Optional[int] = Field(None, ge=0)
    stream: Optional[bool] = False
    metadata: Optional[dict[str, Any]] = None
    tools: Optional[list[AnthropicTool]] = None
    tool_choice: Optional[AnthropicToolChoice] = None
    thinking: Optional[AnthropicThinking] = None

    def to_sampling_params(self) -> SamplingParams:
        return SamplingParams(max_tokens=self.max_tokens, temperature=1.0 if self.temperature is None else self.temperature,
                              top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k or 0,
                              stop=self.stop_sequences)


class CountTokensRequest(_Body):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: Optional[Union[str, list[AnthropicTextBlock]]] = None
    tools: Optional[list[AnthropicTool]] = None
    tool_choice: Optional[AnthropicToolChoice] = None
    thinking: Optional[AnthropicThinking] = None


# ---- /tokenize, /detokenize (vLLM) ----
class TokenizeRequest(_ChatTemplateFields):
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[ChatMessage]] = None
    tools: Optional[list[ChatTool]] = None  # rendered with the messages, as chat completions does
    add_special_tokens: Optional[bool] = None  # default: True for a prompt, False for messages
    return_token_strs: Optional[bool] = False


class DetokenizeRequest(_Body):
    model: Optional[str] = None
    tokens: list[int]  # checked against the vocabulary


# ---- helpers ----
def content_text(content) -> str:
    """A message's content (string, or text parts/blocks) as one string (other blocks are not text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.text for p in content if p.type == "text")



# ---- /v1/embeddings (OpenAI's, vLLM's extras) ----
class EmbeddingRequest(_Body):
    model: Optional[str] = None
    input: Union[str, list[str], list[TokenId], list[list[TokenId]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(None, ge=1)
    user: Optional[str] = None
    add_special_tokens: bool = True
    normalize: Optional[bool] = None
    truncate_prompt_tokens: Optional[int] = Field(None, ge=-1)  # keep the last k tokens; -1: max_model_len


class PoolingRequest(EmbeddingRequest):
    """vLLM's /pooling: the model's pooled output per input, for the task asked (default: classify for a model with
    a classification head, else embed)."""
    task: Optional[Literal["embed", "classify"]] = None


# ---- /score, /v1/score, /rerank, /v1/rerank, /v2/rerank (vLLM's; Jina's and Cohere's rerank shape) ----
class ScoreRequest(_Body):
    model: Optional[str] = None
    text_1: Union[str, list[str]]
    text_2: Union[str, list[str]]
    truncate_prompt_tokens: Optional[int] = Field(None, ge=-1)


class RerankRequest(_Body):
    model: Optional[str] = None
    query: str
    documents: list[str]
    top_n: Optional[int] = Field(None, ge=0)  # 0 or missing: all documents
    return_documents: bool = True
    truncate_prompt_tokens: Optional[int] = Field(None, ge=-1)


class ClassificationRequest(_Body):
    model: Optional[str] = None
    input: Union[str, list[str], list[TokenId], list[list[TokenId]]]
    truncate_prompt_tokens: Optional[int] = Field(None, ge=-1)


class LoadLoRAAdapterRequest(_Body):
    """vLLM's POST /v1/load_lora_adapter."""
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False  # replace an adapter of the same name


class UnloadLoRAAdapterRequest(_Body):
    """vLLM's POST /v1/unload_lora_adapter."""
    lora_name: str = Field(min_length=1)
    lora_int_id: Optional[int] = None
