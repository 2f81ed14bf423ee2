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
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
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


PLACEMENTS = ("megatron", "coarse", "pybubble")
PP2 = (("--ranks", "2", "--schedule", "1f1b"), PLACEMENTS, "cpu", True)
"""The configuration of pp2_reports (as a key of trainer_reports: arguments, modes, device, profiled)."""
_TRAINER_RUNS = pytest.StashKey[list]()


def _run_key(args, modes, device="cpu", profile=False) -> tuple:
    return tuple(map(str, args)), tuple(modes), device, profile


RANK_FIXTURES = {"trainer_reports", "pp2_reports", "trainer_cli", "two_ranks", "every", "dp2_pp2_reports"}
"""Fixtures that start torch ranks: a test that uses one is marked ``distributed``."""


def pytest_collection_modifyitems(session, config, items):
    """Marks ``distributed`` every test that starts torch ranks through a fixture (:data:`RANK_FIXTURES`;
    modules and tests that start them themselves carry the mark), and gathers the configurations of the test trainer (pybubble.testing.mllm) the selected tests train:
    their modules' ``TRAINER_RUNS`` (arguments and modes, and optionally device and profiled, as they
    call trainer_reports with) and pp2_reports' run, so that trainer_reports trains those of one world
    size in one launch."""
    runs: dict = {}
    for item in items:
        if RANK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.distributed)
        for run in getattr(getattr(item, "module", None), "TRAINER_RUNS", ()):
            runs.setdefault(_run_key(*run), None)
        if "pp2_reports" in getattr(item, "fixturenames", ()):
            runs.setdefault(PP2, None)
    config.stash[_TRAINER_RUNS] = list(runs)


@pytest.fixture(scope="session")
def trainer_reports(request, trainer_module, tmp_path_factory):
    """The function trainer_reports(*args, modes, device, timeout, profile): the test trainer
    (pybubble.testing.mllm) trained 3 steps at size tiny with `args` in each of `modes` (the same ranks
    train the modes in turn, each from the seed) and the single-process reference; returns each
    mode's report by mode (each test its own copy).

    Each configuration is trained once per session, and those the selected tests declare
    (``TRAINER_RUNS``, see pytest_collection_modifyitems) in one launch per world size: the first
    call for one of them trains all those of its world size in turn on the same ranks
    (``python -m pybubble.testing.mllm --runs``), each with its own mesh, models and runtime, and asserts that the
    launch succeeded (a failed launch fails every test that reads one of its configurations, and
    is not run again). `timeout`: seconds per mode trained. `profile`: each mode's last step is
    profiled (``--profile``) and its report names the folder of its traces, ``profile_dir``."""
    declared = request.config.stash.get(_TRAINER_RUNS, [])
    done: dict = {}
    failed: dict = {}

    def world(key) -> int:
        return trainer_module.parse_args(list(key[0])).ranks

    def train(batch: list, timeout: float) -> None:
        folder = tmp_path_factory.mktemp("trainer")
        argvs = []
        for i, (args, modes, device, profile) in enumerate(batch):
            more = ["--profile", str(folder / f"{i}.profile")] if profile else []
            argvs.append(["--steps", "3", "--size", "tiny", "--timeout", "30", "--reference", "--report",
                          str(folder / f"{i}.json"), *args, "--mode", ",".join(modes), "--device", device, *more])
        (folder / "runs.json").write_text(json.dumps(argvs))
        # Outside the source tree, so that the installed package (with its extension) is imported.
        r = subprocess.run([sys.executable, "-m", "pybubble.testing.mllm", "--runs", str(folder / "runs.json")],
                           capture_output=True,
                           text=True, timeout=timeout * sum(len(k[1]) for k in batch), cwd=tempfile.gettempdir())
        if r.returncode != 0:
            failed.update((key, f"one launch of {len(batch)} configurations failed:\n{r.stderr[-3000:]}")
                          for key in batch)
            return
        for i, key in enumerate(batch):
            args, modes, device, profile = key
            report = json.loads((folder / f"{i}.json").read_text())
            done[key] = report if len(modes) > 1 else {modes[0]: report}
            for mode in modes if profile else ():
                done[key][mode]["profile_dir"] = str(folder / f"{i}.profile" / (mode if len(modes) > 1 else ""))

    def run(*args, modes=PLACEMENTS, device="cpu", timeout=180, profile=False) -> dict[str, dict]:
        key = _run_key(args, modes, device, profile)
        if key not in done and key not in failed:
            batch = [key] + ([k for k in declared if k != key and k not in done and k not in failed
                              and k[2] == device and world(k) == world(key)] if key in declared else [])
            train(batch, timeout)
        if key in failed:
            pytest.fail(failed[key])
        return copy.deepcopy(done[key])
    return run


@pytest.fixture(scope="session")
def pp2_reports(trainer_reports) -> dict[str, dict]:
    """The three modes' reports on 2 ranks (pp 2, 1F1B), their last steps profiled: one run,
    shared by the tests that compare with its parameters or read its traces."""
    args, modes, device, profile = PP2
    return trainer_reports(*args, modes=modes, device=device, profile=profile)


@pytest.fixture(scope="session")
def trainer_module():
    """The test trainer, pybubble.testing.mllm (skips the test without torch)."""
    pytest.importorskip("torch")
    import pybubble.testing.mllm as trainer

    return trainer


@pytest.fixture(scope="session")
def bench_script():
    """The function bench_script(name): ``bench/NAME.py`` imported as a module (once a session)."""
    loaded = {}

    def load(name: str):
        if name not in loaded:
            spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / "bench"
                                                          / f"{name}.py")
            loaded[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(loaded[name])
        return loaded[name]
    return load


@pytest.fixture(scope="session")
def trainer_cli():
    """The function trainer_cli(*args, timeout): ``python -m pybubble.testing.mllm ARGS`` as a command,
    run outside the source tree (so that the installed package, with its extension, is imported);
    returns the completed process."""
    def run(*args, timeout=180) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pybubble.testing.mllm", *map(str, args)], capture_output=True,
                              text=True, timeout=timeout, cwd=tempfile.gettempdir())
    return run


@pytest.fixture
def trainer_main(trainer_module, capsys):
    """The function trainer_main(*args): the test trainer's ``main(args)`` in this process (the status
    its command exits with; for arguments it refuses before any rank starts); returns the status and
    what it wrote on stderr."""
    def run(*args) -> tuple[int, str]:
        capsys.readouterr()
        code = trainer_module.main(list(map(str, args)))
        return code, capsys.readouterr().err
    return run


@pytest.fixture
def world_of_one(tmp_path):
    """A gloo process group of one rank in this process (a pipeline stage, a shared profile need one)."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
