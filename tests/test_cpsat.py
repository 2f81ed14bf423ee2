"""Greedy against the exact optimum from OR-Tools CP-SAT on tiny integer problems."""

import numpy as np
import pytest

import pybubble
from pybubble.problems import random_problem

cp_model = pytest.importorskip("ortools.sat.python.cp_model")


def free_intervals(a, lane, res, horizon, big):
    prefix = "compute" if res == 0 else "link"
    b, e = a[f"{prefix}_offset"][lane], a[f"{prefix}_offset"][lane + 1]
    ivs = [(-big, 0)] + [(int(s), int(w)) for s, w in zip(a[f"{prefix}_start"][b:e], a[f"{prefix}_end"][b:e])]
    ivs.append((int(horizon), big))
    merged = []
    for lo, hi in ivs:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def optimum(problem: pybubble.Problem, scale: float = 1.0) -> float:
    """The shortest step any valid schedule reaches; every time times `scale` must be an integer."""
    a = dict(problem.arrays())
    for name in ("horizon", "compute_start", "compute_end", "link_start", "link_end", "forward_needed",
                 "grad_ready", "duration"):
        scaled = np.asarray(a[name], np.float64) * scale
        assert np.allclose(scaled, np.round(scaled), atol=1e-9), name
        a[name] = np.round(scaled)
    n, m = problem.num_tasks, problem.num_microbatches
    horizon = int(a["horizon"])
    dur = [int(d) for d in a["duration"]]
    big = horizon + sum(dur) + 1
    model = cp_model.CpModel()
    start = [model.NewIntVar(-big, big, f"s{t}") for t in range(n)]
    by_key: dict[int, list] = {}
    for t in range(n):
        lane, res = int(a["lane"][t]), int(a["resource"][t])
        choices = []
        for lo, hi in free_intervals(a, lane, res, horizon, big):
            if hi - lo < dur[t]:
                continue
            b = model.NewBoolVar("")
            model.Add(start[t] >= lo).OnlyEnforceIf(b)
            model.Add(start[t] + dur[t] <= hi).OnlyEnforceIf(b)
            choices.append(b)
        model.AddExactlyOne(choices)
        by_key.setdefault(2 * lane + res, []).append(model.NewFixedSizeIntervalVar(start[t], dur[t], ""))
        for p in a["after"][a["after_offset"][t]:a["after_offset"][t + 1]]:
            model.Add(start[int(p)] + dur[int(p)] <= start[t])
    for ivs in by_key.values():
        model.AddNoOverlap(ivs)
    x = [[model.NewBoolVar("") for _ in range(m)] for _ in range(m)]
    for j in range(m):
        model.AddExactlyOne(x[j])
        model.AddExactlyOne(x[i][j] for i in range(m))
    for t in range(n):
        j = int(a["microbatch"][t])
        for k in range(m):
            if a["phase"][t] == 0:
                model.Add(start[t] + dur[t] <= int(a["forward_needed"][k])).OnlyEnforceIf(x[j][k])
            else:
                model.Add(start[t] >= int(a["grad_ready"][k])).OnlyEnforceIf(x[j][k])
    first = model.NewIntVar(-big, 0, "first")
    last = model.NewIntVar(horizon, 2 * big, "last")
    for t in range(n):
        model.Add(first <= start[t])
        model.Add(last >= start[t] + dur[t])
    model.Minimize(last - first)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 20.0
    status = solver.Solve(model)
    assert status == cp_model.OPTIMAL
    return solver.ObjectiveValue() / scale


def test_greedy_mean_gap_to_optimum_is_at_most_5_percent():
    gaps = []
    for seed in range(60):
        problem = random_problem(seed, lanes=2, microbatches=3, max_fwd=3, max_bwd=2)
        sched = pybubble.schedule(problem)
        assert pybubble.validate(problem, sched) == []
        best = optimum(problem)
        assert sched.step_time >= best - 1e-9, "the heuristic cannot beat the optimum"
        gaps.append((sched.step_time - best) / best)
    mean_gap = float(np.mean(gaps))
    print(f"mean gap {mean_gap:.3%}, max {max(gaps):.3%} over {len(gaps)} problems")
    assert mean_gap <= 0.05
