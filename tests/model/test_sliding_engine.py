"""Sliding-window layers release the blocks that leave their window (tiny gemma3: window 5, blocks of 4 tokens, five
sliding layers of six). Through the engine, batched, chunked at odd sizes, with prefix-cache hits and preemption,
each request's answer equals its solo run (token for token under batch_invariant; up to the solo run's near ties
otherwise), the solo runs equal transformers' greedy tokens (up to transformers' own near ties), and a long request
holds a bounded number of sliding blocks while its full-attention table grows."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from tests.model.tiny_models import save_tiny_tokenizer, tiny_model
from tests.near_ties import NEAR_TIE, assert_same_up_to_near_ties

_rng = np.random.default_rng(5)
SHARED = [int(t) for t in _rng.integers(2, 256, 26)]  # six blocks and a bit: prefix-cache hits past the window
PROMPTS = [[int(t) for t in _rng.integers(2, 256, n)] for n in (9, 23, 41, 30, 17)]
PROMPTS += [SHARED + [int(t) for t in _rng.integers(2, 256, n)] for n in (3, 8, 13)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, ignore_eos=True)
COMMON = dict(max_model_len=128, kv_cache_memory=0.05, block_size=4, kv_cache_dtype="fp32")
TINY_POOL = 14  # 13 usable blocks of 4 tokens per group: running requests outgrow the full group's and are preempted


@pytest.fixture(scope="module")
def hf_and_folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3_sliding")
    model = tiny_model("gemma3", seed=3)
    model.save_pretrained(path, safe_serialization=True)
    save_tiny_tokenizer(path)
    return model, str(path)


def _prompts():
    return [{"prompt_token_ids": p} for p in PROMPTS]


def _ids(outs):
    return [list(o.outputs[0].token_ids) for o in outs]


def _logprobs(outs):
    return [[{t: e.logprob for t, e in d.items()} for d in o.outputs[0].logprobs] for o in outs]


@pytest.fixture(scope="module")
def solo(hf_and_folder):
    llm = LLM(model=hf_and_folder[1], batch_invariant=True, enable_prefix_caching=False, **COMMON)
    assert [g.window for g in llm.llm_engine.runner.groups] == [0, 5]
    return [llm.generate(p, GREEDY, use_tqdm=False)[0] for p in _prompts()]


def test_solo_runs_equal_transformers_greedy(hf_and_folder, solo):
    model, worst = hf_and_folder[0], 0.0
    for prompt, out in zip(PROMPTS, solo):
        with torch.no_grad():
            gen = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)
        want = gen.sequences[0, len(prompt):].tolist()
        n = len(want)
        hf_lp = [torch.log_softmax(logits[0].double(), -1) for logits in gen.logits]
        for i, lp in enumerate(hf_lp):  # up to transformers' first near tie
            top2 = lp.topk(2).values
            if float(top2[0] - top2[1]) <= NEAR_TIE:
                n = i
                break
        assert n >= 4 and list(out.outputs[0].token_ids)[:n] == want[:n], (len(prompt), n)
        # the tiny model's greedy tokens barely move: its logprobs say whether every window was read whole
        err = max(abs(e.logprob - float(hf_lp[i][t])) for i in range(n) for t, e in out.outputs[0].logprobs[i].items())
        worst = max(worst, err)
    print("largest logprob difference from transformers", worst)
    assert worst < 1e-3


@pytest.mark.parametrize("budget,caching,blocks,seqs", [(5, False, None, 8), (7, True, None, 8), (11, True, None, 2),
                                                        (64, False, TINY_POOL, 8), (13, True, TINY_POOL, 8)])
def test_batch_invariant_runs_equal_each_solo_run(hf_and_folder, solo, budget, caching, blocks, seqs):
    llm = LLM(model=hf_and_folder[1], batch_invariant=True, max_num_batched_tokens=budget, max_num_seqs=seqs,
              enable_prefix_caching=caching, num_gpu_blocks_override=blocks, **COMMON)
    if caching:  # a first pass fills the prefix cache: the shared-prefix prompts then start from cached blocks
        llm.generate(_prompts()[-1:], GREEDY, use_tqdm=False)
    outs = llm.generate(_prompts(), GREEDY, use_tqdm=False)
    assert _ids(outs) == _ids(solo) and _logprobs(outs) == _logprobs(solo)
    kv = llm.llm_engine.kv_manager
    if caching and not blocks and seqs > 2:
        assert all(o.num_cached_tokens >= 24 for o in outs[-3:])  # hits past the window: sliding blocks reused
    if seqs == 2:  # a sliding pool of 2 x (cdiv(4 + 11, 4) + 1 + cdiv(5, 4)) + 1 blocks: hits where its blocks survive
        assert [p.num_blocks for p in kv.pools] == [65, 15] and sum(o.num_cached_tokens for o in outs) > 0
    if blocks:
        assert llm.llm_engine.scheduler.num_preemptions > 0
    assert kv.num_groups == 2 and kv.usage == 0.0  # every group's blocks given back


def test_default_mode_equals_solo_up_to_near_ties(hf_and_folder):
    ref = LLM(model=hf_and_folder[1], enable_prefix_caching=False, **COMMON)
    solo_default = [ref.generate(p, GREEDY, use_tqdm=False)[0] for p in _prompts()]
    for budget, blocks in ((7, None), (64, TINY_POOL)):
        llm = LLM(model=hf_and_folder[1], max_num_batched_tokens=budget, num_gpu_blocks_override=blocks, **COMMON)
        llm.generate(_prompts()[-1:], GREEDY, use_tqdm=False)
        assert_same_up_to_near_ties(solo_default, llm.generate(_prompts(), GREEDY, use_tqdm=False))


def test_long_request_holds_only_its_window_in_sliding_layers(hf_and_folder):
    llm = LLM(model=hf_and_folder[1], max_num_batched_tokens=7, **COMMON)
    eng = llm.llm_engine
    kv = eng.kv_manager
    # the split: the sliding group gets what max_num_seqs requests hold, the full group the rest of the bytes
    assert kv.pools[1].num_blocks < kv.pools[0].num_blocks
    eng.add_request("long", {"prompt_token_ids": [int(t) for t in _rng.integers(2, 256, 90)]},
                    SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    bound = kv.group_blocks_held(1, 10 ** 6, 7)
    assert bound == 4  # cdiv(5 - 1 + 7, 4) + 1
    most = 0
    while eng.has_unfinished_requests():
        eng.step()
        for r in eng.scheduler.running:
            full, sliding = r.block_tables
            assert len(sliding) == len(full)  # position p's block stays at p // block_size
            held = [b for b in sliding if b]
            assert len(held) <= bound and len(held) == len(set(held))
            most = max(most, len(full))
    assert most == 27  # after the step before the last (108 tokens of KV) the full group held them all
    assert kv.usage == 0.0


def test_layers_on_the_torch_device_follow_their_group(hf_and_folder, solo):
    """Layers 3-5 on torch's CPU device (two sliding, the full one): each device cache has its group's blocks (the
    sliding group's what 2 requests' windows hold), and the answers stay the solo runs' (the torch path rounds
    differently: tokens up to near ties, logprobs within 1e-3 while tokens agree)."""
    llm = LLM(model=hf_and_folder[1], n_gpu_layers=3, gpu_device="cpu", max_num_batched_tokens=8, max_num_seqs=2,
              **COMMON)
    eng = llm.llm_engine
    assert eng.model.placement.gpu_layers() == [3, 4, 5]
    full, sliding = eng.runner.group_num_blocks
    assert (full, sliding) == (65, 2 * (4 + 2) + 1)  # 2 x 32 blocks + null; 2 x (cdiv(4 + 8, 4) + 1 + cdiv(5, 4)) + 1
    assert [type(eng.runner.kv_caches[i][0]).__module__.split(".")[0] for i in (2, 3)] == ["numpy", "torch"]
    assert [eng.runner.kv_caches[i][0].shape[0] for i in range(6)] == [sliding] * 5 + [full]
    outs = llm.generate(_prompts(), GREEDY, use_tqdm=False)
    assert_same_up_to_near_ties(solo, outs)
    for ref, got in zip(solo, outs):
        for i, (a, b) in enumerate(zip(ref.outputs[0].token_ids, got.outputs[0].token_ids)):
            if a != b:
                break
            assert abs(ref.outputs[0].logprobs[i][a].logprob - got.outputs[0].logprobs[i][b].logprob) < 1e-3
    assert eng.kv_manager.usage == 0.0


def test_ram_tier_is_refused_with_sliding_layers(hf_and_folder):
    with pytest.raises(ValueError, match="RAM tier .* not supported for models with sliding-window layers"):
        LLM(model=hf_and_folder[1], n_gpu_layers="all", gpu_device="cpu", num_cpu_blocks=8, **COMMON)


@pytest.mark.parametrize("fused", [True, False])
def test_null_entries_out_of_the_window_change_no_bit(hf_and_folder, monkeypatch, fused):
    """Decode steps whose sliding tables hold the null block where blocks left the window give the bits of tables
    that still hold every block, in the fused decode step and kernel by kernel, with group pools of other sizes."""
    from engine.model import fused_compile
    from engine.model.loader import load_model
    from engine.worker.runner import ModelRunner, SeqChunk
    from tests.fused_calls import count_fused_calls
    monkeypatch.setenv("RAMLM_FUSED_COMPILE", "inline")
    monkeypatch.setenv("RAMLM_FUSED_BLOCKS", "1" if fused else "0")
    calls = count_fused_calls(monkeypatch)
    model = load_model(hf_and_folder[1])[0]
    prompt = tuple(int(t) for t in _rng.integers(2, 256, 30))
    outs = []
    for drop in (False, True):
        runner = ModelRunner(model, (20, 12), block_size=4, kv_cache_dtype="fp32")
        full = tuple(range(1, 11))
        runner.execute([SeqChunk(prompt, 0, full[:8], "last", group_block_ids=(full[:8],))])
        got = []
        for pos in range(30, 38):  # position p sees p - 4 ..: blocks before (p - 4) // 4 may be null
            ids = full[: pos // 4 + 1]
            sliding = tuple(0 if drop and b < (pos - 4) // 4 else ids[b] for b in range(len(ids)))
            got.append(runner.execute([SeqChunk((7,), pos, ids, "last", group_block_ids=(sliding,))])[0])
        outs.append(np.concatenate(got))
    assert np.array_equal(outs[0], outs[1])
    assert (calls[0] > 0) == fused
