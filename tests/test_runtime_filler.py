"""The bubble filler inside real gloo waits (two processes), its CUDA mode's window fitting (with a
stand-in for the side stream, no GPU needed; on a GPU also with the real one), and the pipelining
adapter's guard."""

import json
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")

from pybubble.runtime import BubbleFiller, FillTask, PipelineWaits, fill_pipeline_waits, side_stream  # noqa: E402
from pybubble.runtime import torch_seams  # noqa: E402

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

WORKER = textwrap.dedent("""
    import json, sys, time, datetime
    import torch, torch.distributed as dist
    from pybubble.runtime import BubbleFiller, FillTask, PipelineWaits
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=20))
    buf = torch.zeros(4)
    dist.barrier()
    if rank == 1:
        time.sleep(0.4)
        dist.send(torch.ones(4), 0)
        dist.barrier()
        time.sleep(0.2)
        dist.send(torch.ones(4), 0)
    else:
        log = []
        def task(i, ready=lambda: True, needed_by=None):
            return FillTask(name=str(i), duration_s=0.02, planned_start_s=0.01 * i,
                            run=lambda: (log.append(i), time.sleep(0.02)), ready=ready, needed_by=needed_by)
        # 1. Fill a gap predicted at 0.25 s while the receive (0.4 s away) has not completed; past
        #    0.25 s the gap runs long and is still used.
        filler = BubbleFiller.with_gaps([task(i) for i in range(40)], [0.25, 0.0], [("F", 0)], horizon_s=10.0)
        filler.progress.begin_step()
        t = time.perf_counter()
        PipelineWaits(filler).wait([dist.irecv(buf, 1)])
        waited = time.perf_counter() - t
        filled = len(log)
        filler.progress.op_begin(); filler.progress.op_end()
        filler.drain()
        out = {"waited": waited, "filled": filled, "deferred": filler.stats.deferred,
               "order": log == list(range(40)), "received": buf.tolist()}
        # 2. A task whose input has not arrived stops the filling; a forward task that the next op
        #    depends on runs before the rank blocks, even with filling off.
        log.clear()
        dist.barrier()
        filler = BubbleFiller.with_gaps([task(0, needed_by=3), task(1, ready=lambda: False), task(2)], [1.0, 0.0],
                              [("F", 3)], horizon_s=10.0)
        filler.progress.begin_step()
        PipelineWaits(filler).wait([dist.irecv(buf, 1)])
        out["blocked"] = list(log)
        out["forced"] = filler.stats.forced
        print(json.dumps(out))
    dist.destroy_process_group()
""")



def test_filler_runs_tasks_while_a_gloo_receive_is_pending(two_ranks):
    outs = two_ranks(WORKER, timeout=60)
    res = json.loads(outs[0][0].strip().splitlines()[-1])
    assert res["received"] == [1.0] * 4
    # About 0.25 s of 0.02 s tasks fit in the predicted gap, and more while it ran long (each no
    # longer than the overrun so far).
    assert 14 <= res["filled"] <= 21, res
    assert res["deferred"] <= 1
    # The wait lasted until the data came (0.4 s), not until the tasks ran out.
    assert 0.35 <= res["waited"] < 0.8, res
    assert res["order"]  # drain ran the rest, in plan order
    assert res["blocked"] == [0] and res["forced"] == 1


def test_filler_checks_its_gaps():
    with pytest.raises(ValueError, match=r"gaps_s: 1 entries for 1 ops \(need 2\)"):
        BubbleFiller.with_gaps([], [0.1], [("F", 0)], horizon_s=1.0)


def test_adapter_restores_the_schedules_module():
    class Stage:
        def forward_one_chunk(self, mb):
            return f"f{mb}"

        def backward_one_chunk(self, mb, loss=None, full_backward=True):
            return f"b{mb}"

        def backward_weight_one_chunk(self, mb):
            return f"w{mb}"

    original = torch_seams.p2p_wait()
    stage = Stage()
    filler = BubbleFiller.with_gaps([FillTask(name="x", duration_s=0.0, planned_start_s=0.0, run=lambda: None)],
                          [0.0] * 5, [("F", 0), ("I", 0), ("W", 0), ("B", 1)], horizon_s=1.0)
    waits = PipelineWaits(filler)
    with fill_pipeline_waits(waits, [stage]):
        assert torch_seams.p2p_wait() == waits.wait
        assert stage.forward_one_chunk(0) == "f0" and filler.progress.op_index == 1
        assert stage.backward_one_chunk(0, full_backward=False) == "b0" and filler.progress.op_index == 2
        assert stage.backward_weight_one_chunk(0) == "w0" and filler.progress.op_index == 3
        # an op the table does not have next: the plan would not describe the step
        with pytest.raises(RuntimeError, match="ran F1 where its action table has B1 next"):
            stage.forward_one_chunk(1)
    assert torch_seams.p2p_wait() is original
    assert not {"forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"} & set(vars(stage))


# -- CUDA mode: the window fitting, with a stand-in for the side stream ------------------------------
class RecordingSide:
    """Stands for a SideStream: runs each launched task at once and logs what the filler asks of
    the streams (launches, joins of forward tasks' events, the drain)."""

    def __init__(self):
        self.log: list[str] = []
        self.marks = 0

    def launch(self, fn):
        fn()

    def mark(self):
        self.marks += 1
        return f"m{self.marks}"

    def join(self, event):
        self.log.append(f"join {event}")

    def drain(self):
        self.log.append("drain")


class RecordingWork:
    """A p2p work whose ``wait()`` (a stream dependency under NCCL) is logged."""

    def __init__(self, log):
        self.log = log

    def wait(self):
        self.log.append("wait")


def side_task(side, name, duration_s, planned_start_s, needed_by=None, ready=lambda: True):
    return FillTask(name=name, duration_s=duration_s, planned_start_s=planned_start_s,
                    run=lambda: side.log.append(name), needed_by=needed_by, ready=ready)


def test_cuda_mode_launches_what_fits_in_each_gap_by_measured_duration():
    side = RecordingSide()
    tasks = [side_task(side, f"t{i}", 0.03, 0.001 * i) for i in range(10)]
    filler = BubbleFiller.with_gaps(tasks, [0.1, 0.05, 0.0], [("F", 5), ("B", 5)], horizon_s=1.0, side=side)
    filler.progress.begin_step()
    time.sleep(0.15)  # the CPU's clock is not the measure: the window opens when the stream gets there
    PipelineWaits(filler).wait([RecordingWork(side.log)])
    # 3 x 0.03 s fit in the 0.1 s gap, the 4th would overrun it: deferred; then the stream waits.
    assert side.log == ["t0", "t1", "t2", "wait"]
    assert filler.stats.deferred == 1
    PipelineWaits(filler).wait([RecordingWork(side.log)])  # a second wait in the same gap: 0.01 s left
    assert side.log[4:] == ["wait"] and filler.stats.deferred == 2
    filler.progress.op_begin()
    PipelineWaits(filler).wait([RecordingWork(side.log)])  # waits inside an op are not filled
    filler.progress.op_end()
    assert side.log[5:] == ["wait"]
    PipelineWaits(filler).wait([RecordingWork(side.log)])  # the next gap has its own 0.05 s
    assert side.log[6:] == ["t3", "wait"]
    assert filler.stats.filled == 4 and filler.stats.filled_s == pytest.approx(0.12)
    filler.progress.op_begin()
    filler.progress.op_end()
    filler.drain()  # the rest, in plan order, then the LLM's stream waits for the side stream
    assert side.log[8:] == [f"t{i}" for i in range(4, 10)] + ["drain"]
    assert filler.remaining == 0


def test_cuda_mode_stops_at_a_task_not_ready_or_outside_the_step():
    side = RecordingSide()
    arrived = []
    tasks = [side_task(side, "a", 0.01, 0.0), side_task(side, "grad", 0.01, 0.1, ready=lambda: bool(arrived)),
             side_task(side, "late", 0.01, 2.0)]
    filler = BubbleFiller.with_gaps(tasks, [1.0, 1.0], [("F", 0)], horizon_s=1.0, side=side)
    filler.progress.begin_step()
    PipelineWaits(filler).wait([RecordingWork(side.log)])
    assert side.log == ["a", "wait"] and filler.stats.deferred == 0  # waiting for an input is no deferral
    arrived.append(True)
    PipelineWaits(filler).wait([RecordingWork(side.log)])
    assert side.log[2:] == ["grad", "wait"]  # "late" is planned after the LLM's step: left to the drain
    filler.drain()
    assert side.log[4:] == ["late", "drain"]


def test_cuda_mode_forces_forward_tasks_and_joins_their_events_where_consumed():
    side = RecordingSide()
    tasks = [side_task(side, "f0", 0.5, 0.0, needed_by=0), side_task(side, "f1", 0.5, 0.1, needed_by=1),
             side_task(side, "f2", 0.5, 0.2, needed_by=2), side_task(side, "b", 0.5, 0.3)]
    filler = BubbleFiller.with_gaps(tasks, [0.0, 0.0, 0.0], [("F", 1), ("F", 2)], horizon_s=1.0, side=side)
    filler.progress.begin_step()
    # Before the stream waits for op F1, the forwards it may depend on through other ranks are
    # launched even though the gap has no room; no stream waits for them here.
    PipelineWaits(filler).wait([RecordingWork(side.log)])
    assert side.log == ["f0", "f1", "wait"] and filler.stats.forced == 2
    filler.progress.op_begin()
    filler.force(0)  # the op consuming microbatch 0's encoder output: its stream waits for f0's event
    assert side.log[3:] == ["join m1"]
    filler.force(1)
    filler.force(1)  # joined once
    assert side.log[4:] == ["join m2"]
    filler.force(2)  # not launched yet: launched now, then joined
    assert side.log[5:] == ["f2", "join m3"] and filler.stats.forced == 3
    filler.progress.op_end()
    filler.drain()
    assert side.log[7:] == ["b", "drain"] and side.marks == 3  # events only after forward tasks


def test_filler_mode_follows_the_device():
    assert side_stream("cpu") is None
    with pytest.raises(ValueError, match="device: 'meta' is not cpu or cuda"):
        side_stream("meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a CUDA device")
def test_cuda_mode_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match=r"device: 'cuda' but no CUDA device is available"):
        side_stream("cuda")


# -- CUDA mode on a GPU -------------------------------------------------------------------------------
@cuda_only
def test_side_stream_runs_after_the_llm_stream_and_before_the_consumer():
    from pybubble.runtime import SideStream, llm_stream

    side = SideStream()
    with torch.cuda.stream(llm_stream()):
        x = torch.zeros(1 << 16, device="cuda")
        torch_seams.cuda_sleep(50_000_000)  # the LLM's stream is busy...
        x.fill_(1.0)  # ... then writes what the task reads
        out = {}

        def task():
            torch_seams.cuda_sleep(50_000_000)  # the task is slow: its consumer must wait for it
            out["y"] = x * 2

        filler = BubbleFiller.with_gaps([FillTask(name="f", duration_s=0.0, planned_start_s=-1.0, run=task, needed_by=0)],
                              [0.0, 0.0], [("F", 0)], horizon_s=1.0, side=side)
        filler.run_front()
        filler.force(0)
        z = out["y"] + 1  # on the LLM's stream
        filler.drain()
        assert torch.all(z == 3).item()


@cuda_only
def test_pieces_on_the_side_stream_give_the_unsplit_gradients():
    from torch import nn

    from pybubble.runtime import MicrobatchRun, SideStream, llm_stream, split_into_pieces

    torch.manual_seed(0)
    layer = lambda: nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)  # noqa: E731
    encoder = nn.Sequential(layer(), layer()).cuda()
    x = torch.randn(2, 16, 32, device="cuda")
    encoder(x).square().sum().backward()
    expected = [p.grad.clone() for p in encoder.parameters()]
    encoder.zero_grad(set_to_none=True)
    torch.cuda.synchronize()

    pieces = split_into_pieces(encoder, x)
    n = len(pieces)
    run = MicrobatchRun(pieces, (x,))
    grad = {}

    def backward(i):
        if i == n - 1:
            run.output_grad = grad["out"]
        run.backward_piece(i)

    fwd = [FillTask(name=f"f{i}", duration_s=1e-3, planned_start_s=1e-3 * i, run=lambda i=i: run.forward_piece(i),
                    needed_by=1) for i in range(n)]
    bwd = [FillTask(name=f"b{i}", duration_s=1e-3, planned_start_s=2.0 + 1e-3 * k, run=lambda i=i: backward(i),
                    ready=lambda: "out" in grad) for k, i in enumerate(range(n - 1, -1, -1))]

    class Done:
        def wait(self):
            pass

    filler = BubbleFiller.with_gaps(fwd + bwd, [1.0, 1.0], [("F", 0)], horizon_s=1.0, side=SideStream())
    with torch.cuda.stream(llm_stream()):
        filler.progress.begin_step()
        PipelineWaits(filler).wait([Done()])  # every forward piece fits in the window
        assert filler.stats.filled == n and filler.stats.forced == 0
        filler.progress.op_begin()
        filler.force(1)  # the op consuming the encoder's output: its stream waits for the last piece
        leaf = run.output().requires_grad_(True)
        leaf.square().sum().backward()  # the LLM's part, on its stream
        grad["out"] = leaf.grad
        filler.progress.op_end()
        filler.drain()  # the backward pieces on the side stream, then the LLM's stream waits
        got = [p.grad for p in encoder.parameters()]
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


# -- CPU gaps measured in the frame: late, long, chains, forcing by planned need -----------------------
class TimedWork:
    """A p2p work that completes at perf_counter time ``at``."""

    def __init__(self, at):
        self.at = at

    def wait(self):
        time.sleep(max(0.0, self.at - time.perf_counter()))
        return True


def sleeper(log, name, duration_s, start, **kw):
    return FillTask(name=name, duration_s=duration_s, planned_start_s=start,
                    run=lambda: (log.append(name), time.sleep(duration_s)), **kw)


def test_a_gap_entered_late_is_used_for_what_is_left():
    log = []
    filler = BubbleFiller.with_gaps([sleeper(log, f"t{i}", 0.03, 0.01 * i) for i in range(10)], [0.3, 0.0], [("F", 0)],
                          horizon_s=10.0, op_starts_s=[0.3])
    now = time.perf_counter()
    filler.progress.begin_step(frame0=now - 0.2)  # this rank enters the gap 0.2 s late: 0.1 s are left
    PipelineWaits(filler).wait([TimedWork(now + 0.1)])
    took = time.perf_counter() - now
    assert 2 <= len(log) <= 4 and took < 0.2, (log, took)
    assert filler.stats.waited_s < 0.05


def test_a_gap_that_runs_long_is_still_used():
    log = []
    filler = BubbleFiller.with_gaps([sleeper(log, f"t{i}", 0.03, 0.01 * i) for i in range(30)], [0.1, 0.0], [("F", 0)],
                          horizon_s=10.0, op_starts_s=[0.1])
    now = time.perf_counter()
    filler.progress.begin_step(frame0=now)
    PipelineWaits(filler).wait([TimedWork(now + 0.4)])  # predicted at 0.1 s, comes at 0.4 s
    took = time.perf_counter() - now
    # About 0.1 s filled before the predicted end, most of the 0.3 s overrun after it; the data
    # waits no longer than the overrun rule allows (a task no longer than the overrun so far).
    assert len(log) >= 8 and took < 0.4 + 0.1, (len(log), took)
    assert filler.progress.drift == pytest.approx(0.3, abs=0.05)  # the next gaps' ends move by what was seen


def test_another_chains_task_runs_while_this_ones_input_is_missing():
    log = []
    tasks = [sleeper(log, "a", 0.01, 0.0, chain=0, ready=lambda: False), sleeper(log, "a2", 0.01, 0.01, chain=0),
             sleeper(log, "b", 0.01, 0.02, chain=1)]
    filler = BubbleFiller.with_gaps(tasks, [1.0, 0.0], [("F", 0)], horizon_s=10.0, op_starts_s=[1.0])
    now = time.perf_counter()
    filler.progress.begin_step(frame0=now)
    PipelineWaits(filler).wait([TimedWork(now + 0.1)])
    assert log == ["b"]  # a waits for its input, a2 comes after a in its chain


def test_forwards_the_first_stage_needs_before_the_next_wait_are_forced():
    log = []
    tasks = [sleeper(log, "soon", 0.001, 0.0, needed_by=3, needed_at_s=0.05),
             sleeper(log, "later", 0.001, 0.01, needed_by=3, needed_at_s=0.5)]
    filler = BubbleFiller.with_gaps(tasks, [0.0, 0.0, 0.0], [("F", 0), ("B", 0)], horizon_s=10.0, fill=False,
                          op_starts_s=[0.0, 0.1], force_until_s=[0.2, 0.3])
    filler.progress.begin_step()
    PipelineWaits(filler).wait([TimedWork(time.perf_counter())])
    assert log == ["soon"] and filler.stats.forced == 1


def test_cost_history_takes_medians_and_keeps_what_was_not_measured():
    import numpy as np

    from pybubble.runtime import CostHistory, MeasuredCosts
    from pybubble.placement.measured import StepSample

    initial = MeasuredCosts(stage_fwd_s=[1.0, 1.0], stage_bwd_s=[2.0, 2.0], p2p_s=0.5, piece_fwd_s=[0.1, 0.2],
                            piece_bwd_s=[0.3, 0.4], optimizer_s=0.0, grad_sync_s=0.0)
    history = CostHistory(initial, keep=3)
    nan = float("nan")
    for f in (1.0, 3.0, 2.0, 10.0):  # the first falls out of the last 3
        rank0 = StepSample(stage_fwd=[f, nan], stage_bwd=[2 * f, nan], stage_wgrad=[f / 2, nan], lead=0.01,
                           sync=0.1, outside=0.2, plan=0.001, piece_fwd=[f / 10, nan], piece_bwd=[nan, nan])
        rank1 = StepSample(stage_fwd=[nan, f + 1], stage_bwd=[nan, nan], stage_wgrad=[nan, nan], lead=0.02,
                           sync=0.3, outside=nan, plan=0.001, piece_fwd=[3 * f / 10, nan], piece_bwd=[nan, nan])
        history.add(np.stack([rank0.vector(), rank1.vector()]))
        assert history.layout["piece_fwd"] == slice(14, 16) and rank0.vector()[history.layout["sync"]] == 0.1
    c = history.costs()
    assert c.stage_fwd_s == [3.0, 4.0] and c.stage_bwd_s == [6.0, 2.0]  # rank 1 saw no backward: kept
    assert c.stage_wgrad_s == [1.5, 1.0]  # stage 1's W not seen: half its backward
    assert c.piece_fwd_s == pytest.approx([0.6, 0.2]) and c.piece_bwd_s == [0.3, 0.4]
    assert c.p2p_s == 0.5 and c.grad_sync_s == pytest.approx(0.1)  # as the last rank to reach it saw it
    assert c.optimizer_s == pytest.approx(0.211)  # the worst rank's set-up + time between steps + planning
    assert c.tp_count == 0 and c.tp_gap_s == 0.0  # no tensor parallelism seen: kept
    with pytest.raises(ValueError, match=r"samples: shape \(1, 18\), expected \(2, 18\)"):
        history.add(np.zeros((1, 18)))


def test_stage_figures_split_the_ops_by_stage_and_kind():
    from pybubble.placement.measured import stage_figures

    ops = [("F", 0), ("F", 0), ("I", 0), ("W", 0), ("F", 1), ("F", 1), ("I", 1), ("W", 1), ("B", 0)]
    fwd, bwd, wgrad = stage_figures(ops, [0, 3, 3, 3, 0, 3, 3, 3, 0], [1, 2, 3, 4, 5, 6, 7, 9, 8], 4)
    assert fwd[0] == 3 and fwd[3] == 4 and bwd[0] == 8  # medians; stage 0 ran full backwards
    assert bwd[3] == 5 + 6.5 and wgrad[3] == 6.5  # I + W
    assert all(x != x for x in (fwd[1], bwd[2], wgrad[0]))  # NaN: not this rank's, or not run


class EventWork:
    """A stand-in for a ``dist.Work``: completes when ``event`` is set (by a task)."""

    def __init__(self):
        import threading

        self.event, self.returning = threading.Event(), threading.Event()

    def wait(self):
        self.event.wait(30)
        self.returning.set()
        return True

    def complete(self):
        """Completes the work and waits until its waiter saw it."""
        self.event.set()
        self.returning.wait(30)


def fill_until_arrival(estimate_s, completes_in, sleep_s, count=6):
    """A filler with ``count`` tasks estimated at ``estimate_s`` each, in one long gap, waiting for a
    work that task ``completes_in`` completes before sleeping ``sleep_s``: the tasks that ran."""
    work, log = EventWork(), []

    def run(i):
        log.append(i)
        if i == completes_in:
            work.complete()
        time.sleep(sleep_s)

    tasks = [FillTask(name=str(i), duration_s=estimate_s, planned_start_s=0.01 * i, run=lambda i=i: run(i))
             for i in range(count)]
    filler = BubbleFiller.with_gaps(tasks, [10.0, 0.0], [("F", 0)], horizon_s=20.0)
    filler.progress.begin_step()
    PipelineWaits(filler).wait([work])
    return filler, log


def test_an_op_is_held_up_by_at_most_the_piece_running_when_its_input_comes():
    # The input arrives while task 1 runs: task 1 ends, no task starts after it (the gap is given
    # up), and the hold-up is that piece's rest, no overrun (it ran within its estimate).
    filler, log = fill_until_arrival(0.2, completes_in=1, sleep_s=0.005)
    assert log == [0, 1]
    assert 0.0 < filler.stats.held_max_s <= filler.stats.held_s < 0.2  # within the piece's estimate
    assert filler.stats.overruns == 0
    assert filler.pace == 0.5  # tasks ran far under their estimates (kept at the floor)

    # A piece that runs far over its estimate holds the op up longer than one estimated piece:
    # counted as an overrun, and the pace of the tasks left follows (a task fits a gap when its
    # estimate times the pace does).
    filler, log = fill_until_arrival(0.002, completes_in=0, sleep_s=0.05)
    assert log == [0]
    assert filler.stats.held_max_s >= 0.04 and filler.stats.overruns == 1
    assert filler.pace == 3.0  # 25 times over its estimate: the ceiling
    task, too_long = filler.pick(0.005)  # 2 ms estimated, 6 ms at this pace: does not fit 5 ms
    assert task is None and too_long == pytest.approx(0.006)
