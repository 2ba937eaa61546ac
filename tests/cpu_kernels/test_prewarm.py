"""Cold-cache prewarm (cpu_kernels/prewarm.py): the helper process leaves its marker, and the tiny-shape
warm-ups compile exactly the signatures the engine then uses (else the split would compile twice), the bfloat16
prefill path's (the default where bf16 is native) included."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

COVERAGE = """
import sys
import numpy as np
from numba.core.dispatcher import Dispatcher
from cpu_kernels.quant.warmup import warmup as warm_formats
from cpu_kernels.warmup import warmup as warm_kernels
from engine.args import EngineArgs
from engine.model.weights import open_weights

def signatures():
    # By the function's own module (a module importing a kernel lists it too). The fused decode block's functions
    # compile at the engine's warm-up, one signature per combination of the model's weight formats.
    return {(d.py_func.__module__, d.py_func.__qualname__, str(s)) for m, mod in list(sys.modules.items())
            if m.startswith("cpu_kernels") for d in vars(mod).values() if isinstance(d, Dispatcher)
            if d.py_func.__module__ != "cpu_kernels.decode_block" for s in d.signatures}

ws = open_weights(EngineArgs().resolved_model())
warm_formats(types={ws.info(n).ggml_type for n in ws.names() if len(ws.info(n).shape) == 2}, bf16=True)
warm_kernels(kv_storages=(sys.argv[1],))
before = signatures()
from engine import LLM, SamplingParams
llm = LLM(max_model_len=512, kv_cache_memory=0.25, prefill_dtype="bfloat16",  # its tiles: the bf16 dequantizers
          kv_cache_dtype=sys.argv[2])
llm.generate(["The capital of France is", "word " * 40], SamplingParams(max_tokens=3, temperature=0))
new = sorted(signatures() - before)
print(len(before), new)
"""


@pytest.mark.parametrize("storage,kv", [("float16", "auto"), ("q8_0", "int8")])
def test_tiny_warmups_cover_every_signature_the_engine_uses(storage, kv):
    r = subprocess.run([sys.executable, "-c", COVERAGE, storage, kv], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    count, new = r.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(count) > 20 and new == "[]", new


MLA_MOE = """
import pathlib, sys, tempfile
import gguf
import numpy as np
from numba.core.dispatcher import Dispatcher
from cpu_kernels.quant.warmup import warmup as warm_formats
from cpu_kernels.warmup import warmup as warm_kernels
from engine.model.gguf_export import default_qtype, write_gguf
from engine.model.weights import open_weights
from tests.model.tiny_models import save_tiny_tokenizer, tiny_model

def signatures():
    return {(d.py_func.__module__, d.py_func.__qualname__, str(s)) for m, mod in list(sys.modules.items())
            if m.startswith("cpu_kernels") for d in vars(mod).values() if isinstance(d, Dispatcher)
            if d.py_func.__module__ != "cpu_kernels.decode_block" for s in d.signatures}

folder = pathlib.Path(tempfile.mkdtemp())
tiny_model("deepseek2").save_pretrained(folder, safe_serialization=True)
save_tiny_tokenizer(folder)
ws = open_weights(str(folder))
path = str(folder / "q4_k.gguf")
write_gguf(path, ws.config, {n: np.asarray(ws.raw(n), np.float32) for n in ws.names()},
           default_qtype(gguf.GGMLQuantizationType.Q4_K))
ws = open_weights(path)
warm_formats(types={ws.info(n).ggml_type for n in ws.names() if len(ws.info(n).shape) >= 2}, bf16=True)
warm_kernels(kv_storages=("float16",))
before = signatures()
from engine import LLM, SamplingParams
llm = LLM(model=path, tokenizer=str(folder), max_model_len=256, kv_cache_memory=0.02, prefill_dtype="bfloat16")
llm.generate([{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": list(range(3, 60))}],
             SamplingParams(max_tokens=3, temperature=0))
print(len(before), sorted(signatures() - before))
"""


def test_tiny_warmups_cover_an_mla_moe_model():
    """A tiny DeepSeek-V3 in Q4_K (MLA's latent rows and per-head matrices, grouped sigmoid routing with the
    correction bias read from the file, a shared expert): the MoE routing kernels were compiled at its first
    request."""
    # Kernel by kernel: the fused decode step's compile (whenever it runs) compiles its callees too, which is not
    # the warm-ups' business.
    env = dict(os.environ, RAMLM_FUSED_BLOCKS="0")
    r = subprocess.run([sys.executable, "-c", MLA_MOE], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    count, new = r.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(count) > 20 and new == "[]", new


GEMMA4 = "import sys\nARCH = sys.argv[1]\n" + MLA_MOE.replace('tiny_model("deepseek2")', "tiny_model(ARCH)")


def test_tiny_warmups_cover_gemma4_models():
    """Tiny Gemma 4 models in Q4_K: the V norm in the attention inputs, the q-only inputs of KV-shared layers, the
    per-layer embeddings' GELU gate (gemma4), the router's own input norm and the per-expert scale (gemma4-moe):
    compiled at the warm-up, none at their first requests."""
    env = dict(os.environ, RAMLM_FUSED_BLOCKS="0")  # as above
    for arch in ("gemma4", "gemma4-moe"):
        r = subprocess.run([sys.executable, "-c", GEMMA4, arch], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        count, new = r.stdout.strip().splitlines()[-1].split(" ", 1)
        assert int(count) > 20 and new == "[]", (arch, new)


HELPER = """
import numpy as np
from cpu_kernels import CACHE_DIR, prewarm
helper = prewarm.start_kernel_helper("float16")
assert helper is not None, "no helper started on a cache without its marker"
prewarm.wait(helper)
assert helper.returncode == 0, helper.returncode
assert prewarm.is_done(prewarm.kernels_name("float16"))
assert prewarm.start_kernel_helper("float16") is None, "a helper started again on a prewarmed cache"
print("ok", CACHE_DIR)
"""


def test_helper_compiles_into_the_cache_and_leaves_its_marker(tmp_path):
    from cpu_kernels import CACHE_DIR
    cache = tmp_path / "numba"
    if os.path.isdir(CACHE_DIR):  # a copy of this session's cache: the helper loads rather than compiles
        shutil.copytree(CACHE_DIR, cache, ignore=shutil.ignore_patterns("prewarmed-*"))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    r = subprocess.run([sys.executable, "-c", HELPER], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["ok", str(cache)]
