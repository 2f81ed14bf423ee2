"""How much of a setting's gap is its layout's share-out of images (issue 41), measured with a linear
program: the best share-out of each microbatch's images over the encoder pipelines of one plan
against the same conditions as the layout's bound, then that share-out rounded to whole images,
scheduled and compared with the search's own layout.

The program is the planner's own (``pybubble.planner.refill.share_out_program``; the re-fill tries
it on the first one-stage plan it re-fills). For an encoder plan of the search's best three
(``search(step).top``), with x[j, i] the images of LLM microbatch j's encoder microbatch on pipeline
i (a whole microbatch's compute on each lane, ``PlanSpace.per_phase``, split in proportion), the
program minimises front + back subject to, on every lane: the forward work of microbatches 0..k ends by forward_needed[k] in the lane's free time
plus front; the backward of k..M-1 after grad_ready[k] plus back; all of it in the free time plus
both; each microbatch's images all placed. Microbatch j feeds LLM microbatch j and only compute
counts, so the optimum is that of share-outs fed in order, not a bound for every schedule; with
one encoder stage it is what the layout's bound (``pybubble.planner.bound.layout_bound``) of the
best such share-out can reach. It ignores one stage waiting for another, which is why it is shown
for every plan but is a fair layout for one-stage plans only. ``--integral`` solves the whole-image
program (a MILP, 20 s at most) instead of rounding the fractional one by largest remainder.

    python bench/layout_lp.py [--integral] [--setting weak_b ...]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import pybubble
from pybubble.config.schema import load_config
from pybubble.llm.step import LLMStep
from pybubble.planner.bound import layout_bound
from pybubble.planner.search import search
from pybubble.planner.refill import share_out_program
from pybubble.planner.space import PlanSpace
from pybubble.schedule.scheduler import schedule_problem

SETTINGS = ["weak_a", "weak_b", "weak_c", "weak_d", "dual_1", "dual_2", "dual_3", "a100_vit3b_gpt11b"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--integral", action="store_true", help="whole images in the program (a MILP, 20 s at most)")
    parser.add_argument("--setting", nargs="*", default=SETTINGS)
    args = parser.parse_args()
    print(f"command: python bench/layout_lp.py{' --integral' if args.integral else ''}")
    print(f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, load {os.getloadavg()[0]:.1f}")
    print("per setting: the search's step over its bound; per plan of its best three: the program's optimum, the layout "
          "bound of the rounded share-out, its step (the shorter of greedy and holes) over the search's bound\n")
    for name in args.setting:
        found = search(LLMStep.of(load_config(os.path.join(ROOT, "examples", "optimus", f"{name}.yaml"))))
        bound = found.bound.step_time
        print(f"{name}: the search's step {found.best.step_time / 1e3:,.1f} ms, {100 * (found.best.step_time / bound - 1):+.2f}% "
              f"over the bound {bound / 1e3:,.1f} ms (PP_enc {found.best.plan.pp_enc} TP_enc {found.best.plan.tp_enc})")
        for cand in found.top[:3]:
            space = PlanSpace(cand.step, cand.plan)
            t0 = time.process_time()
            optimum, layout = share_out_program(space, args.integral)
            seconds = time.process_time() - t0
            shaped = space.layout_candidate(layout, (len(layout), 0))
            holes = schedule_problem(shaped.problem, "holes")
            step = min(holes.step_time, shaped.step_time)
            valid = pybubble.validate(shaped.problem, holes) == [] and pybubble.validate(shaped.problem, shaped.schedule) == []
            print(f"  PP_enc {cand.plan.pp_enc} TP_enc {cand.plan.tp_enc}: the search's layout {cand.step_time / 1e3:,.1f} ms; "
                  f"program {optimum / 1e3:,.1f} ms ({100 * (optimum / bound - 1):+.2f}%, {seconds:.1f} s); shared out: "
                  f"layout bound {layout_bound(shaped.problem).step_time / 1e3:,.1f} ms, step {step / 1e3:,.1f} ms "
                  f"({100 * (step / bound - 1):+.2f}%){'' if valid else ' INVALID'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
