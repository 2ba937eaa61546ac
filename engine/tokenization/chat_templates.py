"""Chat templates: rendering a model's Jinja template the way transformers does, and built-in templates
for files that carry none.

Rendering mirrors transformers.utils.chat_template_utils: an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and the loopcontrols extension; `raise_exception`, `strftime_now`, a `tojson`
that does not escape HTML, and the special token strings (bos_token, eos_token, ...) as variables.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Message text, whether content is a string or a list of {"type": "text", "text": ...} parts.
_CONTENT = ("{%- if message['content'] is string -%}{{- message['content'] -}}"
            "{%- else -%}{%- for part in message['content'] -%}"
            "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
            "{%- endfor -%}{%- endif -%}")

# Gemma's official template (google/gemma-3-*-it): the system prompt is folded into the first user turn,
# "assistant" is called "model", contents are trimmed.
GEMMA_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

# Llama 3 (Meta-Llama-3-*-Instruct), without the 3.1 tool-calling preamble.
LLAMA3_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' -}}"
    "{%- set content -%}" + _CONTENT + "{%- endset -%}"
    "{{- content | trim + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

# Llama 2 chat: [INST] blocks, the system prompt inside <<SYS>> in the first one.
LLAMA2_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set loop_messages = messages[1:] -%}{%- set system_message = messages[0]['content'] -%}"
    "{%- else -%}{%- set loop_messages = messages -%}{%- set system_message = false -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}"
    "{%- endif -%}"
    "{%- if loop.index0 == 0 and system_message != false -%}"
    "{%- set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] -%}"
    "{%- else -%}{%- set content = message['content'] -%}{%- endif -%}"
    "{%- if message['role'] == 'user' -%}{{- bos_token + '[INST] ' + content | trim + ' [/INST]' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- ' ' + content | trim + ' ' + eos_token -}}{%- endif -%}"
    "{%- endfor -%}"
)

# ChatML (Qwen 2/3 and others): no default system prompt.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}" + _CONTENT + "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# gpt-oss's harmony format, without tools (the checkpoints' own template has them): the system preamble with the
# date and `reasoning_effort` (default medium), system/developer text as the developer message's instructions,
# assistant turns on the final channel; generation starts at <|start|>assistant and stops at <|return|>/<|call|>.
HARMONY_TEMPLATE = (
    "{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\\n'"
    " + 'Knowledge cutoff: 2024-06\\nCurrent date: ' + strftime_now('%Y-%m-%d') + '\\n\\nReasoning: '"
    " + (reasoning_effort if reasoning_effort is defined else 'medium') + '\\n\\n'"
    " + '# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>' -}}"
    "{%- for message in messages -%}"
    "{%- set content -%}" + _CONTENT + "{%- endset -%}"
    "{%- if message['role'] in ('system', 'developer') -%}"
    "{{- '<|start|>developer<|message|># Instructions\\n\\n' + content + '\\n\\n<|end|>' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + content + '<|end|>' -}}"
    "{%- else -%}{{- '<|start|>' + message['role'] + '<|message|>' + content + '<|end|>' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"
)


def builtin_template(arch: str, has_token: Callable[[str], bool]) -> str | None:
    """The built-in chat template for an architecture, or None.

    Args:
        arch: GGUF general.architecture or HF config model_type.
        has_token: whether the vocabulary holds a token string (picks Llama 3 vs Llama 2, and the
            fallback for unknown architectures).
    """
    arch = (arch or "").lower()
    if arch.startswith("gemma"):
        return GEMMA_TEMPLATE
    if arch.startswith("qwen"):
        return CHATML_TEMPLATE
    if arch == "llama":
        return LLAMA3_TEMPLATE if has_token("<|start_header_id|>") else LLAMA2_TEMPLATE
    if arch in ("gpt-oss", "gpt_oss") or has_token("<|channel|>"):
        return HARMONY_TEMPLATE
    if has_token("<|im_start|>"):
        return CHATML_TEMPLATE
    if has_token("<start_of_turn>"):
        return GEMMA_TEMPLATE
    if has_token("<|start_header_id|>"):
        return LLAMA3_TEMPLATE
    return None


def select_template(template: str | Mapping[str, str] | None, tools) -> str | None:
    """A template string from a single template or a dict of named ones (transformers' rule)."""
    if not isinstance(template, Mapping):
        return template
    if tools is not None and "tool_use" in template:
        return template["tool_use"]
    if "default" in template:
        return template["default"]
    raise ValueError(f"the model has several chat templates and none is named 'default': {sorted(template)}")


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes HTML characters; transformers' does not.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compiles a chat template in transformers' sandboxed environment (cached by source)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def normalize_messages(messages: Sequence[Any]) -> list[dict]:
    """Messages as plain dicts without None values (some APIs send content=None, which templates
    render as the text 'None'); pydantic models are dumped."""
    out = []
    for m in messages:
        if callable(getattr(m, "model_dump", None)):
            m = m.model_dump()
        if not isinstance(m, Mapping):
            raise TypeError(f"chat messages must be dicts, got {type(m).__name__}")
        out.append({k: v for k, v in m.items() if v is not None})
    return out


# transformers' marker: appended to the final message's text, then the rendering is cut where it lands.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _tag_final_message(source: str, messages: list[dict]) -> str:
    """Appends the marker to the final message's text (its last text part), in place; returns that text."""
    if not messages:
        raise ValueError("continue_final_message is set but the conversation is empty")
    if "content" not in source:
        raise ValueError('continue_final_message is set but the chat template never reads a message\'s "content"')
    last = messages[-1]
    content = last.get("content")
    if isinstance(content, str):
        last["content"] = content + _CONTINUE_TAG
        return content
    if isinstance(content, (list, tuple)):
        parts = [dict(p) for p in content]
        for part in reversed(parts):
            if isinstance(part.get("text"), str):
                text = part["text"]
                part["text"] = text + _CONTINUE_TAG
                last["content"] = parts
                return text
    raise ValueError("continue_final_message is set but the final message has no text to continue")


def _cut_at_tag(rendered: str, final_text: str) -> str:
    """The rendering up to the end of the final message's text (the template's closing tokens dropped)."""
    tag = _CONTINUE_TAG.strip()
    if final_text.strip() not in rendered or tag not in rendered:
        raise ValueError("continue_final_message is set but the final message does not appear in the chat after "
                         "applying the chat template (the template drops part of it)")
    loc = rendered.rindex(tag)
    if rendered[loc:loc + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:loc]
    return rendered[:loc].rstrip()  # the template trimmed the message: trim what comes before the tag too


def render(source: str, messages: Sequence[Any], *, add_generation_prompt: bool = True,
           continue_final_message: bool = False, tools=None, documents=None,
           special_tokens: Mapping[str, str | None] | None = None, **kwargs) -> str:
    """Renders a chat template to text.

    Args:
        source: the Jinja template.
        messages: [{"role": ..., "content": str | list of parts, ...}, ...]; any role, the template decides.
        add_generation_prompt: end with the header that starts the assistant's turn.
        continue_final_message: end right after the final message's text, leaving it open for the model to
            continue (a prefill), as transformers does; not together with add_generation_prompt.
        tools: JSON schemas of tools (dicts), or None.
        documents: retrieval documents (dicts), or None.
        special_tokens: bos_token, eos_token, ... strings, visible to the template.
        **kwargs: extra template variables; they override special_tokens.
    Returns:
        The rendered text (it may start with the BOS token string).
    Raises:
        jinja2.TemplateError: the template raised (e.g. roles that do not alternate).
        ValueError: continue_final_message cannot be honoured (or comes with add_generation_prompt).
    """
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt are not compatible: the first continues "
                         "the final message, the second starts a new assistant turn after it")
    if tools is not None:
        tools = list(tools)
        for t in tools:
            if not isinstance(t, Mapping):
                raise TypeError("tools must be JSON schemas (dicts)")
    variables = {**(special_tokens or {}), **kwargs}
    messages = normalize_messages(messages)
    final_text = _tag_final_message(source, messages) if continue_final_message else None
    text = compile_template(source).render(messages=messages, tools=tools, documents=documents,
                                           add_generation_prompt=add_generation_prompt, **variables)
    return _cut_at_tag(text, final_text) if continue_final_message else text
