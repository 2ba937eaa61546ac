r"""Do ramlm's GGUF files load in llama.cpp, and compute the same thing there?

    python -m bench.llamacpp_load                      # a tiny exported GGUF of every registered architecture
    python -m bench.llamacpp_load --file /tmp/llama8b.gguf --file ...   # also these (synthetic shapes): load only
    python -m bench.llamacpp_load --arch qwen35 --arch qwen35moe --mtp  # with an MTP layer (blk.{L}.nextn.*)
    python -m bench.llamacpp_load --arch llama --arch qwen3 --lora      # and a LoRA adapter as a GGUF LoRA file
    python -m bench.llamacpp_load --arch bert --arch roberta            # encoders: embeddings of texts
    python -m bench.llamacpp_load --arch gemma-embedding                # EmbeddingGemma's llama.cpp layout

For each architecture, a tiny random model is built with transformers (tests/model/tiny_models.py; run from the
repository root), exported by engine/model/gguf_export.write_gguf in F32 with a byte-level vocabulary, loaded by
llama.cpp (llama-cpp-python, built as `python -m bench.compare --help` says) and run on a prompt: the line gives
llama.cpp's logits' largest error relative to transformers' (llama.cpp computes in its own precision, so ~1e-3
is agreement; a wrong layout or key gives a load error or errors near 1). With --lora, a random PEFT adapter of
every projection, the embedding and the output matrix (those two where they are not tied) is written by
engine/lora/gguf_lora.write in llama.cpp's GGUF LoRA layout, applied by llama.cpp (lora_path) and compared with
PEFT's logits. An encoder (tests/model/tiny_models.ENCODERS) is written with a BERT WordPiece vocabulary in
llama.cpp's phantom-space layout and embeds texts in llama.cpp (its own tokenizer, CLS pooling), against
transformers' CLS rows (XLM-RoBERTa with a SentencePiece Unigram vocabulary in llama.cpp's "t5" layout, and
llama.cpp's token ids against transformers'). Writes JSON to bench/results/.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from bench.common import write_result

PROMPT = [5, 17, 99, 3, 250, 42, 7, 8]


def byte_vocab(n: int) -> dict:
    """A GPT-2 style byte-level vocabulary of the model's n tokens (the 256 byte symbols, then fillers)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, extra = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    tokens = [chr(c) for _, c in sorted(zip(bs, cs))] + [f"<t{i}>" for i in range(256, n)]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens[:n],
            "tokenizer.ggml.token_type": [1] * n, "tokenizer.ggml.merges": ["Ġ Ġ"],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}


# Architectures whose checkpoints carry multi-token-prediction layers (HF mtp.*, GGUF blk.{L}.nextn.*)
MTP_ARCHES = ("qwen35", "qwen35moe")


def add_mtp_layer(hf, folder: Path) -> None:
    """Qwen3.5's mtp.* tensors beside the saved model (a second shard): fc, its three norms and one decoder layer
    shaped as the last one (full attention), random; transformers ignores them, the GGUF keeps them."""
    import json

    import torch
    from safetensors.torch import save_file
    sd, H, last = hf.state_dict(), hf.config.hidden_size, f"model.layers.{hf.config.num_hidden_layers - 1}."
    g = torch.Generator().manual_seed(5)
    mtp = {f"mtp.{k}.weight": torch.randn(*shape, generator=g) for k, shape in
           (("fc", (H, 2 * H)), ("norm", (H,)), ("pre_fc_norm_embedding", (H,)), ("pre_fc_norm_hidden", (H,)))}
    mtp.update({"mtp.layers.0." + k[len(last):]: v.clone() for k, v in sd.items() if k.startswith(last)})
    save_file(mtp, str(folder / "mtp.safetensors"))
    (folder / "model.safetensors").rename(folder / "main.safetensors")
    weight_map = {k: "main.safetensors" for k in sd} | {k: "mtp.safetensors" for k in mtp}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def check_arch(arch: str, folder: Path, mtp: bool = False, lora: bool = False) -> dict:
    import gguf
    import llama_cpp
    from engine.model.gguf_export import write_gguf
    from engine.model.weights import open_weights
    from tests.model.tiny_models import hf_logits, tiny_model
    hf = tiny_model(arch)
    hf.save_pretrained(folder, safe_serialization=True)
    if mtp:
        add_mtp_layer(hf, folder)
    ws = open_weights(str(folder))
    tensors = {n: np.asarray(ws.raw(n), dtype=np.float32) for n in ws.names()}
    path = str(folder / f"{arch}.gguf")
    write_gguf(path, ws.config, tensors, lambda name, shape: gguf.GGMLQuantizationType.F32,
               tokenizer_metadata=byte_vocab(ws.config.vocab_size))
    try:
        llm = llama_cpp.Llama(path, n_ctx=64, logits_all=True, verbose=False, n_threads=2)
    except Exception as e:  # noqa: BLE001 (the load error is the result)
        return {"arch": arch, "mtp_layers": ws.config.nextn_layers, "loads": False, "error": str(e)}
    llm.eval(PROMPT)
    got = np.array(llm.scores[:len(PROMPT)])
    ref = hf_logits(hf, PROMPT).numpy()
    out = {"arch": arch, "mtp_layers": ws.config.nextn_layers, "loads": True,
           "rel_err": float(np.abs(got - ref).max() / np.abs(ref).max())}
    del llm
    return {**out, **check_lora(arch, folder, path, hf, ws.config)} if lora else out


ENCODER_TEXTS = ["the cat sat on the mat", "a big red house", "dogs ran far away"]  # no [UNK]: id 1 is RoBERTa's pad


XLMR_TEXTS = ["hello world caf\u00e9", "  the quick\tbrown \ufb01 fox", "\uff46\uff55\uff4c\uff4c width \u6771\u4eac",
              "na\u00efve r\u00e9sum\u00e9 \u00fcber stra\u00dfe"]  # NFKC forms, whitespace runs, accents, CJK


def check_encoder(arch: str, folder: Path) -> dict:
    """llama.cpp's CLS embeddings of texts (its tokenizer over the GGUF's vocabulary) against transformers'; XLM-R
    with its SentencePiece Unigram vocabulary as llama.cpp's converter writes it ("t5"), the others WordPiece; the
    token ids of llama.cpp's tokenizer against transformers' too."""
    import gguf
    import llama_cpp
    import torch
    from engine.model.gguf_export import write_gguf
    from tests.engine.test_bert_pooling import save_wordpiece
    from tests.model.test_bert import tiny_encoder
    from tests.model.tiny_models import (float_tensors, save_sentencepiece, unigram_gguf_metadata,
                                         wordpiece_gguf_metadata)
    hf = tiny_encoder(arch)
    hf.save_pretrained(folder, safe_serialization=True)
    tok = save_sentencepiece(folder) if arch == "xlm-roberta" else save_wordpiece(folder)
    config, tensors = float_tensors(folder)
    path = str(folder / f"{arch}.gguf")
    keys = (unigram_gguf_metadata(folder, config.vocab_size) if arch == "xlm-roberta"
            else wordpiece_gguf_metadata(tok))
    write_gguf(path, config, tensors, lambda name, shape: gguf.GGMLQuantizationType.F32, tokenizer_metadata=keys)
    try:
        llm = llama_cpp.Llama(path, n_ctx=64, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_CLS,
                              verbose=False, n_threads=2)
    except Exception as e:  # noqa: BLE001 (the load error is the result)
        return {"arch": arch, "mtp_layers": 0, "loads": False, "error": str(e)}
    errs, same_ids = [], True
    for text in XLMR_TEXTS if arch == "xlm-roberta" else ENCODER_TEXTS:
        same_ids &= llm.tokenize(text.encode(), add_bos=True, special=False) == tok(text)["input_ids"]
        got = np.asarray(llm.embed(text, normalize=False), np.float64).reshape(-1)
        with torch.no_grad():
            ref = hf(**tok(text, return_tensors="pt")).last_hidden_state[0, 0].double().numpy()
        errs.append(float(np.abs(got - ref).max() / np.abs(ref).max()))
    return {"arch": arch, "mtp_layers": 0, "loads": True, "rel_err": max(errs), "same_token_ids": bool(same_ids),
            "what": "CLS embeddings"}


def check_gemma_embedding(folder: Path) -> dict:
    """llama.cpp's embeddings of a gemma-embedding file (EmbeddingGemma's layout: bidirectional gemma3 layers, mean
    pooling, the dense_2 / dense_3 projections) against the sentence-transformers pipeline on transformers."""
    import llama_cpp
    from tests.engine.test_embedding_gemma import _reference, gemma_embedding_gguf, saved_embedding_gemma
    model, up, down = saved_embedding_gemma(folder)
    path = gemma_embedding_gguf(folder, up, down, str(folder / "gemma-embedding.gguf"))
    try:
        llm = llama_cpp.Llama(path, n_ctx=64, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                              verbose=False, n_threads=2)
    except Exception as e:  # noqa: BLE001 (the load error is the result)
        return {"arch": "gemma-embedding", "mtp_layers": 0, "loads": False, "error": str(e)}
    errs = []
    for ids in ([5, 9, 200, 3, 17, 42, 7, 8, 100, 11, 12], [4, 4, 4]):
        llm.tokenize = lambda *a, ids=ids, **k: list(ids)  # these token ids, not llama.cpp's tokens of a text
        got = np.asarray(llm.embed("x", normalize=True), np.float64).reshape(-1)
        ref = _reference(model, up, down, ids)
        errs.append(float(np.abs(got - ref).max() / np.abs(ref).max()))
    return {"arch": "gemma-embedding", "mtp_layers": 0, "loads": True, "rel_err": max(errs),
            "what": "normalized mean embeddings after dense_2/dense_3"}


def check_lora(arch: str, folder: Path, gguf_path: str, hf, config) -> dict:
    """llama.cpp with a GGUF LoRA file written from a PEFT folder, against PEFT's logits."""
    import llama_cpp

    from engine.lora import gguf_lora
    from engine.model.registry import architecture
    from tests.engine.lora.adapters import ATTENTION, MLP, peft_logits, save_adapter
    # a tied model's embedding and output matrix are one GGUF tensor: gguf_lora.write refuses adapting either
    targets = ATTENTION + MLP + ([] if config.tie_word_embeddings else ["embed_tokens", "lm_head"])
    model = save_adapter(hf, folder / "lora", targets, seed=3)
    lora_path = gguf_lora.write(str(folder / "lora"), str(folder / "lora.gguf"), architecture(config.arch), config)
    try:
        llm = llama_cpp.Llama(gguf_path, n_ctx=64, logits_all=True, verbose=False, n_threads=2, lora_path=lora_path)
    except Exception as e:  # noqa: BLE001 (the load error is the result)
        return {"lora_loads": False, "lora_error": str(e)}
    llm.eval(PROMPT)
    got = np.array(llm.scores[:len(PROMPT)])
    ref = peft_logits(model, PROMPT)
    return {"lora_loads": True, "lora_targets": targets,
            "lora_rel_err": float(np.abs(got - ref).max() / np.abs(ref).max())}


def check_file(path: str) -> dict:
    import llama_cpp
    try:
        llm = llama_cpp.Llama(path, n_ctx=64, verbose=False, n_threads=2, use_mmap=True)
        llm.eval([1, 2, 3])
        return {"file": os.path.basename(path), "loads": True}
    except Exception as e:  # noqa: BLE001
        return {"file": os.path.basename(path), "loads": False, "error": str(e)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", action="append", help="only these tiny models (default: every one of "
                    "tests/model/tiny_models.ARCHES, each registered architecture's and its variants)")
    ap.add_argument("--file", action="append", default=[], help="a GGUF file to load too")
    ap.add_argument("--mtp", action="store_true", help=f"give {', '.join(MTP_ARCHES)} an MTP layer")
    ap.add_argument("--lora", action="store_true", help="also a LoRA adapter as a GGUF LoRA file (llama.cpp applies it)")
    args = ap.parse_args(argv)
    from tests.model.tiny_models import ARCHES, ENCODERS, POOLING_ONLY
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.arch or ARCHES:
            folder = Path(tmp) / arch
            folder.mkdir()
            if arch in POOLING_ONLY:
                r = check_gemma_embedding(folder)
            elif arch in ENCODERS:
                r = check_encoder(arch, folder)
            else:
                r = check_arch(arch, folder, mtp=args.mtp and arch in MTP_ARCHES, lora=args.lora)
            results.append(r)
            what = r.get("what", "logits")
            print(f"{arch}{' + MTP' if r['mtp_layers'] else ''}: " + (f"loads, {what} within {r['rel_err']:.1e} of transformers" if r["loads"]
                                  else f"does not load: {r['error']}"))
            if "same_token_ids" in r:
                print(f"{arch}: llama.cpp's token ids of the texts {'equal' if r['same_token_ids'] else 'differ from'} "
                      "transformers' tokenizer's")
            if "lora_loads" in r:
                print(f"{arch} + GGUF LoRA: " + (f"llama.cpp's logits within {r['lora_rel_err']:.1e} of PEFT's"
                                                 if r["lora_loads"] else f"does not load: {r['lora_error']}"))
    for path in args.file:
        r = check_file(path)
        results.append(r)
        print(f"{r['file']}: " + ("loads and runs" if r["loads"] else f"does not load: {r['error']}"))
    print(f"wrote {write_result('llamacpp-load', {'results': results}, {'files': args.file, 'mtp': args.mtp})}")


if __name__ == "__main__":
    main()
