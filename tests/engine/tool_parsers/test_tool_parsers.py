"""Tool-call parsers: exact final parses of outputs as the models print them, and the streaming prefix contract."""
from __future__ import annotations

import json

import pytest

from engine.tool_parsers import TOOL_PARSERS, ParsedTools, get_tool_parser
from engine.tool_parsers.base import dump_arguments
from engine.tool_parsers.qwen3_xml import convert

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["c", "f"]}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "integer"}, "score": {"type": "number"},
        "exact": {"type": "boolean"}, "filters": {"type": "object"}, "tags": {"type": "array"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "level": {"type": ["integer", "null"]}}}}},
]
W = "get_weather"
Q = '<|"|>'  # gemma4's string delimiter token

# (parser names, case id, model output, content, [(name, arguments)], well formed: the stream contract applies)
# Arguments are dicts (compared after json.loads), or a str for arguments vLLM passes on as written.
CASES = [
    # hermes (Qwen2.5, Qwen3, Hermes 2/3): JSON in <tool_call> blocks.
    ("hermes", "plain", "The capital of France is Paris.", "The capital of France is Paris.", [], True),
    ("hermes", "one", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "San Francisco", "days": 3}}\n'
     "</tool_call>", "", [(W, {"city": "San Francisco", "days": 3})], True),
    ("hermes", "two", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "search", "arguments": {"query": "Louvre hours"}}\n</tool_call>', "",
     [(W, {"city": "Paris"}), ("search", {"query": "Louvre hours"})], True),
    ("hermes", "content_before", 'Let me check the weather for you.\n<tool_call>\n{"name": "get_weather", '
     '"arguments": {"city": "Tokyo"}}\n</tool_call>', "Let me check the weather for you.\n",
     [(W, {"city": "Tokyo"})], True),
    ("hermes", "nested", '<tool_call>\n{"name": "search", "arguments": {"query": "café \\"crème\\" <b>", "filters": '
     '{"lang": ["fr", "日本語"], "max": 2.5, "deep": {"a": null}}, "exact": true}}\n</tool_call>', "",
     [("search", {"query": 'café "crème" <b>', "filters": {"lang": ["fr", "日本語"], "max": 2.5,
                                                          "deep": {"a": None}}, "exact": True})], True),
    ("hermes", "after_calls_dropped", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
     "</tool_call>\nI'll wait for the result.", "", [(W, {"city": "Oslo"})], True),
    ("hermes", "unclosed_last", 'Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}',
     "Checking.", [(W, {"city": "Rome"})], True),
    ("hermes", "bad_json", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>', [], False),
    ("hermes", "no_arguments_key", 'Hi <tool_call>\n{"name": "get_weather"}\n</tool_call>',
     'Hi <tool_call>\n{"name": "get_weather"}\n</tool_call>', [], False),
    # llama3_json: the whole output is the JSON call(s).
    ("llama3_json", "plain", "Hello! How can I help you today?", "Hello! How can I help you today?", [], True),
    ("llama3_json", "one", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}', "",
     [(W, {"city": "Paris", "days": 2})], True),
    ("llama3_json", "python_tag", '<|python_tag|>{"name": "get_weather", "arguments": {"city": "Lima"}}', "",
     [(W, {"city": "Lima"})], True),
    ("llama3_json", "two", '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "search", '
     '"parameters": {"query": "Eiffel"}}', "", [(W, {"city": "Paris"}), ("search", {"query": "Eiffel"})], True),
    ("llama3_json", "nested", '{"name": "search", "parameters": {"query": "naïve \\"q\\"", "filters": {"tags": '
     '["α", "β"], "n": {"m": 1}}}}', "", [("search", {"query": 'naïve "q"', "filters": {"tags": ["α", "β"],
                                                                                        "n": {"m": 1}}})], True),
    ("llama3_json", "content_before", 'Sure! {"name": "get_weather", "parameters": {"city": "Paris"}}',
     'Sure! {"name": "get_weather", "parameters": {"city": "Paris"}}', [], True),
    ("llama3_json", "json_not_a_call", '{"answer": 42}', '{"answer": 42}', [], True),
    ("llama3_json", "bad_json", '{"name": "get_weather", "parameters": {"city": "Paris"',
     '{"name": "get_weather", "parameters": {"city": "Paris"', [], False),
    # mistral: [TOOL_CALLS] then name[ARGS]{...} (v11+) or a JSON list (older tokenizers).
    ("mistral", "plain", "Bonjour ! Comment puis-je vous aider ?", "Bonjour ! Comment puis-je vous aider ?", [],
     True),
    ("mistral", "one", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}', "",
     [(W, {"city": "Paris", "days": 3})], True),
    ("mistral", "two", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]search[ARGS]{"query": "musées"}',
     "", [(W, {"city": "Paris"}), ("search", {"query": "musées"})], True),
    ("mistral", "content_before", 'Let me look that up.[TOOL_CALLS]get_weather[ARGS]{"city": "Nice"}',
     "Let me look that up.", [(W, {"city": "Nice"})], True),
    ("mistral", "no_args_token", '[TOOL_CALLS]get_weather{"city": "Lyon"}', "", [(W, {"city": "Lyon"})], True),
    ("mistral", "nested", '[TOOL_CALLS]search[ARGS]{"query": "l\'été \\"chaud\\"", "filters": {"lang": ["fr"], '
     '"geo": {"lat": 48.85, "lon": 2.35}}}', "",
     [("search", {"query": 'l\'été "chaud"', "filters": {"lang": ["fr"], "geo": {"lat": 48.85, "lon": 2.35}}})],
     True),
    ("mistral", "pre_v11_list", 'Sure.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "search", "arguments": {"query": "q"}}]', "Sure.",
     [(W, {"city": "Paris"}), ("search", {"query": "q"})], True),
    ("mistral", "bad_args_kept", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"', "",
     [(W, '{"city": "Paris"')], False),
    ("mistral", "bad_list", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": ',
     '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": ', [], False),
    # qwen3_xml / qwen3_coder: XML-ish blocks, values typed by the tool's schema.
    ("qwen3_xml", "plain", "Paris is the capital of France.", "Paris is the capital of France.", [], True),
    ("qwen3_xml", "one", "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
     "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", "",
     [(W, {"city": "San Francisco", "days": 3})], True),
    ("qwen3_xml", "two", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
     "</tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\nLouvre\n</parameter>\n<parameter=limit>\n5\n"
     "</parameter>\n</function>\n</tool_call>", "",
     [(W, {"city": "Paris"}), ("search", {"query": "Louvre", "limit": 5})], True),
    ("qwen3_xml", "content_before", "I'll check that.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
     "Tokyo\n</parameter>\n</function>\n</tool_call>", "I'll check that.\n\n", [(W, {"city": "Tokyo"})], True),
    ("qwen3_xml", "typed", "<tool_call>\n<function=search>\n<parameter=query>\ncafé \"crème\" <b>\nline 2\n"
     "</parameter>\n<parameter=limit>\n10\n</parameter>\n<parameter=score>\n0.5\n</parameter>\n<parameter=exact>\n"
     "True\n</parameter>\n<parameter=filters>\n{\"lang\": \"日本語\", \"n\": {\"a\": [1, 2]}}\n</parameter>\n"
     "<parameter=tags>\n['a', 'b']\n</parameter>\n<parameter=note>\nnull\n</parameter>\n<parameter=level>\nNone\n"
     "</parameter>\n<parameter=extra>\n5\n</parameter>\n</function>\n</tool_call>", "",
     [("search", {"query": 'café "crème" <b>\nline 2', "limit": 10, "score": 0.5, "exact": True,
                  "filters": {"lang": "日本語", "n": {"a": [1, 2]}}, "tags": ["a", "b"], "note": None,
                  "level": None, "extra": "5"})], True),
    ("qwen3_xml", "unknown_tool_strings", "<tool_call>\n<function=lookup>\n<parameter=id>\n42\n</parameter>\n"
     "</function>\n</tool_call>", "", [("lookup", {"id": "42"})], True),
    ("qwen3_xml", "bad_value_stays_text", "<tool_call>\n<function=get_weather>\n<parameter=city>\nnull\n"
     "</parameter>\n<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>", "",
     [(W, {"city": "null", "days": "three"})], True),
    ("qwen3_xml", "literal_tag_in_value", "<tool_call>\n<function=search>\n<parameter=query>\nuse\n<parameter=x>\n"
     "as the tag\n</parameter>\n</function>\n</tool_call>", "",
     [("search", {"query": "use\n<parameter=x>\nas the tag"})], True),
    ("qwen3_xml", "missing_param_end", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
     "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>", "", [(W, {"city": "Paris", "days": 2})], True),
    ("qwen3_xml", "unclosed_last", "Ok.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
     "</parameter>\n</function>", "Ok.\n", [(W, {"city": "Paris"})], True),
    ("qwen3_xml", "bare_function", "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>",
     "", [(W, {"city": "Paris"})], True),
    ("qwen3_xml", "bad_name", "Hm <tool_call>\n<function={{ tool.name }}>\n</function>\n</tool_call>", "Hm ", [],
     False),
    # pythonic (Llama 3.2 / 4): the whole output is a list of calls.
    ("pythonic", "plain", "I can't do that, but here's an idea.", "I can't do that, but here's an idea.", [], True),
    ("pythonic", "one", '[get_weather(city="San Francisco", days=3)]', "",
     [(W, {"city": "San Francisco", "days": 3})], True),
    ("pythonic", "two", "[get_weather(city='Paris'), search(query=\"caf\\u00e9\", limit=5)]", "",
     [(W, {"city": "Paris"}), ("search", {"query": "café", "limit": 5})], True),
    ("pythonic", "llama4_tags", '<|python_start|>[get_weather(city="Tokyo")]<|python_end|>', "",
     [(W, {"city": "Tokyo"})], True),
    ("pythonic", "nested", "[search(query='He said \"hi\", [sic]', filters={'lang': ['fr', '日本語'], 'n': "
     "{'a': None}}, exact=True, score=-1.5), get_time()]", "",
     [("search", {"query": 'He said "hi", [sic]', "filters": {"lang": ["fr", "日本語"], "n": {"a": None}},
                  "exact": True, "score": -1.5}), ("get_time", {})], True),
    ("pythonic", "content_before", 'Sure! [get_weather(city="Paris")]', 'Sure! [get_weather(city="Paris")]', [],
     True),
    ("pythonic", "not_literal", "[get_weather(city=Paris)]", "[get_weather(city=Paris)]", [], False),
    ("pythonic", "unclosed", '[get_weather(city="Paris"', '[get_weather(city="Paris"', [], False),
    # openai: gpt-oss harmony, special tokens kept.
    ("openai", "plain", "<|channel|>analysis<|message|>User says hi. Respond.<|end|><|start|>assistant<|channel|>"
     "final<|message|>Hello! How can I help?<|return|>", "Hello! How can I help?", [], True),
    ("openai", "plain_no_stop", "<|channel|>analysis<|message|>Greet.<|end|><|start|>assistant<|channel|>final"
     "<|message|>Hi there!", "Hi there!", [], True),
    ("openai", "one", "<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant<|channel|>"
     'commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"San Francisco"}<|call|>', "",
     [(W, {"city": "San Francisco"})], True),
    ("openai", "recipient_first", "<|channel|>analysis<|message|>Weather.<|end|><|start|>assistant "
     'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Tokyo", "days": 2}<|call|>', "",
     [(W, {"city": "Tokyo", "days": 2})], True),
    ("openai", "two", "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
     '{"city":"Paris"}<|call|><|start|>assistant<|channel|>commentary to=functions.search <|constrain|>json'
     '<|message|>{"query":"Louvre"}<|call|>', "", [(W, {"city": "Paris"}), ("search", {"query": "Louvre"})], True),
    ("openai", "preamble", "<|channel|>analysis<|message|>Check weather.<|end|><|start|>assistant<|channel|>"
     "commentary<|message|>Let me check the weather.<|end|><|start|>assistant<|channel|>commentary "
     'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>', "Let me check the weather.",
     [(W, {"city": "Paris"})], True),
    ("openai", "nested_no_stop", "<|channel|>commentary to=functions.search <|constrain|>json<|message|>"
     '{"query":"ümlaut \\"q\\" <|x","filters":{"tags":["a"],"deep":{"n":1.5}}}', "",
     [("search", {"query": 'ümlaut "q" <|x', "filters": {"tags": ["a"], "deep": {"n": 1.5}}})], True),
    ("openai", "preamble_and_final", "<|channel|>commentary<|message|>One moment.<|end|><|start|>assistant"
     "<|channel|>final<|message|>Done: 42.<|return|>", "One moment.\nDone: 42.", [], True),
    ("openai", "builtin_tool_dropped", "<|channel|>analysis to=browser.search code<|message|>"
     '{"query":"x"}<|call|>', "", [], True),
    ("openai", "bad_json_kept", "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
     '{"city": "Paris"<|call|>', "", [(W, '{"city": "Paris"')], False),
    ("openai", "no_harmony_tokens", "Just text.", "Just text.", [], False),
    # gemma4: call:name{...} with <|"|>-quoted strings.
    ("gemma4", "plain", "Hello there! 👋", "Hello there! 👋", [], True),
    ("gemma4", "one", f"<|tool_call>call:get_weather{{city:{Q}San Francisco{Q},days:3}}<tool_call|>", "",
     [(W, {"city": "San Francisco", "days": 3})], True),
    ("gemma4", "two", f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|><|tool_call>call:search"
     f"{{query:{Q}Louvre{Q},limit:5}}<tool_call|><|tool_response>", "",
     [(W, {"city": "Paris"}), ("search", {"query": "Louvre", "limit": 5})], True),
    ("gemma4", "content_before", f"Let me check.\n<|tool_call>call:get_weather{{city:{Q}Oslo{Q}}}<tool_call|>",
     "Let me check.", [(W, {"city": "Oslo"})], True),
    ("gemma4", "nested", f"<|tool_call>call:search{{query:{Q}café \"crème\", {{x:1}}{Q},filters:{{lang:[{Q}fr{Q},"
     f"{Q}日本語{Q}],max:2.5,strict:false}},exact:true,note:null,tags:[]}}<tool_call|>", "",
     [("search", {"query": 'café "crème", {x:1}', "filters": {"lang": ["fr", "日本語"], "max": 2.5,
                                                             "strict": False}, "exact": True, "note": None,
                  "tags": []})], True),
    ("gemma4", "unclosed_last", f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}", "", [(W, {"city": "Paris"})],
     True),
    ("gemma4", "bad_call", f"<|tool_call>call:get_weather{{city:{Q}Paris}}<tool_call|>",
     f"<|tool_call>call:get_weather{{city:{Q}Paris}}<tool_call|>", [], False),
]
# Other names of the same parsers (qwen3_coder prints what qwen3_xml does).
ALIASES = (("qwen3_xml", "qwen3_coder"), ("gemma4", "gemma"), ("llama3_json", "llama4_json"),
           ("pythonic", "llama4_pythonic"))
CASES += [(alias, *rest) for name, alias in ALIASES for (n, *rest) in CASES if n == name]
WELL_FORMED = [c for c in CASES if c[5]]


@pytest.mark.parametrize("name,case,text,content,calls,_", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_final_parse(name, case, text, content, calls, _):
    parsed = get_tool_parser(name)(TOOLS).parse(text, final=True)
    assert parsed.content == content
    got = [(c.name, json.loads(c.arguments) if isinstance(want, dict) else c.arguments)
           for c, (_n, want) in zip(parsed.calls, calls)]
    assert len(parsed.calls) == len(calls) and got == calls
    for c, (_n, want) in zip(parsed.calls, calls):
        if isinstance(want, dict):  # canonical text, so a stream's arguments match the final ones exactly
            assert c.arguments == dump_arguments(json.loads(c.arguments))


@pytest.mark.parametrize("name,case,text,content,calls,_", WELL_FORMED, ids=[f"{c[0]}-{c[1]}" for c in WELL_FORMED])
def test_streaming_prefix_contract(name, case, text, content, calls, _):
    parser = get_tool_parser(name)(TOOLS)
    final = parser.parse(text, final=True)
    seen = 0
    for i in range(len(text) + 1):
        p = parser.parse(text[:i], final=False)
        assert final.content.startswith(p.content), (i, text[:i], p.content)
        assert p.calls == final.calls[:len(p.calls)], (i, text[:i], p.calls)
        assert len(p.calls) >= seen  # calls are never taken back
        seen = len(p.calls)


def test_streams_incrementally():
    """Partial parses show content and closed calls before the output ends (the contract alone allows nothing)."""
    hermes = get_tool_parser("hermes")()
    text = ('Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "search", "arg')
    assert hermes.parse("Let me check.<tool_", final=False) == ParsedTools("Let me check.")
    assert [c.name for c in hermes.parse(text, final=False).calls] == [W]
    cases = {
        "qwen3_xml": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
                      "</tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\nLou", 1),
        "mistral": ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]sea', 1),
        "pythonic": ('[get_weather(city="Paris"), search(query="Lou', 1),
        "llama3_json": ('{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "sea', 1),
        "openai": ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}'
                   '<|call|><|start|>assistant<|channel|>commentary to=functions.search', 1),
        "gemma4": (f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|><|tool_call>call:sea", 1),
    }
    for name, (partial, n) in cases.items():
        assert len(get_tool_parser(name)(TOOLS).parse(partial, final=False).calls) == n, name
    harmony = get_tool_parser("openai")()
    assert harmony.parse("<|channel|>final<|message|>Hello wor", final=False).content == "Hello wor"
    assert harmony.parse("<|channel|>final<|message|>Hello<|ret", final=False).content == "Hello"
    assert harmony.parse("<|channel|>analysis<|message|>thinking", final=False).content == ""
    assert get_tool_parser("gemma4")().parse("Sure thing.\n<|tool", final=False).content == "Sure thing."
    assert get_tool_parser("mistral")().parse("Voilà [TOOL_", final=False).content == "Voilà "
    assert get_tool_parser("pythonic")().parse("[get_wea", final=False).content == ""
    assert get_tool_parser("llama3_json")().parse("<|python", final=False).content == ""


def test_qwen3_convert():
    assert convert("12", {"type": "integer"}) == 12
    assert convert("1.0", {"type": "number"}) == 1 and convert("2.25", {"type": "number"}) == 2.25
    assert convert("FALSE", {"type": "boolean"}) is False
    assert convert("null", {"type": "string"}) == "null"
    assert convert("None", {"anyOf": [{"type": "string"}, {"type": "null"}]}) is None
    assert convert("[1, {'a': 2}]", {"type": "array"}) == [1, {"a": 2}]
    assert convert('"{\'k\': \'v\'}"', {"type": "object"}) == {"k": "v"}
    assert convert("{1, 2}", {"type": "object"}) == "{1, 2}"  # a set has no JSON form
    assert convert("inf", {"type": "integer"}) == "inf"
    assert convert("x", {}) == "x"


def test_registry():
    required = {"hermes", "llama3_json", "mistral", "qwen3_xml", "qwen3_coder", "pythonic", "openai", "gemma4",
                "gemma"}
    assert required <= set(TOOL_PARSERS)
    assert get_tool_parser("gemma") is get_tool_parser("gemma4")
    assert get_tool_parser("qwen3_coder") is get_tool_parser("qwen3_xml")
    assert {n for n, cls in TOOL_PARSERS.items() if cls.needs_special_tokens} >= {
        "hermes", "mistral", "qwen3_xml", "openai", "gemma4"}
    with pytest.raises(ValueError) as e:
        get_tool_parser("qwen25")
    assert "qwen25" in str(e.value) and ",".join(sorted(TOOL_PARSERS)) in str(e.value)
    # every registered name has well-formed fixtures with calls, so the contract test covers it
    assert {c[0] for c in WELL_FORMED if c[4]} == set(TOOL_PARSERS)
