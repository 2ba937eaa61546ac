"""torch kernels with the contracts of cpu_kernels/, for layers placed on a GPU (or on torch's CPU device).

ops.py (norms, rope, activations), attention.py (paged attention over the same block tables),
dequant.py (GGUF block formats on the device), linear.py (dense / packed / streamed weights),
modules.py (blocks with the CPU blocks' call signature). Triton kernels: triton_qmatmul.py (packed GGUF
matmul, dequantized in registers by triton_dequant.py) and triton_attention.py (paged decode attention);
triton_dispatch.py decides per call which runs, and torch is the fallback everywhere. Importing this
package imports nothing: torch comes with the modules, triton with the first Triton launch, and nothing
here touches torch.cuda at import.
"""
