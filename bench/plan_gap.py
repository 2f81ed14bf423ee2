"""Where the time between pybubble's step and its lower bound goes, on small instances of the shapes
of the Optimus settings that stay above their bound (docs/reproduction.md): the same LLM schedule
(interleaved 1F1B, two microbatches per pipeline stage, TP 8 or TP 2 gaps), the same encoders cut
to a few layers, solved exactly.

For each instance: the planner's search (pybubble's plan and the optimus row), the lower bound, and
for every candidate small enough (pybubble's, the optimus row's and each encoder plan's best, at
most --max-tasks tasks) the greedy filler's step against the CP-SAT optimum of the same tasks
(``pybubble.testing.exact``, OR-Tools). Greedy above CP-SAT: the plan leaves time (the filler's
order); CP-SAT above the bound: no schedule of that layout reaches the bound.

With ``--every-layout``, each shape's instance holds one image of ``--tokens`` tokens per microbatch
(``--images``: that many; 4 microbatches, ``--layers`` encoder layers): few enough layouts to solve
them all. For every plan whose bound is below the best step found so far, every layout (each
microbatch's images over the pipelines, in each order: encoder microbatch j feeds LLM microbatch j)
whose layout bound under that assignment is also below it is solved by CP-SAT with the assignment
given (fixed deadlines: far quicker to prove than a free assignment); the least is the optimum over
every layout of every plan (proved when each solve is). It splits pybubble's distance to the plans'
bound in two: the bound's (bound to optimum) and the plan's (optimum to pybubble's step); and the
optimum's own layout scheduled by the holes filler (in the best order of its microbatches) says how
much of the plan's is the filler's.
With ``--within SHARE`` it asks instead whether any schedule of any layout comes within SHARE of the
plans' bound (``pybubble.testing.exact.within`` on every order whose layout bound is below that step):
proved none where every answer is no.

    python bench/plan_gap.py [--budget 30] [--max-tasks 600] [--shape weak] [--plans]
    python bench/plan_gap.py --every-layout [--tokens 4096] [--images 1] [--layers 2] [--shape a100]
    python bench/plan_gap.py --every-layout --within 0.02 [--layers 2] [--shape weak]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

import pybubble
from pybubble.config.schema import load_config
from pybubble.llm.step import LLMStep
from pybubble.planner.bound import layout_bound
from pybubble.planner.search import search
from pybubble.planner.space import PlanSpace
from pybubble.schedule.scheduler import schedule_problem
from pybubble.testing.exact import optimum, within

SHAPES = {
    "weak": "weak_a, weak_b (LLaMA-70B, PP 4 V 5, TP 8, 8 microbatches): PP 2 V 2, TP 8, 4 microbatches, ViT-22B",
    "gpt": "weak_c, weak_d (GPT-175B, PP 8 V 12, TP 8, 16 microbatches): PP 2 V 2, TP 8, 4 microbatches, ViT-22B",
    "dual": "dual_1-3 (two encoders): as gpt, ViT-22B + ViT-5B",
    "a100": "a100_vit3b_gpt11b (GPT-11B, PP 4 V 5, TP 2, 8 microbatches): PP 2 V 2, TP 2, 4 microbatches, ViT-3B",
}
"""The instances and the settings whose shape they have."""


def instance(shape: str) -> dict:
    """A small config of `shape` (see :data:`SHAPES`): 4 LLM layers, 2 encoder layers, 8 images of
    256 tokens per sample, full recomputation."""
    llm, tp, gpu = {"weak": ("llama-70b", 8, "h100"), "gpt": ("gpt-175b", 8, "h100"), "dual": ("gpt-175b", 8, "h100"),
                    "a100": ("gpt-11b", 2, "a100-80gb")}[shape]
    encoders = [{"preset": "vit-3b" if shape == "a100" else "vit-22b", "tokens_per_sample": 2048, "layers": 2}]
    if shape == "dual":
        encoders.append({"preset": "vit-5b", "tokens_per_sample": 2048, "layers": 2})
    return {"cluster": {"gpus": 2 * tp, "gpu": gpu, "gpus_per_node": 8}, "llm": {"preset": llm, "layers": 4},
            "encoders": encoders, "training": {"global_batch": 8, "micro_batch": 2, "seq_len": 2048, "recompute": "full"},
            "llm_plan": {"dp": 1, "pp": 2, "tp": tp, "vpp": 2, "schedule": "interleaved_1f1b"}, "memory_gb": 80}


def one_image(shape: str, tokens: int, layers: int, images: int = 1) -> dict:
    """:func:`instance` of `shape` with one image of `tokens` tokens per microbatch (4 microbatches)
    and `layers` encoder layers; `images`: that many images of `tokens` tokens instead."""
    cfg = instance(shape)
    for enc in cfg["encoders"]:
        enc.update(tokens=tokens, tokens_per_sample=tokens * images, layers=layers)
    cfg["training"].update(global_batch=4, micro_batch=1)
    return cfg


def placements(space: PlanSpace) -> list:
    """Every way one microbatch's images go over the plan's pipelines (a layout's entries): the
    pipeline that takes them all, or the images per pipeline (with several encoders of as many images
    each, every encoder's images split alike); with several encoders of unlike counts, whole
    microbatches only."""
    pipes, images = space.plan.pipelines, space.work.images
    if len(set(images)) > 1:
        return list(range(pipes))
    n = images[0]
    return [next(i for i, c in enumerate(counts) if c) if max(counts) == n else counts
            for counts in itertools.product(range(n + 1), repeat=pipes) if sum(counts) == n]


def scored_orders(step, plan, max_layouts: int) -> tuple[PlanSpace, list[tuple[float, list, object]] | None]:
    """`plan`'s space on `step` and every order of every layout of it (each microbatch's placement
    one of :func:`placements`; encoder microbatch j feeds LLM microbatch j) as (its layout bound under
    that assignment, the order, its problem), lowest bound first; None when there are more than
    `max_layouts` orders."""
    space, microbatches = PlanSpace(step, plan), step.config.microbatches
    options = placements(space)
    if len(options) ** microbatches > max_layouts:
        return space, None
    identity = list(range(microbatches))
    scored = []
    for pick in itertools.combinations_with_replacement(options, microbatches):
        for order in dict.fromkeys(itertools.permutations(pick)):
            problem = space.bubbles.with_tasks(space.work.layout_tasks(list(order)))
            scored.append((layout_bound(problem, identity).step_time, list(order), problem))
    return space, sorted(scored, key=lambda x: x[0])


def orders_below(step, searched, limit: float, max_layouts: int) -> tuple[str, PlanSpace, list | None] | None:
    """A searched plan's name, space and :func:`scored_orders` where its bound is below `limit` (us);
    None where it is not, and no orders (None) where there are more than `max_layouts`; each skip
    printed."""
    plan = searched.plan
    name = f"PP_enc {plan.pp_enc} TP_enc {plan.tp_enc}"
    if searched.bound.step_time >= limit:
        print(f"  {name}: plan bound {searched.bound.step_time / 1e3:.2f} ms, not below {limit / 1e3:.2f}", flush=True)
        return None
    space, scored = scored_orders(step, plan, max_layouts)
    if scored is None:
        print(f"  {name}: more than --max-layouts orders: skipped", flush=True)
    return name, space, scored


def within_every_layout(step, found, share: float, budget: float, max_layouts: int, workers: int = 2) -> dict:
    """Whether any schedule of any layout of any plan comes within `share` of the plans' lower bound
    (``exact.within`` on every order whose plan bound and layout bound are below that step), printed;
    returns ``limit`` (us), ``found`` (the orders with such a schedule), ``proved`` (those with none),
    ``unknown`` (budget spent) and ``exhaustive`` (every plan's orders asked)."""
    limit = (1.0 + share) * found.bound.step_time
    out = {"limit": limit, "found": [], "proved": 0, "unknown": 0, "exhaustive": True}
    for searched in sorted(found.plans, key=lambda p: p.bound.step_time):
        got = orders_below(step, searched, limit, max_layouts)
        if got is None:
            continue
        name, _, scored = got
        if scored is None:
            out["exhaustive"] = False
            continue
        asked = [(order, problem) for lower, order, problem in scored if lower < limit]
        for order, problem in asked:
            got = within(problem, limit, round_times=True, assignment=list(range(step.config.microbatches)),
                         max_deterministic_time=budget, workers=workers)
            if got:
                out["found"].append((name, order))
            else:
                out["proved" if got is False else "unknown"] += 1
        print(f"  {name}: plan bound {searched.bound.step_time / 1e3:.2f} ms, {len(asked)} orders with a layout "
              f"bound below {limit / 1e3:.2f} ms asked", flush=True)
    verdict = ("a schedule within it exists" if out["found"] else "no schedule within it: proved" if
               out["exhaustive"] and not out["unknown"] else "not settled")
    print(f"  within {share:.0%} of the plans' bound ({limit / 1e3:.2f} ms, times rounded to whole us): {verdict}; "
          f"{len(out['found'])} orders with one, {out['proved']} proved without, {out['unknown']} unknown", flush=True)
    return out


def every_layout(step, found, budget: float, max_layouts: int, workers: int = 2) -> dict:
    """The optimum over every layout of every plan (see the module docstring), printed; returns
    ``optimum`` (us, the least step found), ``proved`` (us, no layout's step is below it),
    ``exhaustive`` (every plan's layouts counted), ``layout`` (the optimum's plan and layout, None
    when pybubble's step is it) and ``held`` (the holes filler's step on that layout in its best
    order, us). `workers`: CP-SAT's (one: the same answer on every machine)."""
    bound, ours = found.bound.step_time, found.best.step_time
    best, best_at, lows, solves, exhaustive = ours, None, [], 0, True
    identity = list(range(step.config.microbatches))
    for searched in sorted(found.plans, key=lambda p: p.bound.step_time):
        got = orders_below(step, searched, best, max_layouts)
        if got is None:
            continue
        name, space, scored = got
        if scored is None:
            exhaustive = False
            continue
        solved = 0
        for lower, layout, problem in scored:
            if lower >= best:
                break
            exact = optimum(problem, round_times=True, assignment=identity, max_deterministic_time=budget,
                            workers=workers)
            solves, solved = solves + 1, solved + 1
            if not exact.optimal:
                lows.append(exact.bound)
            if exact.step_time < best:
                best, best_at = exact.step_time, (space, layout, exact.schedule)
        print(f"  {name}: plan bound {searched.bound.step_time / 1e3:.2f} ms, {len(scored)} layouts, "
              f"{solved} solved; best so far {best / 1e3:.2f} ms", flush=True)
    low = min([best] + lows)
    proved = "optimal" if low >= best else f"proved >= {low / 1e3:.2f} ms"
    print(f"  optimum over every layout{'' if exhaustive else ' solved'}: {best / 1e3:.2f} ms ({proved}; {solves} "
          f"CP-SAT solves), {low / bound - 1:+.2%} over the plans' bound ({bound / 1e3:.2f} ms); pybubble's step "
          f"{ours / 1e3:.2f} ms, {ours / best - 1:+.2%} over the optimum", flush=True)
    out = {"optimum": best, "proved": low, "exhaustive": exhaustive, "layout": None, "held": None}
    if best_at is not None:
        space, layout, exact = best_at
        by_order = {order: schedule_problem(space.bubbles.with_tasks(space.work.layout_tasks(list(order))), "holes",
                                            fixed_assignment=True)  # microbatch j feeding LLM microbatch j
                    for order in set(itertools.permutations(layout))}
        held = min(s.step_time for s in by_order.values())
        print(f"  the optimum's layout: PP_enc {space.plan.pp_enc} TP_enc {space.plan.tp_enc} {layout} (in CP-SAT's "
              f"order); the holes filler {held / 1e3:.2f} ms on it in its best order ({held / best - 1:+.2%})", flush=True)
        same = by_order[tuple(layout)]
        print(f"  the optimum grows the step {exact.shift_front / 1e3:.2f} ms before the LLM and "
              f"{exact.shift_back / 1e3:.2f} ms after it; the holes filler on its order {same.step_time / 1e3:.2f} ms: "
              f"{same.shift_front / 1e3:.2f} before, {same.shift_back / 1e3:.2f} after", flush=True)
        out.update(layout=(space.plan, layout), held=held)
    return out


def candidates(found, plans: bool) -> list[tuple[str, object]]:
    """pybubble's plan, the optimus row and (with `plans`) each plan's best, each once."""
    out, seen = [], set()
    for name, cand in [("pybubble", found.best), ("optimus", found.optimus)] + [
            (f"PP_enc {p.plan.pp_enc} TP_enc {p.plan.tp_enc}", p.best) for p in (found.plans if plans else [])]:
        if cand is not None and id(cand) not in seen:
            seen.add(id(cand))
            out.append((name, cand))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=30.0, help="CP-SAT's budget per candidate (deterministic units)")
    p.add_argument("--max-tasks", type=int, default=600, help="solve candidates with at most this many tasks")
    p.add_argument("--shape", choices=sorted(SHAPES), action="append", help="these shapes only (default: all)")
    p.add_argument("--plans", action="store_true", help="also each encoder plan's best layout")
    p.add_argument("--every-layout", action="store_true",
                   help="one image per microbatch: the optimum over every layout of every plan")
    p.add_argument("--tokens", type=int, default=4096, help="with --every-layout: the image's tokens")
    p.add_argument("--images", type=int, default=1, help="with --every-layout: images per microbatch")
    p.add_argument("--layers", type=int, default=1, help="with --every-layout: the encoder's layers")
    p.add_argument("--max-layouts", type=int, default=5000, help="with --every-layout: solve plans with at most "
                   "this many layouts")
    p.add_argument("--within", type=float, help="with --every-layout: instead of the optimum, whether any "
                   "schedule comes within this share of the plans' bound (e.g. 0.02)")
    a = p.parse_args()
    for shape in a.shape or list(SHAPES):
        cfg = one_image(shape, a.tokens, a.layers, a.images) if a.every_layout else instance(shape)
        step = LLMStep.of(load_config(cfg))
        found = search(step, warmup=False, optimus=True, workers=1)
        alone, bound = step.timeline.step_time, found.bound.step_time
        size = (f", {'one image' if a.images == 1 else f'{a.images} images'} of {a.tokens} tokens per microbatch, "
                f"{a.layers} encoder layers" if a.every_layout else "")
        print(f"{shape}: {SHAPES[shape]}{size}\n  LLM alone {alone / 1e3:.2f} ms, lower bound {bound / 1e3:.2f} ms "
              f"({bound / alone - 1:+.1%}); pybubble {found.best.step_time / 1e3:.2f} ms "
              f"({found.best.step_time / bound - 1:+.1%} over the bound), optimus row "
              f"{found.optimus.step_time / 1e3:.2f} ms", flush=True)
        if a.every_layout and a.within is not None:
            within_every_layout(step, found, a.within, a.budget, a.max_layouts)
            continue
        if a.every_layout:
            every_layout(step, found, a.budget, a.max_layouts)
            continue
        for name, cand in candidates(found, a.plans):
            tasks = cand.problem.num_tasks
            layout = f"spread {cand.spread}" if any(cand.spread) else f"partition {cand.partition}"
            if tasks > a.max_tasks:
                print(f"  {name:<20} {layout:<20} {tasks:5d} tasks: greedy {cand.step_time / 1e3:8.2f} ms "
                      f"(too many tasks for CP-SAT here)", flush=True)
                continue
            t0 = time.monotonic()
            exact = optimum(cand.problem, scale=1.0, round_times=True, max_deterministic_time=a.budget, workers=2)
            print(f"  {name:<20} {layout:<20} {tasks:5d} tasks: greedy {cand.step_time / 1e3:8.2f} ms, CP-SAT "
                  f"{exact.step_time / 1e3:8.2f} ms ({'optimal' if exact.optimal else f'not proved, >= {exact.bound / 1e3:.2f}'})"
                  f", its plan's bound {cand.bound.step_time / 1e3:8.2f} ms; greedy {cand.step_time / exact.step_time - 1:+.1%}"
                  f" over CP-SAT, CP-SAT {exact.step_time / cand.bound.step_time - 1:+.1%} over the bound "
                  f"[{time.monotonic() - t0:.0f} s, load {os.getloadavg()[0]:.1f}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
