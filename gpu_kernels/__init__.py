"""torch kernels with the contracts of cpu_kernels/, for layers placed on a GPU (or on torch's CPU device).

ops.py (norms, rope, activations), attention.py (paged attention over the same block tables),
dequant.py (GGUF block formats on the device), linear.py (dense / packed / streamed weights),
modules.py (blocks with the CPU blocks' call signature). Importing this package imports nothing: torch
comes with the modules, and nothing here touches torch.cuda at import. There is no Triton kernel yet:
every op is torch, which runs wherever torch does.
"""
