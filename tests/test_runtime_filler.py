"""The bubble filler inside real gloo waits (two processes), and the pipelining adapter's guard."""

import json
import socket
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from pybubble.runtime import BubbleFiller, FillTask, check_torch_version, fill_pipeline_waits  # noqa: E402

WORKER = textwrap.dedent("""
    import json, sys, time, datetime
    import torch, torch.distributed as dist
    from pybubble.runtime import BubbleFiller, FillTask
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
        # 1. Fill a 0.25 s gap while the receive (0.4 s away) has not completed; defer what overruns.
        filler = BubbleFiller([task(i) for i in range(40)], [0.25, 0.0], [("F", 0)], horizon_s=10.0)
        filler.begin_step()
        t = time.perf_counter()
        filler.wait([dist.irecv(buf, 1)])
        waited = time.perf_counter() - t
        filled = len(log)
        filler.op_begin(); filler.op_end()
        filler.drain()
        out = {"waited": waited, "filled": filled, "deferred": filler.stats.deferred,
               "order": log == list(range(40)), "received": buf.tolist()}
        # 2. A task whose input has not arrived stops the filling; a forward task that the next op
        #    depends on runs before the rank blocks, even with filling off.
        log.clear()
        dist.barrier()
        filler = BubbleFiller([task(0, needed_by=3), task(1, ready=lambda: False), task(2)], [1.0, 0.0],
                              [("F", 3)], horizon_s=10.0)
        filler.begin_step()
        filler.wait([dist.irecv(buf, 1)])
        out["blocked"] = list(log)
        out["forced"] = filler.stats.forced
        print(json.dumps(out))
    dist.destroy_process_group()
""")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_filler_runs_tasks_while_a_gloo_receive_is_pending(tmp_path):
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path) for r in (0, 1)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    res = json.loads(outs[0][0].strip().splitlines()[-1])
    assert res["received"] == [1.0] * 4
    # About 0.25 s of 0.02 s tasks fit in the gap; the one that would overrun it was deferred.
    assert 8 <= res["filled"] <= 13, res
    assert res["deferred"] == 1
    # The wait still lasted until the data came (0.4 s), not until the tasks ran out.
    assert 0.35 <= res["waited"] < 0.8, res
    assert res["order"]  # drain ran the rest, in plan order
    assert res["blocked"] == [0] and res["forced"] == 1


def test_filler_checks_its_gaps():
    with pytest.raises(ValueError, match="gaps_s: 1 gaps for 1 ops"):
        BubbleFiller([], [0.1], [("F", 0)], horizon_s=1.0)


def test_adapter_refuses_unsupported_torch():
    check_torch_version("2.13.0+cpu")
    with pytest.raises(RuntimeError, match=r"torch 2.12.1 is not supported .* supported: 2.13"):
        check_torch_version("2.12.1")
    with pytest.raises(RuntimeError, match="torch 3.0.0 is not supported"):
        check_torch_version("3.0.0")


def test_adapter_restores_the_schedules_module():
    import torch.distributed.pipelining.schedules as schedules

    class Stage:
        def forward_one_chunk(self):
            return "f"

        def backward_one_chunk(self):
            return "b"

    original = schedules._wait_batch_p2p
    stage = Stage()
    filler = BubbleFiller([FillTask(name="x", duration_s=0.0, planned_start_s=0.0, run=lambda: None)],
                          [0.0, 0.0], [("F", 0)], horizon_s=1.0)
    with fill_pipeline_waits(filler, stage):
        assert schedules._wait_batch_p2p == filler.wait
        assert stage.forward_one_chunk() == "f" and filler._op == 1
    assert schedules._wait_batch_p2p is original
    assert "forward_one_chunk" not in vars(stage)
