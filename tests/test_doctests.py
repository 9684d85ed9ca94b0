"""The examples in docstrings run, and show what they print."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "aiovec._loop",
    "aiovec._make",
    "aiovec.async_env",
    "aiovec.bookkeeping",
    "aiovec.integrations.sb3",
    "aiovec.replay",
    "aiovec.vector_env",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples to run"
    assert result.failed == 0


def test_every_module_with_examples_is_run():
    """A docstring example added anywhere in aiovec runs here (no silent skips)."""
    from pathlib import Path

    import aiovec

    root = Path(aiovec.__file__).parent
    with_examples = {
        ".".join(("aiovec", *path.relative_to(root).with_suffix("").parts))
        for path in root.rglob("*.py")
        if ">>>" in path.read_text()
    }
    assert with_examples <= set(MODULES), sorted(with_examples - set(MODULES))
