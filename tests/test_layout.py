"""The folder layout shows the architecture, and imports keep to it: the transport
imports nothing of aiovec but its errors; the worker side imports the transport and a
few leaf modules, never the agent side (VecEnv, the scheduler, the backends)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aiovec"

#: What each layer may import from aiovec (prefixes of module names).
ALLOWED = {
    "_transport": (
        "aiovec._transport",
        "aiovec.errors",
        "aiovec._interrupts",  # deferring Ctrl-C over a section: a leaf
    ),
    "_worker": (
        "aiovec._worker",
        "aiovec._transport",
        "aiovec.errors",
        "aiovec.async_env",  # the AsyncEnv base class users subclass: a leaf
        "aiovec._loop",  # which event loop to run: a leaf
        "aiovec._interrupts",
    ),
}


def aiovec_imports(path: Path) -> set[str]:
    """Every aiovec module ``path`` imports, at the top or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("aiovec"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("aiovec"):
            if node.module == "aiovec":  # from aiovec import x: the module aiovec.x
                found.update(f"aiovec.{alias.name}" for alias in node.names)
            else:
                found.add(node.module)
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_what_lies_below_it(layer):
    modules = sorted((PACKAGE / layer).glob("*.py"))
    assert modules, f"aiovec/{layer} is empty"
    for module in modules:
        for imported in aiovec_imports(module):
            assert imported.startswith(ALLOWED[layer]), (
                f"aiovec/{layer}/{module.name} imports {imported}, which the {layer} layer "
                f"must not (allowed: {', '.join(ALLOWED[layer])})"
            )


def test_the_leaves_the_worker_side_uses_stay_leaves():
    for leaf in ("errors.py", "async_env.py", "_loop.py", "_interrupts.py"):
        for imported in aiovec_imports(PACKAGE / leaf):
            assert imported == "aiovec.errors", f"aiovec/{leaf} imports {imported}"
