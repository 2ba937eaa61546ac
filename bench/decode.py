"""Decode speed: tokens/s generating 128 tokens after a short prompt, one sequence.

    python -m bench.decode [--model M] [--gen-tokens 128] [--repeats 3] [--threads N]
"""
import sys

from bench.speed import main as _speed_main


def main(argv=None) -> None:
    _speed_main(["--only", "decode", *(sys.argv[1:] if argv is None else argv)])  # argv None: the command line


if __name__ == "__main__":
    main()
