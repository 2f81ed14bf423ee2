"""Speed of the pipeline simulator through the Python API: p = 8, m = 32, v = 12 interleaved 1F1B,
24 TP collectives per op (12 layers per chunk, 2 per layer). Prints medians."""

import statistics
import time

import pybubble
from pybubble.llm import tables as schedules

COSTS = dict(fwd=1200.0, bwd=2400.0, p2p=20.0, tp_comm=(24, 30.0), dp_allgather=3000.0, dp_reducescatter=8000.0)


def median_ms(run, repeats=20):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main():
    table = schedules.interleaved_1f1b(8, 32, 12)
    timeline = pybubble.simulate_pipeline(table, **COSTS)
    plain = pybubble.simulate_pipeline(table, fwd=1200.0, bwd=2400.0, dp_allgather=3000.0, dp_reducescatter=8000.0)
    assert plain.step_time == (32 * 12 + 8 - 1) * 3600.0 + 11000.0  # closed form without p2p
    assert timeline.step_time > plain.step_time  # p2p latency lengthens the step
    print(f"ops {len(timeline.ops)}, bubbles {len(timeline.bubbles)}, step {timeline.step_time / 1000:.3f} ms")
    print(f"build table (Python)          median {median_ms(lambda: schedules.interleaved_1f1b(8, 32, 12)):7.2f} ms")
    print(f"simulate_pipeline(table)      median {median_ms(lambda: pybubble.simulate_pipeline(table, **COSTS)):7.2f} ms")


if __name__ == "__main__":
    main()
