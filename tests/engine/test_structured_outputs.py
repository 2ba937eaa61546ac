"""Structured outputs through the Python API on gemma-3-270m, both backends (xgrammar, llguidance): every schema of
structured_schemas.py gives a valid instance, regex / choice / grammar outputs match, bad constraints are refused
before anything is queued, constrained and free requests share batches without changing the free ones, and a
grammar that accepts nothing more ends its request cleanly."""
from __future__ import annotations

import json
import re

import pytest

from engine import LLM, SamplingParams
from engine.engine import GRAMMAR_END
from engine.errors import RequestsFailed
from engine.structured.params import StructuredOutputsParams
from tests.engine.structured_schemas import MODELS, Paint, prompt_for

BACKENDS = ["xgrammar", "guidance"]


@pytest.fixture(scope="module", params=BACKENDS)
def llm(request):
    return LLM(max_model_len=512, structured_outputs_backend=request.param)


def greedy(so: StructuredOutputsParams, max_tokens: int = 200, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, structured_outputs=so, **kw)


def test_every_schema_gives_a_valid_instance(llm):
    """Objects take only their properties (OpenAI's strict schemas; xgrammar's strict mode does so anyway)."""
    params = [greedy(StructuredOutputsParams(json=m.model_json_schema(), disable_additional_properties=True))
              for m in MODELS]
    outs = llm.generate([prompt_for(m) for m in MODELS], params, use_tqdm=False)
    for m, out in zip(MODELS, outs):
        o = out.outputs[0]
        assert o.finish_reason == "stop", (m.__name__, o.text)
        m.model_validate_json(o.text)  # raises on anything the schema does not allow


def test_regex_choice_and_grammars_match(llm):
    cases = [
        (StructuredOutputsParams(regex=r"[A-Z][a-z]{2,6} [0-9]{2}"), lambda t: re.fullmatch(r"[A-Z][a-z]{2,6} [0-9]{2}", t)),
        (StructuredOutputsParams(choice=["yes", "no", "it \"depends\""]), lambda t: t in ("yes", "no", 'it "depends"')),
        (StructuredOutputsParams(grammar='root ::= "cat" | "dog" " " [0-9] [0-9]?'),  # EBNF
         lambda t: re.fullmatch(r"cat|dog [0-9]{1,2}", t)),
        (StructuredOutputsParams(grammar='start: "ping" | "pong" NUM\nNUM: /[0-9]{3}/'),  # Lark
         lambda t: re.fullmatch(r"ping|pong[0-9]{3}", t)),
        (StructuredOutputsParams(json_object=True), lambda t: isinstance(json.loads(t), dict)),
    ]
    outs = llm.generate(["Answer: "] * len(cases), [greedy(so, 40) for so, _ in cases], use_tqdm=False)
    for (so, ok), out in zip(cases, outs):
        assert ok(out.outputs[0].text), (so.kind, out.outputs[0].text)


@pytest.mark.parametrize("so,message", [
    (dict(json={"type": "object", "properties": {"a": {"type": "objectx"}}}), "objectx"),
    (dict(regex="a(b"), "structured_outputs.regex"),
    (dict(grammar="root ::= \"a\" | ("), "structured_outputs.grammar"),
])
def test_bad_constraints_are_refused_before_queueing(llm, so, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        llm.generate(["x"], greedy(StructuredOutputsParams(**so)), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_constrained_and_free_requests_share_a_batch(llm):
    free = SamplingParams(max_tokens=24, temperature=0.0)
    alone = llm.generate(["The capital of France is"], free, use_tqdm=False)[0].outputs[0].text
    so = StructuredOutputsParams(json=MODELS[0].model_json_schema(), disable_additional_properties=True)
    outs = llm.generate(["Write one person as JSON.", "The capital of France is", "Write one person as JSON."],
                        [greedy(so), free, greedy(so)], use_tqdm=False)
    assert outs[1].outputs[0].text == alone
    for i in (0, 2):
        MODELS[0].model_validate_json(outs[i].outputs[0].text)


def test_sampled_completions_follow_the_schema(llm):
    """Paint: an enum and a bounded integer, so that random digits cannot run past max_tokens."""
    so = StructuredOutputsParams(json=Paint.model_json_schema(), disable_any_whitespace=True,
                                 disable_additional_properties=True)
    out = llm.generate(["Some paint:"], SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=120,
                                                       structured_outputs=so), use_tqdm=False)[0]
    for o in out.outputs:
        Paint.model_validate_json(o.text)
        assert "\n" not in o.text and "  " not in o.text  # no free whitespace: single-space separators at most


def test_a_grammar_that_accepts_nothing_more_ends_the_request(llm):
    """With ignore_eos the end of the choice and the EOS after it leave no token the grammar allows."""
    out = llm.generate(["Answer: "], greedy(StructuredOutputsParams(choice=["yes", "no"]), 20, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop" and out.stop_reason == GRAMMAR_END
    assert len(out.token_ids) < 20


def test_params_are_checked_on_their_own():
    with pytest.raises(ValueError, match="exactly one of json, json_object, regex, choice, grammar, structural_tag; "
                                         "got json, regex"):
        StructuredOutputsParams(json={}, regex="a")
    with pytest.raises(ValueError, match="got none"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="whitespace_pattern must be a regex string, with json or json_object"):
        StructuredOutputsParams(regex="a+", whitespace_pattern=r"\s*")
    with pytest.raises(ValueError, match="choice must be a non-empty list of strings"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match="json is not valid JSON"):
        StructuredOutputsParams(json="{not json")
    assert SamplingParams(structured_outputs={"regex": "a+"}).structured_outputs.regex == "a+"


def test_auto_sends_what_xgrammar_would_not_enforce_to_guidance():
    from engine.structured.manager import StructuredOutputs
    from engine.tokenization.tokenizer import Tokenizer  # noqa: F401  (the engine's tokenizer type)
    llm = LLM(max_model_len=128)  # the default backend: auto
    manager: StructuredOutputs = llm.llm_engine.structured
    assert manager.check(StructuredOutputsParams(json={"type": "integer", "minimum": 0})) == "xgrammar"
    multiple = {"type": "integer", "multipleOf": 5, "minimum": 5, "maximum": 95}
    assert manager.check(StructuredOutputsParams(json=multiple)) == "guidance"
    with pytest.raises(ValueError, match="uses multipleOf, which xgrammar does not enforce"):
        manager.check(StructuredOutputsParams(json=multiple, disable_fallback=True))
    with pytest.raises(ValueError, match="uses not"):  # neither backend takes it: xgrammar's reason
        manager.check(StructuredOutputsParams(json={"not": {"type": "string"}}))
    compact = StructuredOutputsParams(json_object=True, whitespace_pattern="")  # guidance's: no free whitespace
    assert manager.check(compact) == "guidance"
    text = llm.generate(["An object:"], greedy(compact, 40), use_tqdm=False)[0].outputs[0].text
    outside_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    assert isinstance(json.loads(text), dict) and not re.search(r"\s", outside_strings), text
    out = llm.generate(["A multiple of five:"], greedy(StructuredOutputsParams(json=multiple), 8), use_tqdm=False)
    assert int(out[0].outputs[0].text) % 5 == 0


def test_structural_tags_dispatch_on_their_triggers():
    """vLLM's structural_tag form: free text until a trigger, then the structure's schema up to its end tag. Fed a
    string token by token, the matcher takes a valid call and refuses a call that breaks the schema."""
    llm = LLM(max_model_len=128, structured_outputs_backend="xgrammar")
    manager, tok = llm.llm_engine.structured, llm.get_tokenizer()
    tag = {"type": "structural_tag", "triggers": ["<fn"], "structures": [
        {"begin": "<fn=add>", "schema": {"type": "object", "properties": {"a": {"type": "integer"}},
                                          "required": ["a"], "additionalProperties": False}, "end": "</fn>"}]}
    so = StructuredOutputsParams(structural_tag=json.dumps(tag))

    def takes(text: str) -> bool:
        m = manager.matcher(manager.check(so), manager.compile(so).result())
        return all(m.accept(t) for t in tok.encode(text, add_special_tokens=False))
    assert takes('Let me add. <fn=add>{"a": 12}</fn> Done.')
    assert not takes('Let me add. <fn=add>{"b": 12}')
    with pytest.raises(ValueError, match="structural_tag is an xgrammar feature"):
        LLM(max_model_len=128, structured_outputs_backend="guidance").generate(["x"], greedy(so), use_tqdm=False)


def test_odd_constraints_are_value_errors_not_crashes(llm):
    """Non-boolean flags, a schema nested past Python's recursion limit, and a matcher that raises mid-step: each
    fails its own request with a ValueError (or alone in the step) and the engine goes on."""
    with pytest.raises(ValueError, match="disable_fallback must be true or false"):
        StructuredOutputsParams(json_object=True, disable_fallback="false")
    deep: dict = {"type": "string"}
    for _ in range(5000):
        deep = {"type": "array", "items": deep}
    with pytest.raises(ValueError, match="structured_outputs.json"):
        llm.llm_engine.structured.check(StructuredOutputsParams(json=deep))
    so = StructuredOutputsParams(choice=["alpha", "beta"])
    free = SamplingParams(max_tokens=8, temperature=0.0)
    engine = llm.llm_engine
    bad = engine.add_request("bad", "Answer: ", greedy(so, 8))
    good = engine.add_request("good", "The capital of France is", free)
    for _ in range(100):  # until both are admitted (the grammar may still be compiling)
        if "bad" in engine.children and "good" in engine.children:
            break
        engine.step()

    def broken(bitmask, row):
        raise RuntimeError("matcher broke")
    engine.children["bad"].grammar.fill = broken
    outputs, failed = {}, {}
    while engine.has_unfinished_requests():
        try:
            outs = engine.step()
        except RequestsFailed as e:
            failed.update(e.failures)
            outs = e.outputs
        outputs.update({o.request_id: o for o in outs if o.finished})
    assert set(failed) == {bad} and "matcher broke" in str(failed[bad])
    assert outputs[good].outputs[0].text == llm.generate(["The capital of France is"], free,
                                                         use_tqdm=False)[0].outputs[0].text


def test_grammar_starts_after_the_reasoning_end(llm):
    """With a reasoning parser the grammar constrains the answer, not the reasoning: tokens are free until the
    text shows the end marker (here ", " stands for "</think>", which gemma-3-270m does not write), then the
    regex holds."""
    so = StructuredOutputsParams(regex="[0-9]{3}")
    so._reasoning_end = ", "
    out = llm.generate(["Name three colours, one after another"], greedy(so, max_tokens=60))[0].outputs[0]
    tok, ids = llm.get_tokenizer(), list(out.token_ids)
    opened = next(i for i in range(len(ids)) if ", " in tok.decode(ids[:i + 1], skip_special_tokens=False))
    assert opened > 0 and re.fullmatch("[0-9]{3}", tok.decode(ids[opened + 1:])), out.text
    assert out.finish_reason == "stop"
