"""The test trainer (pybubble.testing.mllm) launched the way trainers launch: torchrun
(``python -m torch.distributed.run``, env:// rendezvous), a DeviceMesh ("pp", "dp"), FSDP2 or DDP
on the LLM's stages; and faults in that launch. Real gloo processes, tiny models, few steps."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.distributed

TRAINER = "pybubble.testing.mllm"
"""The test trainer's module (torchrun runs it with --module)."""
MODES = ("megatron", "coarse", "pybubble")
DP2_PP2 = [("fsdp", "dp"), ("ddp", "dp"), ("fsdp", "dp_shard")]
"""--dp-wrap and --dp-dim of the dp 2 x pp 2 runs. dp_shard: the mesh ("pp", "dp_shard") as
torchtitan names it, FSDP2 over dp_shard; the runtime finds the replicas."""


def torchrun(nproc, *args, timeout=240):
    """The test trainer under torchrun (--standalone: a free port, so runs side by side do not meet)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "--module", TRAINER, *map(str, args)]
    # Outside the source tree so that the installed package (with its extension) is imported.
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=Path(tempfile.gettempdir()))


def run_args(path, *args, modes=MODES, steps=3) -> list[str]:
    """The trainer's arguments for ``steps`` steps of each mode, with the single-process reference,
    the report written to `path`."""
    return ["--steps", str(steps), "--size", "tiny", "--mode", ",".join(modes), "--timeout", "30", "--report",
            str(path), *map(str, args), "--reference"]


def read_reports(path, nproc, modes=MODES, steps=3) -> dict[str, dict]:
    """Each mode's report (written by a torchrun launch of `nproc` processes)."""
    out = json.loads(path.read_text())
    out = out if len(modes) > 1 else {modes[0]: out}
    assert list(out) == list(modes)
    for mode in modes:
        assert out[mode]["mode"] == mode and "reference_checksum" in out[mode]
        assert out[mode]["launcher"] == "torchrun" and out[mode]["ranks"] == nproc
        assert len(out[mode]["step_times_s"]) == steps and len(out[mode]["waits"]) == nproc
    return out


def reports(tmp_path, nproc, *args, modes=MODES, steps=3):
    """Each mode's report after ``steps`` steps, with the single-process reference's checksum: one
    torchrun launch of the trainer, its processes train the modes in turn."""
    path = tmp_path / "report.json"
    r = torchrun(nproc, *run_args(path, *args, modes=modes, steps=steps), timeout=240 * len(modes))
    assert r.returncode == 0, r.stderr[-3000:]
    return read_reports(path, nproc, modes, steps)


@pytest.fixture(scope="module")
def dp2_pp2_reports(tmp_path_factory) -> dict[tuple[str, str], dict[str, dict]]:
    """Each mode's report of each dp 2 x pp 2 run (DP2_PP2) by (wrap, dim): one torchrun launch of 4
    processes trains them in turn (``--runs``)."""
    folder = tmp_path_factory.mktemp("dp2_pp2")
    argvs = [run_args(folder / f"{wrap}_{dim}.json", "--dp", 2, "--pp", 2, "--dp-wrap", wrap, "--dp-dim", dim)
             for wrap, dim in DP2_PP2]
    (folder / "runs.json").write_text(json.dumps(argvs))
    r = torchrun(4, "--runs", folder / "runs.json", timeout=240 * len(MODES) * len(DP2_PP2))
    assert r.returncode == 0, r.stderr[-3000:]
    return {(wrap, dim): read_reports(folder / f"{wrap}_{dim}.json", 4) for wrap, dim in DP2_PP2}


def test_three_modes_under_torchrun_reach_the_single_process_parameters(tmp_path):
    # no --ranks: torchrun started the processes; kernel pieces, which fit the tiny model's waits
    # (merged, they would run before and after the pipeline)
    got = reports(tmp_path, 2, "--piece-ms", 0, "--dump-plan", tmp_path / "plans")
    reference = got["pybubble"]["reference_checksum"]
    for mode, report in got.items():
        assert report["param_checksum"] == pytest.approx(reference, rel=1e-6), mode
        assert report["pp"] == 2 and report["dp"] == 1
        for rank in report["waits"]:  # no data parallelism, no tensor parallelism: not observed
            assert rank["dp"] is None and rank["tp"] is None
            assert rank["pp"]["waited_s"] >= 0 and rank["pp"]["filled_s"] >= 0
        # the last stage waits for the first stage's forwards in every step: a pp wait is seen
        assert report["waits"][1]["pp"]["waited_s"] > 0, mode
    # Only pybubble plans encoder tasks inside the pipeline (megatron: stage 0's encoder at the
    # step's start and its backward at the end; coarse: before and after). Whether a task then
    # fits a wait of a few milliseconds depends on the machine's load: the filler's runs in real
    # gloo waits are tested with waits of a quarter second (test_runtime_filler).
    for mode in MODES:
        plans = [json.loads((tmp_path / "plans" / mode / f"rank{r}.plan.json").read_text()) for r in range(2)]
        inside = [t for p in plans for t in p["tasks"] if 0.0 < t["planned_start_s"] < p["horizon_s"]]
        assert bool(inside) == (mode == "pybubble"), (mode, inside)
    assert sum(r["pp"]["filled_s"] for r in got["megatron"]["waits"]) == 0


@pytest.mark.parametrize("wrap, dim", DP2_PP2)
def test_dp2_pp2_reaches_the_parameters_of_pp2(dp2_pp2_reports, wrap, dim):
    # 4 processes on this machine's 2 cores: a correctness run, not a timing.
    got = dp2_pp2_reports[wrap, dim]
    reference = got["pybubble"]["reference_checksum"]  # one process, the whole batch: what pp 2 reaches
    for mode, report in got.items():
        assert report["param_checksum"] == pytest.approx(reference, rel=1e-6), mode
        assert report["dp"] == 2 and report["pp"] == 2 and report["dp_wrap"] == wrap
        # every rank's LLM stage is data-parallel: its gradient collective was waited for
        assert all(r["dp"] is not None for r in report["waits"]), mode
        assert sum(r["dp"]["waited_s"] + r["dp"]["filled_s"] for r in report["waits"]) > 0, mode
    assert sum(r["dp"]["filled_s"] for r in got["megatron"]["waits"]) == 0


def _failed_within_the_timeout(r, t0, limit=60):
    assert r.returncode != 0  # torchrun reports the failed worker
    assert "ChildFailedError" in r.stderr
    assert time.monotonic() - t0 < limit


@pytest.mark.parametrize("fault, error", [
    # SIGKILL in the middle of a forward: the peer's next receive fails, torchrun ends the rest
    ("kill", "exitcode  : -9"),
    # sleeps far past its ops: the peer's collective times out (--timeout 10), torchrun ends the sleeper
    ("stall", "rank 0: error:"),
    # raises inside an encoder piece run by the filler
    ("encoder", "rank 1: error: RuntimeError: injected fault in encoder piece"),
])
def test_a_failing_rank_under_torchrun_ends_every_rank_within_the_timeout(fault, error):
    t0 = time.monotonic()
    r = torchrun(2, "--steps", 3, "--size", "tiny", "--mode", "pybubble", "--timeout", 10, "--fail-rank", 1,
                 "--fail-step", 1, "--fault", fault, timeout=120)
    _failed_within_the_timeout(r, t0)
    assert error in r.stderr
    assert "rank 0: error:" in r.stderr  # the healthy rank ended with an error, it did not hang


SIGTERM_RANK = """
import os, signal, time
from pybubble.runtime.launcher import _free_port, run_rank
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
run_rank(lambda rank: None)  # returns: the default handler is back
print("restored", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)

def ended(rank):
    os.kill(os.getpid(), signal.SIGTERM)  # what torchrun sends a healthy rank when another failed
    time.sleep(30)

run_rank(ended)
"""


def test_a_rank_ended_by_its_launcher_says_so_like_a_failed_one():
    # torchrun ends every worker with SIGTERM once one failed; a rank it ends while computing
    # (before its own receive from the failed rank fails) must still say how it ended.
    r = subprocess.run([sys.executable, "-c", SIGTERM_RANK], capture_output=True, text=True, timeout=60,
                       cwd=tempfile.gettempdir())
    assert r.stdout.split() == ["restored", "True"]
    assert r.returncode == 1
    assert r.stderr.strip() == ("rank 0: error: Terminated: signal SIGTERM: the launcher ended this rank "
                                "(another rank failed, or the job was stopped)")


def test_a_straggler_under_torchrun_finishes_with_the_same_parameters(tmp_path):
    # Rank 1's LLM forwards take twice as long in every step: slower, not wrong.
    path = tmp_path / "slow.json"
    r = torchrun(2, "--steps", 3, "--size", "tiny", "--mode", "pybubble", "--timeout", 30, "--fail-rank", 1,
                 "--fault", "slow", "--report", path, "--reference", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(path.read_text())
    assert report["param_checksum"] == pytest.approx(report["reference_checksum"], rel=1e-6)


BAD_GROUPS = textwrap.dedent("""
    # One gloo rank: EncoderRuntime refuses groups and counts it cannot run on, naming the field.
    import os, torch, torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleZBVZeroBubble
    from pybubble.runtime import EncoderRuntime, RuntimeOptions, TrainerGroups

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"], RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    stage = PipelineStage(nn.Linear(4, 4), 0, 1, torch.device("cpu"))
    schedule = Schedule1F1B(stage, 2, loss_fn=lambda y, t: y.sum())
    encoder = nn.Sequential(nn.Linear(4, 4))
    cases = {
        "no pp": dict(groups=init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))),
        "both": dict(groups=TrainerGroups(mesh=init_device_mesh("cpu", (1,), mesh_dim_names=("pp",)), pp=dist.group.WORLD)),
        "zero": dict(options={"microbatches": 0}),
    }
    ddp = nn.parallel.DistributedDataParallel(nn.Linear(4, 4))
    ddp.register_comm_hook(None, lambda state, bucket: None)  # the trainer's own hook: DDP takes one
    ddp_stage = PipelineStage(ddp, 0, 1, torch.device("cpu"))
    cases["hooked"] = dict(stage=ddp_stage, schedule=Schedule1F1B(ddp_stage, 2, loss_fn=lambda y, t: y.sum()))
    # DDP under a schedule that splits the backward: W's gradients bypass its all-reduce (torch's)
    v = [PipelineStage(nn.parallel.DistributedDataParallel(nn.Linear(4, 4)), s, 2, torch.device("cpu"))
         for s in (0, 1)]
    cases["zero-bubble ddp"] = dict(stage=v, schedule=ScheduleZBVZeroBubble(v, 2, loss_fn=lambda y, t: y.sum()))
    for name, kwargs in cases.items():
        kwargs = {"stage": stage, "schedule": schedule, **kwargs}
        try:
            options = RuntimeOptions(mode="pybubble", **kwargs.pop("options", {}))
            EncoderRuntime(encoder, example=torch.ones(2, 4), options=options, **kwargs)
        except ValueError as e:
            print(f"{name}: {e}".splitlines()[0])
    dist.destroy_process_group()
""")


def test_bad_groups_and_counts_raise_value_errors_naming_the_field():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-c", BAD_GROUPS], capture_output=True, text=True, timeout=120,
                       cwd=Path(tempfile.gettempdir()), env={**os.environ, "PORT": str(port)})
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[:3] == [
        "no pp: mesh: no 'pp' dimension (its dimensions: ('dp',)); name the pipeline's dimension with "
        "roles={'pp': ..., 'dp': ..., 'tp': ...}",
        "both: mesh: give one of parallel_dims, mesh (with roles) or pp_group/dp_group/tp_group, not mesh and pp_group",
        "zero: microbatches: 0 is not an integer >= 1",
    ]
    assert len(lines) == 5 and lines[3].startswith("hooked: stage: its DDP module already has a communication hook (")
    assert lines[4] == ("zero-bubble ddp: stage: a DDP module beside ScheduleZBVZeroBubble, which splits backwards "
                        "into I and W: torch computes W's gradients with autograd.grad, which DDP's all-reduce never "
                        "sees (pytorch/pytorch#144530), so the replicas' gradients would not be averaged "
                        "(docs/runtime.md, 'Zero-bubble schedules beside data parallelism'); shard it with FSDP2")
