"""`pybubble calibrate --trace`: the cost model fitted to a measured step. On traces the simulator
writes with known op factors the fit recovers them, and the calibrated config predicts steps the
fit never saw (other schedules, microbatch counts); bad traces and traces of another job are one
error line."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pybubble
from pybubble.config.schema import load_config
from pybubble.costs.roofline import OP_KINDS
from pybubble.llm.step import LLMStep
from pybubble.measure.fit import fit_step, fit_steps, read_step, read_steps
from pybubble.planner.layouts import megatron
from pybubble.planner.report import plan

ROOT = Path(__file__).resolve().parent.parent

JOB = {"cluster": {"gpus": 8, "gpu": "h100"}, "llm": {"preset": "llama-3-8b", "layers": 8},
       "encoders": [{"preset": "vit-l-14", "tokens_per_sample": 1028}],
       "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 2048},
       "llm_plan": {"dp": 2, "pp": 4, "tp": 1, "schedule": "1f1b"}}
"""A job with every op kind a trace of it measures: LLM forward and backward, pipeline sends, the
data-parallel all-gather and reduce-scatter, the encoder's forward and backward."""
KNOWN = {"llm_fwd": 1.31, "llm_bwd": 1.22, "p2p": 2.5, "all_gather": 1.8, "reduce_scatter": 0.6,
         "encoder_fwd": 1.42, "encoder_bwd": 0.88}
"""The factors the 'measured' steps run at."""


def job(tmp_path, factors=None, **changes):
    """The job's config (with `changes` per section) and, with `factors`, a calibration holding them."""
    doc = json.loads(json.dumps(JOB))
    for section, values in changes.items():
        doc[section].update(values)
    if factors is not None:
        calib = tmp_path / f"known{len(list(tmp_path.glob('known*.json')))}.json"
        calib.write_text(json.dumps({"format": "pybubble.calibration/1", "op_factors": factors}))
        doc["cluster"]["calibration"] = str(calib)
    return load_config(doc)


def megatron_trace(tmp_path, name, factors, **changes):
    """The simulator's trace of the Megatron-LM layout (the encoder inside stage 0's ops) at `factors`."""
    tl = megatron(LLMStep.of(job(tmp_path, factors, **changes))).timeline
    path = tmp_path / f"{name}.json"
    pybubble.save_trace(tl, path)
    return path, tl


def test_the_fit_recovers_known_factors_from_a_megatron_trace(tmp_path):
    path, _ = megatron_trace(tmp_path, "megatron", KNOWN)
    fit = fit_step(job(tmp_path), read_step(path))
    assert set(fit.factors) == set(KNOWN)
    for kind, want in KNOWN.items():
        assert fit.factors[kind] == pytest.approx(want, rel=0.02), kind
    assert max(abs(r) for rs in fit.residuals.values() for r in rs) < 0.02


def test_the_fit_recovers_known_factors_from_pybubbles_plan_trace(tmp_path):
    """The plan's trace: the encoder's kernels in the bubbles (summed per microbatch and phase)."""
    report = plan(job(tmp_path, KNOWN), workers=1)
    path = tmp_path / "plan.trace.json"
    report.save_trace(path)
    fit = fit_step(job(tmp_path), read_step(path))
    for kind, want in KNOWN.items():
        assert fit.factors[kind] == pytest.approx(want, rel=0.02), kind


def test_the_fit_recovers_the_weight_gradient_of_a_zero_bubble_schedule(tmp_path):
    known = {**KNOWN, "llm_wgrad": 0.45}
    path, _ = megatron_trace(tmp_path, "zb", known, llm_plan={"schedule": "zb_h1"})
    fit = fit_step(job(tmp_path, llm_plan={"schedule": "zb_h1"}), read_step(path))
    for kind, want in known.items():
        assert fit.factors[kind] == pytest.approx(want, rel=0.02), kind


@pytest.mark.parametrize("schedule,microbatches", [("gpipe", 8), ("interleaved_1f1b", 16), ("zb_h1", 4)])
def test_a_calibration_predicts_a_schedule_the_fit_never_saw(tmp_path, schedule, microbatches):
    """Fitted on the 1F1B step at 8 microbatches, the calibrated config predicts the step of another
    schedule and microbatch count as the simulator runs it at the known factors."""
    path, _ = megatron_trace(tmp_path, "megatron", KNOWN)
    fit = fit_step(job(tmp_path), read_step(path))
    other = {"llm_plan": {"schedule": schedule, "vpp": 2 if schedule == "interleaved_1f1b" else 1},
             "training": {"global_batch": 2 * microbatches}}
    _, truth = megatron_trace(tmp_path, "truth", KNOWN, **other)
    predicted = megatron(LLMStep.of(job(tmp_path, fit.factors, **other))).step_time
    uncalibrated = megatron(LLMStep.of(job(tmp_path, **other))).step_time
    assert predicted == pytest.approx(truth.step_time, rel=0.02)
    assert abs(uncalibrated / truth.step_time - 1) > 0.05  # the calibration is what makes it right


def test_calibrate_command_writes_a_calibration_that_plan_reads(tmp_path):
    path, _ = megatron_trace(tmp_path, "megatron", KNOWN)
    cfg = tmp_path / "job.yaml"
    cfg.write_text(json.dumps(JOB))
    out = tmp_path / "calib.json"
    r = run("calibrate", "--trace", path, "--config", cfg, "-o", out)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["format"] == "pybubble.calibration/1" and set(doc["op_factors"]) == set(KNOWN) <= set(OP_KINDS)
    assert "llm_fwd" in r.stdout and r.stdout.strip().splitlines()[-1].startswith("calibrate: trace=")
    calibrated = tmp_path / "calibrated.yaml"
    calibrated.write_text(json.dumps({**JOB, "cluster": {**JOB["cluster"], "calibration": str(out)}}))
    r = run("plan", calibrated)
    assert r.returncode == 0, r.stderr
    want = plan(job(tmp_path, KNOWN), workers=1).baselines["megatron"].step_time / 1e3
    megatron_ms = float(next(line for line in r.stdout.splitlines() if line.startswith("megatron ")).split()[1]
                        .replace(",", ""))
    assert megatron_ms == pytest.approx(want, rel=0.02)


def run(*args):
    return subprocess.run([sys.executable, "-m", "pybubble", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT.parent)


def one_error_line(r, message):
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr


@pytest.mark.parametrize("content,message", [
    ("{not json", "not valid JSON"),
    ('{"traceEvents": [{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 0, "dur": 5}]}', "no pipeline ops"),
    ('{"traceEvents": [{"ph": "X", "name": "PP:0F0", "cat": "user_annotation", "ts": "soon", "dur": 5}]}', "ts"),
    ("", "empty"),
])
def test_a_bad_trace_is_one_error_line(tmp_path, content, message):
    trace = tmp_path / "rank0.json"
    trace.write_text(content)
    cfg = tmp_path / "job.yaml"
    cfg.write_text(json.dumps(JOB))
    one_error_line(run("calibrate", "--trace", trace, "--config", cfg, "-o", tmp_path / "c.json"), message)
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("change,message", [
    ({"cluster": {"gpus": 16}, "llm_plan": {"pp": 8}}, "ranks: the trace has 4 ranks"),  # another rank count
    ({"cluster": {"gpus": 4}, "llm_plan": {"pp": 4, "dp": 1}, "training": {"global_batch": 8}},
     None),  # fits: the same pipeline without data parallelism
])
def test_a_config_of_another_job_is_one_error_line(tmp_path, change, message):
    path, _ = megatron_trace(tmp_path, "megatron", KNOWN, llm_plan={"dp": 1}, cluster={"gpus": 4},
                             training={"global_batch": 8})
    doc = json.loads(json.dumps(JOB))
    for section, values in change.items():
        doc[section].update(values)
    cfg = tmp_path / "job.yaml"
    cfg.write_text(json.dumps(doc))
    r = run("calibrate", "--trace", path, "--config", cfg, "-o", tmp_path / "c.json")
    if message is None:
        assert r.returncode == 0, r.stderr
    else:
        one_error_line(r, message)


def test_op_kinds_the_trace_lacks_are_one_error_line(tmp_path):
    """A trace without data parallelism fitted with a config that has it: its all-gather and
    reduce-scatter are nowhere in the trace."""
    path, _ = megatron_trace(tmp_path, "megatron", KNOWN, llm_plan={"dp": 1}, cluster={"gpus": 4},
                             training={"global_batch": 8})
    cfg = tmp_path / "job.yaml"
    cfg.write_text(json.dumps(JOB))
    one_error_line(run("calibrate", "--trace", path, "--config", cfg, "-o", tmp_path / "c.json"),
                   "op_kinds: the config predicts all_gather, reduce_scatter but the trace measures none")


def test_calibration_op_factors_are_checked(tmp_path):
    from pybubble.costs.roofline import CostModel

    for bad, message in (({"llm_fwd": 0}, "op_factors.llm_fwd"), ({"vision": 1.0}, "unknown op kind 'vision'"),
                         ({"p2p": "fast"}, "op_factors.p2p")):
        with pytest.raises(ValueError, match=message):
            CostModel("h100", calibration={"format": "pybubble.calibration/1", "op_factors": bad})


def test_the_example_writes_its_own_config(tmp_path, trainer_main):
    out = tmp_path / "example.yaml"
    code, err = trainer_main("--ranks", 3, "--microbatches", 6, "--write-config", out)
    assert code == 0, err
    cfg = load_config(out)
    assert cfg.cluster.gpu == "cpu" and cfg.cluster.gpus == 3 and cfg.llm_plan.pp == 3
    assert cfg.microbatches == 6 and cfg.llm.layers == 3 * 2 and cfg.encoders[0].model.layers == 12


def test_what_if_on_a_megatron_trace_predicts_its_step_and_pybubbles(tmp_path):
    """On the simulator's Megatron-LM step at known factors, the what-if reproduces the measured step
    and predicts pybubble's step as planned at those factors."""
    from pybubble.planner.what_if import what_if

    path, truth = megatron_trace(tmp_path, "megatron", KNOWN)
    w = what_if(path, job(tmp_path), workers=1)
    assert w.layout == "megatron"
    assert w.measured_step == pytest.approx(truth.step_time, rel=1e-9)
    assert w.predicted_step == pytest.approx(w.measured_step, rel=0.02)
    at_known = plan(job(tmp_path, KNOWN), workers=1)
    assert w.pybubble_step == pytest.approx(at_known.step_time, rel=0.02)
    assert w.hidden_fraction == pytest.approx(at_known.hidden_fraction, abs=0.02) and 0 < w.hidden_fraction <= 1
    assert w.pybubble_step < w.measured_step


def test_what_if_on_pybubbles_own_trace_predicts_its_step(tmp_path):
    from pybubble.planner.what_if import what_if

    report = plan(job(tmp_path, KNOWN), workers=1)
    path = tmp_path / "plan.trace.json"
    report.save_trace(path)
    w = what_if(path, job(tmp_path), workers=1)
    assert w.layout == "pybubble"
    assert w.measured_step == pytest.approx(report.step_time, rel=1e-9)
    assert w.predicted_step == pytest.approx(w.measured_step, rel=0.02)


def test_what_if_command(tmp_path):
    path, _ = megatron_trace(tmp_path, "megatron", KNOWN)
    cfg = tmp_path / "job.yaml"
    cfg.write_text(json.dumps(JOB))
    r = run("measure", path, "--what-if", cfg)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("what-if: measured_ms=") and "hidden=" in last and "pybubble_ms=" in last
    fields = dict(kv.split("=") for kv in last.split()[1:])
    assert abs(float(fields["error"])) < 0.02 and float(fields["speedup"]) > 1.0
    other = tmp_path / "other.yaml"
    other.write_text(json.dumps({**JOB, "cluster": {"gpus": 16}, "llm_plan": {**JOB["llm_plan"], "pp": 8}}))
    one_error_line(run("measure", path, "--what-if", other), "ranks: the trace has 4 ranks")


def as_profiler_traces(simulated: Path, folder: Path) -> Path:
    """The simulator's trace rewritten as torch.profiler writes a trainer's step that never used
    pybubble, one file per rank: torch.distributed.pipelining's ``PP:`` annotations around the ops'
    CPU work, NCCL's collective annotations, ``distributedInfo``."""
    events = json.loads(simulated.read_text())["traceEvents"]
    ranks = sorted({e["pid"] for e in events if e.get("ph") == "X"})
    folder.mkdir()
    names = {"dp_allgather": "nccl:_all_gather_base", "dp_reducescatter": "nccl:_reduce_scatter_base"}
    for r in ranks:
        out = []
        for e in events:
            if e.get("ph") != "X" or e["pid"] != r:
                continue
            if e["cat"] == "op":
                out.append({"ph": "X", "cat": "user_annotation", "name": f"PP:{e['name']}", "pid": 100 + r, "tid": 1,
                            "ts": e["ts"], "dur": e["dur"]})
                out.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100 + r, "tid": 1,
                            "ts": e["ts"], "dur": e["dur"]})
            elif e["cat"] == "bubble" and e["name"] in names:
                out.append({"ph": "X", "cat": "user_annotation", "name": names[e["name"]], "pid": 100 + r, "tid": 1,
                            "ts": e["ts"], "dur": e["dur"]})
        (folder / f"worker{r}.json").write_text(json.dumps(
            {"distributedInfo": {"backend": "nccl", "rank": r, "world_size": len(ranks)}, "traceEvents": out}))
    return folder


def test_the_fit_reads_a_trainers_profiler_traces_that_never_used_pybubble(tmp_path):
    """PP: annotations and NCCL collectives, the encoder inside stage 0's ops (Megatron-LM's layout):
    the factors come back from the rank files as from the simulator's own trace."""
    path, truth = megatron_trace(tmp_path, "megatron", KNOWN)
    folder = as_profiler_traces(path, tmp_path / "prof")
    fit = fit_step(job(tmp_path), read_step(folder))
    assert fit.ranks == 4
    for kind, want in KNOWN.items():
        assert fit.factors[kind] == pytest.approx(want, rel=0.02), kind
    cfg = tmp_path / "job.yaml"
    cfg.write_text(json.dumps(JOB))
    r = run("measure", folder, "--what-if", cfg)
    assert r.returncode == 0, r.stderr
    fields = dict(kv.split("=") for kv in r.stdout.strip().splitlines()[-1].split()[1:])
    assert float(fields["measured_ms"]) == pytest.approx(truth.step_time / 1e3, rel=1e-3)
    assert abs(float(fields["error"])) < 0.02


def example_config(tmp_path, trainer_main) -> Path:
    """The planning config of pp2_reports' job (the trainer writes it)."""
    cfg = tmp_path / "example.yaml"
    code, err = trainer_main("--ranks", 2, "--size", "tiny", "--write-config", cfg)
    assert code == 0, err
    return cfg


def test_the_fit_reads_the_example_trainers_profile(tmp_path, trainer_main, pp2_reports):
    """The runtime's own --profile traces of real gloo ranks (tiny models, megatron mode): every op
    kind of the trainer's config is measured and fitted (the figures are this machine's)."""
    cfg = example_config(tmp_path, trainer_main)
    prof = pp2_reports["megatron"]["profile_dir"]  # 2 ranks, tiny, 3 steps
    r = run("calibrate", "--trace", prof, "--config", cfg, "-o", tmp_path / "c.json")
    assert r.returncode == 0, r.stderr
    factors = json.loads((tmp_path / "c.json").read_text())["op_factors"]
    assert set(factors) == {"llm_fwd", "llm_bwd", "p2p", "encoder_fwd", "encoder_bwd"}
    assert all(v > 0 for v in factors.values())


def slowed(folder, to: Path, factor: float, ranks=(0, 1)) -> Path:
    """A copy of the profiler traces of `ranks` in `folder` in `to`, with every pipeline op and encoder
    piece `factor` times as long and every event's start `factor` times as far from the first
    event of any rank (a step disturbed by load). The gaps between ops stretch alike, so the sends
    stay where they were found: stretching the ops alone made them overlap the ops that wait for
    them whenever the step had no gap over 1 / factor of an op, and the fit found no send."""
    to.mkdir()
    docs = {r: json.loads((Path(folder) / f"rank{r}.json").read_text()) for r in ranks}
    t0 = min(float(e["ts"]) for doc in docs.values() for e in doc["traceEvents"] if "ts" in e)  # one clock
    for r, doc in docs.items():
        for e in doc["traceEvents"]:
            if "ts" in e:
                e["ts"] = t0 + (float(e["ts"]) - t0) * factor
            if e.get("ph") == "X" and re.match(r"(PP:|pybubble:task:)", str(e.get("name"))):
                e["dur"] *= factor
        (to / f"rank{r}.json").write_text(json.dumps(doc))
    return to


def test_several_steps_fit_the_medians_so_that_a_disturbed_step_moves_nothing(tmp_path, trainer_main, pp2_reports):
    """Three copies of the trainer's profiled step, one of them 2x slower: the factors are those of
    the two undisturbed steps (each quantity's median), not those of the disturbed one (nor of a
    mean, which would move them by a third)."""
    config = load_config(example_config(tmp_path, trainer_main))
    prof = pp2_reports["megatron"]["profile_dir"]
    a, b, slow = (slowed(prof, tmp_path / name, f) for name, f in (("a", 1.0), ("b", 1.0), ("slow", 2.0)))
    three, two, alone = fit_steps(config, read_steps([a, slow, b])), fit_steps(config, read_steps([a, b])), \
        fit_step(config, read_step(slow))
    assert three.steps == 3 and set(three.factors) == set(two.factors) == set(alone.factors)
    for kind, want in two.factors.items():
        assert three.factors[kind] == pytest.approx(want, rel=1e-9), kind
    assert max(alone.factors["llm_fwd"], alone.factors["llm_bwd"]) > 1.5 * max(two.factors["llm_fwd"],
                                                                                two.factors["llm_bwd"])
    r = run("calibrate", "--trace", a, slow, b, "--config", tmp_path / "example.yaml", "-o", tmp_path / "c.json")
    assert r.returncode == 0, r.stderr
    assert " steps=3 " in r.stdout.strip().splitlines()[-1]
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["op_factors"] == pytest.approx(three.factors, rel=1e-12) and "medians of 3 measured steps" in doc["fit"]
    assert doc["fitted_on"] == "a, slow, b"


def test_several_steps_refuse_no_step_an_empty_folder_and_other_ranks(tmp_path, trainer_main, pp2_reports):
    cfg = example_config(tmp_path, trainer_main)
    prof = pp2_reports["megatron"]["profile_dir"]
    with pytest.raises(ValueError, match="trace: no measured step given"):
        read_steps([])
    with pytest.raises(ValueError, match="steps: no measured step to fit"):
        fit_steps(load_config(cfg), [])
    (tmp_path / "empty").mkdir()
    one_error_line(run("calibrate", "--trace", prof, tmp_path / "empty", "--config", cfg, "-o", tmp_path / "c.json"),
                   f"{tmp_path / 'empty'}: no *.json or *.json.gz traces in this folder")
    alone = slowed(prof, tmp_path / "alone", 1.0, ranks=(0,))
    one_error_line(run("calibrate", "--trace", prof, alone, "--config", cfg, "-o", tmp_path / "c.json"),
                   f"trace: {alone} holds the traces of 1 rank (0), {prof} of 2 ranks (0, 1): not steps of one job")
    assert not (tmp_path / "c.json").exists()
