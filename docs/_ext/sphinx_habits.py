"""A griffe extension for the API reference. aiovec's docstrings are Google style, with
two habits from Sphinx that Markdown does not know:

- cross-references as roles (``:class:`VecEnv```, ``:meth:`~aiovec.VecEnv.recv```),
  which would show verbatim: each becomes a plain code span (``VecEnv``, ``recv``), and
  a reStructuredText ``::`` that introduces an indented code block becomes ``:``;
- attributes documented by ``#:`` comments on the lines above them (the fields of
  ``aiovec.Stats``, ``VecEnv.envs_per_block``), which griffe does not read: those
  comments become the attributes' docstrings.

Only the rendered text changes; the code is left alone.

Loaded by mkdocstrings through ``extensions:`` in ``mkdocs.yml``; excluded from the site
by ``exclude_docs``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|obj|mod|data|exc|const):`~?([^`]+)`")
_LITERAL_INTRO = re.compile(r"(\S)::$", flags=re.M)


def _shorten(match: re.Match[str]) -> str:
    target = match.group(1)
    if match.group(0).split("`", 1)[1].startswith("~"):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def _comment_above(obj: griffe.Object) -> str:
    """The ``#:`` comment lines right above ``obj``'s first line, without the marks."""
    if not obj.lineno or obj.filepath is None:
        return ""
    try:
        lines = obj.lines_collection[obj.filepath]
    except KeyError:
        return ""
    found: list[str] = []
    index = obj.lineno - 2
    while index >= 0 and lines[index].strip().startswith("#:"):
        found.insert(0, lines[index].strip()[2:].strip())
        index -= 1
    return " ".join(found)


class SphinxHabits(griffe.Extension):
    """Rewrites Sphinx roles in every docstring griffe loads, and turns ``#:`` comments
    above attributes into their docstrings."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None and obj.is_attribute:
            comment = _comment_above(obj)
            if comment:
                agent = kwargs.get("agent")
                obj.docstring = griffe.Docstring(
                    comment,
                    parent=obj,
                    parser=getattr(agent, "docstring_parser", None),
                    parser_options=getattr(agent, "docstring_options", None),
                )
        docstring = obj.docstring
        if docstring is not None:
            text = _ROLE.sub(_shorten, docstring.value)
            docstring.value = _LITERAL_INTRO.sub(r"\1:", text)
