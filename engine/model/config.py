"""Architecture-neutral hyperparameters, read from GGUF metadata or an HF config.json."""
from __future__ import annotations

from dataclasses import dataclass, field, asdict

from cpu_kernels.rope import RopeScaling  # noqa: F401 (re-exported: the engine's configs carry it)


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters every architecture file reads. Shapes follow GGUF: weights are (out, in)."""
    arch: str                      # GGUF general.architecture (engine/model/archs/)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_theta_local: float = 0.0  # gemma3, gpt-oss: base for sliding-window layers (0 = same as rope_theta)
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    # One entry per layer: 0 = full attention, W = attends to the last W positions (incl. itself).
    layer_sliding_window: tuple[int, ...] = ()
    attn_logit_softcap: float = 0.0   # 0 = none
    final_logit_softcap: float = 0.0  # 0 = none
    attn_scale: float = 0.0           # 0 = 1/sqrt(head_dim); gemma3 uses query_pre_attn_scalar**-0.5
    bidirectional: bool = False       # encoder attention (EmbeddingGemma): a position sees the whole prompt
    hidden_act: str = "silu"          # silu | gelu_tanh | gelu (erf: BERT's plain MLP)
    type_vocab_size: int = 0          # BERT's token types (token_types.weight rows)
    pooling_type: str = ""            # the model's own pooling (MEAN, CLS, LAST; GGUF pooling_type), "" = none said
    # MoE (qwen3moe)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    dense_layers: tuple[int, ...] = ()  # layers of a MoE model with a dense MLP instead
    expert_gating: str = "softmax"      # softmax | sigmoid | topk_softmax (cpu_kernels.moe.SCORINGS)
    expert_shared_count: int = 0        # shared experts, each moe_intermediate_size wide, fused into one MLP
    expert_group_count: int = 1         # group-limited routing (DeepSeek): groups, and groups kept
    expert_group_used_count: int = 1
    expert_weights_scale: float = 1.0   # routed_scaling_factor
    expert_selection_bias: bool = False  # exp_probs_b.bias (DeepSeek's correction bias) joins the choice
    shared_expert_intermediate_size: int = 0  # one shared expert this wide (qwen3.5; else expert_shared_count)
    # Attention variants
    rope_dim: int = 0                   # rotated dims of a head (partial rotary); 0 = head_dim
    attn_bias: bool = False             # q/k/v biases
    attn_out_bias: bool = False         # o_proj bias (gpt-oss)
    qk_norm: bool = False               # per-head RMSNorm of q and k before RoPE
    # Gemma 4: full-attention layers with their own heads, KV shared by the last layers, per-layer embeddings
    head_dim_global: int = 0            # head_dim of full-attention layers (0 = head_dim)
    num_kv_heads_global: int = 0        # their kv heads (0 = num_kv_heads)
    rope_pairs_global: int = 0          # their rotating frequency pairs (proportional RoPE; 0 = all)
    attn_k_eq_v: bool = False           # full-attention layers have no attn_v: V is the raw k projection
    kv_shared_layers: int = 0           # the last N layers read the K/V of the last earlier layer of their kind
    double_wide_mlp: bool = False       # those KV-shared layers' MLP is 2 x intermediate_size wide
    per_layer_input_size: int = 0       # per-layer embeddings: width per layer (0 = none)
    value_head_dim: int = 0             # 0 = head_dim (MLA's values are narrower than its query/key heads)
    # MLA (deepseek2): head_dim is a query/key head (nope + rope dims), rope_dim its rope part, num_kv_heads 1
    q_lora_rank: int = 0                # q's low-rank projection; 0 = attn_q straight from the input
    kv_lora_rank: int = 0               # the cached latent's width
    rope_yarn_log_mul: float = 0.0      # llama.cpp's yarn_log_multiplier (0.1 mscale_all_dim): YaRN multiplies
                                        # the softmax scale by (1 + it ln factor)^2
    # Linear attention (Gated DeltaNet, qwen3.5): which layers, and the geometry of their per-sequence state
    linear_layers: tuple[int, ...] = ()  # layers that are linear attention (the others full attention)
    ssm_conv_kernel: int = 0             # the causal conv1d's width
    ssm_num_k_heads: int = 0             # query/key heads (GGUF ssm.group_count)
    ssm_num_v_heads: int = 0             # value heads (ssm.time_step_rank)
    ssm_k_head_dim: int = 0              # (ssm.state_size)
    ssm_v_head_dim: int = 0              # (ssm.inner_size / value heads)
    # Multi-token-prediction layers after the main ones (kept in the file, not run by the decoder)
    nextn_layers: int = 0
    # Tokens
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    name: str = ""

    @property
    def rope_neox(self) -> bool:
        """RoPE pairs (i, i + d/2) (True) or (2i, 2i + 1) (llama's permuted GGUF rows): the architecture's."""
        from engine.model.registry import architecture
        return architecture(self.arch).rope_neox

    def sliding_window(self, layer: int) -> int:
        return self.layer_sliding_window[layer] if self.layer_sliding_window else 0

    def to_dict(self) -> dict:
        return {**asdict(self), "rope_neox": self.rope_neox}
