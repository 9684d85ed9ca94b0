"""Fetch a project's own test files from its sdist on PyPI, at test time.

Nothing of an upstream test-suite is kept in this repository: :func:`sdist_tests`
downloads the sdist of the installed version with pip (once), extracts its ``tests/``
folder and ``pyproject.toml`` into a cache outside the repository (:func:`cache_dir`),
and returns that folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from importlib import metadata
from pathlib import Path

import pytest

#: What is extracted from the sdist (paths below its top folder).
EXTRACTED = ("tests/", "pyproject.toml", "setup.cfg")


def cache_dir() -> Path:
    """``$AIOVEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/aiovec`` (``~/.cache/aiovec``), as
    ``tests/test_gymnasium_upstream.py`` uses."""
    if os.environ.get("AIOVEC_CACHE_DIR"):
        return Path(os.environ["AIOVEC_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aiovec"


def index_url() -> str:
    return os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"


def index_reachable(project: str) -> str | None:
    """``None`` if the package index answers for ``project``, else why not."""
    url = f"{index_url().rstrip('/')}/{project}/"
    try:
        with urllib.request.urlopen(url, timeout=15):
            return None
    except urllib.error.HTTPError as error:  # it answered: reachable (pip's error stands)
        return None if error.code < 500 else f"{url}: HTTP {error.code}"
    except (OSError, ValueError) as error:
        return f"{url}: {error}"


def sdist_tests(project: str, version: str | None = None) -> Path:
    """The root of ``project``'s extracted sdist (``tests/`` and ``pyproject.toml``), for
    ``version`` (default: the installed one). Downloads it on the first call.

    Skips the calling test only if the package index cannot be reached; any other
    failure to download or extract fails it.
    """
    version = version or metadata.version(project)
    root = cache_dir() / f"{project}-{version}-sdist-tests"
    if (root / "tests").is_dir():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=f".{project}-") as scratch:
        download = Path(scratch) / "download"
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            project,
            "--disable-pip-version-check",
            "-d",
            str(download),
            f"{project}=={version}",
        ]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired as error:
            result = subprocess.CompletedProcess(command, -1, "", f"timed out: {error}")
        archives = sorted(download.glob("*.tar.gz")) if result.returncode == 0 else []
        if not archives:
            unreachable = index_reachable(project)
            if unreachable:
                pytest.skip(f"PyPI is unreachable, cannot fetch {project}'s tests: {unreachable}")
            pytest.fail(
                f"pip could not download the sdist of {project}=={version}:\n"
                f"{' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        extracted = Path(scratch) / "extracted"
        with tarfile.open(archives[0]) as archive:
            members = []
            for member in archive.getmembers():
                parts = member.name.split("/", 1)
                inside = parts[1] if len(parts) == 2 else ""
                if any(
                    inside == e or (e.endswith("/") and inside.startswith(e)) for e in EXTRACTED
                ):
                    member.name = inside
                    members.append(member)
            if hasattr(tarfile, "data_filter"):
                archive.extractall(extracted, members=members, filter="data")
            else:  # Python < 3.10.12 / 3.11.4
                archive.extractall(extracted, members=members)  # noqa: S202
        if not (extracted / "tests").is_dir():
            pytest.fail(f"the sdist {archives[0].name} has no tests/ folder")
        try:
            extracted.rename(root)  # atomic: a concurrent run may have won the race
        except OSError:
            if not (root / "tests").is_dir():
                raise
            shutil.rmtree(extracted, ignore_errors=True)
    return root
