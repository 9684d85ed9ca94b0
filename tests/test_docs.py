"""The documentation site (``docs/``, ``mkdocs.yml``) stays runnable and builds cleanly.

- Every fenced ```python block in ``docs/**/*.md`` compiles, and runs: the blocks of one
  page run in order in one namespace shared by that page only (so a page may define an
  env class in one block and use it in the next), with the working directory in a
  temporary folder. A block whose fence says ``title="not run: <reason>"`` (a Ray
  cluster, a library aiovec does not depend on, a long training) is compiled but not
  run. Each page must leave no worker process, shared memory segment, thread or
  descriptor behind (the ``no_leaks`` fixture), so examples close their envs.
- ``mkdocs build --strict`` succeeds (every warning is an error: broken links and
  anchors, docstrings the API reference cannot parse); skipped when mkdocs is not
  installed (``pip install -e ".[docs]"``).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOT_RUN = 'title="not run:'

# A fence opening (any indentation, e.g. inside a list item), its info string, the body,
# and the closing fence at the same indentation.
_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```python(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    flags=re.M | re.S,
)


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _blocks(page: Path) -> list[tuple[int, str, str]]:
    """``(line number, info string, code)`` of each ```python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        body = textwrap.dedent(match.group("body"))
        found.append((line, match.group("info").strip(), body))
    return found


def _page_id(page: Path) -> str:
    return page.relative_to(DOCS).as_posix()


PAGES_WITH_CODE = [page for page in _pages() if _blocks(page)]


def test_the_docs_have_code_to_run():
    assert len(PAGES_WITH_CODE) >= 5, "the fence pattern no longer finds the docs' examples"
    skipped = [
        (_page_id(page), line)
        for page in PAGES_WITH_CODE
        for line, info, _ in _blocks(page)
        if NOT_RUN in info
    ]
    assert len(skipped) <= 6, f"keep blocks that are not run few: {skipped}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=_page_id)
def test_code_blocks_run(page, tmp_path, monkeypatch, no_leaks):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    for line, info, code in _blocks(page):
        where = f"{_page_id(page)}:{line}"
        compiled = compile(code, where, "exec", flags=ast.PyCF_ONLY_AST)
        if NOT_RUN in info:
            continue
        try:
            exec(compile(compiled, where, "exec"), namespace)
        except BaseException as error:
            raise AssertionError(f"the code block at {where} failed: {error!r}") from error


@pytest.mark.timeout(120)
def test_mkdocs_build_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip('mkdocs is not installed (pip install -e ".[docs]")')
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    assert (tmp_path / "site" / "index.html").exists()
