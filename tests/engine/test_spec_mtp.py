"""MTP drafts (engine/spec_decode/mtp.py) on tiny random Qwen3.5 (dense and MoE), DeepSeek-V3 and GLM-4.5 models
carrying an MTP layer in HF's layout (which transformers does not load): the layer's logits against transformers' own
modules (pre-fc norms, a decoder layer and the final norm of a one-layer text model loaded with the MTP weights, the
model's head) over the main model's hidden states; in the engine, every proposal's first draft is the reference's argmax for
the request's tokens at that moment (the layer's cache and positions kept right through rejections), and greedy
output is token for token that of plain decoding."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import save_file

from engine import LLM, SamplingParams
from engine.model.loader import load_model
from engine.spec_decode.config import SpeculativeConfig
from engine.spec_decode.mtp import MtpProposer
from engine.worker.runner import ModelRunner, SeqChunk
from tests.model.tiny_models import save_tiny_tokenizer, tiny_model

PROMPT = [int(t) for t in np.random.default_rng(4).integers(2, 256, 30)]


def _rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


# where each family keeps its MTP layer's tensors (HF names): Qwen3.5 apart (mtp.*), DeepSeek-V3 and GLM-4.5 as layer L
QWEN_NAMES = {"fc": "mtp.fc.weight", "norm": "mtp.norm.weight", "enorm": "mtp.pre_fc_norm_embedding.weight",
              "hnorm": "mtp.pre_fc_norm_hidden.weight", "layer": "mtp.layers.0."}


def _layer_names(L):
    return {"fc": f"model.layers.{L}.eh_proj.weight", "norm": f"model.layers.{L}.shared_head.norm.weight",
            "enorm": f"model.layers.{L}.enorm.weight", "hnorm": f"model.layers.{L}.hnorm.weight",
            "layer": f"model.layers.{L}."}


FAMILIES = {"qwen35": 3, "qwen35moe": 3, "deepseek2": 2, "glm4moe": 2}  # the main layer the MTP layer is shaped as


class Reference:
    """The MTP layer run by transformers' modules (float32): the model's own norm class for the pre-fc norms, and a
    one-layer text model of the same config (its layer shaped as the MTP layer, its final norm the shared head's)."""

    def __init__(self, hf, mtp: dict, names: dict, like: int):
        cfg = hf.config
        self.hf, H, eps = hf, cfg.hidden_size, cfg.rms_norm_eps
        norm = type(hf.model.norm)
        self.pre_e, self.pre_h = norm(H, eps=eps), norm(H, eps=eps)
        self.pre_e.weight.data[:] = mtp[names["enorm"]]
        self.pre_h.weight.data[:] = mtp[names["hnorm"]]
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        self.fc.weight.data[:] = mtp[names["fc"]]
        one = {**cfg.to_dict(), "num_hidden_layers": 1}
        if "layer_types" in one:
            one["layer_types"] = [one["layer_types"][like]]
        if "first_k_dense_replace" in one:
            one["first_k_dense_replace"] = 0  # the MTP layer routes experts
        self.layer = type(hf.model)(transformers.AutoConfig.for_model(**one)).float().eval()
        prefix = names["layer"]
        state = {"layers.0." + k[len(prefix):]: v for k, v in mtp.items() if k.startswith(prefix)
                 and k not in names.values()}
        self.layer.load_state_dict({**state, "norm.weight": mtp[names["norm"]],
                                    "embed_tokens.weight": hf.model.embed_tokens.weight.data})

    @torch.no_grad()
    def logits(self, ids):
        """Row i: the layer at position i from the main model's state there and token ids[i + 1]."""
        ids = torch.tensor([ids])
        h = self.hf.model(input_ids=ids).last_hidden_state[0]
        e = self.hf.model.embed_tokens(ids[0, 1:])
        x = self.fc(torch.cat([self.pre_e(e), self.pre_h(h[:-1])], dim=-1))
        out = self.layer(inputs_embeds=x[None]).last_hidden_state[0]
        return self.hf.lm_head(out).numpy()


@pytest.fixture(scope="module", params=list(FAMILIES))
def with_mtp(request, tmp_path_factory):
    """A tiny model saved with an MTP layer: the weights of a main layer of its shape, with noise; random fc and
    norms (Qwen3.5 stores w of its (1 + w) norms)."""
    arch, like = request.param, FAMILIES[request.param]
    folder = tmp_path_factory.mktemp(arch)
    hf = tiny_model(arch).float().eval()
    hf.save_pretrained(folder, safe_serialization=True)
    save_tiny_tokenizer(folder)
    sd, H = hf.state_dict(), hf.config.hidden_size
    names = QWEN_NAMES if arch.startswith("qwen35") else _layer_names(hf.config.num_hidden_layers)
    g = torch.Generator().manual_seed(7)
    one = 0.0 if arch.startswith("qwen35") else 1.0

    def norm():
        return one + torch.randn(H, generator=g) * 0.1
    mtp = {names["fc"]: torch.randn(H, 2 * H, generator=g) * 0.05, names["norm"]: norm(),
           names["enorm"]: norm(), names["hnorm"]: norm()}
    for k, v in sd.items():
        if k.startswith(f"model.layers.{like}."):
            noise = torch.randn(v.shape, generator=g) * 0.02 * (v.float().std() if v.numel() > 1 else 1)
            mtp[names["layer"] + k[len(f"model.layers.{like}."):]] = v + noise
    save_file(mtp, str(folder / "mtp.safetensors"))
    (folder / "model.safetensors").rename(folder / "main.safetensors")
    weight_map = {k: "main.safetensors" for k in sd} | {k: "mtp.safetensors" for k in mtp}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return str(folder), Reference(hf, mtp, names, like)


def test_the_layer_matches_transformers(with_mtp):
    folder, ref = with_mtp
    model, _ = load_model(folder)
    model.prefill_dtype = "float32"
    main = ModelRunner(model, num_blocks=8, block_size=16, kv_cache_dtype="fp32")
    blocks = tuple(range(1, 3))
    hidden = main.execute_hidden([SeqChunk(tuple(PROMPT), 0, blocks, "all", state_slot=1)])[0]
    mtp = MtpProposer(SpeculativeConfig.from_dict({"method": "mtp"}), model, 8, 16, "fp32")
    mtp.layer.prefill_dtype = "float32"
    meta = mtp.runner.build_batch([SeqChunk(tuple(PROMPT[1:]), 0, blocks, "all")])
    out, _ = mtp.layer.forward(meta, mtp.runner.kv_caches, model.final_norm(hidden[:-1]))
    assert _rel_err(mtp.layer.logits(out), ref.logits(PROMPT)) < 2e-3


def test_engine_drafts_are_the_layers_guesses_and_output_is_exact(with_mtp, monkeypatch):
    folder, ref = with_mtp
    kw = dict(model=folder, max_model_len=256, kv_cache_memory=0.05, kv_cache_dtype="fp32", dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [{"prompt_token_ids": PROMPT}, {"prompt_token_ids": PROMPT[:11]}]
    want = [list(o.outputs[0].token_ids) for o in LLM(**kw).generate(prompts, params, use_tqdm=False)]
    spec = LLM(speculative_config={"method": "mtp", "num_speculative_tokens": 2}, **kw)
    proposer, seen = spec.llm_engine.speculator.proposer, []
    real = proposer.propose_many

    def recorded(items):  # the real proposer runs; the test keeps what it was asked and answered
        drafts = real(items)
        seen.extend((list(req.all_token_ids), d) for (_, req, _), d in zip(items, drafts))
        return drafts
    monkeypatch.setattr(proposer, "propose_many", recorded)
    got = [list(o.outputs[0].token_ids) for o in spec.generate(prompts, params, use_tqdm=False)]
    assert got == want
    checked = 0
    for tokens, drafts in seen:
        if drafts:
            row = ref.logits(tokens)[-1]  # the last position: the main model's state there and the newest token
            assert row[drafts[0]] >= row.max() - 1e-3 * np.abs(row).max()
            checked += 1
    assert checked > 10 and spec.llm_engine.spec_stats.num_draft_tokens > 10


def test_a_model_without_an_mtp_layer_is_refused(tmp_path):
    tiny_model("qwen3").save_pretrained(tmp_path, safe_serialization=True)
    save_tiny_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="no MTP layer"):
        LLM(model=str(tmp_path), max_model_len=128, kv_cache_memory=0.05, speculative_config={"method": "mtp"})


def test_a_full_step_of_requests_still_feeds_the_layer(with_mtp):
    """With 8 or more requests decoding, no drafts run, but the layer takes every new position (drafts resume once
    requests finish, from a cache that is whole)."""
    folder, ref = with_mtp
    kw = dict(model=folder, max_model_len=256, kv_cache_memory=0.05, kv_cache_dtype="fp32", dtype="float32")
    prompts = [{"prompt_token_ids": PROMPT[i:i + 12]} for i in range(10)]
    params = [SamplingParams(temperature=0, max_tokens=8 + 3 * i, ignore_eos=True) for i in range(10)]
    want = [list(o.outputs[0].token_ids) for o in LLM(**kw).generate(prompts, params, use_tqdm=False)]
    spec = LLM(speculative_config={"method": "mtp", "num_speculative_tokens": 2}, **kw)
    assert [list(o.outputs[0].token_ids) for o in spec.generate(prompts, params, use_tqdm=False)] == want
    assert spec.llm_engine.spec_stats.num_draft_tokens > 0
    assert not spec.llm_engine.speculator.proposer._rows  # every kept row was used (or freed with its request)
