"""Speed of the pipeline simulator through the Python API beside the same simulation timed in C++:
p = 8, m = 32, v = 12 interleaved 1F1B, 24 TP collectives per op (12 layers per chunk, 2 per layer).

Prints medians of repeated runs (interleaved, so that both see the same machine) and their ratio.
Usage: python bench/pipeline_speed.py [--repeat N]
"""

import argparse
import statistics

import numpy as np

import pybubble
from pybubble import _core
from pybubble.llm import tables as schedules
from scheduler_speed import median_time  # bench/ is the script's folder

COSTS = dict(fwd=1200.0, bwd=2400.0, p2p=20.0, tp_comm=(24, 30.0), dp_allgather=3000.0, dp_reducescatter=8000.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="runs per round (10 rounds)")
    args = parser.parse_args()
    p, m, v = 8, 32, 12
    table = schedules.interleaved_1f1b(p, m, v)
    timeline = pybubble.simulate_pipeline(table, **COSTS)
    plain = pybubble.simulate_pipeline(table, fwd=1200.0, bwd=2400.0, dp_allgather=3000.0, dp_reducescatter=8000.0)
    assert plain.step_time == (m * v + p - 1) * 3600.0 + 11000.0  # closed form without p2p
    assert timeline.step_time > plain.step_time  # p2p latency lengthens the step
    # The core's arguments for the same step, as pybubble.simulate_pipeline builds them.
    offset, stage, kind, mb = schedules.flatten(schedules.check_table(table))
    spec = dict(ranks=p, chunks=v, microbatches=m, row_offset=offset, stage=stage, kind=kind, microbatch=mb,
                fwd=np.full(p * v, 1200.0), bwd=np.full(p * v, 2400.0), wgrad=np.full(p * v, 1200.0), p2p=20.0,
                tp_count=24, tp_duration=30.0, dp_allgather=3000.0, dp_reducescatter=8000.0)
    assert _core.simulate_pipeline(**spec)["step_time"] == timeline.step_time
    rounds = {"python": [], "core_call": [], "prep": [], "cpp": []}
    for _ in range(10):
        rounds["python"].append(median_time(lambda: pybubble.simulate_pipeline(table, **COSTS), args.repeat))
        rounds["core_call"].append(median_time(lambda: _core.simulate_pipeline(**spec), args.repeat))
        rounds["prep"].append(median_time(lambda: schedules.flatten(schedules.check_table(table)), args.repeat))
        rounds["cpp"].append(_core.simulate_pipeline_seconds(args.repeat, **spec))
    med = {k: statistics.median(v) * 1e3 for k, v in rounds.items()}
    rng = {k: (min(v) * 1e3, max(v) * 1e3) for k, v in rounds.items()}
    print(f"ops {len(timeline.ops)}, bubbles {len(timeline.bubbles)}, step {timeline.step_time / 1000:.3f} ms")
    print(f"build table (Python)                  median "
          f"{median_time(lambda: schedules.interleaved_1f1b(p, m, v), args.repeat) * 1e3:7.2f} ms")
    for key, label in (("python", "pybubble.simulate_pipeline(table)"), ("prep", "  of which table -> arrays (Python)"),
                       ("core_call", "  of which _core.simulate_pipeline"), ("cpp", "C++ simulate_pipeline (in C++)")):
        print(f"{label:37s} median {med[key]:7.2f} ms  (rounds {rng[key][0]:.2f}-{rng[key][1]:.2f})")
    print(f"Python call / C++: {med['python'] / med['cpp']:.2f}x; "
          f"_core call / C++: {med['core_call'] / med['cpp']:.2f}x")


if __name__ == "__main__":
    main()
