"""Everything LLMEngine needs from the files: model, tokenizer, context length, KV pool size."""
from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

from engine.args import EngineArgs
from engine.core.kv_cache import num_blocks_for_budget
from engine.model.config import ModelConfig
from engine.core.kv_spec import KV_RAM_FRACTION, kv_storage_dtype, layout_state_bytes
from engine.worker.runner import ModelRunner


@dataclass
class Loaded:
    model: object
    config: ModelConfig
    tokenizer: object
    model_path: str
    max_model_len: int
    num_blocks: tuple[int, ...]  # KV blocks per cache group (core/kv_spec.cache_groups), null block included


def configure_threads(num_threads: int | None) -> None:
    import numba
    from cpu_kernels import configure_threads as configure
    configure()
    if num_threads:
        numba.set_num_threads(min(num_threads, numba.config.NUMBA_NUM_THREADS))


def load_tokenizer(args: EngineArgs, ws):
    from engine.tokenization.tokenizer import Tokenizer
    from engine.tokenization.tokenizer_gguf import tokenizer_cache_key
    if args.tokenizer:
        tok = Tokenizer.from_hf(args.tokenizer)
    elif ws.format == "gguf":
        tok = Tokenizer.from_gguf_metadata(ws.metadata, tokenizer_cache_key(ws.path))
    else:
        tok = Tokenizer.from_hf(ws.path)
    if args.chat_template:
        text = args.chat_template
        if os.path.isfile(text):
            with open(text, encoding="utf-8") as f:
                text = f.read()
        tok.chat_template = text
    return tok


def cache_budget(args: EngineArgs, weight_bytes: int) -> int:
    """Bytes for the KV blocks (and the states of linear-attention layers): kv_cache_memory, else a share of the RAM
    left after the weights."""
    if args.kv_cache_memory is not None:
        return int(args.kv_cache_memory * 2**30)
    return int(max(psutil.virtual_memory().available - weight_bytes, 2**28) * KV_RAM_FRACTION)


def state_pool_slots(args: EngineArgs, cfg: ModelConfig, weight_bytes: int, state_bytes: int) -> int:
    """State slots of a model with linear-attention layers (state_bytes: one sequence's states in all of them, from
    its kv_layout; 0 without: no slots): num_state_slots, else one live state per running request plus as many
    prefix-cache checkpoints, within half the cache budget (at least 2 slots)."""
    if not state_bytes:
        return 0
    if args.num_cpu_blocks:
        raise ValueError(f"--num-cpu-blocks: {cfg.arch} keeps a recurrent state per request in its linear-attention "
                         "layers, which the RAM tier does not swap; run without it (preempted requests are recomputed)")
    if args.num_state_slots is not None:
        if args.num_state_slots < 2:
            raise ValueError(f"num_state_slots must be at least 2 (1 usable + the scratch slot), got "
                             f"{args.num_state_slots}")
        return int(args.num_state_slots)
    fits = cache_budget(args, weight_bytes) // 2 // state_bytes
    return max(2, min(2 * args.max_num_seqs + 1, fits))


def kv_pool_blocks(args: EngineArgs, cfg: ModelConfig, max_model_len: int, weight_bytes: int,
                   state_bytes: int = 0) -> int:
    """KV blocks for the budget left after state_bytes (the state pool)."""
    if args.num_gpu_blocks_override:
        return int(args.num_gpu_blocks_override)
    budget = max(cache_budget(args, weight_bytes) - state_bytes, 0)
    per_block = ModelRunner.kv_bytes_per_block(cfg, args.block_size, args.kv_cache_dtype)
    return num_blocks_for_budget(budget, per_block, args.block_size, max_model_len, args.max_num_seqs)


def load_everything(args: EngineArgs) -> Loaded:
    from concurrent.futures import ThreadPoolExecutor

    from cpu_kernels import prewarm
    from engine.model.loader import load_model
    from engine.model.weights import open_weights
    configure_threads(args.num_threads)
    from engine.model.online_quant import quantize_at_load
    path = args.resolved_model()
    ws = quantize_at_load(open_weights(path), args.quantization)
    # Cold JIT cache: a helper process compiles the non-matmul kernels while this one compiles the formats'.
    helper = prewarm.start_kernel_helper(kv_storage_dtype(args.kv_cache_dtype))
    try:
        # The tokenizer (about 1 s for a 262k vocabulary, mostly in Rust) loads while the weights repack.
        with ThreadPoolExecutor(1, thread_name_prefix="ramlm-tokenizer") as pool:
            tok_future = pool.submit(load_tokenizer, args, ws)
            prewarm.compile_formats({ws.info(n).ggml_type for n in ws.names() if len(ws.info(n).shape) == 2})
            model, cfg = load_model(path, batch_invariant=args.batch_invariant, weights=ws)
            model.prefill_dtype = args.effective_prefill_dtype()
            tokenizer = tok_future.result()
    except BaseException:
        prewarm.stop(helper)
        raise
    prewarm.wait(helper)  # before the engine's warm-up, which then loads the helper's kernels from the cache
    max_model_len = args.max_model_len or cfg.max_position_embeddings
    if max_model_len > cfg.max_position_embeddings:
        raise ValueError(f"max_model_len {max_model_len} exceeds the model's context ({cfg.max_position_embeddings})")
    weight_bytes = sum(model.weights.info(n).nbytes for n in model.weights.names())
    state_bytes = layout_state_bytes(model.kv_layout)  # linear-attention layers: one sequence's states
    model.num_state_slots = state_pool_slots(args, cfg, weight_bytes, state_bytes)
    num_blocks = kv_pool_blocks(args, cfg, max_model_len, weight_bytes, model.num_state_slots * state_bytes)
    # Offload hook (issue 6): plan and apply the RAM/GPU placement; it may shrink the KV pool to what fits.
    from offload import apply_placement
    num_blocks = apply_placement(args, model, max_model_len, num_blocks)  # split per cache group
    if min(num_blocks) < 2:
        per = ModelRunner.kv_bytes_per_block(cfg, args.block_size, args.kv_cache_dtype)
        raise ValueError(f"the KV cache budget holds {min(num_blocks)} blocks of {per} bytes; give more kv_cache_memory")
    return Loaded(model, cfg, tokenizer, path, max_model_len, num_blocks)
