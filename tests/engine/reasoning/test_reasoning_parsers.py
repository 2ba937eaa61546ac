"""Reasoning parsers: exact splits of outputs as the models print them, and the streaming prefix contract."""
from __future__ import annotations

import pytest

from engine.reasoning import REASONING_PARSERS, Reasoned, get_reasoning_parser

# (parser name, chat_template_kwargs, model output, expected reasoning, expected content)
CASES = [
    # qwen3: hybrid Qwen3 writes <think> itself; Qwen3-2507 thinking / Qwen3.5 templates open it in the prompt.
    ("qwen3", None, "<think>\nOkay, the user asks 2+2. That's 4.\n</think>\n\n2 + 2 = **4**.",
     "\nOkay, the user asks 2+2. That's 4.\n", "\n\n2 + 2 = **4**."),
    ("qwen3", {"enable_thinking": True},
     "The user greets me.\nI should greet back.\n</think>\n\nHello! How can I help?",
     "The user greets me.\nI should greet back.\n", "\n\nHello! How can I help?"),
    ("qwen3", None, "<think>\nLet me count: 1, 2, 3", "\nLet me count: 1, 2, 3", ""),  # truncated
    ("qwen3", None, "Counting the r's in strawberry: s-t-r", "Counting the r's in strawberry: s-t-r", ""),
    ("qwen3", None, "<think>\n\n</think>\n\nHi there!", "\n\n", "\n\nHi there!"),
    ("qwen3", None, "<think>\n用户问东京的人口。🤔\n</think>\n\n東京の人口は約1400万人です。",
     "\n用户问东京的人口。🤔\n", "\n\n東京の人口は約1400万人です。"),
    ("qwen3", None, "The format wraps calls in <tool_call> tags.\n</think>\n\nDone.",
     "The format wraps calls in <tool_call> tags.\n", "\n\nDone."),
    ("qwen3", None, "I should check the weather.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
     "</parameter>\n</function>\n</tool_call>", "I should check the weather.\n\n",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"),
    ("qwen3", {"enable_thinking": False}, "Paris is the capital of France.", None, "Paris is the capital of France."),
    ("qwen3", {"enable_thinking": False}, "Odd: </think> stays text.", None, "Odd: </think> stays text."),
    # deepseek_r1: the template opens <think>; older R1 outputs repeat it.
    ("deepseek_r1", None, "The user wants a haiku.\nFive, seven, five.\n</think>\n\nAutumn moonlight—\na worm digs "
     "silently\ninto the chestnut.", "The user wants a haiku.\nFive, seven, five.\n",
     "\n\nAutumn moonlight—\na worm digs silently\ninto the chestnut."),
    ("deepseek_r1", None, "<think>\nHmm, a greeting.\n</think>\n\nHello!", "\nHmm, a greeting.\n", "\n\nHello!"),
    ("deepseek_r1", None, "Let me think about this carefully. First", "Let me think about this carefully. First", ""),
    ("deepseek_r1", None, "</think>\n\nHello!", None, "\n\nHello!"),
    ("deepseek_r1", None, "Ελληνικά και 中文 ✓</think>Ναι", "Ελληνικά και 中文 ✓", "Ναι"),
    # deepseek_v3: reasoning only when the request turns thinking on.
    ("deepseek_v3", None, "Hello! How can I help you today?", None, "Hello! How can I help you today?"),
    ("deepseek_v3", {"thinking": False}, "A stray </think> is text.", None, "A stray </think> is text."),
    ("deepseek_v3", {"thinking": True}, "The user says hi.\n</think>Hello!\nWelcome.", "The user says hi.\n",
     "Hello!\nWelcome."),
    ("deepseek_v3", {"enable_thinking": True}, "Still working on step 2", "Still working on step 2", ""),
    # glm45: GLM-4.5 writes <think> after <|assistant|>\n; thinking unless the request turns it off.
    ("glm45", None, "\n<think>The user asks for the capital of France.</think>\nThe capital of France is Paris.",
     "The user asks for the capital of France.", "\nThe capital of France is Paris."),
    ("glm45", None, "\n<think>Let me recall the", "Let me recall the", ""),
    ("glm45", None, "<think></think>\nHi!", None, "\nHi!"),
    ("glm45", {"enable_thinking": False}, "\nThe capital is Paris.", None, "\nThe capital is Paris."),
    ("glm45", {"thinking": False}, "Plain answer.", None, "Plain answer."),
    ("glm45", {"enable_thinking": True}, "<think>多行\n推理</think>\n答案：42", "多行\n推理", "\n答案：42"),
    # gemma4: <|channel>thought\n...<channel|>, special tokens kept.
    ("gemma4", None, "<|channel>thought\nThe user wants a greeting.\nKeep it short.<channel|>Hello there!",
     "The user wants a greeting.\nKeep it short.", "Hello there!"),
    ("gemma4", None, "Hello there! 👋", None, "Hello there! 👋"),
    ("gemma4", None, "<|channel>thought\nStill thinking about", "Still thinking about", ""),
    ("gemma4", None, "<|channel>thought\n<channel|>The answer is 4.", None, "The answer is 4."),
    ("gemma4", None, "<|channel>thoughtful start<channel|>ok", "thoughtful start", "ok"),
    # openai: gpt-oss harmony, special tokens kept.
    ("openai", None, "<|channel|>analysis<|message|>User says hi. Respond friendly.<|end|><|start|>assistant"
     "<|channel|>final<|message|>Hello! How can I help you today?<|return|>",
     "User says hi. Respond friendly.", "Hello! How can I help you today?"),
    ("openai", None, "<|channel|>analysis<|message|>Short.<|end|><|start|>assistant<|channel|>final<|message|>Hi!",
     "Short.", "Hi!"),
    ("openai", None, "<|channel|>analysis<|message|>Need the weather; call the tool.<|end|><|start|>assistant"
     "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
     "Need the weather; call the tool.", ""),
    ("openai", None, "<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant<|channel|>commentary<|message|>"
     "Let me look that up.<|end|><|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{}"
     "<|call|>", "Plan.", "Let me look that up."),
    ("openai", None, "<|channel|>analysis<|message|>First,\nsecond.<|end|><|start|>assistant<|channel|>analysis"
     "<|message|>Third.<|end|><|start|>assistant<|channel|>final<|message|>Line 1\nLine 2 — ünïcödé ✓<|return|>",
     "First,\nsecond.\nThird.", "Line 1\nLine 2 — ünïcödé ✓"),
    ("openai", None, "<|channel|>analysis<|message|>Thinking about 多语言 text", "Thinking about 多语言 text", ""),
    ("openai", None, "<|channel|>final<|message|>Just the answer.<|return|>", None, "Just the answer."),
    ("openai_gptoss", None, "<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>final<|message|>"
     "done", "ok", "done"),
]
# Edge cases: partial markers inside text, a call before </think> (the first marker wins), a second think block,
# untagged Gemma 4 text with a stray end tag (content, as vLLM's streaming reads it), empty harmony messages.
CASES += [
    ("qwen3", None, "x </thi y <tool_call> z </think> w", "x </thi y <tool_call> z ", " w"),
    ("qwen3", None, "r<tool_call>\n\n<function=f>\n</think>after", "r", "<tool_call>\n\n<function=f>\n</think>after"),
    ("qwen3", None, "<think>a</think>b<think>c</think>d", "a", "b<think>c</think>d"),
    ("deepseek_r1", None, "  \n <think>x</think>y", "x", "y"),
    ("gemma4", None, "<|channel>though t<channel|>x", "though t", "x"),
    ("gemma4", None, "  <|channel>thought\nA<channel|>B", "A", "B"),
    ("gemma4", None, "Answer <channel|> tail", None, "Answer <channel|> tail"),
    ("openai", None, "<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
     "<|start|>assistant<|channel|>final<|message|><|end|>", "\nb", ""),
    ("openai", None, "<|channel|>final<|message|>a <| b<|return|>", None, "a <| b"),
]
IDS = [f"{name}-{i}" for i, (name, *_rest) in enumerate(CASES)]


def _parser(name, kwargs):
    return get_reasoning_parser(name)(kwargs)


@pytest.mark.parametrize("name, kwargs, text, reasoning, content", CASES, ids=IDS)
def test_final_split(name, kwargs, text, reasoning, content):
    assert _parser(name, kwargs).split(text, final=True) == Reasoned(reasoning, content)


@pytest.mark.parametrize("name, kwargs, text, reasoning, content", CASES, ids=IDS)
def test_prefix_contract(name, kwargs, text, reasoning, content):
    parser = _parser(name, kwargs)
    full = parser.split(text, final=True)
    for i in range(len(text) + 1):
        part = parser.split(text[:i], final=False)
        assert isinstance(part.content, str), i
        assert (full.reasoning or "").startswith(part.reasoning or ""), (i, part, full)
        assert full.content.startswith(part.content), (i, part, full)
    # the stream does not sit on text it could already send: at the end it holds nothing back
    whole = parser.split(text, final=False)
    assert (whole.reasoning or "", whole.content) == (full.reasoning or "", full.content)


@pytest.mark.parametrize("text, held", [
    ("<think>\nabc</th", "\nabc"),  # a partial end tag
    ("  <thi", ""),  # could be the start tag
    ("abc\n<tool_call>\n<func", "abc\n"),  # could be a Qwen3.5 call
    ("abc <tool_call> is a tag", "abc <tool_call> is a tag"),  # a mention, not a call
])
def test_qwen3_holds_back_markers(text, held):
    assert (_parser("qwen3", None).split(text, final=False).reasoning or "") == held


def test_gemma4_holds_back_thought_label():
    p = _parser("gemma4", None)
    assert p.split("<|channel>though", final=False) == Reasoned(None, "")
    assert p.split("<|channel>thought\nX", final=False) == Reasoned("X", "")
    assert p.split("<|chan", final=False) == Reasoned(None, "")


def test_harmony_holds_back_end_tokens():
    p = _parser("openai", None)
    assert p.split("<|channel|>final<|message|>Hi<|ret", final=False) == Reasoned(None, "Hi")
    assert p.split("<|channel|>analysis<|mess", final=False) == Reasoned(None, "")


def test_registry():
    assert set(REASONING_PARSERS) >= {"qwen3", "deepseek_r1", "deepseek_v3", "glm45", "openai", "gemma4"}
    for name, cls in REASONING_PARSERS.items():
        assert name in cls.names and get_reasoning_parser(name) is cls
    assert get_reasoning_parser("openai").needs_special_tokens
    assert get_reasoning_parser("gemma4").needs_special_tokens
    assert not get_reasoning_parser("qwen3").needs_special_tokens
    assert get_reasoning_parser("qwen3")().template_kwargs == {}


def test_unknown_parser_names_valid_ones():
    with pytest.raises(ValueError) as err:
        get_reasoning_parser("qwen2")
    msg = str(err.value)
    assert "'qwen2'" in msg
    assert ", ".join(sorted(REASONING_PARSERS)) in msg
