"""Hostile input to the C++ core (issue 17): every entry point checks what it is given and answers
a ValueError naming the field, never a crash, a hang or a wrapped value."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import pybubble
from pybubble import _core
from pybubble.llm import tables
from pybubble.llm.timeline import Windows
from pybubble.problem.arrays import TASK_FIELDS, ProblemArrays, Tasks
from pybubble.problem.generated import random_problem, synthetic
from pybubble.schedule import balance


def small_arrays() -> dict:
    """A small problem's arrays by their flat names (compute_offset, ..., lane, ...), to spoil one."""
    a = random_problem(1, lanes=2).arrays()
    return {"horizon": a.horizon, "forward_needed": a.forward_needed, "grad_ready": a.grad_ready,
            **{f"compute_{k}": getattr(a.compute_free, k) for k in ("offset", "start", "end")},
            **{f"link_{k}": getattr(a.link_free, k) for k in ("offset", "start", "end")},
            **{k: getattr(a.tasks, k) for k in TASK_FIELDS}}


def from_flat(a: dict) -> pybubble.Problem:
    """The problem of flat arrays, handed to the core as they are (no conversion on the way)."""
    windows = {w: Windows(offset=a[f"{w}_offset"], start=a[f"{w}_start"], end=a[f"{w}_end"]) for w in ("compute", "link")}
    return pybubble.Problem.from_arrays(ProblemArrays(
        horizon=a["horizon"], compute_free=windows["compute"], link_free=windows["link"],
        forward_needed=a["forward_needed"], grad_ready=a["grad_ready"], tasks=Tasks(**{k: a[k] for k in TASK_FIELDS})))


# -- the three segfaults found by hand ------------------------------------------------------------

def test_window_offsets_rising_then_falling_are_refused():
    a = small_arrays()
    count = len(a["compute_start"])
    a["compute_offset"] = np.array([0, count + 10**8, count], np.int64)
    # Checked against the window count before any window is read (the walk used to run past them).
    with pytest.raises(ValueError, match=r"compute_free\.offset\[1\]: %d is not in \[0, %d\]" % (count + 10**8, count)):
        from_flat(a)


@pytest.mark.parametrize("costs, m", [(np.zeros((0, 2)), 1), (np.zeros((0, 2)), 0), (np.ones((3, 2)), 0),
                                      (np.ones((3, 2)), -4)])
def test_max_microbatch_cost_on_no_samples_or_a_bad_count(costs, m):
    with pytest.raises(ValueError, match=r"costs|num_microbatches"):
        balance.max_microbatch_cost(costs, np.zeros(len(costs), np.int64), m)


def test_scheduler_run_with_fewer_durations_than_tasks():
    p = random_problem(2)
    with pytest.raises(ValueError, match=r"durations: 1 values? for %d tasks" % p.num_tasks):
        _core.Scheduler(p.core).run("greedy", np.ones(1))


# -- the bindings refuse wrong dtypes and lossy conversions --------------------------------------

@pytest.mark.parametrize("key, value, message", [
    ("lane", lambda a: a + 0.9, r"lane: dtype float64 is not an integer type"),
    ("lane", lambda a: a.astype(bool), r"lane: dtype bool is not a number type"),
    ("lane", lambda a: a.astype(object), r"lane: dtype object is not a number type"),
    ("lane", lambda a: a.astype(np.uint64) + np.uint64(2**63), r"lane\[0\]: \d+ is not in \["),
    ("lane", lambda a: a.reshape(-1, 1), r"lane: a 2-dimensional array, expected 1-dimensional"),
    ("lane", lambda a: ["0"] * len(a), r"lane: dtype <U1 is not a number type"),
    ("lane", lambda a: 0, r"lane: a 0-dimensional array, expected 1-dimensional"),
    ("duration", lambda a: a.astype(complex), r"duration: dtype complex128 is not a number type"),
    ("duration", lambda a: a.astype(np.int64) + 2**60 + 1, r"duration\[0\]: \d+ has no exact float64 value"),
    ("duration", lambda a: a.astype(np.longdouble), r"duration: dtype float128 is wider than float64"),
    ("horizon", lambda a: True, r"horizon: True is not a number"),
    ("horizon", lambda a: "1" * 1000, r"horizon: '1{40}\.\.\.' is not a number$"),
    ("horizon", lambda a: 10**400, r"horizon: an integer of 1329 bits \(dtype object\) is not a number"),
    # issue 23: Python integers past 64 bits in a list, as a document's numbers arrive
    ("lane", lambda a: [2**63] + a.tolist()[1:], r"lane: dtype float64 is not an integer type"),
    ("after", lambda a: [-(10**400)] + a.tolist()[1:], r"after: dtype object is not a number type"),
    ("duration", lambda a: [2**1100] + a.tolist()[1:], r"duration: dtype object is not a number type"),
])
def test_problem_arrays_refuse_lossy_dtypes(key, value, message):
    a = small_arrays()
    a[key] = value(np.asarray(a[key]))
    with pytest.raises(ValueError, match=message):
        from_flat(a)


def test_problem_arrays_accept_lossless_dtypes_in_any_order():
    a = small_arrays()
    ref = pybubble.schedule_problem(from_flat(a))
    a["lane"] = a["lane"].astype(np.uint8)
    a["after"] = np.asarray(a["after"], np.int16)
    a["duration"] = np.asfortranarray(a["duration"].astype(np.int32))[::-1][::-1]
    a["compute_start"] = a["compute_start"].astype(">f8")  # big-endian
    p = from_flat(a)
    assert np.array_equal(pybubble.schedule_problem(p).start, ref.start)


def pipeline_spec(**change):
    offset, stage, kind, mb = tables.flatten(tables.build_table("1f1b", 2, 2, 1))
    spec = dict(ranks=2, chunks=1, microbatches=2, row_offset=offset, stage=stage, kind=kind, microbatch=mb,
                fwd=np.full(2, 2.0), bwd=np.full(2, 4.0), wgrad=np.full(2, 1.0), p2p=0.0, tp_count=0,
                tp_duration=0.0, dp_allgather=0.0, dp_reducescatter=0.0)
    spec.update(change)
    return spec


@pytest.mark.parametrize("change, message", [
    (dict(kind=np.array([256, 1, 0, 1, 0, 1, 0, 1])), r"kind\[0\]: 256 is not in \[0, 255\]"),
    (dict(stage=np.array([0.9] * 8)), r"stage: dtype float64 is not an integer type"),
    (dict(ranks=2.0), r"ranks: 2 is not an integer"),
    (dict(ranks=2**40), r"ranks: 1099511627776 is not in \[-2147483648, 2147483647\]"),
    (dict(tp_count=True), r"tp_count: True is not an integer"),
    (dict(p2p="fast"), r"p2p: 'fast' is not a number"),
    (dict(p2p=None), r"p2p: None is not a number|p2p: a NoneType object is not a number"),
    (dict(fast=1), r"'fast': not an argument of the simulation"),
])
def test_simulate_pipeline_refuses_wrapping(change, message):
    with pytest.raises(ValueError, match=message):
        _core.simulate_pipeline(**pipeline_spec(**change))


def test_scalar_arguments_out_of_range_name_the_argument():
    with pytest.raises(ValueError, match=r"seed: -5 is not in \[0, 18446744073709551615\]"):
        synthetic(seed=-5)
    with pytest.raises(ValueError, match=r"stages: 3000000000 is not in \[-2147483648, 2147483647\]"):
        synthetic(stages=3_000_000_000)
    with pytest.raises(ValueError, match=r"num_microbatches: 2.5 is not an integer"):
        balance.balance_microbatches(np.ones((4, 2)), 2.5)
    with pytest.raises(ValueError, match=r"assignment: dtype float64 is not an integer type"):
        balance.max_microbatch_cost(np.ones((2, 2)), np.array([0.0, 1.0]), 2)
    with pytest.raises(ValueError, match=r"costs: expected an N x 2 array, got 3 columns"):
        balance.lower_bound(np.ones((4, 3)), 2)
    with pytest.raises(ValueError, match=r"problem: 'p' is not a _core.Problem"):
        _core.Scheduler("p")


def test_a_long_policy_is_cut_in_the_message():
    with pytest.raises(ValueError) as e:
        _core.Scheduler(random_problem(0).core).run("x" * 10**6)
    assert len(str(e.value)) < 120


@pytest.mark.parametrize("args, message", [(["--seed", "-5"], "seed: -5 is not in"),
                                           (["--stages", "3000000000"], "stages: 3000000000 is not in")])
def test_cli_generate_out_of_range_is_one_error_line(tmp_path, args, message):
    r = subprocess.run([sys.executable, "-m", "pybubble", "generate", "-o", str(tmp_path / "p.json"), *args],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "p.json").exists()


# -- stated limits --------------------------------------------------------------------------------

def test_limits_are_exported_once():
    limits = _core.LIMITS
    assert {"tasks", "predecessors", "windows", "lanes", "microbatches", "actions", "tp_gaps", "stages", "chunks",
            "samples", "time"} <= limits.keys()
    assert all(isinstance(v, int) and v > 0 for k, v in limits.items() if k != "time")
    assert limits["time"] == 1e12


def test_durations_beyond_the_largest_time_are_refused():
    doc = random_problem(3).to_dict()
    doc["tasks"][0]["duration"] = 1e308
    with pytest.raises(ValueError, match=r"tasks\[0\].duration: 1e\+308 is above the largest time, 1e\+12 us"):
        pybubble.load_problem(doc)
    p = random_problem(3)
    d = p.arrays().tasks.duration.copy()
    d[-1] = 2e12
    with pytest.raises(ValueError, match=r"durations\[%d\]: 2e\+12 is above the largest time" % (len(d) - 1)):
        pybubble.OnlineScheduler(p).reschedule(d)
    with pytest.raises(ValueError, match=r"fwd\[0\]: 1e\+13 is above the largest time"):
        pybubble.simulate_pipeline("1f1b", ranks=2, microbatches=2, fwd=1e13)


def test_arrays_beyond_a_limit_are_refused_before_they_are_copied():
    a = small_arrays()
    n = _core.LIMITS["tasks"] + 1
    a["lane"] = np.broadcast_to(np.int64(0), (n,))  # no memory behind it: refused by its length
    with pytest.raises(ValueError, match=r"tasks.lane: %d entries, more than the limit of %d \(LIMITS\['tasks'\]\)"
                       % (n, n - 1)):
        from_flat(a)
    with pytest.raises(ValueError, match=r"costs: \d+ rows, more than the limit"):
        balance.balance_microbatches(np.broadcast_to(np.ones(2), (_core.LIMITS["samples"] + 1, 2)), 2)
    with pytest.raises(ValueError, match=r"microbatches x encoder_layers x kernels_per_layer: .* more than the limit"):
        synthetic(encoder_layers=100_000_000)
    with pytest.raises(ValueError, match=r"microbatches: 1000000000, more than the limit of 1000000"):
        _core.simulate_pipeline(**pipeline_spec(microbatches=1_000_000_000))


# -- near-linear work that Ctrl-C stops -----------------------------------------------------------

def test_many_stages_simulate_in_linear_time():
    # 1F1B over 100,000 ranks and one microbatch: each backward waits on the next rank's, which a
    # sweep over all ranks per step made quadratic (and the free windows scanned every bubble per
    # rank). The core now takes a fraction of a second; building the table in Python takes longer.
    p = 100_000
    offset, stage, kind, mb = tables.flatten(tables.build_table("1f1b", p, 1, 1))
    spec = pipeline_spec(ranks=p, microbatches=1, row_offset=offset, stage=stage, kind=kind, microbatch=mb,
                         fwd=np.full(p, 2.0), bwd=np.full(p, 4.0), wgrad=np.full(p, 1.0))
    assert _core.simulate_pipeline_seconds(1, **spec) < 2.0
    out = _core.simulate_pipeline(**spec)
    assert out["step_time"] == (p - 1) * 2.0 + 2.0 + 4.0 + (p - 1) * 4.0  # F down the ranks, B back up
    assert len(out["compute_free_offset"]) == p + 1


INTERRUPTED = """
import sys, time
import numpy as np
from pybubble import _core
from pybubble.llm import tables as schedules
p, m = 64, 64
offset, stage, kind, mb = schedules.flatten(schedules.build_table("1f1b", p, m, 1))
spec = dict(ranks=p, chunks=1, microbatches=m, row_offset=offset, stage=stage, kind=kind, microbatch=mb,
            fwd=np.full(p, 2.0), bwd=np.full(p, 4.0), wgrad=np.full(p, 1.0), p2p=0.0, tp_count=8,
            tp_duration=0.01, dp_allgather=0.0, dp_reducescatter=0.0)
print("ready", flush=True)
t = time.perf_counter()
try:
    _core.simulate_pipeline_seconds(10**7, **spec)  # hours of simulation, the GIL released
except KeyboardInterrupt:
    print(f"interrupted after {time.perf_counter() - t:.2f} s", flush=True)
    sys.exit(3)
print("finished", flush=True)
"""


def test_ctrl_c_stops_a_long_simulation(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 3, err
    assert out.startswith("interrupted after")


# -- the validator's tolerance comes from the problem --------------------------------------------

FAR_PROBLEM = {
    "format": "pybubble.problem/1", "horizon": 10.0,
    "lanes": [{"name": "lane0", "compute_free": [[0.0, 10.0]], "link_free": []}],
    "microbatches": [{"forward_needed": 10.0, "grad_ready": 10.0}],
    "tasks": [{"id": i, "lane": 0, "duration": 1.0, "resource": "compute", "phase": "fwd" if i < 4 else "bwd",
               "microbatch": 0, "after": []} for i in range(5)],
}
# Four tasks on top of each other at 0 and one at 1e300, with a matching step time: a schedule that
# used to widen the validator's tolerance to 1e288 us and pass.
FAR_SCHEDULE = {"format": "pybubble.schedule/1", "step_time": 1e300, "shift_front": 0.0, "shift_back": 1e300,
                "start": [0.0, 0.0, 0.0, 0.0, 1e300], "assignment": [0]}


def test_a_far_start_does_not_widen_the_tolerance():
    problem = pybubble.load_problem(FAR_PROBLEM)
    violations = pybubble.validate(problem, pybubble.load_schedule(FAR_SCHEDULE))
    assert "tasks 0 and 1 overlap on lane 0 (compute)" in violations
    assert len([v for v in violations if "overlap" in v]) == 3


def test_cli_validate_exits_1_on_a_far_start(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps(FAR_PROBLEM))
    (tmp_path / "s.json").write_text(json.dumps(FAR_SCHEDULE))
    r = subprocess.run([sys.executable, "-m", "pybubble", "validate", "p.json", "s.json"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "overlap" in r.stdout
