"""continue_final_message and custom roles render as transformers renders them (the reference vLLM uses)."""
from __future__ import annotations

import json

import pytest

from engine.tokenization import chat_templates
from engine.tokenization.tokenizer import Tokenizer
from tests.engine.tokenization.test_chat_template import TEMPLATE, _backend

TEMPLATES = {"custom": TEMPLATE, "gemma": chat_templates.GEMMA_TEMPLATE, "chatml": chat_templates.CHATML_TEMPLATE,
             "llama3": chat_templates.LLAMA3_TEMPLATE}

CONTINUED = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! My name is"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "  padded answer  "}],  # trimmed by some
    [{"role": "user", "content": "Hi"},
     {"role": "assistant", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second part"}]}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write a list:\n1."}],  # a user turn
]


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def pair(request, tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp(f"tok_{request.param}")
    _backend(with_bos_post_processor=True).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATES[request.param]}))
    return Tokenizer.from_hf(folder), transformers.AutoTokenizer.from_pretrained(str(folder))


@pytest.mark.parametrize("conv", range(len(CONTINUED)))
def test_continue_final_message_like_transformers(pair, conv):
    ours, theirs = pair
    msgs = CONTINUED[conv]
    kw = dict(add_generation_prompt=False, continue_final_message=True)
    text = ours.apply_chat_template(msgs, **kw)
    assert text == theirs.apply_chat_template(msgs, tokenize=False, **kw)
    ids = theirs.apply_chat_template(msgs, tokenize=True, return_dict=False, **kw)
    if ids[:1] != [ours.bos_token_id]:
        ids = [ours.bos_token_id] + ids  # ours puts BOS in front where the template does not write it
    assert ours.apply_chat_template(msgs, tokenize=True, **kw) == ids
    closed = ours.apply_chat_template(msgs, add_generation_prompt=False)
    assert closed.startswith(text) and len(closed) > len(text)  # the final turn's closing tokens are gone
    assert msgs == CONTINUED[conv]  # the caller's messages are left as they were


def test_continue_final_message_with_generation_prompt_is_refused(pair):
    ours, _ = pair
    with pytest.raises(ValueError, match="not compatible"):
        ours.apply_chat_template(CONTINUED[0], add_generation_prompt=True, continue_final_message=True)


def test_continue_final_message_without_text_is_refused(pair):
    ours, _ = pair
    with pytest.raises(ValueError, match="no text to continue"):
        ours.apply_chat_template([{"role": "user", "content": [{"type": "image"}]}], add_generation_prompt=False,
                                 continue_final_message=True)


def test_custom_role_reaches_the_template():
    ours_chatml = chat_templates.render(chat_templates.CHATML_TEMPLATE,
                                        [{"role": "narrator", "content": "Once upon a time"}])
    assert ours_chatml.startswith("<|im_start|>narrator\nOnce upon a time<|im_end|>")
    # Gemma's template names any role but user/assistant as it is, and raises where turns do not alternate.
    text = chat_templates.render(chat_templates.GEMMA_TEMPLATE, [{"role": "user", "content": "Hi"},
                                                                 {"role": "critic", "content": "Meh"}],
                                 special_tokens={"bos_token": "<bos>"})
    assert "<start_of_turn>critic\nMeh<end_of_turn>" in text
