"""Embedding throughput of a BERT-base-shaped encoder (random weights in an HF folder: 12 layers, 768 wide, 3072
MLP, 30522 tokens) against transformers on the same CPU threads (and sentence-transformers' pipeline where it is
installed), the same token ids, alternating rounds in one process, medians:

    python -m bench.embeddings [--batch 32] [--tokens 128] [--batches 4] [--rounds 3] [--dtype auto|float32|bfloat16]
                               [--prefill-dtype auto|float32|bfloat16|int8]

Each round embeds --batches batches of --batch prompts of --tokens tokens (CLS pooling, normalized) with each engine;
ramlm's long prompts run in --prefill-dtype (auto: bf16 GEMMs where the CPU has them; int8: W8A8).
transformers runs float32 (the checkpoint's dtype, what sentence-transformers loads); --hf-bf16 adds a transformers
run in bfloat16 autocast for comparison.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from bench.common import median, write_result

FOLDER = os.path.join(os.environ.get("TMPDIR", "/tmp"), "ramlm-bench-bert-base")


def bert_base_folder(folder: str = FOLDER) -> str:
    """A BERT-base-shaped HF folder (random weights, seed 0) with a word-level tokenizer.json of its vocabulary."""
    if os.path.isfile(os.path.join(folder, "model.safetensors")):
        return folder
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig()).float().eval()
    model.save_pretrained(folder, safe_serialization=True)
    vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t100"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"unk_token": "t100"}, f)
    return folder


def _cls_normalized(hidden):
    import torch
    return torch.nn.functional.normalize(hidden[:, 0].float(), dim=-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    ap.add_argument("--prefill-dtype", default="auto", choices=("auto", "float32", "bfloat16", "int8"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--hf-bf16", action="store_true", help="also time transformers in bfloat16 autocast")
    a = ap.parse_args()
    import torch
    import transformers
    from engine import LLM
    torch.set_num_threads(a.threads)
    folder = bert_base_folder()
    llm = LLM(model=folder, dtype=a.dtype, prefill_dtype=a.prefill_dtype, num_threads=a.threads,
              max_num_batched_tokens=a.batch * a.tokens)
    llm.llm_engine.import_torch_now()
    hf = transformers.BertModel.from_pretrained(folder, dtype=torch.float32).eval()
    try:
        from sentence_transformers import SentenceTransformer, models as st_models
        word = st_models.Transformer(folder)
        st = SentenceTransformer(modules=[word, st_models.Pooling(word.get_word_embedding_dimension(), "cls"),
                                          st_models.Normalize()], device="cpu").eval()
    except ImportError:
        st = None
    rng = np.random.default_rng(0)
    batches = [rng.integers(1000, 30000, (a.batch, a.tokens)) for _ in range(a.batches)]

    def ramlm():
        return [np.asarray([o.outputs.embedding for o in llm.embed([{"prompt_token_ids": r.tolist()} for r in b],
                                                                    use_tqdm=False)]) for b in batches]

    def transformers_run(bf16=False):
        out = []
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            for b in batches:
                out.append(_cls_normalized(hf(input_ids=torch.from_numpy(b)).last_hidden_state).numpy())
        return out

    def sentence_transformers_run():
        out = []
        with torch.inference_mode():
            for b in batches:
                ids = torch.from_numpy(b)
                feats = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                         "token_type_ids": torch.zeros_like(ids)}
                out.append(st(feats)["sentence_embedding"].numpy())
        return out

    engines = {"ramlm": ramlm, "transformers": transformers_run}
    if a.hf_bf16:
        engines["transformers-bf16"] = lambda: transformers_run(True)
    if st is not None:
        engines["sentence-transformers"] = sentence_transformers_run
    seqs = a.batch * a.batches
    runs = {k: [] for k in engines}
    vecs = {}
    for r in range(a.rounds + 1):
        for k, fn in engines.items():
            t0 = time.perf_counter()
            vecs[k] = fn()
            if r:  # round 0 warms every engine
                runs[k].append(seqs / (time.perf_counter() - t0))
    med = {k: median(v) for k, v in runs.items()}
    diff = max(float(np.abs(x - y).max()) for x, y in zip(vecs["ramlm"], vecs["transformers"]))
    cos = min(float((np.asarray(x, np.float64) * y).sum(axis=1).min())  # both normalized
              for x, y in zip(vecs["ramlm"], vecs["transformers"]))
    line = ", ".join(f"{k} {v:.1f}" for k, v in med.items())
    print(f"BERT-base, {a.batch} x {a.tokens} tokens, {a.threads} threads: sequences/s {line}; ramlm / transformers "
          f"{med['ramlm'] / med['transformers']:.2f}x; against transformers' vectors: max |difference| {diff:.1e}, "
          f"least cosine {cos:.6f}")
    write_result("embeddings", {"batch": a.batch, "tokens": a.tokens, "batches": a.batches, "dtype": a.dtype,
                                "prefill_dtype": a.prefill_dtype,
                                "threads": a.threads, "seqs_per_s": med, "runs": runs,
                                "ratio_vs_transformers": med["ramlm"] / med["transformers"],
                                "max_abs_diff_vs_transformers": diff, "min_cosine_vs_transformers": cos,
                                "torch": torch.__version__,
                                "transformers": transformers.__version__})


if __name__ == "__main__":
    main()
