"""The offline API on the real model: vLLM-shaped outputs, prompt forms, logprobs, bad input."""
from __future__ import annotations

import math

import pytest

from engine import LLM, SamplingParams
from engine.errors import ModelLoadError


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=256, kv_cache_memory=0.25)


def test_generate_strings_and_token_ids_agree(llm):
    tok = llm.get_tokenizer()
    ids = tok.encode("The capital of France is")
    assert ids[0] == tok.bos_token_id
    params = SamplingParams(temperature=0.0, max_tokens=8)
    a, b = llm.generate(["The capital of France is", {"prompt_token_ids": ids}], params, use_tqdm=False)
    assert a.prompt_token_ids == ids and b.prompt_token_ids == ids
    assert a.prompt == "The capital of France is" and b.prompt is None
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert len(a.outputs[0].token_ids) == 8 and a.outputs[0].finish_reason == "length"
    assert a.outputs[0].text == tok.decode(a.outputs[0].token_ids)
    assert a.finished


def test_logprobs_and_prompt_logprobs_in_vllm_form(llm):
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=3, prompt_logprobs=2)
    out = llm.generate("Hello world, this is", params, use_tqdm=False)[0]
    comp = out.outputs[0]
    assert len(comp.logprobs) == 4
    for tok_id, entry in zip(comp.token_ids, comp.logprobs):
        assert tok_id in entry and entry[tok_id].rank == 1  # greedy picks the top-1
        assert 3 <= len(entry) <= 4
        assert all(lp.logprob <= 0 and lp.decoded_token is not None for lp in entry.values())
    assert math.isclose(comp.cumulative_logprob, sum(e[t].logprob for t, e in zip(comp.token_ids, comp.logprobs)),
                        rel_tol=1e-6)
    pl = out.prompt_logprobs
    assert len(pl) == len(out.prompt_token_ids) and pl[0] is None
    for j in range(1, len(pl)):
        assert out.prompt_token_ids[j] in pl[j]
        assert 2 <= len(pl[j]) <= 3
        ranks = sorted(lp.rank for lp in pl[j].values())
        assert ranks[0] == 1


def test_prompt_longer_than_max_model_len_is_a_clear_error(llm):
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt_token_ids": [2] + [100] * 300}, SamplingParams(max_tokens=1), use_tqdm=False)
    # The engine still serves afterwards.
    assert llm.generate("Hi", SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)[0].finished


def test_stream_yields_growing_text(llm):
    texts = [o.outputs[0].text for o in llm.generate_stream("One, two, three,", SamplingParams(max_tokens=6,
                                                                                               temperature=0))]
    assert len(texts) == 6 and all(texts[i].startswith(texts[i - 1]) for i in range(1, len(texts)))


def test_corrupt_model_file_raises_model_load_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(ModelLoadError, match="bad.gguf"):
        LLM(model=str(bad))


def test_engine_compiles_new_fused_blocks_after_a_first_token(llm, monkeypatch, tmp_path):
    """An uncached fused-block signature is noted at the warm-up; the engine starts its compile once a request has
    sampled a token (not before the first token), and the decode steps after it run the blocks fused."""
    from engine.model import fused_compile
    from tests.fused_calls import count_fused_calls
    monkeypatch.setenv("RAMLM_FUSED_COMPILE", "background")
    monkeypatch.setattr(fused_compile, "CACHE_DIR", str(tmp_path))  # no markers: every signature is new here
    monkeypatch.setattr(fused_compile, "_state", {})
    monkeypatch.setattr(fused_compile, "_wanted", {})
    blocks = llm.llm_engine.runner.model.blocks
    for b in blocks:
        b.fused.reset()
    calls = count_fused_calls(monkeypatch)
    params = SamplingParams(max_tokens=3, temperature=0)
    first = llm.generate(["The capital of France is"], params, use_tqdm=False)
    assert not fused_compile.pending()  # started after the first token
    fused_compile.wait()
    assert any(p.name.startswith("fused-block-") for p in tmp_path.iterdir())
    calls[0] = 0
    again = llm.generate(["The capital of France is"], params, use_tqdm=False)
    assert calls[0] >= 2 * len(blocks)  # the prompt and the decode steps ran fused
    assert again[0].outputs[0].token_ids == first[0].outputs[0].token_ids
