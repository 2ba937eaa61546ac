"""The packages' layering: the kernel packages import nothing from engine/ (ast, not grep: comments may name it)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize("pkg", ["cpu_kernels", "gpu_kernels"])
def test_kernel_packages_import_nothing_from_engine(pkg):
    bad = {str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m == "engine" or m.startswith("engine."))
           for p in (ROOT / pkg).rglob("*.py")}
    assert not {k: v for k, v in bad.items() if v}
