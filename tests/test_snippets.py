"""Every snippet of README.md and docs/*.md runs as written.

Each fenced ``python`` block runs as a script, each ``bash`` block with ``bash -e``, in a scratch
folder holding a copy of ``examples/`` and ``bench/`` (the paths the docs use), with the installed
``pybubble`` on PATH. A block that installs packages, needs CUDA or runs longer than 30 s is marked
in the doc by the line ``<!-- snippet: skip (reason) -->`` just before it, and is skipped with that
reason; an unmarked block must finish within 30 s. The README's pictures are the ones
``docs/figures.py`` draws, with the commands the README shows.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
SKIP = re.compile(r"^<!-- snippet: skip \((.+)\) -->$")
RUN = {"python", "bash", "sh"}
HANG_S = 600.0
"""A snippet still running after this long is hung (a guard, not a speed check: speed lives in bench/)."""


def snippets() -> list:
    """One pytest param per python or bash block: (language, code), skipped where the doc says."""
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            language = m.group(1)
            if language not in RUN:
                continue
            line = text.count("\n", 0, m.start()) + 1
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            skip = SKIP.match(before)
            marks = [pytest.mark.skip(reason=skip.group(1))] if skip else []
            out.append(pytest.param(language, m.group(2), id=f"{path.name}:{line}", marks=marks))
    return out


SNIPPETS = snippets()


@pytest.fixture
def scratch(tmp_path):
    """A folder with the paths the docs name, and the environment a reader's shell would have."""
    for folder in ("examples", "bench"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("results", "__pycache__"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLUMNS": "100", "MPLBACKEND": "Agg"}
    return tmp_path, env


def test_every_doc_has_been_read():
    assert len(DOCS) >= 10 and len(SNIPPETS) >= 15


@pytest.mark.parametrize("language,code", SNIPPETS)
def test_snippet_runs_as_written(scratch, language, code):
    folder, env = scratch
    if language == "python":
        (folder / "snippet.py").write_text(code)
        args = [sys.executable, "snippet.py"]
    else:
        args = ["bash", "-e", "-o", "pipefail", "-c", code]
    r = subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, f"exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"


def test_the_readme_shows_each_picture_and_the_command_that_draws_it():
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "docs" / "figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    readme = ROOT / "README.md"
    text = readme.read_text()
    flat = " ".join(text.replace("\\\n", " ").split())
    for image, command in figures.FIGURES.items():
        assert f"]({figures.IMAGES}/{image})" in text, image
        assert (ROOT / figures.IMAGES / image).stat().st_size < 300_000, f"{image}: keep the committed pictures small"
        assert " ".join(command.split()) in flat, command
    assert "<!-- quickstart-output -->\n```text\n$ " + figures.QUICKSTART in text
    assert "python docs/figures.py" in text
