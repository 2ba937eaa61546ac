"""Quantized weights: GGUF formats, their repacking, numpy-checked kernels and QuantLinear.

configure_threads() should run before the first kernel; warmup() compiles every kernel once.
"""
from .linear import QuantLinear
from .quantize import quantize
from .registry import FORMATS, QuantFormat, get_format
from .threads import configure_threads
from .warmup import warmup

__all__ = ["QuantLinear", "quantize", "FORMATS", "QuantFormat", "get_format", "configure_threads", "warmup"]
