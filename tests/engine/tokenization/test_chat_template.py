"""Chat templates: rendering parity with transformers, built-in templates' exact text, BOS handling."""
from __future__ import annotations

import json

import jinja2
import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from engine.tokenization import chat_templates
from engine.tokenization.tokenizer import Tokenizer

SPECIALS = ["<s>", "</s>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>",
            "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

# Exercises what transformers' environment adds or configures: trim_blocks/lstrip_blocks, loop controls,
# namespace, tojson without HTML escaping (and its arguments), raise_exception, strftime_now, tools,
# special-token variables and extra keyword arguments.
TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(n=0) %}
{% if tools %}
    <tools>{{ tools | tojson }}</tools>
    <pretty>{{ tools[0] | tojson(indent=2, sort_keys=True) }}</pretty>
{% endif %}
{% for message in messages %}
    {% if message['role'] == 'skip' %}{% continue %}{% endif %}
    {% if message['role'] == 'stop' %}{% break %}{% endif %}
    {% set ns.n = ns.n + 1 %}
    <|im_start|>{{ message['role'] }}
    {% if message['content'] is string %}
{{ message['content'] }}
    {% else %}
        {% for part in message['content'] %}[{{ part['type'] }}:{{ part.get('text', '') }}]{% endfor %}
    {% endif %}
    {% if message.tool_calls is defined %}calls={{ message.tool_calls | tojson }}{% endif %}
<|im_end|>
{% endfor %}
count={{ ns.n }} year={{ strftime_now('%Y') | length }} think={{ enable_thinking | default('unset') }}
{% if messages | length > 6 %}{{ raise_exception('too many messages: ' ~ messages | length) }}{% endif %}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}{{ eos_token }}"""

CONVERSATIONS = [
    [{"role": "user", "content": "Hi <b>&amp; \"quotes\" 'single' ünïcödé 日本"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4", "tool_calls": None},
     {"role": "skip", "content": "dropped"}, {"role": "user", "content": [{"type": "text", "text": "and 3+3?"},
                                                                         {"type": "image"}]}],
    [{"role": "user", "content": "a"}, {"role": "stop", "content": "b"}, {"role": "user", "content": "c"}],
    [{"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": {"x": "<1>"}}]}],
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather & <rain>",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def _backend(with_bos_post_processor=False) -> Backend:
    corpus = ["Hi there, how are you? What is 2+2? and 3+3? Be brief. user assistant system model"] * 20
    tok = Backend(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if with_bos_post_processor:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return tok


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_hf_tokenizer")
    _backend(with_bos_post_processor=True).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE}))
    return folder


@pytest.fixture(scope="module")
def ours(hf_folder):
    return Tokenizer.from_hf(hf_folder)


@pytest.fixture(scope="module")
def theirs(hf_folder):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(hf_folder))


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_template_renders_like_transformers(ours, theirs, conv, gen, tools):
    msgs = CONVERSATIONS[conv]
    kw = {"enable_thinking": False} if conv == 1 else {}
    text = ours.apply_chat_template(msgs, add_generation_prompt=gen, tools=tools, **kw)
    assert text == theirs.apply_chat_template(msgs, add_generation_prompt=gen, tools=tools, tokenize=False, **kw)
    ids = ours.apply_chat_template(msgs, add_generation_prompt=gen, tools=tools, tokenize=True, **kw)
    assert ids == theirs.apply_chat_template(msgs, add_generation_prompt=gen, tools=tools, tokenize=True,
                                             return_dict=False, **kw)
    assert ids.count(ours.bos_token_id) == 1 and ids == ours.encode(text)


def test_template_exception_is_raised(ours, theirs):
    msgs = [{"role": "user", "content": str(i)} for i in range(7)]
    with pytest.raises(jinja2.TemplateError, match="too many messages: 7"):
        ours.apply_chat_template(msgs)
    with pytest.raises(jinja2.TemplateError, match="too many messages: 7"):
        theirs.apply_chat_template(msgs, tokenize=False)


def test_sandbox_blocks_attribute_escapes():
    with pytest.raises(jinja2.exceptions.SecurityError):
        chat_templates.render("{{ messages.__class__.__mro__ }}", [])
    with pytest.raises(jinja2.exceptions.SecurityError):  # immutable: no mutating the caller's data
        chat_templates.render("{{ messages.append(1) }}", [])


BUILTIN_CASES = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  Hi  "},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": [{"type": "text", "text": "Bye"}]}],
]


@pytest.mark.parametrize("name", ["GEMMA_TEMPLATE", "LLAMA3_TEMPLATE", "LLAMA2_TEMPLATE", "CHATML_TEMPLATE"])
@pytest.mark.parametrize("case", range(len(BUILTIN_CASES)))
def test_builtin_templates_render_like_transformers(name, case):
    utils = pytest.importorskip("transformers.utils.chat_template_utils")
    source = getattr(chat_templates, name)
    msgs = BUILTIN_CASES[case]
    if name == "LLAMA2_TEMPLATE" and case == 1:  # Llama 2's template reads content as a string
        msgs = msgs[:3]
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    for gen in (True, False):
        ours = chat_templates.render(source, msgs, add_generation_prompt=gen, special_tokens=special)
        theirs = utils.render_jinja_template([msgs], chat_template=source, add_generation_prompt=gen, **special)[0][0]
        assert ours == theirs


def test_gemma_builtin_exact_text():
    src = chat_templates.GEMMA_TEMPLATE
    render = lambda msgs, gen=True: chat_templates.render(src, msgs, add_generation_prompt=gen,  # noqa: E731
                                                          special_tokens={"bos_token": "<bos>"})
    assert render([{"role": "user", "content": "Hello"}]) == \
        "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n"
    assert render(BUILTIN_CASES[1]) == (
        "<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n")
    assert render([{"role": "user", "content": "Hello"}], gen=False) == "<bos><start_of_turn>user\nHello<end_of_turn>\n"
    with pytest.raises(jinja2.TemplateError, match="alternate"):
        render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_other_builtins_exact_text():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    assert chat_templates.render(chat_templates.LLAMA3_TEMPLATE, msgs, special_tokens=special) == (
        "<s><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert chat_templates.render(chat_templates.LLAMA2_TEMPLATE, msgs + [{"role": "assistant", "content": "A"}],
                                 special_tokens=special) == "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST] A </s>"
    assert chat_templates.render(chat_templates.CHATML_TEMPLATE, msgs) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n")


def test_harmony_builtin_exact_text():
    """gpt-oss's harmony format (the layout its checkpoints' template renders, without tools)."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]
    got = chat_templates.render(chat_templates.HARMONY_TEMPLATE, msgs, strftime_now=lambda fmt: "2025-08-28",
                                reasoning_effort="high")
    assert got == (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: 2025-08-28\n\nReasoning: high\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
        "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|end|>"
        "<|start|>user<|message|>2+2?<|end|><|start|>assistant")
    assert "Reasoning: medium" in chat_templates.render(chat_templates.HARMONY_TEMPLATE, msgs[1:2])
    assert chat_templates.builtin_template("gpt-oss", lambda t: False) is chat_templates.HARMONY_TEMPLATE


def test_builtin_template_selection():
    has = lambda *names: (lambda t: t in names)  # noqa: E731
    assert chat_templates.builtin_template("gemma3", has()) is chat_templates.GEMMA_TEMPLATE
    assert chat_templates.builtin_template("llama", has("<|start_header_id|>")) is chat_templates.LLAMA3_TEMPLATE
    assert chat_templates.builtin_template("llama", has()) is chat_templates.LLAMA2_TEMPLATE
    for arch in ("qwen2", "qwen3", "qwen3moe"):
        assert chat_templates.builtin_template(arch, has()) is chat_templates.CHATML_TEMPLATE
    assert chat_templates.builtin_template("mystery", has("<|im_start|>")) is chat_templates.CHATML_TEMPLATE
    assert chat_templates.builtin_template("mystery", has()) is None


def _tokenizer(arch, bos="<bos>", add_bos=True, template=None) -> Tokenizer:
    backend = _backend()
    bos_id = backend.token_to_id(bos)
    if add_bos:
        backend.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, bos_id)])
    return Tokenizer(backend, bos_token_id=bos_id, eos_token_id=backend.token_to_id("<eos>"),
                     chat_template=template, arch=arch)


def test_gemma_builtin_through_tokenizer_has_one_bos():
    tok = _tokenizer("gemma3")
    msgs = [{"role": "user", "content": "Hi there"}]
    text = tok.apply_chat_template(msgs)
    assert text == "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n"
    ids = tok.apply_chat_template(msgs, tokenize=True)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert ids == tok.encode(text)  # encoding the rendered text as a prompt: still one BOS
    # <eos> first, then every end-of-generation token the vocabulary has (this one has all three kinds)
    assert tok.eos_token_ids == (tok.eos_token_id, *sorted(tok.convert_tokens_to_ids(
        ["<|im_end|>", "<end_of_turn>", "<|eot_id|>"])))


def test_bos_added_when_template_omits_it():
    tok = _tokenizer("mystery", template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True)
    assert ids == tok.encode("Hi") and ids[0] == tok.bos_token_id
    no_bos = _tokenizer("qwen2", add_bos=False)
    assert no_bos.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True) == \
        no_bos.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_no_template_at_all_raises():
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(Backend(models.BPE()), bos_token_id=None, eos_token_id=None).apply_chat_template(
            [{"role": "user", "content": "x"}])


def test_none_valued_keys_are_dropped():
    out = chat_templates.render("{{ messages[0] | tojson }}", [{"role": "user", "content": None, "name": "n"}])
    assert out == '{"role": "user", "name": "n"}'
