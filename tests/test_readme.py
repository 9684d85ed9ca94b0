"""The README stays consistent: its Python examples compile, its links to its own
sections resolve, and its table of differences from AsyncVectorEnv covers what
``tests/test_gymnasium_upstream.py`` lists as deliberate."""

from __future__ import annotations

import ast
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_python_examples_compile():
    blocks = _python_blocks(_text())
    assert blocks
    for block in blocks:
        # Some snippets continue a coroutine shown earlier: allow top-level await.
        compile(block, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_links_to_own_sections_resolve():
    text = _text()
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(anchor)
    for target in re.findall(r"\]\(#([^)]+)\)", text):
        assert target in anchors, f"README links to #{target}, which is no heading"


def test_deliberate_differences_are_in_the_table():
    from tests.test_gymnasium_upstream import DELIBERATE_DIFFERENCES

    section = _section(_text(), "Differences from AsyncVectorEnv")
    for nodeid in DELIBERATE_DIFFERENCES:
        test_name = nodeid.split("::")[-1].split("[")[0]
        assert f"`{test_name}`" in section, f"{nodeid}: `{test_name}` not in the README table"


def test_every_argument_is_documented():
    """Each keyword of ``aiovec.VecEnv`` and ``aiovec.make`` is named in the README."""
    import inspect

    import aiovec

    text = _text()
    names = set(inspect.signature(aiovec.VecEnv.__init__).parameters)
    names |= set(inspect.signature(aiovec.make).parameters)
    for name in sorted(names - {"self", "env_fns", "env_id", "num_envs", "options"}):
        assert re.search(rf"`{name}\b", text), f"`{name}` is not in the README"


def test_asyncvectorenv_arguments_are_accepted_or_in_the_table():
    """An ``AsyncVectorEnv`` argument that ``aiovec.VecEnv`` lacks is in the table, and
    one the section says is not an argument is indeed none."""
    import inspect

    import gymnasium

    import aiovec

    section = _section(_text(), "Differences from AsyncVectorEnv")
    ours = set(inspect.signature(aiovec.VecEnv.__init__).parameters)
    theirs = set(inspect.signature(gymnasium.vector.AsyncVectorEnv.__init__).parameters)
    for name in sorted(theirs - ours):
        assert f"| `{name}=` |" in section, f"`{name}=` (not accepted) is not in the table"
    refused = re.findall(r"^\| `(\w+)=` \|[^|]*\| not an argument", section, flags=re.M)
    refused += re.findall(r"`(\w+)=` is not an argument", section)
    for name in refused:  # none today: every AsyncVectorEnv argument is accepted
        assert name not in ours, f"the README says `{name}=` is not an argument, but it is"
