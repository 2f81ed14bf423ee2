"""pybubble inside torchtitan, trained for real: ``examples/titan_vlm.py`` (torchtitan's llama3
debugmodel with a vision encoder, its ParallelDims, pipeline_vlm, parallelize_llama, loss,
optimizers, LR schedule, clipping and checkpoint wrapper) under torchrun on gloo. Each of pybubble's
modes must end with the parameters of torchtitan's own placement (``titan``: the encoder inside
stage 0). Needs torchtitan (and torch 2.14 or newer): ``.ci/titan`` installs both and runs this
file; elsewhere it is skipped."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (.ci/titan installs it)")
import torch  # noqa: E402

pytestmark = pytest.mark.distributed
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "titan_vlm.py"
MODES = ("megatron", "coarse", "pybubble")


def train(tmp: Path, name: str, ranks: int, *args: str, ok: bool = True) -> tuple[dict, dict] | str:
    """One run of the example on ``ranks`` processes: its report and parameters (or, with
    ``ok=False``, its output, the run having failed)."""
    report = tmp / f"{name}.json"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                          str(EXAMPLE), *args, "--report", str(report)], capture_output=True, text=True,
                         timeout=600, cwd=tmp)
    if not ok:
        assert run.returncode != 0, run.stdout[-2000:]
        return run.stdout + run.stderr
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return json.loads(report.read_text()), torch.load(str(report) + ".pt")


def worst(a: dict, b: dict) -> tuple[float, str]:
    """The largest relative difference of one parameter, ||a - b|| / ||a||, and its name."""
    assert set(a) == set(b)
    return max((float((a[k] - b[k]).double().norm() / a[k].double().norm().clamp_min(1e-30)), k) for k in a)


LAYOUTS = {
    "pp2_dp_shard2": (4, ("--pp", "2", "--dp-shard", "2")),
    "pp2_dp_replicate2": (4, ("--pp", "2", "--dp-replicate", "2")),
    "pp2_interleaved": (2, ("--pp", "2", "--schedule", "interleaved_1f1b")),
    "pp2_zbv": (2, ("--pp", "2", "--schedule", "zbv")),  # V-shaped: the first and last stages on rank 0
}
"""The layouts the must-shows name: (processes, arguments)."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each layout's runs, by (layout, mode): SGD, a max norm that clips every step, 3 steps."""
    tmp, cache = tmp_path_factory.mktemp("titan"), {}

    def get(layout: str, mode: str):
        if (layout, mode) not in cache:
            ranks, args = LAYOUTS[layout]
            cache[layout, mode] = train(tmp, f"{layout}_{mode}", ranks, *args, "--mode", mode, "--optimizer", "sgd",
                                        "--max-norm", "0.05")
        return cache[layout, mode]
    return get


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_ends_with_torchtitans_parameters(runs, layout, mode):
    (titan, titan_params), (mine, params) = runs(layout, "titan"), runs(layout, mode)
    assert any(k.startswith("vision_encoder.") for k in params) and len(params) == len(titan_params)
    diff, name = worst(titan_params, params)
    assert diff <= 1e-6, f"{name}: {diff:.2e}"
    clipped = [max(g) for g in titan["grad_norms"]]
    assert min(clipped) > 0.05  # every step clipped: the norm, counted once over the whole model, decides by how much
    for a, b in zip(titan["grad_norms"], mine["grad_norms"]):  # the encoder's and the LLM's, before clipping
        assert a == pytest.approx(b, rel=1e-6)


def test_with_adamw_the_encoders_gradients_are_summed_as_torchtitans(tmp_path):
    """torchtitan's own optimizer (AdamW), dp 2: the encoder's gradient norms before each step
    equal titan's (the sum over dp; a mean would halve them), step by step."""
    args = ("--pp", "2", "--dp-shard", "2")
    titan, _ = train(tmp_path, "titan", 4, *args, "--mode", "titan")
    mine, _ = train(tmp_path, "pybubble", 4, *args, "--mode", "pybubble")
    for a, b in zip(titan["grad_norms"], mine["grad_norms"]):
        assert a == pytest.approx(b, rel=1e-6)


def test_a_reduction_other_than_the_trainers_is_refused_on_every_rank(tmp_path):
    out = train(tmp_path, "mean", 4, "--pp", "2", "--dp-shard", "2", "--mode", "pybubble", "--dp-reduce", "mean",
                ok=False)
    refused = [line for line in out.splitlines() if "dp_reduce: 'mean', but the stages' modules take the sum" in line]
    assert len({line.split("]")[0] for line in refused}) == 4, out[-3000:]  # each of the 4 ranks says why


def test_checkpoint_after_two_steps_and_resume_for_the_third(tmp_path):
    args = ("--pp", "2", "--mode", "pybubble", "--total-steps", "3")
    _, straight = train(tmp_path, "straight", 2, *args, "--steps", "3")
    train(tmp_path, "first", 2, *args, "--steps", "2", "--checkpoint", str(tmp_path / "ckpt"))
    _, resumed = train(tmp_path, "resumed", 2, *args, "--steps", "1", "--first-step", "2", "--resume",
                       str(tmp_path / "ckpt"))
    diff, name = worst(straight, resumed)
    assert diff <= 1e-6, f"{name}: {diff:.2e}"


def test_the_trainer_subclass_is_torchtitans_with_a_pybubble_config():
    from torchtitan.trainer import Trainer

    from pybubble.integrations.torchtitan.titan_trainer import (PybubbleConfig, PybubbleTrainer,
                                                                  splitting_after_taking)
    assert issubclass(PybubbleTrainer, Trainer) and issubclass(PybubbleTrainer.Config, Trainer.Config)
    assert PybubbleTrainer.Config.__dataclass_fields__["pybubble"].default_factory().mode == "pybubble"
    with pytest.raises(ValueError, match="mode: 'fast' is not one of megatron, coarse, pybubble"):
        PybubbleConfig(mode="fast").options()
    taken, seen = [], []
    split = splitting_after_taking(lambda model, **kw: seen.append(type(model.vision_encoder).__name__) or kw,
                                   PybubbleConfig(), taken)
    model = torch.nn.Module()
    model.vision_encoder = torch.nn.Linear(2, 2)
    assert split(model, parallel_dims=None) == {"parallel_dims": None}
    assert seen == ["EncoderStandIn"] and isinstance(taken[0].encoder, torch.nn.Linear)
    with pytest.raises(ValueError, match="pipelining_fn: None"):
        splitting_after_taking(None, PybubbleConfig(), [])


def test_the_encoder_follows_torchtitans_mixed_precision(tmp_path):
    """torchtitan's default precision (bfloat16 compute, float32 parameters and reduction): the
    runtime computes the encoder in bfloat16 as FSDP2 computes it inside stage 0."""
    args = ("--pp", "2", "--optimizer", "sgd", "--max-norm", "0.05", "--precision", "bfloat16")
    titan, titan_params = train(tmp_path, "titan", 2, *args, "--mode", "titan")
    mine, params = train(tmp_path, "pybubble", 2, *args, "--mode", "pybubble")
    diff, name = worst(titan_params, params)
    assert diff <= 1e-6, f"{name}: {diff:.2e}"
    assert all(p.dtype == torch.float32 for p in params.values())  # the master weights
