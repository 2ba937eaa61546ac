#!/usr/bin/env bash
# GPU checks of hybrid placement (issue 6), one prepared script for a machine with an NVIDIA GPU, < 10 min:
#   1. gpu_kernels against cpu_kernels on CUDA (pytest -k cuda), the Triton kernels compiled for this GPU
#      (tests/gpu_kernels/triton_cases.py, which CPU machines only interpret), mixed placements of tiny models
#   2. an 8B-shaped synthetic Q4_K_M model (bench/make_synthetic.py): `ramlm plan`, then the offload sweep
#      (packed weights with the Triton kernels, and again with RAMLM_TRITON=0 to see whether they win)
#
# Where the GPU image lacks pure-Python deps (the workplace's H200 image has no `gguf`), first run here:
#   bash bench/gpu_check.sh --prepare      # copies them into build/gpu_deps (ignored by git)
# then on the GPU machine, carrying build/gpu_deps:   bash bench/gpu_check.sh
# The log, plans and sweep JSON/PNG are copied to $OUT when set (the device tool's folder); the sweeps also
# write bench/results/offload-*.json (+ .png with matplotlib) as every bench does.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

if [[ "${1:-}" == "--prepare" ]]; then
    mkdir -p build/gpu_deps
    for mod in gguf; do
        src=$(python -c "import $mod, os; print(os.path.dirname($mod.__file__))")
        rm -rf "build/gpu_deps/$mod" && cp -r "$src" "build/gpu_deps/$mod"
        find "build/gpu_deps/$mod" -name __pycache__ -prune -exec rm -rf {} +
    done
    du -sh build/gpu_deps
    exit 0
fi

PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT/build/gpu_deps:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export RAMLM_CACHE_DIR=${RAMLM_CACHE_DIR:-/tmp/ramlm_cache}
RES=${OUT:-/tmp/ramlm_gpu_check}
mkdir -p "$RES"
MODEL=${MODEL:-/tmp/llama8b.gguf}
exec > >(tee "$RES/gpu_check.log") 2>&1  # one log: the device tool brings back at most 8 files
status=0
step() { echo; echo "=== $* ($(date +%T))"; }

step "machine"
nvidia-smi -L || true
$PY - <<'EOF' || exit 1
import importlib, sys
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
assert torch.cuda.is_available(), "no CUDA GPU: nothing to check"
print(torch.cuda.get_device_name(0), f"{torch.cuda.mem_get_info()[1] / 2**30:.1f} GiB")
missing = [m for m in ("gguf", "numba", "numpy", "psutil", "tokenizers", "jinja2", "safetensors", "transformers",
                       "pytest") if importlib.util.find_spec(m) is None]
try:
    import triton
    print("triton", triton.__version__, "(packed matmuls and decode attention of GPU layers)")
except ImportError:
    print("triton: not installed (the torch kernels run; the Triton step skips)")
if missing:
    sys.exit(f"missing Python packages: {missing} (run bash bench/gpu_check.sh --prepare on a machine that has them "
             "and carry build/gpu_deps)")
EOF

step "probe + plan on this machine"
$PY - <<'EOF'
from offload import probe_devices
d = probe_devices()
print(d.ram)
for g in d.gpus:
    print(g)
EOF

step "CUDA kernel tests (gpu_kernels vs cpu_kernels)"
timeout 240 $PY -m pytest tests/gpu_kernels -q -k cuda -p no:cacheprovider || status=1

step "Triton kernels compiled for this GPU (against gguf, Numba and the torch path)"
env -u TRITON_INTERPRET timeout 300 $PY -m pytest tests/gpu_kernels/triton_cases.py -q -rs -p no:cacheprovider || status=1

step "mixed placements of tiny models on CUDA"
timeout 240 $PY -m pytest tests/offload/test_apply.py -q -k cuda -p no:cacheprovider || status=1

step "synthetic llama-8b Q4_K_M"
if [[ ! -f "$MODEL" ]]; then
    if [[ -f bench/make_synthetic.py ]]; then
        timeout 180 $PY -m bench.make_synthetic --shape llama-8b --quant q4_k_m --out "$MODEL" || status=1
    else
        echo "bench/make_synthetic.py is missing: set MODEL=path/to/an/8B.gguf"; status=1
    fi
fi

if [[ -f "$MODEL" ]]; then
    step "ramlm plan (auto, 8 GiB described GPU and this GPU)"
    cat > /tmp/gpu8.json <<'EOF'
{"ram": {"total_gib": 32, "available_gib": 28},
 "gpus": [{"name": "cuda:0", "kind": "cuda", "description": "an 8 GiB card", "total_gib": 8, "free_gib": 7.7,
           "compute_capability": "8.9"}]}
EOF
    $PY -m engine.entrypoints.cli plan "$MODEL" --devices-file /tmp/gpu8.json --n-gpu-layers auto --max-model-len 4096 \
        --max-num-seqs 2
    $PY -m engine.entrypoints.cli plan "$MODEL" --n-gpu-layers auto --max-model-len 4096 --max-num-seqs 8 --json \
        > "$RES/plan_this_gpu.json" || status=1

    step "offload sweep: dequantized weights (auto), KV on GPU or RAM"
    timeout 300 $PY -m bench.offload "$MODEL" --device cuda:0 --layers 0,16,32,all --kv gpu,ram --batch 1,8 \
        --prompt-tokens 128 --gen-tokens 16 --budget 8 --time-limit 240 || status=1

    step "offload sweep: packed weights (what an 8 GiB card would hold)"
    timeout 150 $PY -m bench.offload "$MODEL" --device cuda:0 --layers 16,all --kv gpu --batch 1,8 \
        --prompt-tokens 128 --gen-tokens 16 --weight-dtype packed --budget 8 --time-limit 100 || status=1

    step "offload sweep: packed weights with the torch kernels (RAMLM_TRITON=0), to compare with the one above"
    RAMLM_TRITON=0 timeout 120 $PY -m bench.offload "$MODEL" --device cuda:0 --layers all --kv gpu --batch 1,8 \
        --prompt-tokens 128 --gen-tokens 16 --weight-dtype packed --budget 8 --time-limit 60 || status=1
    if [[ -n "${OUT:-}" ]]; then
        cp bench/results/offload-*.json bench/results/offload-*.png "$OUT"/ 2>/dev/null || true
    fi
fi

step "done (status $status)"
exit $status
