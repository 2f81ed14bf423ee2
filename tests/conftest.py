"""Test session set-up and shared fixtures.

Hypothesis runs under one of two profiles, chosen by the environment variable ``PYBUBBLE_FUZZ``:

- ``ci`` (the default): derandomized (examples drawn from a fixed seed per test), no example
  database and no time limits, so the same commit gives the same result on every machine;
- ``long``: fresh randomness on every run and :data:`LONG_SCALE` times each test's examples, for a
  thorough search on demand: ``PYBUBBLE_FUZZ=long pytest -m fuzz``. A failure it finds becomes an
  explicit ``@example`` (or a plain regression test) in the test that found it.

Every hypothesis test is marked ``fuzz`` here, at collection, so ``pytest -m fuzz`` selects them all
and no property test can be left out of the long run.

The tests import the installed pybubble (with its compiled extension). ``python -m pytest`` puts the
working directory first on sys.path, where the bare source folder pybubble/ (no extension) would
shadow the installed package; drop it before any test imports pybubble. ``pytest`` alone (as in
CI) never adds it, and then this changes nothing.
"""

import copy
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

_ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]

LONG_SCALE = 25
"""How many times more examples each hypothesis test runs under the ``long`` profile."""

# No deadline and no speed health check in either: a verdict must not depend on the machine's load.
_COMMON = dict(database=None, print_blob=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", derandomize=True, **_COMMON)
settings.register_profile("long", derandomize=False, **_COMMON)
FUZZ_PROFILE = os.environ.get("PYBUBBLE_FUZZ", "ci")
if FUZZ_PROFILE not in ("ci", "long"):
    raise pytest.UsageError(f"PYBUBBLE_FUZZ: {FUZZ_PROFILE!r} is not ci or long")
settings.load_profile(FUZZ_PROFILE)


_SCALED: set = set()


def pytest_itemcollected(item):
    """Marks every hypothesis test ``fuzz``; under the ``long`` profile, multiplies its examples by
    :data:`LONG_SCALE`. A test's own ``@settings(max_examples=...)`` overrides a profile's, so the
    scaling is done here, on the settings hypothesis keeps on the test, in this one place."""
    test = getattr(item, "obj", None)
    if not hasattr(test, "hypothesis"):  # @given sets .hypothesis (its inner_test) on every test
        return
    item.add_marker(pytest.mark.fuzz)
    if FUZZ_PROFILE == "long" and test not in _SCALED:  # once per function, however parametrized
        _SCALED.add(test)
        own = test._hypothesis_internal_use_settings  # the settings @given and @settings leave on the test
        scaled = settings(own, max_examples=own.max_examples * LONG_SCALE)
        test._hypothesis_internal_use_settings = scaled


def _replaced(doc, path, value):
    """A deep copy of `doc` with the entry at `path` (a sequence of keys and indices) set to
    `value`, or removed when `value` is KeyError."""
    doc = copy.deepcopy(doc)
    *head, last = path
    target = doc
    for k in head:
        target = target[k]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return doc


@pytest.fixture
def replaced():
    """The function replaced(doc, path, value): see _replaced."""
    return _replaced


@pytest.fixture
def two_ranks(tmp_path):
    """The function two_ranks(worker, timeout): runs the Python source `worker` as ranks 0 and 1
    (arguments: rank, a free loopback port), asserts both exit 0, and returns their (stdout, stderr)."""
    def run(worker: str, timeout: float) -> list[tuple[str, str]]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [subprocess.Popen([sys.executable, "-c", worker, str(r), str(port)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=tmp_path) for r in (0, 1)]
        outs = [p.communicate(timeout=timeout) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        return outs
    return run
