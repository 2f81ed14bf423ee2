"""Importing pybubble from a source checkout's root, where the pybubble/ folder has no compiled
core: one message says what happened and the two ways out, instead of Python's "partially
initialized module" error; the README documents the same editable install."""

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

import pybubble
from pybubble._native import EDITABLE_INSTALL

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def checkout(tmp_path):
    """A folder laid out like a checkout's root: the package's Python sources, no compiled core."""
    shutil.copytree(ROOT / "pybubble", tmp_path / "pybubble",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    return tmp_path


@pytest.mark.parametrize("args", [["-c", "import pybubble"], ["-m", "pybubble", "--version"],
                                  ["-m", "pybubble.config.presets"]])
def test_importing_from_a_checkout_without_the_core_says_what_to_do(checkout, args):
    # Without site's .pth files (-S; the installed packages on PYTHONPATH instead): an editable
    # install's import hook, which such a file sets up, would import the built tree over the folder's.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(site.getsitepackages())}
    r = subprocess.run([sys.executable, "-S", *args], cwd=checkout, capture_output=True, text=True, env=env)
    assert r.returncode == 1
    assert "partially initialized" not in r.stderr and "circular import" not in r.stderr
    message = r.stderr[r.stderr.index("ImportError: "):]
    assert f"pybubble._core) is not in {checkout / 'pybubble'}" in message
    assert "run from any other folder" in message
    assert EDITABLE_INSTALL in message
    assert "pip install scikit-build-core pybind11 cmake ninja" in message


def test_the_installed_package_imports_from_another_folder(tmp_path):
    r = subprocess.run([sys.executable, "-c", "import pybubble; print(pybubble.__file__)"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == Path(pybubble.__file__)


def test_the_readme_documents_the_editable_install():
    readme = (ROOT / "README.md").read_text()
    assert EDITABLE_INSTALL in readme
    assert "-Ceditable.rebuild=true" in EDITABLE_INSTALL and "--no-build-isolation" in EDITABLE_INSTALL
