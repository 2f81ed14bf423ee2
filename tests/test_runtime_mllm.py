"""The test trainer (pybubble.testing.mllm, a user of pybubble.runtime.EncoderRuntime) as real
gloo processes: tiny models, a few steps; on CUDA where two GPUs are present."""

import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.distributed import pipelining  # noqa: E402

PLACEMENTS = ("megatron", "coarse", "pybubble")
FOUR_RANKS = ("--ranks", 4, "--microbatches", 4)
ENCODER_KINDS = {encoder: ("--ranks", 2, "--encoder", encoder) for encoder in ("timm", "clip")}
MULTI_STAGE = [
    (("--ranks", 2, "--schedule", "interleaved_1f1b", "--chunks", 2), PLACEMENTS),
    (("--ranks", 2, "--schedule", "zbv"), PLACEMENTS),
    (("--ranks", 2, "--schedule", "interleaved_zb", "--chunks", 2), ("pybubble",)),
    (("--ranks", 2, "--schedule", "gpipe"), ("pybubble",)),
    # two stages per rank beside data parallelism (4 processes on 2 cores: correctness only)
    (("--dp", 2, "--pp", 2, "--schedule", "interleaved_1f1b", "--chunks", 2), ("pybubble",)),
    # split backwards (I, W) beside FSDP2: its blocks resharded after the forward lost W's gradients
    (("--dp", 2, "--pp", 2, "--schedule", "zbv"), ("pybubble",)),
    (("--dp", 2, "--pp", 2, "--schedule", "interleaved_zb", "--chunks", 2), ("pybubble",)),
]
HAS_DUALPIPEV = hasattr(pipelining, "ScheduleDualPipeV")
DUALPIPEV = ("--ranks", 2, "--schedule", "dualpipev", "--microbatches", 4)
TRAINER_RUNS = [(FOUR_RANKS, PLACEMENTS), *((args, ("megatron", "pybubble")) for args in ENCODER_KINDS.values()),
                *MULTI_STAGE, *([(DUALPIPEV, ("pybubble",))] if HAS_DUALPIPEV else [])]
"""The trainer's configurations these tests train on CPU ranks (trainer_reports trains those of one
world size in one launch)."""


def checksums(reports: dict[str, dict], device="cpu") -> tuple[dict[str, float], float]:
    """Each mode's parameter checksum after 3 steps (trainer_reports' launch), and the single-process
    reference's."""
    for report in reports.values():
        assert len(report["step_times_s"]) == 3 and report["median_step_s"] > 0 and report["predicted_step_s"] > 0
        assert len(report["predicted_steps_s"]) == 3 and report["device"] == device
        assert report["reference_checksum"] == next(iter(reports.values()))["reference_checksum"]  # computed once
    return {m: r["param_checksum"] for m, r in reports.items()}, report["reference_checksum"]


def test_three_modes_reach_the_single_process_parameters(pp2_reports):
    sums, reference = checksums(pp2_reports)
    assert list(sums) == list(PLACEMENTS)
    for mode, s in sums.items():
        assert s == pytest.approx(reference, rel=1e-6), mode


def test_four_ranks_reach_the_single_process_parameters(trainer_reports):
    # More processes than this machine's cores: a correctness run.
    sums, reference = checksums(trainer_reports(*FOUR_RANKS))
    for mode, s in sums.items():
        assert s == pytest.approx(reference, rel=1e-6), mode


@pytest.mark.parametrize("encoder", ["timm", "clip"])
def test_real_encoders_reach_the_single_process_parameters(trainer_reports, encoder):
    sums, reference = checksums(trainer_reports(*ENCODER_KINDS[encoder], modes=("megatron", "pybubble")))
    for mode, s in sums.items():
        assert s == pytest.approx(reference, rel=1e-6), mode


@pytest.fixture(scope="module")
def one_f_one_b(pp2_reports) -> float:
    """The pybubble mode's checksum under --schedule 1f1b (2 ranks, tiny, 3 steps)."""
    return checksums(pp2_reports)[0]["pybubble"]


@pytest.mark.parametrize("schedule, modes", MULTI_STAGE)
def test_multi_stage_schedules_reach_the_parameters_of_1f1b(trainer_reports, one_f_one_b, schedule, modes):
    # The same GPT cut into pp x V stages: the modes agree with each other, with the unsplit
    # single-process training and with --schedule 1f1b.
    sums, reference = checksums(trainer_reports(*schedule, modes=modes))
    for mode, s in sums.items():
        assert s == pytest.approx(reference, rel=1e-6), mode
        assert s == pytest.approx(one_f_one_b, rel=1e-6), mode


@pytest.mark.skipif(not HAS_DUALPIPEV, reason="torch has no DualPipeV")
def test_dualpipev_reaches_the_single_process_parameters(trainer_reports):
    sums, reference = checksums(trainer_reports(*DUALPIPEV, modes=("pybubble",)))
    assert sums["pybubble"] == pytest.approx(reference, rel=1e-6)


def test_profile_writes_traces_that_pybubble_measure_reads(tmp_path, pp2_reports):
    prof = Path(pp2_reports["coarse"]["profile_dir"])  # several modes: one folder each
    assert sorted(p.name for p in prof.parent.iterdir()) == sorted(PLACEMENTS)
    assert sorted(p.name for p in prof.iterdir()) == ["plan.json", "rank0.json", "rank1.json"]
    out = subprocess.run([sys.executable, "-m", "pybubble", "measure", str(prof), "--predict", str(prof / "plan.json"),
                          "--json", str(tmp_path / "m.json")], capture_output=True, text=True, timeout=60,
                         cwd=Path(tempfile.gettempdir()))
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "m.json").read_text())
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for rank in doc["ranks"]:
        assert rank["phases_known"] and rank["busy"] > 0 and rank["idle"] >= 0
        assert rank["idle"] == pytest.approx(sum(rank["idle_by_kind"].values()))
        assert rank["waiting"] + rank["transferring"] == pytest.approx(rank["idle"])
    assert len(doc["prediction"]["ranks"]) == 2


STAND_IN_SIDE = textwrap.dedent("""
    # The trainer with the filler in its CUDA mode (launches, events, window budget by measured
    # durations) on CPU ranks: a stand-in side stream runs each launched task at once. The first
    # stage's forwards take 0.1 s more, so the last stage waits that long for each microbatch,
    # whatever the machine's load: the windows the plan fills there open on every run.
    import json, sys, time
    import pybubble.testing.mllm as mllm
    import pybubble.runtime.encoder_runtime as encoder_runtime

    first_forward = mllm.FirstStage.forward

    def slow_first_forward(self, *args, **kwargs):
        time.sleep(0.1)
        return first_forward(self, *args, **kwargs)

    mllm.FirstStage.forward = slow_first_forward

    class SynchronousSide:
        def log(self, what):
            with open("side.log", "a") as f:  # in the test's folder, from every rank
                f.write(what)

        def launch(self, fn):
            self.log("l")
            fn()

        def mark(self):
            return None

        def join(self, event):
            self.log("j")

        def drain(self):
            self.log("d")

    encoder_runtime.side_stream = lambda device: SynchronousSide()  # also in the spawned ranks (they import this file)

    if __name__ == "__main__":
        print(json.dumps(mllm.launch_job(mllm.parse_args(sys.argv[1:]))))
""")


@pytest.mark.distributed
def test_the_cuda_mode_filler_in_the_trainer_reaches_the_reference(tmp_path):
    script = tmp_path / "stand_in_side.py"
    script.write_text(STAND_IN_SIDE)
    args = ["--ranks", "2", "--steps", "3", "--size", "tiny", "--mode", "pybubble", "--timeout", "30", "--reference",
            "--piece-ms", "0",  # kernel pieces: the tiny encoder's tasks fit the windows, whatever the profile says
            "--dump-plan", str(tmp_path / "plans")]
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                       timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.strip().splitlines()[-1])
    # the plans put encoder tasks inside the pipeline's windows; whether a launch then lands inside
    # one of the tiny model's waits or at the drain is the machine's load (a CI run launched none
    # inside): the gap launches are tested with waits of their own (tests/test_runtime_filler.py)
    plans = [json.loads((tmp_path / "plans" / f"rank{k}.plan.json").read_text()) for k in (0, 1)]
    assert any(0.0 < t["planned_start_s"] < p["horizon_s"] for p in plans for t in p["tasks"])
    assert len(report["filled_per_step"]) == 2 and all(len(steps) == 3 for steps in report["filled_per_step"])
    log = (tmp_path / "side.log").read_text()
    assert log.count("d") == 2 * 3 and "l" in log and "j" in log  # the stand-in ran every rank's tasks
    assert report["param_checksum"] == pytest.approx(report["reference_checksum"], rel=1e-6)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (NCCL, one GPU per rank)")
def test_three_modes_reach_the_same_parameters_on_cuda(trainer_reports):
    # float32 on the GPU: other kernels and summation orders than the CPU reference's.
    sums, reference = checksums(trainer_reports("--ranks", 2, device="cuda"), device="cuda")
    for mode, s in sums.items():
        assert s == pytest.approx(sums["megatron"], rel=1e-5), mode
        assert s == pytest.approx(reference, rel=1e-5), mode


def test_a_failing_rank_ends_every_rank_within_the_timeout(trainer_cli):
    t = time.monotonic()
    r = trainer_cli("--ranks", 2, "--steps", 3, "--size", "tiny", "--mode", "pybubble", "--fail-rank", 1, "--fail-step", 1,
             "--timeout", 10)
    assert r.returncode == 1
    assert "rank 1: error: RuntimeError: injected fault on rank 1 at step 1" in r.stderr
    assert "rank 0: error:" in r.stderr  # the other rank ended with an error, not a hang
    assert r.stderr.strip().splitlines()[-1].startswith("error: training failed (rank 0 exit 1, rank 1 exit 1)")
    assert time.monotonic() - t < 60


@pytest.mark.parametrize("args, message", [
    (["--mode", "fast"], "error: mode: 'fast' is not one of megatron, coarse, pybubble"),
    (["--mode", "coarse,megatron,coarse"], "error: mode: 'coarse,megatron,coarse' names a mode twice"),
    (["--ranks", 1], "error: ranks: 1 is not >= 2"),
    (["--size", "huge"], "error: size: 'huge' is not one of small, tiny"),
    (["--encoder", "resnet"], "error: encoder: 'resnet' is not one of vit, timm, clip, qwen2_5_vl, titan_vit"),
    (["--fail-rank", 5], "error: fail_rank: 5 is not a rank (< 2)"),
    (["--device", "tpu"], "error: device: 'tpu' is not one of cpu, cuda"),
    (["--ranks", 4, "--size", "tiny"], "error: pp: 4 exceeds the 2 microbatches of size 'tiny'"),
    (["--dp", 2, "--pp", 3, "--size", "tiny"], "error: pp: 3 exceeds the 2 microbatches of size 'tiny'"),
    (["--dp-wrap", "zero"], "error: dp_wrap: 'zero' is not one of fsdp, ddp"),
    (["--piece-ms", -1], "error: piece_ms: -1.0 is not a number of milliseconds >= 0"),
    (["--piece-ms", "nan"], "error: piece_ms: nan is not a number of milliseconds >= 0"),
    (["--fault", "crash"], "error: fault: 'crash' is not one of raise, kill, stall, encoder, slow, tile_shape, empty_step"),
    (["--schedule", "looped"], "error: schedule: 'looped' is not one of 1f1b, gpipe, interleaved_1f1b, "
                               "interleaved_zb, zbv, dualpipev"),
    (["--schedule", "1f1b", "--chunks", 2], "error: chunks: 2 stages per rank, but 1f1b runs one"),
    (["--schedule", "zbv", "--chunks", 3], "error: chunks: 3 stages per rank, but zbv runs two (a V)"),
    (["--schedule", "interleaved_1f1b", "--chunks", 3],
     "error: chunks: the 4 GPT blocks of size 'small' do not split into 2 x 3 stages"),
    (["--schedule", "dualpipev", "--size", "tiny"],
     "error: microbatches: dualpipev needs at least one per stage (4), size 'tiny' has 2"),
    (["--schedule", "zbv", "--dp", 2, "--pp", 2, "--dp-wrap", "ddp"],
     "error: dp_wrap: 'ddp' beside --schedule zbv, which splits the backward (I, W): torch computes W's weight "
     "gradients with autograd.grad, which DDP's all-reduce never sees (pytorch/pytorch#144530), so the replicas' "
     "gradients are not averaged; see docs/runtime.md, 'Zero-bubble schedules beside data parallelism'; use "
     "--dp-wrap fsdp"),
    (["--tp", 0], "error: tp: 0 is not >= 1"),
    (["--tp", 3, "--ranks", 3], "error: tp: 3 does not divide the 4 heads of size 'small'"),
    (["--tp", 2, "--ranks", 3], "error: pp: dp 1 x pp 1 x tp 2 is not the 3 ranks"),
    (["--tp", 2, "--pp", 2, "--dp", 2], "error: tp: 2 beside dp 2: the trainer runs tensor parallelism without "
                                       "data parallelism"),
    (["--tp", 2, "--pp", 2, "--schedule", "zbv"], "error: tp: 2 beside --schedule zbv, which splits the backward "
                                                  "(I, W): the runtime predicts TP gaps in whole forwards and "
                                                  "backwards only; use 1f1b, gpipe or interleaved_1f1b"),
    (["--tp", 2, "--schedule", "interleaved_1f1b", "--chunks", 2],
     "error: schedule: 'interleaved_1f1b' with --pp 1 (tensor parallelism alone) is not run by the trainer; use "
     "1f1b or gpipe"),
])
def test_bad_arguments_exit_2_with_one_line(trainer_main, args, message):
    code, err = trainer_main(*args)
    assert code == 2
    assert err.strip() == message


def test_the_command_exits_2_with_one_line_on_a_bad_argument(trainer_cli):
    # The command line itself (the cases above call its main in this process).
    r = trainer_cli("--mode", "megatron,fast")
    assert r.returncode == 2
    assert r.stderr.strip() == "error: mode: 'fast' is not one of megatron, coarse, pybubble"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a CUDA device")
def test_cuda_without_a_gpu_exits_2_with_one_line(trainer_main):
    code, err = trainer_main("--device", "cuda", "--size", "tiny", "--steps", 1)
    assert code == 2
    assert err.strip() == ("error: device: 'cuda' but no CUDA device is available "
                           "(torch.cuda.is_available() is False)")


def test_dump_plan_writes_each_ranks_plan_that_loads_back_equal(trainer_cli, tmp_path):
    from pybubble.placement.plan import RankPlan

    r = trainer_cli("--ranks", 2, "--steps", 2, "--size", "tiny", "--mode", "pybubble", "--dump-plan", tmp_path / "plans")
    assert r.returncode == 0, r.stderr
    plans = [RankPlan.read(tmp_path / "plans" / f"rank{k}.plan.json") for k in (0, 1)]
    for k, plan in enumerate(plans):
        doc = json.loads((tmp_path / "plans" / f"rank{k}.plan.json").read_text())
        assert RankPlan.from_json(doc) == plan and plan.to_json() == doc
        assert plan.rank == k and plan.mode == "pybubble" and plan.ops
    # the step's encoder microbatches, each on its producer, every piece forward and backward
    chains = sorted({t.chain for p in plans for t in p.tasks})
    assert chains == list(range(len(plans[0].producer)))
    assert all(plans[0].producer[t.chain] == p.rank for p in plans for t in p.tasks)
