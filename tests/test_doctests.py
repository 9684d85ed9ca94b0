"""The examples in docstrings run, and show what they print."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["aiovec._loop", "aiovec.vector_env", "aiovec.replay", "aiovec.bookkeeping"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples to run"
    assert result.failed == 0
