"""The private torch seams the runtime uses (pybubble/runtime/torch_seams.py): each resolves on the
installed torch and behaves as the runtime relies on; each, taken away, gives a RuntimeError that
names it and the torch versions it was tested on."""

import collections

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from pybubble.runtime import torch_seams  # noqa: E402


def test_every_seam_resolves_on_the_installed_torch():
    torch_seams.check_torch_seams()
    from torch.distributed.pipelining import schedules
    assert torch_seams.p2p_wait() is schedules._wait_batch_p2p
    assert torch_seams.stage_op_names() == ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
    include, exclude = torch_seams.dispatch_keys()
    with torch_seams.dispatch_key_guard((include, exclude)):
        assert torch.ones(2).add(1).tolist() == [2.0, 2.0]
    all_gather, reduce_scatter = torch_seams.fsdp_comm_classes()
    assert {all_gather.__name__, reduce_scatter.__name__} == {"AllGather", "ReduceScatter"}
    assert torch_seams.op_schema(torch.ops.aten.add_.Tensor).is_mutable
    assert not torch_seams.op_schema(torch.ops.aten.add.Tensor).is_mutable
    assert torch_seams.op_schema(len) is None  # a Python function in a traced graph has no schema
    assert {"aten.addmm.default", "aten._fused_rms_norm.default"} <= torch_seams.aten_op_names(
        "addmm", "_fused_rms_norm", "no_such_op")
    assert len(torch_seams.aten_op_names("no_such_op")) == 0
    assert set(torch_seams.SEAMS) == {
        torch_seams.P2P_WAIT, torch_seams.STAGE_OPS, torch_seams.MICROBATCHES, torch_seams.NUM_STAGES,
        torch_seams.ACTIONS, torch_seams.FUNCTIONAL_WAIT, torch_seams.DISPATCH_KEYS, torch_seams.FSDP_COMMS,
        torch_seams.PROFILER_ENABLED, torch_seams.OP_SCHEMA, torch_seams.CUDA_SLEEP, torch_seams.FSDP_DIVIDE,
        torch_seams.FSDP_POLICY, torch_seams.SCHEDULE_STAGES}


def test_the_profiler_flag_follows_the_profiler():
    assert torch_seams.profiler_enabled() is False
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert torch_seams.profiler_enabled() is True
    assert torch_seams.profiler_enabled() is False


@pytest.mark.parametrize("args,kwargs,full", [
    ((), {}, True), ((None,), {}, True), ((None, False), {}, False), ((None, True, True), {}, True),
    ((), {"full_backward": False}, False), ((None,), {"full_backward": True, "last_backward": True}, True),
])
def test_full_backward_is_read_by_name_or_by_torchs_position(args, kwargs, full):
    assert torch_seams.is_full_backward(args, kwargs) is full


def test_schedules_counts_and_action_tables(world_of_one):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

    def loss(out, target):
        return out.sum()

    single = Schedule1F1B(PipelineStage(nn.Linear(4, 4), 0, 1, torch.device("cpu")), n_microbatches=3, loss_fn=loss)
    assert torch_seams.microbatch_count(single) == 3
    assert torch_seams.stage_count(single) == 1
    stages = [PipelineStage(nn.Linear(4, 4), s, 2, torch.device("cpu")) for s in (0, 1)]
    multi = ScheduleInterleaved1F1B(stages, n_microbatches=2, loss_fn=loss)
    order = torch_seams.pipeline_order(multi)
    actions = [a for a in order[0] if a is not None]
    assert {(a.stage_index, str(getattr(a.computation_type, "value", a.computation_type)), a.microbatch_index)
            for a in actions if a.sub_actions is None} >= {(0, "F", 0), (1, "F", 1), (1, "B", 0), (0, "B", 1)}
    assert torch_seams.microbatch_count(object()) is None  # not a torch schedule: the caller asks for it
    assert torch_seams.schedule_stages(single) == [single._stage] and torch_seams.schedule_stages(multi) == stages
    with pytest.raises(RuntimeError, match=r"schedule._stage / _stages is not set on object"):
        torch_seams.schedule_stages(object())


def test_fsdp2s_divide_factor_and_precision_are_read(world_of_one):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    module = fully_shard(nn.Linear(4, 4), mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    assert torch_seams.fsdp_divide_factors(module) == {None} and torch_seams.fsdp_param_dtype(module) == torch.bfloat16
    module.set_gradient_divide_factor(1.0)
    assert torch_seams.fsdp_divide_factors(module) == {1.0}
    with pytest.raises(RuntimeError, match="gradient_divide_factor is not readable on Linear"):
        torch_seams.fsdp_divide_factors(nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="_mp_policy is not readable on Linear"):
        torch_seams.fsdp_param_dtype(nn.Linear(2, 2))


def test_functional_collective_hooks_see_the_launch_and_the_wait_then_restore(world_of_one):
    import torch.distributed._functional_collectives as funcol
    real = (funcol.wait_tensor, funcol._maybe_wrap_tensor)
    seen = []

    def wait(tensor, real_wait):
        seen.append("wait")
        return real_wait(tensor)

    with torch_seams.functional_collective_hooks(wait, lambda t: seen.append("launched")):
        out = funcol.all_reduce(torch.ones(3), "sum", world_of_one)
        assert seen == ["launched"]  # launched, not yet waited: the wait is at the first use
        assert (out + 1).tolist() == [2.0, 2.0, 2.0]
    assert seen == ["launched", "wait"]
    assert (funcol.wait_tensor, funcol._maybe_wrap_tensor) == real
    # a coalesced collective: each result's launch (torch 2.15 wraps them with _maybe_wrap_tensors)
    seen.clear()
    with torch_seams.functional_collective_hooks(wait, lambda t: seen.append("launched")):
        outs = funcol.all_reduce_coalesced([torch.ones(2), torch.ones(3)], "sum", world_of_one)
        assert seen == ["launched", "launched"]
        assert [(o * 2).tolist() for o in outs] == [[2.0, 2.0], [2.0, 2.0, 2.0]]
    assert seen == ["launched", "launched", "wait", "wait"]


def _remove(monkeypatch, dotted: str):
    module, _, name = dotted.rpartition(".")
    monkeypatch.delattr(__import__("importlib").import_module(module), name)


def _no_full_backward(self, bwd_chunk_id, loss=None, last_backward=False):
    return None


MISSING = [
    ("torch.distributed.pipelining.schedules._wait_batch_p2p", torch_seams.p2p_wait, torch_seams.P2P_WAIT),
    ("torch.distributed._functional_collectives._maybe_wrap_tensor",
     lambda: torch_seams.functional_collective_hooks(lambda t, w: w(t), lambda t: None).__enter__(),
     torch_seams.FUNCTIONAL_WAIT),
    ("torch.distributed._functional_collectives.wait_tensor",
     lambda: torch_seams.functional_collective_hooks(lambda t, w: w(t), lambda t: None).__enter__(),
     torch_seams.FUNCTIONAL_WAIT),
    ("torch._C._ForceDispatchKeyGuard", lambda: torch_seams.dispatch_key_guard((None, None)),
     torch_seams.DISPATCH_KEYS),
    ("torch._C._dispatch_tls_local_include_set", torch_seams.dispatch_keys, torch_seams.DISPATCH_KEYS),
    ("torch.distributed.fsdp._fully_shard._fsdp_api.ReduceScatter", torch_seams.fsdp_comm_classes,
     torch_seams.FSDP_COMMS),
    ("torch.autograd._profiler_enabled", torch_seams.profiler_enabled, torch_seams.PROFILER_ENABLED),
    ("torch.cuda._sleep", lambda: torch_seams.cuda_sleep(1), torch_seams.CUDA_SLEEP),
]


@pytest.mark.parametrize("attribute,call,seam", MISSING, ids=[m[0] for m in MISSING])
def test_a_missing_seam_is_named_with_the_versions_known_to_work(monkeypatch, attribute, call, seam):
    _remove(monkeypatch, attribute)
    with pytest.raises(RuntimeError) as e:
        call()
    message = str(e.value)
    assert seam in message and attribute.rsplit(".", 1)[1] in message
    assert "Known to work on torch 2.13.0, 2.14.1, 2.15.0" in message
    if seam != torch_seams.CUDA_SLEEP:  # for benchmarks and tests: not a seam of the runtime
        with pytest.raises(RuntimeError, match=seam.split(" ")[0].replace(".", r"\.")):
            torch_seams.check_torch_seams()


def test_changed_seams_are_refused_too(monkeypatch):
    from torch.distributed.pipelining import PipelineStage, schedules
    monkeypatch.setattr(PipelineStage, "backward_one_chunk", _no_full_backward)
    with pytest.raises(RuntimeError, match=r"PipelineStage\.forward_one_chunk .* has no backward_one_chunk\(\.\.\., "
                                           r"full_backward=\.\.\.\)"):
        torch_seams.stage_op_names()
    monkeypatch.undo()

    monkeypatch.setattr(schedules, "_Action", collections.namedtuple("_Action", "stage_index computation_type"))
    with pytest.raises(RuntimeError, match=r"schedules\._Action has the fields"):
        torch_seams.pipeline_order(object())
    monkeypatch.undo()

    monkeypatch.setattr(schedules, "_wait_batch_p2p", lambda works, timeout: None)
    with pytest.raises(RuntimeError, match=r"_wait_batch_p2p takes \['works', 'timeout'\]"):
        torch_seams.p2p_wait()
    monkeypatch.undo()

    monkeypatch.delattr(torch.ops.aten.add_.Tensor, "_schema")
    with pytest.raises(RuntimeError, match=r"OpOverload\._schema does not exist"):
        torch_seams.op_schema(len)
    monkeypatch.undo()

    bare = object.__new__(schedules.Schedule1F1B)  # a torch schedule whose constructor set no count
    with pytest.raises(RuntimeError, match=r"schedule\._n_microbatches is not set on Schedule1F1B"):
        torch_seams.microbatch_count(bare)
    with pytest.raises(RuntimeError, match=r"schedule\._num_stages is not set on Schedule1F1B"):
        torch_seams.stage_count(bare)


def test_a_schedule_that_stops_calling_the_wait_is_refused(monkeypatch):
    from torch.distributed.pipelining import schedules

    def step_without_the_wait(self, *args, **kwargs):
        return None

    monkeypatch.setattr(schedules.Schedule1F1B, "_step_microbatches", step_without_the_wait)
    with pytest.raises(RuntimeError, match=r"_wait_batch_p2p is not what Schedule1F1B\._step_microbatches waits with"):
        torch_seams.p2p_wait()
