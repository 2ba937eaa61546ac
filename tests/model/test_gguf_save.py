"""`ramlm quantize`: a GGUF file's float tensors quantized into a new GGUF file that llama.cpp's reader and ramlm load,
with the source's metadata (tokenizer included) and the same model as quantizing at load."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from engine.entrypoints.cli import main
from engine.errors import ModelLoadError
from engine.model.gguf_export import write_gguf
from engine.model.gguf_save import save_quantized_gguf
from engine.model.loader import load_model
from engine.model.online_quant import QuantizedWeights
from engine.model.weights import open_weights
from tests.model.test_architectures import PROMPTS, run_batched
from tests.model.tiny_models import save_tiny_tokenizer, tiny_model

Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def bf16_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("save")
    tiny_model("qwen3").save_pretrained(root / "hf", safe_serialization=True)
    save_tiny_tokenizer(root / "hf")
    ws = open_weights(str(root / "hf"))
    path = str(root / "bf16.gguf")
    tok = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [f"t{i}" for i in range(256)],
           "tokenizer.ggml.token_type": [1] * 256, "tokenizer.ggml.merges": ["t 1"]}
    write_gguf(path, ws.config, {n: np.asarray(ws.raw(n), np.float32) for n in ws.names()},
               lambda name, shape: Q.BF16 if len(shape) >= 2 else Q.F32, tokenizer_metadata=tok)
    return path


@pytest.mark.parametrize("method", ["q8_0", "q4_k", "int4"])
def test_saved_gguf_is_the_model_quantized_at_load(bf16_gguf, tmp_path, method):
    out = str(tmp_path / f"{method}.gguf")
    assert main(["quantize", bf16_gguf, out, "--quantization", method]) == 0
    src, saved = gguf.GGUFReader(bf16_gguf), gguf.GGUFReader(out)
    want = {Q.Q8_0: 7, Q.Q4_K: 14, Q.Q4_0: 2}[{"q8_0": Q.Q8_0, "q4_k": Q.Q4_K, "int4": Q.Q4_0}[method]]
    assert saved.fields["general.file_type"].contents() == want
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "qwen3.attention.head_count_kv"):
        assert saved.fields[key].contents() == src.fields[key].contents()
    types = {t.name: t.tensor_type for t in saved.tensors}
    assert types["blk.0.ffn_up.weight"] == {"q8_0": Q.Q8_0, "q4_k": Q.Q4_K, "int4": Q.Q4_0}[method]
    assert types["blk.0.attn_norm.weight"] == Q.F32
    online, _ = load_model(bf16_gguf, weights=QuantizedWeights(open_weights(bf16_gguf), method))
    offline, _ = load_model(out)
    for a, b in zip(run_batched(online, PROMPTS), run_batched(offline, PROMPTS)):
        np.testing.assert_array_equal(a, b)


def test_unsavable_requests_are_refused(bf16_gguf, tmp_path):
    with pytest.raises(ValueError, match="GGUF files cannot hold"):
        save_quantized_gguf(bf16_gguf, str(tmp_path / "x.gguf"), "fp8")
    with pytest.raises(ValueError, match="not supported"):
        save_quantized_gguf(bf16_gguf, str(tmp_path / "x.gguf"), "q3_k")
    hf = str(tmp_path / "hf")
    tiny_model("qwen3").save_pretrained(hf, safe_serialization=True)
    with pytest.raises(ModelLoadError, match="convert_hf_to_gguf"):
        save_quantized_gguf(hf, str(tmp_path / "x.gguf"), "q8_0")
    assert main(["quantize", bf16_gguf, str(tmp_path / "y.gguf"), "-q", "fp8"]) == 2
