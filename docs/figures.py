"""Regenerates the README's pictures (docs/images/*.png) and the quickstart's output quoted in the
README, by running the very commands the README shows with the installed ``pybubble``.

Run it from the checkout's root after installing the checkout (``pip install .``), whenever the cost
model, the planner or the charts change:

    python docs/figures.py

It rewrites docs/images/*.png and the README's block between ``<!-- quickstart-output -->`` and
``<!-- /quickstart-output -->``; nothing else. ``tests/test_snippets.py`` checks that the README
shows every command below.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from pybubble.cli.terminal import progress_bar

ROOT = Path(__file__).resolve().parent.parent
IMAGES = "docs/images"
COLUMNS = 100
"""The terminal width the README's quoted output is printed at."""

QUICKSTART = "pybubble plan examples/quickstart.yaml --plot plan.png"
"""The README's main command; its output is quoted in the README."""
FIGURES = {
    "plan.png": QUICKSTART,
    "plan_3072_end.png":
        "pybubble plan examples/optimus/strong_3072.yaml --plot plan_3072_end.png --window 2750:3170",
    "bubbles.png": "pybubble bubbles --schedule interleaved_1f1b --stages 8 --microbatches 32 --chunks 12 "
                   "--tp-count 2 --tp-duration 60 --dp-allgather 3000 --dp-reducescatter 8000 --plot bubbles.png",
    "dynamic.png": "pybubble dynamic examples/quickstart.yaml --steps 50 --plot dynamic.png",
}
"""Each picture and the README command that draws it (run in the checkout's root, the picture moved
to docs/images/)."""
BLOCK = re.compile(r"(<!-- quickstart-output -->\n```text\n).*?(```\n<!-- /quickstart-output -->)", re.S)


def pybubble() -> str:
    """The installed ``pybubble`` command (beside this Python, else on PATH)."""
    here = Path(sys.executable).parent / "pybubble"
    found = str(here) if here.exists() else shutil.which("pybubble")
    if not found:
        raise SystemExit("error: the pybubble command is not installed (pip install .)")
    return found


def run(command: str) -> str:
    """Runs a README command in the checkout's root; returns its stdout."""
    args = command.split()
    env = {**os.environ, "COLUMNS": str(COLUMNS), "MPLBACKEND": "Agg"}
    r = subprocess.run([pybubble(), *args[1:]], cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"error: `{command}` failed:\n{r.stderr}")
    return r.stdout


def main() -> int:
    """Draws every picture, then quotes the quickstart's output in the README."""
    (ROOT / IMAGES).mkdir(parents=True, exist_ok=True)
    quoted = ""
    with progress_bar("drawing the README's pictures", total=len(FIGURES)) as update:
        for done, (image, command) in enumerate(FIGURES.items()):
            out = run(command)
            os.replace(ROOT / image, ROOT / IMAGES / image)
            if command == QUICKSTART:
                quoted = "\n".join(line.rstrip() for line in out.splitlines() if not line.startswith("wrote "))
            update(done + 1)
    readme = ROOT / "README.md"
    text, n = BLOCK.subn(lambda m: f"{m.group(1)}$ {QUICKSTART}\n{quoted}\n{m.group(2)}", readme.read_text())
    if n != 1:
        raise SystemExit("error: README.md has no <!-- quickstart-output --> block")
    readme.write_text(text)
    for image in FIGURES:
        print(f"wrote {IMAGES}/{image} ({(ROOT / IMAGES / image).stat().st_size / 1e3:,.0f} kB)")
    print("wrote the quickstart's output into README.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
