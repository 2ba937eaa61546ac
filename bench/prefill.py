"""Prefill speed: tokens/s over a 512-token prompt, one sequence, prefix caching off.

    python -m bench.prefill [--model M] [--prompt-tokens 512] [--repeats 3] [--threads N]
"""
import sys

from bench.speed import main as _speed_main


def main(argv=None) -> None:
    _speed_main(["--only", "prefill", *(sys.argv[1:] if argv is None else argv)])  # argv None: the command line


if __name__ == "__main__":
    main()
