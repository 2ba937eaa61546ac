"""EngineArgs: every knob in one dataclass; the CLI flags and LLM(...) keywords are generated from it."""
from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field, fields
from typing import Any, Optional, get_type_hints

from engine.core.kv_spec import KV_CACHE_DTYPES


def _meta(help: str, **kw) -> dict:
    return {"help": help, **kw}


@dataclass
class EngineArgs:
    model: Optional[str] = field(default=None, metadata=_meta(
        "GGUF file or HF folder; default: the embedded gemma-3-270m Q4_K_M"))
    tokenizer: Optional[str] = field(default=None, metadata=_meta("HF tokenizer folder (default: from the model)"))
    max_model_len: Optional[int] = field(default=None, metadata=_meta(
        "context length: the most tokens (prompt + output) a request may hold; default: the model's own context "
        "(131072 for Llama 3.1), and more than that is refused. The KV pool holds at most max_model_len x "
        "max_num_seqs tokens"))
    dtype: str = field(default="auto", metadata=_meta(
        "activation precision (vLLM's dtype): float32 (or float) computes everything in float32: long prefill "
        "chunks, their attention, MoE routers and GPU layers; bfloat16 runs long prefill chunks, their attention and "
        "GPU layers in bfloat16 (decode's int8/float32 kernels are the same either way); auto keeps prefill_dtype's "
        "choice and the GPU's native type. float16/half is refused: the CPU kernels have no float16 path",
        choices=("auto", "float32", "float", "bfloat16")))
    quantization: Optional[str] = field(default=None, metadata=_meta(
        "quantize float weights as they load (vLLM's quantization): fp8 (the linear layers to float8 e4m3 with a "
        "scale per 128 values of a row; an FP8 checkpoint already is), q8_0 (every weight matrix llama.cpp "
        "quantizes, to GGUF Q8_0), q4_k (the same to Q4_K, Q5_0 where rows are not whole 256-value blocks), int8 "
        "or int4 (the linear layers, symmetric round-to-nearest per row / per 128 values, as Q8_0 / Q4_0 blocks). "
        "Quantized checkpoints are read as they are (their config.json says how)",
        choices=("fp8", "q8_0", "q4_k", "int8", "int4")))
    speculative_config: Optional[dict] = field(default=None, metadata=_meta(
        'speculative decoding (vLLM\'s speculative_config, JSON on the command line): {"method": "ngram", '
        '"num_speculative_tokens": k, "prompt_lookup_max": n, "prompt_lookup_min": m}, {"method": "suffix", '
        '"num_speculative_tokens": k, "suffix_decoding_*": ...}, {"model": draft, "num_speculative_tokens": k} or '
        '{"method": "mtp", "num_speculative_tokens": k}: completions check k guessed tokens in one step; other methods '
        "are refused"))
    runner: str = field(default="auto", metadata=_meta(
        "what the model serves (vLLM's runner): generate (text), pooling (embeddings from its final hidden states: "
        "LLM.embed, /v1/embeddings), or auto: pooling for a *ForSequenceClassification checkpoint, else generate",
        choices=("auto", "generate", "pooling")))
    pooler_config: Optional[dict] = field(default=None, metadata=_meta(
        'a pooling model\'s pooler (vLLM\'s pooler_config, JSON on the command line): {"pooling_type": "LAST" | '
        '"MEAN" | "CLS", "normalize": true | false}; default: the folder\'s sentence-transformers files, else LAST, '
        "normalized"))
    enable_lora: bool = field(default=False, metadata=_meta(
        "serve LoRA adapters chosen per request (vLLM's enable_lora): LLM.generate(lora_request=LoRARequest(...)), "
        "the server's --lora-modules and the request's model field; PEFT folders and llama.cpp GGUF LoRA files"))
    max_loras: int = field(default=1, metadata=_meta(
        "most distinct LoRA adapters in one step (vLLM's); requests of another adapter wait for a free one"))
    max_lora_rank: int = field(default=16, metadata=_meta(
        "largest LoRA rank accepted (vLLM's); an adapter of higher rank is refused"))
    lora_dtype: str = field(default="auto", metadata=_meta(
        "LoRA weights' type in the slots the kernels read (vLLM's lora_dtype): float32, bfloat16 (half the bytes a "
        "step reads), or auto: float32 with dtype float32, else bfloat16", choices=("auto", "float32", "bfloat16")))
    max_cpu_loras: Optional[int] = field(default=None, metadata=_meta(
        "LoRA adapters kept loaded in RAM, least recently used dropped beyond it (vLLM's); default: max_loras"))
    hf_overrides: Optional[dict] = field(default=None, metadata=_meta(
        'vLLM\'s hf_overrides (JSON on the command line), the keys that turn a causal LM into a one-label classifier: '
        '{"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"], '
        '"is_original_qwen3_reranker": true} (or "method": "from_2_way_softmax"): the head is lm_head[yes] - '
        "lm_head[no], so the score is P(yes) over the two (Qwen3-Reranker, mxbai-rerank-v2); other keys are refused"))
    structured_outputs_backend: str = field(default="auto", metadata=_meta(
        "library that compiles structured outputs (JSON schema, regex, choice, grammar) into token masks: xgrammar, "
        "guidance (llguidance), or auto: xgrammar, and guidance for what xgrammar cannot take (as vLLM)",
        choices=("auto", "xgrammar", "guidance")))
    kv_cache_dtype: str = field(default="auto", metadata=_meta(
        "KV cache element type: auto (= fp16), fp16/float16, fp32/float32, fp8/fp8_e4m3 or fp8_e5m2 (one byte per "
        "value, unit scales as vLLM's uncalibrated fp8 KV; values past the format's range saturate), int8/q8_0 "
        "(llama.cpp's q8_0 cache: 32 int8 and an f16 scale per 32 values, 8.5 bits a value; head_dim a multiple of 32)",
        choices=tuple(KV_CACHE_DTYPES)))
    block_size: int = field(default=16, metadata=_meta("tokens per KV-cache block"))
    kv_cache_memory: Optional[float] = field(default=None, metadata=_meta(
        "GiB of RAM for the KV cache (default: a safe fraction of available RAM)"))
    num_gpu_blocks_override: Optional[int] = field(default=None, metadata=_meta(
        "exact number of KV blocks (tests, tuning)"))
    num_state_slots: Optional[int] = field(default=None, metadata=_meta(
        "models with linear-attention layers (qwen3.5): state slots (live states of running requests and prefix-"
        "cache checkpoints, slot 0 scratch); default: up to 2 x max_num_seqs + 1 within half the cache budget"))
    max_num_batched_tokens: int = field(default=2048, metadata=_meta("token budget per engine step"))
    max_num_seqs: int = field(default=128, metadata=_meta("most sequences running at once"))
    enable_prefix_caching: bool = field(default=True, metadata=_meta("reuse KV blocks of shared prefixes"))
    enable_chunked_prefill: bool = field(default=True, metadata=_meta("split long prompts over steps"))
    batch_invariant: bool = field(default=False, metadata=_meta(
        "identical results whatever the batch, chunking or cache state (slower prefill)"))
    prefill_dtype: str = field(default="auto", metadata=_meta(
        "precision of long prefill chunks: float32 (agrees with decode's kernels to rounding order), "
        "bfloat16 (oneDNN's bf16 GEMM: 2-10x faster prefill, about 0.2 percent relative error per matmul "
        "output), int8 (W8A8: weight and activation rows quantized per row to int8, oneDNN's int8 GEMM; about "
        "1 percent relative error per output, an int8 copy of every weight used) or auto (bfloat16 where the CPU "
        "multiplies bf16 natively, else float32)",
        choices=("auto", "float32", "bfloat16", "int8")))
    seed: int = field(default=0, metadata=_meta("seed of the engine's sampler"))
    num_threads: Optional[int] = field(default=None, metadata=_meta("CPU threads for the kernels (default: all cores)"))
    chat_template: Optional[str] = field(default=None, metadata=_meta("Jinja chat template file or string"))
    # Hybrid placement (offload/): which layers and KV blocks go to a GPU. Default: everything in RAM.
    n_gpu_layers: Optional[str] = field(default=None, metadata=_meta(
        "layers on the GPU: N (the last N; N > layers moves the output matrix too), auto or all "
        "(llama.cpp's -ngl); default 0"))
    gpu_device: Optional[str] = field(default=None, metadata=_meta(
        "GPU for the offloaded layers: cuda:0 (ROCm too), xpu:0, mps, or cpu (the GPU code path on torch's "
        "CPU device, for testing); default: the first GPU found"))
    gpu_memory_utilization: float = field(default=0.9, metadata=_meta(
        "fraction of the GPU's memory this engine may use (vLLM's)"))
    cpu_offload_gb: float = field(default=0.0, metadata=_meta(
        "GiB of GPU-layer weights kept in RAM and copied to the GPU at every step (vLLM's)"))
    override_tensor: Optional[str] = field(default=None, metadata=_meta(
        "REGEX=DEVICE[,...]: tensors whose name matches go to DEVICE (CPU or GPU), e.g. exps=CPU keeps MoE "
        "experts in RAM (llama.cpp's -ot)"))
    kv_offload: bool = field(default=False, metadata=_meta(
        "keep the KV cache of GPU layers in RAM (their attention then runs on the CPU)"))
    num_cpu_blocks: Optional[int] = field(default=None, metadata=_meta(
        "KV blocks of a RAM tier behind the GPU's KV blocks (planned and allocated on first use)"))
    gpu_weight_dtype: str = field(default="auto", metadata=_meta(
        "GPU layer weights: auto (dequantized once where the budget allows, else packed), float32, float16, "
        "bfloat16, or packed (GGUF blocks, dequantized per matmul)"))
    devices_file: Optional[str] = field(default=None, metadata=_meta(
        "JSON description of RAM and GPUs used instead of probing (README, Offload): `ramlm plan` plans for the "
        "machine it describes; the engine sizes this machine's devices from it (a GPU torch does not see is refused)"))

    def __post_init__(self):
        if self.dtype in ("float16", "half"):
            raise ValueError(f"dtype {self.dtype!r} is not supported: ramlm's CPU kernels compute in float32 or "
                             "bfloat16 (use dtype='bfloat16', 'float32' or 'auto')")
        for f in fields(self):
            allowed = f.metadata.get("choices")
            if allowed and getattr(self, f.name) is not None and getattr(self, f.name) not in allowed:
                raise ValueError(f"{f.name} must be one of {', '.join(allowed)}, got {getattr(self, f.name)!r}")
        self.effective_prefill_dtype()
        if self.hf_overrides is not None:
            from engine.pooling.config import check_hf_overrides
            check_hf_overrides(self.hf_overrides)
        if self.max_loras < 1 or self.max_lora_rank < 1:
            raise ValueError(f"max_loras ({self.max_loras}) and max_lora_rank ({self.max_lora_rank}) must be positive")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})")
        from offload.plan_types import PlanOptions
        PlanOptions.from_args(self)  # the placement flags are refused here, before a model is loaded

    def effective_prefill_dtype(self) -> str:
        """The long prefill chunks' precision once dtype is applied: dtype float32/bfloat16 decide it (a conflicting
        prefill_dtype is refused); dtype auto leaves prefill_dtype's own choice."""
        want = {"float": "float32", "float32": "float32", "bfloat16": "bfloat16"}.get(self.dtype)
        if want is None:
            return self.prefill_dtype
        if self.prefill_dtype not in ("auto", want):
            raise ValueError(f"dtype={self.dtype!r} conflicts with prefill_dtype={self.prefill_dtype!r}")
        return want

    def resolved_model(self) -> str:
        if self.model:
            return self.model
        from engine.default_model import default_model_path
        return default_model_path()

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
        """Adds one flag per field (vLLM's names, dashes); booleans get --x / --no-x."""
        hints = get_type_hints(cls)
        for f in fields(cls):
            if f.name in skip:
                continue
            flag = "--" + f.name.replace("_", "-")
            typ = hints[f.name]
            base = _base_type(typ)
            if base is bool:
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default,
                                    help=f.metadata.get("help", ""))
            elif base is dict:
                parser.add_argument(flag, type=_json_object, default=f.default, help=f.metadata.get("help", ""))
            else:
                parser.add_argument(flag, type=base, default=f.default, help=f.metadata.get("help", ""),
                                    choices=f.metadata.get("choices"))

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> "EngineArgs":
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)})

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineArgs":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown engine argument(s): {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        return cls(**kwargs)

    def replace(self, **kw) -> "EngineArgs":
        return dataclasses.replace(self, **kw)


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _base_type(typ) -> type:
    args = getattr(typ, "__args__", None)
    if args:  # Optional[X]
        return next(a for a in args if a is not type(None))
    return typ

