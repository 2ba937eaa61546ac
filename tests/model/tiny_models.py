"""Tiny random HF models for the architecture tests (built in-process, no downloads)."""
from __future__ import annotations

import numpy as np
import torch
import transformers

COMMON = dict(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512)


def tiny_config(arch: str):
    """The HF config of a tiny random model for one GGUF architecture name."""
    if arch == "llama":
        return transformers.LlamaConfig(**COMMON, rms_norm_eps=1e-5, tie_word_embeddings=False, rope_parameters={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64, "rope_theta": 10000.0})
    if arch == "qwen2":
        return transformers.Qwen2Config(**COMMON, tie_word_embeddings=True, rope_parameters={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 1e6})
    if arch == "qwen3":
        return transformers.Qwen3Config(**COMMON, tie_word_embeddings=False)
    if arch == "gemma3":
        cfg = dict(COMMON, num_hidden_layers=6)
        return transformers.Gemma3TextConfig(**cfg, sliding_window=5, query_pre_attn_scalar=64,
                                             final_logit_softcapping=30.0)
    if arch == "qwen3moe":
        return transformers.Qwen3MoeConfig(**COMMON, moe_intermediate_size=256, num_experts=8, num_experts_per_tok=2,
                                           norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    if arch == "glm4moe":  # a dense first layer, grouped sigmoid routing, a shared expert, half-head RoPE, biases
        cfg = dict(COMMON, num_hidden_layers=3)
        return transformers.Glm4MoeConfig(**cfg, moe_intermediate_size=128, n_routed_experts=8, num_experts_per_tok=2,
                                          n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1,
                                          routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True,
                                          attention_bias=True)
    if arch == "gpt-oss":  # both layer types (window 4 < the prompts), sinks, every bias, unrounded YaRN
        cfg = dict(COMMON, intermediate_size=128, max_position_embeddings=2048)
        return transformers.GptOssConfig(**cfg, num_local_experts=8, num_experts_per_tok=2, sliding_window=4,
                                         rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                                          "beta_slow": 1.0, "truncate": False,
                                                          "original_max_position_embeddings": 64,
                                                          "rope_theta": 150000.0})
    if arch in ("deepseek2", "deepseek2-lite"):
        # MLA (q through q_a, or straight for -lite) with YaRN and mscale_all_dim, a dense first layer, then grouped
        # sigmoid routing with the correction bias, routed scaling and a shared expert
        cfg = {k: v for k, v in COMMON.items() if k != "head_dim"}
        cfg.update(num_hidden_layers=3, num_key_value_heads=4, rms_norm_eps=1e-6)  # HF repeats K/V by heads / kv heads
        return transformers.DeepseekV3Config(
            **cfg, q_lora_rank=None if arch.endswith("lite") else 64, kv_lora_rank=256, qk_nope_head_dim=32,
            qk_rope_head_dim=16, v_head_dim=64, moe_intermediate_size=128, n_routed_experts=8, num_experts_per_tok=2,
            n_shared_experts=1, n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5,
            norm_topk_prob=True, rope_parameters={
                "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 32.0,
                "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707, "rope_theta": 10000.0})
    if arch in ("qwen35", "qwen35moe"):  # 3 Gated DeltaNet layers + 1 gated attention; 4 value heads over 2 key heads
        cfg = dict(COMMON, num_hidden_layers=4, tie_word_embeddings=False, linear_num_key_heads=2,
                   linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
                   rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
        if arch == "qwen35":
            return transformers.Qwen3_5TextConfig(**cfg)
        cfg.pop("intermediate_size")
        return transformers.Qwen3_5MoeTextConfig(**cfg, moe_intermediate_size=256, shared_expert_intermediate_size=256,
                                                 num_experts=8, num_experts_per_tok=2)
    if arch == "gemma4":  # per-layer embeddings, the last two layers reading earlier K/V (a double-wide MLP there),
        # full layers with their own head_dim and one kv head, V = raw k projection, proportional RoPE
        return transformers.Gemma4TextConfig(**GEMMA4, hidden_size_per_layer_input=32, vocab_size_per_layer_input=256,
                                             num_kv_shared_layers=2, use_double_wide_mlp=True)
    if arch == "gemma4-moe":  # 26B-A4B's block: a dense MLP beside a GELU MoE with its own router norm and scales
        return transformers.Gemma4TextConfig(**dict(GEMMA4, num_hidden_layers=4, layer_types=GEMMA4_TYPES[2:]),
                                             hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=8,
                                             top_k_experts=2, moe_intermediate_size=128)
    if arch in ENCODERS:  # BERT's layout; RoBERTa's positions start after padding_idx, one token type
        kw = dict(vocab_size=256, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                  max_position_embeddings=64, layer_norm_eps=1e-12)
        if arch == "bert":
            return transformers.BertConfig(**kw, type_vocab_size=2)
        cls = transformers.RobertaConfig if arch == "roberta" else transformers.XLMRobertaConfig
        return cls(**dict(kw, max_position_embeddings=66), type_vocab_size=1, pad_token_id=1)
    raise KeyError(arch)


# Sliding, sliding, sliding, full | sliding, full: the KV-shared layers 4 and 5 read layers 2 and 3 (llama.cpp takes
# the producers as the boundary - 2 and - 1, the same here).
GEMMA4_TYPES = ["sliding_attention"] * 3 + ["full_attention", "sliding_attention", "full_attention"]
GEMMA4 = dict(COMMON, num_hidden_layers=6, head_dim=32, global_head_dim=64, num_global_key_value_heads=1,
              attention_k_eq_v=True, sliding_window=5, layer_types=GEMMA4_TYPES, final_logit_softcapping=30.0,
              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                               "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                  "rope_theta": 1000000.0}})
ARCHES = ["llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "glm4moe", "gpt-oss", "deepseek2", "qwen35",
          "qwen35moe", "gemma4", "gemma4-moe"]
# encoders (GGUF bert): no logits, no decode steps; tested in tests/model/test_bert.py
ENCODERS = ["bert", "roberta", "xlm-roberta"]
# gemma3's layers as llama.cpp's converter writes EmbeddingGemma: tests/engine/test_embedding_gemma.py
POOLING_ONLY = ["gemma-embedding"]
# their routers' top-k can flip near ties under quantization
MOE_ARCHES = {"qwen3moe", "glm4moe", "gpt-oss", "deepseek2", "deepseek2-lite", "qwen35moe", "gemma4-moe"}
ZERO_CENTRED_NORMS = {"gemma3", "qwen35", "qwen35moe"}  # HF stores w of (1 + w)
# HF parameters stored as x @ W (input dim before output dim): gpt-oss's experts (other families' fused experts
# of the same names are (E, N, K)).
X_AT_W = {"gpt-oss": ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")}


def gguf_rows(arch: str, name: str, p):
    """A 2-D+ HF weight as the (..., K) rows GGUF quantizes (a view), or None for what GGUF keeps in float
    (biases, routers, sinks, norms)."""
    if p.ndim < 2 or "bias" in name or "router" in name or name.endswith("mlp.gate.weight"):
        return None
    return p.transpose(-1, -2) if name.endswith(X_AT_W.get(arch, ())) else p


def arch_of(name: str) -> str:
    """The GGUF architecture of a tiny model's name (gemma4-moe: a second gemma4 configuration; RoBERTa's: bert)."""
    return "gemma4" if name == "gemma4-moe" else ("bert" if name in ENCODERS else name)


def tiny_model(arch: str, seed: int = 0, **overrides):
    """overrides: config attributes set after tiny_config (num_experts_per_tok=8, ...)."""
    torch.manual_seed(seed)
    cfg = tiny_config(arch)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    cfg._attn_implementation = "eager"
    return randomize(transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32), arch)


@torch.no_grad()
def randomize(model, arch: str):
    """Random init is tiny (std 0.02): scale norms and weights up so that logits spread and errors show."""
    for name, p in model.named_parameters():
        if "linear_attn.norm" in name:  # Qwen3.5's gated norm: a plain weight
            p.normal_(1.0, 0.1)
        elif arch.startswith("gemma4") and name.endswith(("q_norm.weight", "k_norm.weight")):
            # Gemma 4 scores q.k unscaled (scale 1): norms of ~0.4 keep them near unit spread, as trained models do,
            # instead of a near-argmax softmax that int8 activations flip (llama.cpp's too)
            p.normal_(0.4, 0.05)
        elif "LayerNorm.weight" in name:  # BERT's LayerNorms
            p.normal_(1.0, 0.1)
        elif "norm" in name or name.endswith("router.scale"):
            p.normal_(0.0 if arch in ZERO_CENTRED_NORMS else 1.0, 0.1)
        elif name.endswith("sinks"):  # per-head logits in the score range: some heads give them real weight
            p.normal_(0.0, 1.0)
        elif name.endswith("A_log"):  # decays exp(-exp(A_log) softplus(.)) spread over (0, 1)
            p.uniform_(-1.0, 1.0)
        elif name.endswith("dt_bias"):
            p.normal_(0.0, 1.0)
        elif p.ndim >= 2:
            p.normal_(0.0, 0.08)
        else:
            p.normal_(0.0, 0.05)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):  # a buffer: random too, so that it moves the choice
            b.normal_(0.0, 0.05)
        if name.endswith("layer_scalar"):  # a buffer in the checkpoint: not 1, so that a missing scale shows
            b.uniform_(0.5, 1.5)
    return model.eval()


@torch.no_grad()
def hf_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0].float()


def wordpiece_gguf_metadata(tok) -> dict:
    """The tokenizer keys llama.cpp's converter writes for a BERT WordPiece tokenizer (a transformers fast one): its
    vocabulary in phantom-space spelling ("▁word", "##piece" -> "piece", [specials] as they are), specials CONTROL,
    [CLS] as BOS and [SEP] as EOS and separator, both added."""
    def phantom(t: str) -> str:
        if t.startswith("[") and t.endswith("]"):
            return t
        return t[2:] if t.startswith("##") else "\u2581" + t
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    special = set(tok.all_special_ids)
    return {"tokenizer.ggml.model": "bert", "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": [phantom(t) for t, _ in vocab],
            "tokenizer.ggml.token_type": [3 if i in special else 1 for _, i in vocab],
            "tokenizer.ggml.bos_token_id": tok.cls_token_id, "tokenizer.ggml.eos_token_id": tok.sep_token_id,
            "tokenizer.ggml.seperator_token_id": tok.sep_token_id, "tokenizer.ggml.unknown_token_id": tok.unk_token_id,
            "tokenizer.ggml.padding_token_id": tok.pad_token_id, "tokenizer.ggml.mask_token_id": tok.mask_token_id,
            "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True}


def save_sentencepiece(folder, vocab_size: int = 250):
    """XLM-RoBERTa's tokenizer file beside a tiny model: a SentencePiece Unigram model (SentencePiece's defaults, as
    XLM-R's: NFKC charsmap, unk 0, bos 1, eos 2, extra whitespace removed) trained on random words with accents and
    CJK, saved as sentencepiece.bpe.model; returns transformers' tokenizer of the folder (fairseq ids: <s> <pad> </s>
    <unk>, the pieces from spm id 3 shifted by one, <mask> last)."""
    import io
    import json
    import random

    import sentencepiece as spm
    import transformers
    rng = random.Random(0)
    alpha = "abcdefghijklmnopqrstuvwxyz\u00e4\u00f6\u00fc\u00e9\u00e8\u00df\u00e7\u00f1\u6771\u4eac\u30bf\u30ef"
    words = ["".join(rng.choice(alpha) for _ in range(rng.randint(2, 9))) for _ in range(400)]
    words += "the quick brown fox caf\u00e9 na\u00efve r\u00e9sum\u00e9 stra\u00dfe \u00fcber hello world".split()
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(4000)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
                                   model_type="unigram", character_coverage=1.0, num_threads=1,
                                   minloglevel=2)
    (folder / "sentencepiece.bpe.model").write_bytes(model.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer"}))
    return transformers.AutoTokenizer.from_pretrained(folder)


def unigram_gguf_metadata(folder, vocab_size: int) -> dict:
    """The tokenizer keys llama.cpp's converter writes for XLM-RoBERTa from folder's sentencepiece.bpe.model
    (conversion/bert.py, _xlmroberta_set_vocab, and gguf's SpecialVocab): model "t5", vocab_size entries ([PADi],
    UNUSED, score -10000 where the model has none), the first four realigned to fairseq's <s> <pad> </s> <unk>
    (CONTROL x 3, UNKNOWN) and the pieces from spm id 3 after them, the model's add_dummy_prefix,
    remove_extra_whitespaces and precompiled_charsmap, BOS / EOS / SEP added (the <s> $A </s> </s> $B </s> template)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    raw = (folder / "sentencepiece.bpe.model").read_bytes()
    proto = pb.ModelProto()
    proto.ParseFromString(raw)
    sp = spm.SentencePieceProcessor(model_proto=raw)
    n = max(vocab_size, sp.vocab_size())
    tokens, scores, types = [f"[PAD{i}]" for i in range(n)], [-10000.0] * n, [5] * n
    for i in range(sp.vocab_size()):
        tokens[i], scores[i] = sp.IdToPiece(i), sp.GetScore(i)
        types[i] = 2 if sp.IsUnknown(i) else 3 if sp.IsControl(i) else 5 if sp.IsUnused(i) else 6 if sp.IsByte(i) else 1
    tokens = ["<s>", "<pad>", "</s>", "<unk>"] + tokens[3:-1]
    return {"tokenizer.ggml.model": "t5", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0] * 4 + scores[3:-1], "tokenizer.ggml.token_type": [3, 3, 3, 2] + types[3:-1],
            "tokenizer.ggml.add_space_prefix": proto.normalizer_spec.add_dummy_prefix,
            "tokenizer.ggml.remove_extra_whitespaces": proto.normalizer_spec.remove_extra_whitespaces,
            "tokenizer.ggml.precompiled_charsmap": bytes(proto.normalizer_spec.precompiled_charsmap),
            "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 3,
            "tokenizer.ggml.seperator_token_id": 2, "tokenizer.ggml.padding_token_id": 1,
            "tokenizer.ggml.mask_token_id": sp.vocab_size() + 1, "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.add_eos_token": True, "tokenizer.ggml.add_sep_token": True}


def save_tiny_tokenizer(folder, vocab_size: int = 256) -> None:
    """A real word-level tokenizer.json of vocab_size tokens ("t0".."tN", t1 = EOS) beside a tiny model, so that
    LLM(model=folder) loads it like any HF folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text('{"eos_token": "t1", "unk_token": "t0"}')


def float_tensors(folder):
    """(ModelConfig, {GGUF name: float32 array}) of a saved HF folder as ramlm reads it: what write_gguf takes."""
    from engine.model.weights import open_weights
    ws = open_weights(str(folder))
    return ws.config, {n: np.asarray(ws.raw(n), dtype=np.float32) for n in ws.names()}


def saved_tiny(folder, arch: str):
    """(the tiny transformers model of arch, its weights as ramlm reads them) after saving it with its tokenizer
    into folder (a pathlib.Path)."""
    from engine.model.weights import open_weights
    hf = tiny_model(arch)
    hf.save_pretrained(folder, safe_serialization=True)
    save_tiny_tokenizer(folder)
    return hf, open_weights(str(folder))


def saved_tiny_classifier(folder, num_labels: int = 3):
    """A tiny random Qwen3ForSequenceClassification (its head scaled so that the probabilities are far from uniform),
    saved with the tiny tokenizer and named labels; returns the transformers model."""
    cfg = tiny_config("qwen3")
    cfg.num_labels, cfg.pad_token_id = num_labels, 0
    cfg.id2label = {i: f"class_{i}" for i in range(num_labels)}
    cfg.label2id = {v: k for k, v in cfg.id2label.items()}
    torch.manual_seed(0)
    hf = transformers.Qwen3ForSequenceClassification(cfg).float().eval()
    with torch.no_grad():
        hf.score.weight.mul_(20.0)
    hf.save_pretrained(folder, safe_serialization=True)
    save_tiny_tokenizer(folder)
    return hf
