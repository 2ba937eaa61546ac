"""LoRA in the engine: LLM.generate with LoRARequests, batches mixing adapters (more than max_loras: the others wait)
equal to each request alone; prefix-cache blocks kept apart by adapter; adapters dropped from RAM beyond
max_cpu_loras and read again; bad adapters refused with nothing held; speculative decoding on top."""
from __future__ import annotations

import pytest

from engine import LLM, LoRARequest, SamplingParams
from tests.engine.lora.adapters import ATTENTION, EVERY, MLP, save_adapter
from tests.model.tiny_models import saved_tiny, tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
PROMPTS = [[3, 17, 42, 99], [7, 5, 200], [13, 8, 77, 31, 4], [9, 9], [120, 121, 122], [60, 61, 62, 63]]
KW = dict(enable_lora=True, max_lora_rank=16, block_size=4, kv_cache_dtype="fp32", dtype="float32",
          max_model_len=64, num_gpu_blocks_override=96)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_engine")
    hf, _ = saved_tiny(root / "base", "qwen3")
    loras = []
    for i, targets in enumerate((ATTENTION, MLP, EVERY)):
        save_adapter(hf, root / f"l{i}", targets, seed=10 + i)
        loras.append(LoRARequest(f"l{i}", i + 1, str(root / f"l{i}")))
    llm = LLM(model=str(root / "base"), max_loras=2, max_cpu_loras=2, **KW)
    return root, hf, loras, llm


def tokens_and_logprobs(out):
    c = out.outputs[0]
    return list(c.token_ids), [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)]


def test_mixed_batch_equals_each_alone(setup):
    root, hf, loras, llm = setup
    which = [loras[0], None, loras[1], loras[2], loras[0], None]  # three adapters, max_loras 2: one waits
    batch = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False, lora_request=which)
    for p, lora, out in zip(PROMPTS, which, batch):
        alone = llm.generate({"prompt_token_ids": p}, GREEDY, use_tqdm=False, lora_request=lora)[0]
        (t1, l1), (t2, l2) = tokens_and_logprobs(out), tokens_and_logprobs(alone)
        assert t1 == t2
        assert max(abs(a - b) for a, b in zip(l1, l2)) < 1e-5
    base = tokens_and_logprobs(batch[1])
    assert tokens_and_logprobs(llm.generate({"prompt_token_ids": PROMPTS[1]}, GREEDY, use_tqdm=False,
                                            lora_request=loras[2])[0]) != base  # the adapters change the answers
    # max_cpu_loras 2: the least recently used went, but never one in a slot (both slots' adapters may be running
    # while a third is read for a new request)
    lora = llm.llm_engine.lora
    assert len(lora.loaded) <= 3 and all(lid in lora.loaded for lid in lora.slots if lid)


def test_prefix_cache_is_kept_apart_by_adapter(setup):
    root, hf, loras, llm = setup
    prompt = {"prompt_token_ids": list(range(30, 50))}  # five full blocks
    first = llm.generate(prompt, GREEDY, use_tqdm=False, lora_request=loras[0])[0]
    other = llm.generate(prompt, GREEDY, use_tqdm=False, lora_request=loras[1])[0]
    again = llm.generate(prompt, GREEDY, use_tqdm=False, lora_request=loras[0])[0]
    plain = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    assert other.num_cached_tokens == 0 and plain.num_cached_tokens == 0  # another adapter's KV is not theirs
    assert again.num_cached_tokens >= 16
    assert tokens_and_logprobs(again)[0] == tokens_and_logprobs(first)[0]


def test_bad_adapters_are_refused_and_hold_nothing(setup, tmp_path):
    root, hf, loras, llm = setup
    wide = tiny_model("qwen3", hidden_size=128, head_dim=32)  # another base model's adapter
    save_adapter(wide, tmp_path / "wide", ATTENTION, seed=1)
    save_adapter(hf, tmp_path / "big", ATTENTION, seed=2, r=32)
    save_adapter(hf, tmp_path / "dora", ATTENTION, seed=3, use_dora=True)
    cases = {"wide": "do not fit", "big": "max_lora_rank", "dora": "DoRA", "missing": "does not exist"}
    engine = llm.llm_engine
    free = engine.kv_manager.num_free_blocks
    for i, (name, words) in enumerate(cases.items()):
        bad = LoRARequest(name, 100 + i, str(tmp_path / name))
        with pytest.raises(ValueError, match=words):
            llm.generate([{"prompt_token_ids": [5, 6]}] * 2, GREEDY, use_tqdm=False, lora_request=[loras[0], bad])
        assert not engine.has_unfinished_requests()
    assert engine.kv_manager.num_free_blocks == free
    with pytest.raises(ValueError, match="is adapter 'l0'"):  # one id, two adapters
        llm.generate({"prompt_token_ids": [5]}, GREEDY, use_tqdm=False,
                     lora_request=LoRARequest("renamed", loras[0].lora_int_id, str(tmp_path / "big")))
    ok = llm.generate({"prompt_token_ids": [5, 6]}, GREEDY, use_tqdm=False, lora_request=loras[0])[0]
    assert len(ok.outputs[0].token_ids) == 6


def test_lora_needs_enable_lora(setup):
    root, hf, loras, _ = setup
    llm = LLM(model=str(root / "base"), **{**KW, "enable_lora": False})
    with pytest.raises(ValueError, match="enable_lora"):
        llm.generate({"prompt_token_ids": [5]}, GREEDY, use_tqdm=False, lora_request=loras[0])
    with pytest.raises(ValueError, match="max_cpu_loras"):
        LLM(model=str(root / "base"), max_loras=3, max_cpu_loras=2, **KW)


def test_speculative_decoding_with_adapters(setup):
    """n-gram drafts are checked by the adapter's own rows: the same greedy answer as without drafts."""
    root, hf, loras, llm = setup
    spec = LLM(model=str(root / "base"), max_loras=2, **KW,
               speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                   "prompt_lookup_max": 2})
    prompts = [{"prompt_token_ids": [40, 41, 42, 40, 41, 42, 40, 41]}] * 3
    which = [loras[0], None, loras[2]]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False, lora_request=which)]
    got = [o.outputs[0].token_ids for o in spec.generate(prompts, params, use_tqdm=False, lora_request=which)]
    assert got == want


def test_embeddings_with_an_adapter(setup):
    """A pooling model runs adapters too: LLM.embed's vector is PEFT's last hidden state, normalized."""
    import numpy as np
    import torch
    root, hf, loras, _ = setup
    llm = LLM(model=str(root / "base"), runner="pooling", max_loras=1, **KW)
    ids = [5, 6, 7, 8]
    model = save_adapter(hf, root / "embed", ATTENTION + MLP, seed=7)
    with torch.no_grad():
        h = model.base_model.model.model(torch.tensor([ids])).last_hidden_state[0, -1].double()
    want = torch.nn.functional.normalize(h, dim=0).numpy()
    got = llm.embed({"prompt_token_ids": ids}, use_tqdm=False,
                    lora_request=LoRARequest("embed", 9, str(root / "embed")))[0].outputs.embedding
    plain = llm.embed({"prompt_token_ids": ids}, use_tqdm=False)[0].outputs.embedding
    assert np.abs(np.asarray(got) - want).max() < 2e-3 < np.abs(np.asarray(plain) - want).max()
