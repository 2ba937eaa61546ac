"""Load time and peak RSS of a float model quantized at load (vLLM's `quantization` argument), one method per fresh
process so each peak is its own:

    python -m bench.make_synthetic_fp8 --shape llama-8b --dtype bf16 --out /tmp/llama8b-bf16
    python -m bench.quantize_load --model /tmp/llama8b-bf16 --methods q8_0,q4_k,int8,int4,fp8
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from bench.common import write_result

_WORKER = """
import json, resource, sys, time
from engine.model.loader import load_model
from engine.model.online_quant import QuantizedWeights
from engine.model.weights import open_weights
t0 = time.perf_counter()
load_model(sys.argv[1], weights=QuantizedWeights(open_weights(sys.argv[1]), sys.argv[2]))
print(json.dumps({"load_s": time.perf_counter() - t0,
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20}))
"""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="an HF folder or GGUF file of float weights")
    ap.add_argument("--methods", default="q8_0,q4_k,int8,int4,fp8")
    args = ap.parse_args(argv)
    figures = {}
    for method in args.methods.split(","):
        out = subprocess.run([sys.executable, "-c", _WORKER, args.model, method], capture_output=True, text=True,
                             check=True)
        figures[method] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{method}: loaded and quantized in {figures[method]['load_s']:.1f} s, peak RSS "
              f"{figures[method]['peak_rss_gb']:.2f} GB")
    print(f"wrote {write_result('quantize-load', figures, {'model': args.model})}")


if __name__ == "__main__":
    main()
