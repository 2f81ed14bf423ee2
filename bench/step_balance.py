"""Balancing and re-planning one step of the Optimus 3,072-GPU setting: time per step.

examples/optimus/strong_3072.yaml: dp 48, 16 microbatches of 2 samples per replica (global batch
1536), sequences of 2 x 2048 tokens packed per microbatch. Every step draws a new batch from the
mix (`--data mix`, pybubble.data.mix.MixSpec: text-only, single images of 1..13 tiles,
multi-image, video) or from a data file (`--data-file FILE`, JSON lines, drawn with replacement),
prices each image with an EncoderCost fitted to the cost model's ViT-22B (one image of t tiles as
one sequence of t x 256 encoder tokens, forward plus backward), and times the work before the step:

1. balance: pybubble.schedule.balance.balance_step (packing, the microbatches ordered by the plan's
   deadline gaps, moves between replicas), the pricing included;
2. re-plan: the fill of every replica rescheduled for the encoder seconds it runs per LLM slot (the
   best encoder plan's problem, encoder microbatch j scaled by slot j's seconds over the run's mean
   microbatch; encoder microbatch j feeds LLM microbatch j, its data's) in one call to the core:
   ReplicaScheduler.run splits the replicas over `--threads` threads inside the core (replica k on
   thread k % threads, the GIL released) and, the problem's lanes being twins (the 8 encoder
   pipelines on each LLM stage share every microbatch evenly: the same windows and kernels),
   schedules one copy of them; it returns every
   replica's schedule as compact rows (ReplicaSchedules: replica k's task t starts at
   start[k, t // copies]). Timed on `--threads` threads and on one, and the path before it, the
   baseline of the ratio: one OnlineScheduler per thread, each replica's durations from numpy and
   its full Schedule from the core (ReplicaScheduler before one core call); the three in turns.

Prints, over the steps, the median and range of: the balance; balance plus all replicas' re-plans
on `--threads` threads and on one (one process planning the whole step, as `pybubble dynamic`
does); the same with the per-replica path and the ratio per-replica / one call (both on
`--threads` threads, measured in the same steps); what expanding every replica's row into a full
Schedule (one start per task, as the per-replica path returns) would add, untimed in the figures
above (a rank reads its own replica's row); per rank, the balance plus one replica's re-plan in
the core, on one thread, for the median and the slowest replica of the step (in training, each
replica's ranks re-plan only their own replica, all replicas at once on their own hosts: this is
a rank's work before the step). Outside the timed part, every replica's schedule is checked by
the core's validator against its durations, the one call's schedules on `--threads` threads
against one thread's and against the per-replica path's (identical), and each step's invariants
of the balance.

Usage: python bench/step_balance.py [--steps 50] [--seed 0] [--data mix | --data-file FILE]
       [--tokens-per-tile 64] [--threads 2] [--cpus 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pybubble.config.schema import load_config
from pybubble.costs.roofline import CostModel
from pybubble.llm.step import LLMStep
from pybubble.planner.dynamic import ranked_candidates
from pybubble.data.sources import add_data_options, data_source
from pybubble.data.samples import Samples
from pybubble.planner.sample_costs import encoder_time
from pybubble.problem.problem import Problem
from pybubble.schedule.balance import EncoderCost, StepBalance, balance_step, deadline_gaps
from pybubble.schedule.online import OnlineScheduler, ReplicaScheduler, ReplicaSchedules, data_parallel_step
from pybubble.schedule.scheduler import Schedule
from pybubble.schedule.validator import validate

CONFIG = Path(__file__).resolve().parent.parent / "examples" / "optimus" / "strong_3072.yaml"


@dataclass(kw_only=True, slots=True)
class Setting:
    """The Optimus setting: replicas, microbatches, the encoder's cost, the plan's problem."""

    replicas: int
    microbatches: int
    samples: int
    sequence: int
    cost: EncoderCost
    owner: np.ndarray
    problem: Problem
    bubble: np.ndarray

    @classmethod
    def of(cls, path: Path) -> "Setting":
        config = load_config(path)
        r, m = config.llm_plan.dp, config.microbatches
        n = m * config.training.micro_batch
        enc = config.encoders[0].model
        tiles = np.arange(1, 33)
        seconds = [encoder_time(enc, int(t) * enc.tokens, CostModel("h100"), recompute=config.training.recompute) / 1e6
                   for t in tiles]
        problem = ranked_candidates(LLMStep.of(config), 1)[0].problem
        return cls(replicas=r, microbatches=m, samples=n, sequence=config.training.micro_batch * config.training.seq_len,
                   cost=EncoderCost.fit(tiles, np.array(seconds)), owner=np.repeat(np.arange(r), n),
                   problem=problem, bubble=deadline_gaps(problem))


class Timings:
    """Per step, milliseconds of each part, and what the steps gave: one list per part, a value per
    step (``moves`` and ``images`` count, ``before`` and ``after`` are the imbalances)."""

    __slots__ = ("balance", "threads", "single", "per_replica", "expand", "rank", "rank_slowest", "cpu", "before",
                 "after", "moves", "images", "step")

    def __init__(self) -> None:
        for part in self.__slots__:
            setattr(self, part, [])


def check_balance(b: StepBalance, s: Samples, tokens: np.ndarray, setting: Setting) -> None:
    """The balance's invariants: every image once, moves only from the owner, the largest replica
    never heavier, orders are permutations, the sequences not overfilled."""
    owner, m = setting.owner, setting.microbatches
    assert b.runs_on.size == s.tiles.size and np.unique(b.moves[:, 0]).size == len(b.moves)
    assert (b.moves[:, 1] == owner[s.image_sample][b.moves[:, 0]]).all()
    assert b.encoder_after.max() <= b.encoder_before.max() * (1 + 1e-12)
    assert (np.sort(b.order, axis=1) == np.arange(m)).all()
    assert np.bincount(owner * m + b.microbatch, weights=tokens, minlength=setting.replicas * m).max() <= setting.sequence


class PerReplica:
    """The path before one core call, the baseline of the ratio: one OnlineScheduler per thread
    (replica k on thread k % threads, the core releasing the GIL), each replica's durations from
    numpy and its full Schedule from the core."""

    def __init__(self, problem: Problem, threads: int):
        self.threads = threads
        self.online = [OnlineScheduler(problem, fixed_assignment=True) for _ in range(threads)]
        self.pool = ThreadPoolExecutor(max_workers=threads) if threads > 1 else None

    def reschedule(self, scale: np.ndarray) -> list[Schedule]:
        out: list[Schedule] = [None] * len(scale)  # type: ignore[list-item]  # each filled below

        def part(w: int) -> None:
            online = self.online[w]
            for k in range(w, len(scale), self.threads):
                out[k] = online.reschedule(online.scaled_durations(scale[k]))

        if self.pool is None:
            part(0)
        else:
            list(self.pool.map(part, range(self.threads)))
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def check_schedules(each: ReplicaScheduler, scale: np.ndarray, got: ReplicaSchedules, want: ReplicaSchedules,
                    per_replica: list[Schedule]) -> float:
    """Every replica's schedule valid for its durations (the core's validator), the same on every
    number of threads and on the per-replica path; returns the milliseconds that expanding every
    row into a full Schedule took."""
    for a, b in ((got.start, want.start), (got.assignment, want.assignment), (got.step_time, want.step_time)):
        assert np.array_equal(a, b)
    t0 = time.perf_counter()
    full = got.schedules()
    expand = (time.perf_counter() - t0) * 1e3
    for k, (a, b) in enumerate(zip(full, per_replica)):
        assert np.array_equal(a.start, b.start) and np.array_equal(a.assignment, b.assignment)
        assert (a.step_time, a.shift_front, a.shift_back) == (b.step_time, b.shift_front, b.shift_back)
        errors = validate(each.problem.with_durations(each.durations(scale[k])), a)
        assert errors == [], f"replica {k}: {errors[:3]}"
    return expand


def timed(replan, scale: np.ndarray) -> tuple:
    """What `replan(scale)` gives, and the milliseconds it took."""
    t0 = time.perf_counter()
    out = replan(scale)
    return out, (time.perf_counter() - t0) * 1e3


def one_step(i: int, s: Samples, setting: Setting, unit: float,
             pools: tuple[ReplicaScheduler, ReplicaScheduler, PerReplica], tokens_per_tile: int, out: Timings) -> None:
    """Step i: balance, re-plan on the three paths (their order turning), check, keep the times."""
    tokens = s.tokens(tokens_per_tile)
    t0, c0 = time.perf_counter(), time.thread_time()
    b = balance_step(setting.cost(s.tiles), s.image_sample, tokens, setting.owner, replicas=setting.replicas,
                     microbatches=setting.microbatches, sequence_length=setting.sequence, bubble=setting.bubble)
    balance, cpu = (time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3
    scale = b.slot_load / unit
    many, one, old = pools
    paths = [many.run, one.run, old.reschedule]
    turn = [(i + x) % 3 for x in range(3)]
    results: list = [None] * 3
    for x in turn:
        results[x] = timed(paths[x], scale)
    (got, t_many), (want, t_one), (before, t_old) = results
    check_balance(b, s, tokens, setting)
    out.expand.append(check_schedules(one, scale, got, want, before))
    out.balance.append(balance)
    out.cpu.append(cpu)
    out.threads.append(balance + t_many)
    out.single.append(balance + t_one)
    out.per_replica.append(balance + t_old)
    out.rank.append(balance + float(np.median(want.took)) * 1e3)
    out.rank_slowest.append(balance + float(want.took.max()) * 1e3)
    out.before.append(b.imbalance_before)
    out.after.append(b.imbalance_after)
    out.moves.append(len(b.moves))
    out.images.append(s.tiles.size)
    out.step.append(data_parallel_step(got.step_time))


def spread(values: list[float]) -> str:
    """Median and range of per-step milliseconds."""
    return f"median {statistics.median(values):.2f} ms (range {min(values):.2f} to {max(values):.2f})"


def report(t: Timings, setting: Setting, args: argparse.Namespace, load: tuple[float, ...], copies: int) -> None:
    r, m = setting.replicas, setting.microbatches
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(f"{CONFIG.name}: dp {r}, {m} microbatches, {setting.samples} samples per replica, sequences of "
          f"{setting.sequence} tokens, {args.tokens_per_tile} tokens per tile; data: {args.data_file or 'mix'}")
    c = setting.cost
    print(f"encoder cost per image (ViT-22B, fitted): {c.a * 1e3:.4f} ms x tiles^2 + {c.b * 1e3:.3f} ms x tiles "
          f"+ {c.c * 1e3:.3f} ms; plan problem: {setting.problem.num_tasks} tasks on {setting.problem.num_lanes} lanes")
    print(f"{args.steps} steps, {statistics.median(t.images):.0f} images per step (median), on {cpus} CPUs; "
          f"every replica's schedule valid, the same on {args.threads} threads as on one and as the per-replica path; "
          f"twin lanes: the core schedules 1 of {copies} copies")
    print(f"balance (balance_step):                        {spread(t.balance)}; CPU {spread(t.cpu)}")
    print(f"balance + re-plan {r} replicas on {args.threads} threads:     {spread(t.threads)}")
    print(f"balance + re-plan {r} replicas on 1 thread:       {spread(t.single)}")
    ratio = [a / b for a, b in zip(t.single, t.threads)]
    print(f"ratio 1 thread / {args.threads} threads: median {statistics.median(ratio):.2f}x "
          f"(range {min(ratio):.2f} to {max(ratio):.2f})")
    print(f"per-replica path (OnlineScheduler per replica, full Schedules), balance + re-plan on {args.threads} "
          f"threads: {spread(t.per_replica)}")
    old = [a / b for a, b in zip(t.per_replica, t.threads)]
    print(f"ratio per-replica path / one call, balance included, {args.threads} threads: median "
          f"{statistics.median(old):.1f}x (range {min(old):.1f} to {max(old):.1f})")
    print(f"expanding every replica's row into a full Schedule (not timed above): {spread(t.expand)}")
    print(f"per rank, balance + its own replica's re-plan:  {spread(t.rank)} (the median replica), "
          f"{spread(t.rank_slowest)} (the slowest)")
    print(f"replicas' imbalance (max / mean encoder s): median {statistics.median(t.before):.3f} before, "
          f"{statistics.median(t.after):.4f} after; moves per step median {statistics.median(t.moves):.0f}; "
          f"step (slowest replica) median {statistics.median(t.step) / 1e3:,.1f} ms, "
          f"LLM alone {setting.problem.horizon / 1e3:,.1f} ms")
    print(f"load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}")


def draws(args: argparse.Namespace, count: int) -> list[Samples]:
    """The steps' samples, seeded: from the mix or the data file (with replacement)."""
    source = data_source(args, tokens_per_tile=args.tokens_per_tile)
    rng = np.random.default_rng(args.seed)
    return [source.draw(count, rng) for _ in range(args.steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    add_data_options(parser, ("mix",), default="mix", file_use="drawn with replacement")
    parser.add_argument("--tokens-per-tile", type=int, default=64,
                        help="LLM tokens per tile (64: a 32-frame video and its text fit one 4096-token sequence)")
    parser.add_argument("--threads", type=int, default=2, help="threads the replicas' re-plans are split over")
    parser.add_argument("--cpus", type=int, default=2, help="run on this many CPUs (0: all)")
    args = parser.parse_args()
    if args.steps < 1:
        raise ValueError(f"steps: {args.steps}, expected at least 1")
    if args.cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.cpus])
    setting = Setting.of(CONFIG)
    steps = draws(args, setting.replicas * setting.samples)
    unit = float(np.mean([setting.cost(s.tiles).sum() for s in steps])) / (setting.replicas * setting.microbatches)
    load = os.getloadavg()
    t = Timings()
    old = PerReplica(setting.problem, args.threads)
    with ReplicaScheduler(setting.problem, threads=args.threads) as many, ReplicaScheduler(setting.problem) as one:
        for i, s in enumerate(steps):
            one_step(i, s, setting, unit, (many, one, old), args.tokens_per_tile, t)
        copies = many.copies
    old.close()
    report(t, setting, args, load, copies)


if __name__ == "__main__":
    main()
