"""What a trainer written against the earlier API keeps: the runtime's old keyword arguments and its
settable ``trace``, and the modules that moved, each still working for a release with a
``DeprecationWarning`` that names its replacement; the new options refuse bad values by name."""

import importlib
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.distributed.pipelining import PipelineStage, Schedule1F1B  # noqa: E402

from pybubble.runtime import BalanceOptions, EncoderRuntime, PieceOptions, RuntimeOptions  # noqa: E402


@pytest.fixture
def one_stage(world_of_one):
    stage = PipelineStage(nn.Linear(4, 4), 0, 1, torch.device("cpu"))
    return dict(stage=stage, schedule=Schedule1F1B(stage, 2, loss_fn=lambda y, t: y.sum()), example=torch.ones(2, 4))


def test_the_old_keyword_arguments_build_the_same_runtime_with_a_warning_each(one_stage):
    with pytest.warns(DeprecationWarning) as seen:
        old = EncoderRuntime(nn.Linear(4, 4), mode="coarse", microbatches=2, piece_s=0.001, group=None, **one_stage)
    assert sorted(str(w.message) for w in seen) == [
        "EncoderRuntime(group=...) is deprecated: pass groups=TrainerGroups(traffic=...)",
        "EncoderRuntime(microbatches=...) is deprecated: pass options",
        "EncoderRuntime(mode=...) is deprecated: pass options",
        "EncoderRuntime(piece_s=...) is deprecated: pass options.pieces.min_s"]
    assert old.options == RuntimeOptions(mode="coarse", microbatches=2, pieces=PieceOptions(min_s=0.001))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new way warns of nothing
        new = EncoderRuntime(nn.Linear(4, 4), options=RuntimeOptions(mode="coarse", microbatches=2), **one_stage)
    assert new.mode == old.mode == "coarse" and new.microbatches == 2 and not new.trace
    with pytest.warns(DeprecationWarning, match=r"setting EncoderRuntime.trace is deprecated: pass "
                                                r"options=RuntimeOptions\(trace=...\)"):
        new.trace = True
    assert new.trace and new.options.trace


def test_old_and_new_arguments_together_or_unknown_ones_are_refused(one_stage):
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="mode: given beside options; pass one"):
        EncoderRuntime(nn.Linear(4, 4), mode="coarse", options=RuntimeOptions(), **one_stage)
    with pytest.raises(TypeError, match="unexpected keyword argument 'moed'"):
        EncoderRuntime(nn.Linear(4, 4), moed="coarse", **one_stage)
    with pytest.raises(ValueError, match="groups: int is not a DeviceMesh, a torchtitan ParallelDims or a TrainerGroups"):
        EncoderRuntime(nn.Linear(4, 4), groups=3, **one_stage)


@pytest.mark.parametrize("build, message", [
    (lambda: RuntimeOptions(mode="fast"), "mode: 'fast' is not one of megatron, coarse, pybubble"),
    (lambda: RuntimeOptions(keep=0), "keep: 0 is not an integer >= 1"),
    (lambda: RuntimeOptions(microbatches=1.5), "microbatches: 1.5"),
    (lambda: RuntimeOptions(trace="yes"), "trace: 'yes' is not True or False"),
    (lambda: RuntimeOptions(pieces=0.004), r"pieces: 0.004 is not a PieceOptions"),
    (lambda: PieceOptions(min_s=-1.0), r"pieces.min_s: -1.0 is not a number of seconds >= 0"),
    (lambda: PieceOptions(min_s=float("nan")), r"pieces.min_s: nan"),
    (lambda: BalanceOptions(replicas=1), r"balance.replicas: 1 is not True or False"),
])
def test_bad_options_name_the_field(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_options_are_frozen():
    with pytest.raises(AttributeError):
        RuntimeOptions().mode = "coarse"


@pytest.mark.parametrize("old, names", [
    ("pybubble.runtime.placement", ["make_placement", "rank_plan", "lockstep_s", "MeasuredCosts", "piece_tasks"]),
    ("pybubble.runtime.plan", ["RankPlan", "PlannedTask"]),
    ("pybubble.runtime.records", ["StepRecord", "consumer_delays"]),
    ("pybubble.runtime.costs", ["CostHistory", "StepSample", "share_samples"]),
    ("pybubble.planner.workloads", ["mix", "MixSpec", "Samples", "read_samples", "sample_costs", "batches"]),
    ("pybubble.schedule.reference", ["reference_schedule"]),
    ("pybubble.schedule.exact", ["optimum"]),
    ("pybubble.measure.trace", ["Trace", "file_rank"]),
    ("pybubble.viz.trace", ["save_trace"]),
])
def test_a_moved_module_imports_by_its_old_name_with_a_warning(old, names):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated: import from pybubble\."):
        module = importlib.import_module(old)
    assert [n for n in names if not hasattr(module, n)] == []
