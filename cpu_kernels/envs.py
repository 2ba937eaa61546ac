"""Every RAMLM_* environment variable, declared once with its default and meaning (vLLM keeps its VLLM_* in one
envs module too). Code reads them through get(); the README's table is written from VARIABLES
(`python -m cpu_kernels.envs` prints it) and a test checks that both list the same variables. This module lives
at the bottom of the packages (kernels read some of them, and kernels import nothing from engine/)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable


def _flag(text: str) -> bool:
    return text.strip().lower() not in ("", "0", "false", "no", "off")


def _tristate(text: str) -> bool | None:
    """'1' / '0' force a path on or off; anything else leaves the automatic choice."""
    return {"1": True, "0": False}.get(text.strip())


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.strip() not in allowed:
            raise ValueError(text)
        return text.strip()
    return parse


@dataclass(frozen=True)
class Var:
    default: Any
    parse: Callable[[str], Any]
    help: str


VARIABLES: dict[str, Var] = {
    "RAMLM_CACHE_DIR": Var(None, str, "folder of the JIT-compiled kernels (`numba/`) and converted tokenizers "
                           "(`tokenizers/`); default `~/.cache/ramlm`. NUMBA_CACHE_DIR, when set, takes the "
                           "kernels' place"),
    "RAMLM_FUSED_BLOCKS": Var(True, _flag, "`0` runs decode steps kernel by kernel instead of one compiled call per "
                              "block (to compare, or to profile the kernels one by one)"),
    "RAMLM_FUSED_COMPILE": Var("background", _choice("background", "inline", "cached"),
                               "when a block's fused step is compiled for a model's weight formats the JIT cache "
                               "lacks: `background` (a thread after the first token; kernel by kernel meanwhile), "
                               "`inline` (at the first decode step) or `cached` (never: only cached ones run fused)"),
    "RAMLM_SERIAL_WORK": Var(None, int, "bytes of work under which a kernel runs on the calling thread; default: "
                             "256 KiB on a quiet machine, 2 MiB while other processes' threads are runnable"),
    "RAMLM_SIMD": Var("auto", str, "`avx2` or `generic` caps the int8 kernels' instruction set below the host's "
                      "(those builds are never cached)"),
    "RAMLM_PORTABLE_SIMD": Var(False, _flag, "`1`: the generic LLVM kernels, as RAMLM_SIMD=generic"),
    "RAMLM_SDPA_PREFILL": Var(None, _tristate, "`1` / `0` forces long prefill chunks' attention through torch's "
                              "bf16 SDPA on or off; default: on where the CPU has AMX"),
    "RAMLM_TRITON": Var(True, _flag, "`0`: GPU layers run torch only, no Triton kernels"),
    "RAMLM_API_KEY": Var(None, str, "the key `ramlm serve` requires when --api-key is not given"),
    "RAMLM_MAX_N_SEQUENCES": Var(16384, int, "the largest `n` a request may ask for (vLLM's VLLM_MAX_N_SEQUENCES)"),
}


def get(name: str) -> Any:
    """The variable's value now (parsed), or its default when unset or empty."""
    var = VARIABLES[name]
    text = os.environ.get(name)
    if text is None or text == "":
        return var.default
    try:
        return var.parse(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not valid: {var.help}") from None


def markdown_table() -> str:
    rows = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for name, var in VARIABLES.items():
        default = "unset" if var.default is None else f"`{var.default}`"
        rows.append(f"| `{name}` | {default} | {var.help} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
