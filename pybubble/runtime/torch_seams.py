"""Every private torch seam pybubble uses, named in one place and detected by feature.

The runtime hooks torch where torch offers no public extension point: the pipelining schedules'
wait on point-to-point work, the stages' op methods, the schedules' microbatch and stage counts,
the functional collectives' wait and wrap (the TP waits), the dispatch keys a piece runs with, the
base classes of FSDP2's custom collectives, the profiler's on/off flag, an op's schema, and a few
aten ops whose names start with an underscore. Each has one accessor here; each accessor checks
that the installed torch has the seam as pybubble uses it (its name, its parameters and, where
pybubble relies on it, that torch's own code calls it by that name), never torch's version, and
raises ``RuntimeError`` naming the seam and the torch versions it was tested on when it does not.
:data:`SEAMS` lists them (docs/runtime.md has the table, with the public extension points the
runtime uses beside them); :func:`check_torch_seams` resolves them all.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

TESTED_TORCH = ("2.13.0", "2.14.1", "2.15.0")
"""The torch releases on which every seam below was checked and the runtime's tests pass."""

P2P_WAIT = "torch.distributed.pipelining.schedules._wait_batch_p2p"
STAGE_OPS = "PipelineStage.forward_one_chunk / backward_one_chunk / backward_weight_one_chunk"
MICROBATCHES = "torch.distributed.pipelining schedule._n_microbatches"
NUM_STAGES = "torch.distributed.pipelining schedule._num_stages"
ACTIONS = "torch.distributed.pipelining.schedules._Action"
FUNCTIONAL_WAIT = "torch.distributed._functional_collectives.wait_tensor / _maybe_wrap_tensor"
DISPATCH_KEYS = "torch._C._dispatch_tls_local_include_set / _dispatch_tls_local_exclude_set / _ForceDispatchKeyGuard"
FSDP_COMMS = "torch.distributed.fsdp._fully_shard._fsdp_api.AllGather / ReduceScatter"
PROFILER_ENABLED = "torch.autograd._profiler_enabled"
OP_SCHEMA = "torch._ops.OpOverload._schema"
CUDA_SLEEP = "torch.cuda._sleep"
FSDP_DIVIDE = "FSDPModule._get_fsdp_state()._fsdp_param_groups[i].gradient_divide_factor"
FSDP_POLICY = "FSDPModule._get_fsdp_state()._mp_policy"
SCHEDULE_STAGES = "torch.distributed.pipelining schedule._stage / _stages"

SEAMS = {
    P2P_WAIT: "the pipelining schedules' wait on p2p work, replaced so that the filler runs tasks in it",
    STAGE_OPS: "wrapped per stage instance: the filler's op boundaries (F, B or I, W) and the PP:<stage><op><mb> "
               "profiler names",
    MICROBATCHES: "the microbatches per step of a schedule (pass microbatches= to EncoderRuntime instead)",
    NUM_STAGES: "the stage count of a single-stage schedule (Schedule1F1B, ScheduleGPipe), for its action table",
    ACTIONS: "the fields of a multi-stage schedule's pipeline_order actions, read into pybubble's table",
    FUNCTIONAL_WAIT: "the eager wait of a functional collective (DTensor's TP collectives), replaced so that the "
                     "filler runs pieces in it; the wrap notes the collective's launch",
    DISPATCH_KEYS: "the dispatch keys of the step, restored for the pieces run inside a TP wait on CUDA",
    FSDP_COMMS: "the base classes of the custom all-gather and reduce-scatter given to FSDP2's public "
                "set_custom_all_gather / set_custom_reduce_scatter",
    PROFILER_ENABLED: "whether torch.profiler records, to annotate a task only then",
    OP_SCHEMA: "the schema of a traced op, to refuse an encoder that writes a parameter in place",
    CUDA_SLEEP: "a spin kernel of a given length (the CUDA benchmark's and tests' stand-in collective)",
    FSDP_DIVIDE: "the divide factor FSDP2's public set_gradient_divide_factor sets (None: the mean), read to "
                 "reduce the encoder's gradients over dp as the LLM's are (options.dp_reduce 'auto')",
    FSDP_POLICY: "the mixed-precision policy fully_shard was given, read so that the encoder computes in the "
                 "LLM's dtype (pybubble.integrations.torchtitan: RuntimeOptions.compute_dtype)",
    SCHEDULE_STAGES: "the stages a schedule was built over, for a trainer that keeps only the schedule "
                     "(torchtitan's pipeline_llm): EncoderRuntime(stage=None)",
}
"""Each private seam's name and what pybubble uses it for."""


def missing_seam(seam: str, detail: str) -> RuntimeError:
    """The error for a torch that lacks ``seam`` (one of :data:`SEAMS`) as pybubble uses it."""
    return RuntimeError(f"torch {torch.__version__}: {seam} {detail}; pybubble.runtime uses it ({SEAMS[seam]}). "
                        f"Known to work on torch {', '.join(TESTED_TORCH)}")


def _code_names(fn: Any) -> frozenset[str]:
    """The global and attribute names ``fn``'s code looks up or stores, nested functions included."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(fn, "__code__", None)
    return _names_in(code) if code is not None else frozenset()


@functools.lru_cache(maxsize=None)
def _names_in(code: types.CodeType) -> frozenset[str]:
    names = set(code.co_names)
    for k in code.co_consts:
        if isinstance(k, types.CodeType):
            names |= _names_in(k)
    return frozenset(names)


def _stored_by_init(cls: type, attribute: str) -> bool:
    """Whether an ``__init__`` of ``cls`` or its bases stores ``attribute``."""
    return any(attribute in _code_names(c.__dict__["__init__"]) for c in cls.__mro__ if "__init__" in c.__dict__)


def _parameters(fn: Any) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def _module(seam: str, name: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise missing_seam(seam, f"cannot be imported ({e})") from None


# -- pipelining: the p2p wait, the stages' ops, the schedules' counts and actions ----------------------

def _schedules() -> types.ModuleType:
    return _module(P2P_WAIT, "torch.distributed.pipelining.schedules")


def p2p_wait() -> Callable[[list[Any]], None]:
    """torch's ``_wait_batch_p2p(works)``, checked to be what the schedules' step loops (single-
    and multi-stage) call by that module-level name."""
    s = _schedules()
    fn = getattr(s, "_wait_batch_p2p", None)
    if not callable(fn):
        raise missing_seam(P2P_WAIT, "does not exist")
    if len(_parameters(fn)) != 1:
        raise missing_seam(P2P_WAIT, f"takes {_parameters(fn)}, not one list of works")
    for name in ("Schedule1F1B", "ScheduleGPipe", "ScheduleInterleaved1F1B"):
        cls = getattr(s, name, None)
        if cls is None or "_wait_batch_p2p" not in _code_names(cls._step_microbatches):
            raise missing_seam(P2P_WAIT, f"is not what {name}._step_microbatches waits with")
    return fn


def set_p2p_wait(fn: Callable[[list[Any]], None]) -> None:
    """Makes the schedules wait on p2p work with ``fn`` (give back :func:`p2p_wait`'s to restore)."""
    s = _schedules()
    if not hasattr(s, "_wait_batch_p2p"):
        raise missing_seam(P2P_WAIT, "does not exist")
    s._wait_batch_p2p = fn


def stage_op_names() -> tuple[str, str, str]:
    """The names of a pipeline stage's forward, backward (B, or I with ``full_backward=False``)
    and weight-gradient (W) ops, checked to take the microbatch (chunk) first and to be what the
    schedules call on the stage object (so that a per-instance wrapper sees them)."""
    from torch.distributed.pipelining import PipelineStage
    names = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
    for name in names:
        params = _parameters(getattr(PipelineStage, name, None))
        if len(params) < 2 or "chunk" not in params[1]:
            raise missing_seam(STAGE_OPS, f"has no {name}(chunk_id, ...) (parameters: {params})")
    if "full_backward" not in _parameters(PipelineStage.backward_one_chunk):
        raise missing_seam(STAGE_OPS, "has no backward_one_chunk(..., full_backward=...)")
    s = _schedules()
    for cls, used in ((s.Schedule1F1B, names[:2]), (s.ScheduleInterleaved1F1B, names)):
        missing = [n for n in used if n not in _code_names(cls._step_microbatches)]
        if missing:
            raise missing_seam(STAGE_OPS, f"{', '.join(missing)} not called by {cls.__name__}._step_microbatches")
    return names


@functools.lru_cache(maxsize=None)
def _full_backward_parameter() -> tuple[int, bool]:
    """(position after the chunk id, default) of ``backward_one_chunk``'s ``full_backward``."""
    from torch.distributed.pipelining import PipelineStage
    stage_op_names()
    params = inspect.signature(PipelineStage.backward_one_chunk).parameters
    return list(params).index("full_backward") - 2, bool(params["full_backward"].default)  # after self, chunk


def is_full_backward(args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether a call ``backward_one_chunk(chunk_id, *args, **kwargs)`` is a full backward (B)
    rather than the input-gradient half (I): its ``full_backward`` argument, found by name or
    by its position in torch's signature, else its default."""
    if "full_backward" in kwargs:
        return bool(kwargs["full_backward"])
    position, default = _full_backward_parameter()
    return bool(args[position]) if len(args) > position else default


def is_torch_schedule_class(cls: type) -> bool:
    """Whether ``cls`` is one of torch.distributed.pipelining's schedule classes (defined there)."""
    return cls.__module__ == _schedules().__name__


def _is_torch_schedule(schedule: Any) -> bool:
    return any(is_torch_schedule_class(c) for c in type(schedule).__mro__)


def _check_counts() -> None:
    s = _schedules()
    for seam, cls, attribute in ((MICROBATCHES, s.Schedule1F1B, "_n_microbatches"),
                                 (MICROBATCHES, s.ScheduleInterleaved1F1B, "_n_microbatches"),
                                 (NUM_STAGES, s.Schedule1F1B, "_num_stages")):
        if not _stored_by_init(cls, attribute):
            raise missing_seam(seam, f"is not set by {cls.__name__}'s constructor")


def microbatch_count(schedule: Any) -> Any:
    """A schedule's microbatch count as torch keeps it (``_n_microbatches``); None for an object
    that is not a torch schedule and has none."""
    if _is_torch_schedule(schedule) and not hasattr(schedule, "_n_microbatches"):
        raise missing_seam(MICROBATCHES, f"is not set on {type(schedule).__name__}")
    return getattr(schedule, "_n_microbatches", None)


def stage_count(schedule: Any) -> int:
    """The stage count of a single-stage torch schedule (``_num_stages``)."""
    n = getattr(schedule, "_num_stages", None)
    if isinstance(n, bool) or not isinstance(n, int):
        raise missing_seam(NUM_STAGES, f"is not set on {type(schedule).__name__} ({n!r})")
    return n


def schedule_stages(schedule: Any) -> list[Any]:
    """The stages a torch schedule was built over: a single-stage schedule's ``_stage``, a
    multi-stage one's ``_stages`` (this rank's, in the order the schedule holds them)."""
    stages = getattr(schedule, "_stages", None)
    if stages is None and getattr(schedule, "_stage", None) is not None:
        stages = [schedule._stage]
    if not stages or not all(hasattr(st, "stage_index") for st in stages):
        raise missing_seam(SCHEDULE_STAGES, f"is not set on {type(schedule).__name__}")
    return list(stages)


ACTION_FIELDS = ("stage_index", "computation_type", "microbatch_index", "sub_actions")
"""The fields of torch's schedule actions pybubble reads."""


def pipeline_order(schedule: Any) -> Any:
    """A schedule's action table (its public ``pipeline_order``, None if it has none), after
    checking that torch's actions have the fields pybubble reads (:data:`ACTION_FIELDS`)."""
    fields = getattr(getattr(_schedules(), "_Action", None), "_fields", ())
    if not set(ACTION_FIELDS) <= set(fields):
        raise missing_seam(ACTIONS, f"has the fields {fields}, not {ACTION_FIELDS}")
    return getattr(schedule, "pipeline_order", None)


# -- tensor parallelism: the functional collectives' wait and wrap, the dispatch keys -----------------

def _functional_collectives() -> types.ModuleType:
    funcol = _module(FUNCTIONAL_WAIT, "torch.distributed._functional_collectives")
    for name in ("wait_tensor", "_maybe_wrap_tensor"):
        if len(_parameters(getattr(funcol, name, None))) != 1:
            raise missing_seam(FUNCTIONAL_WAIT, f"has no {name}(tensor)")
    act = getattr(funcol, "AsyncCollectiveTensor", None)
    if act is None or "wait_tensor" not in _code_names(act.trigger_wait):
        raise missing_seam(FUNCTIONAL_WAIT, "is not what AsyncCollectiveTensor waits with")
    if "_maybe_wrap_tensor" not in _code_names(funcol.all_reduce):
        raise missing_seam(FUNCTIONAL_WAIT, "is not what all_reduce wraps its result with")
    return funcol


@contextlib.contextmanager
def functional_collective_hooks(wait: Callable[[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]], torch.Tensor],
                                launched: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """While active, every eager wait of a functional collective runs ``wait(tensor, real_wait)``
    (which must call ``real_wait(tensor)`` and return its result), and ``launched(result)`` is
    called when a collective's result is wrapped (at its launch): the single-tensor wrap, and the
    multi-tensor one where torch has it (``_maybe_wrap_tensors``, for the coalesced collectives)."""
    funcol = _functional_collectives()
    real_wait, real_wrap = funcol.wait_tensor, funcol._maybe_wrap_tensor
    real_wraps = getattr(funcol, "_maybe_wrap_tensors", None)

    def wait_tensor(tensor):
        return wait(tensor, real_wait)

    def maybe_wrap_tensor(tensor):
        launched(tensor)
        return real_wrap(tensor)

    def maybe_wrap_tensors(tensors):
        for t in tensors:
            launched(t)
        return real_wraps(tensors)

    funcol.wait_tensor, funcol._maybe_wrap_tensor = wait_tensor, maybe_wrap_tensor
    if real_wraps is not None:
        funcol._maybe_wrap_tensors = maybe_wrap_tensors
    try:
        yield
    finally:
        funcol.wait_tensor, funcol._maybe_wrap_tensor = real_wait, real_wrap
        if real_wraps is not None:
            funcol._maybe_wrap_tensors = real_wraps


def _dispatch_functions() -> tuple[Callable, Callable, Callable]:
    names = ("_dispatch_tls_local_include_set", "_dispatch_tls_local_exclude_set", "_ForceDispatchKeyGuard")
    found = tuple(getattr(torch._C, n, None) for n in names)
    absent = [n for n, f in zip(names, found) if f is None]
    if absent:
        raise missing_seam(DISPATCH_KEYS, f"lacks {', '.join('torch._C.' + n for n in absent)}")
    return found  # type: ignore[return-value]


def dispatch_keys() -> tuple[Any, Any]:
    """The current thread's local dispatch keys: (included, excluded)."""
    include, exclude, _ = _dispatch_functions()
    return include(), exclude()


def dispatch_key_guard(keys: tuple[Any, Any]) -> contextlib.AbstractContextManager:
    """A guard under which ops run with ``keys`` (from :func:`dispatch_keys`)."""
    return _dispatch_functions()[2](*keys)


# -- FSDP2, the profiler, traced ops, CUDA -----------------------------------------------------------

def fsdp_comm_classes() -> tuple[type, type]:
    """The base classes of FSDP2's custom collectives, (AllGather, ReduceScatter): from
    ``torch.distributed.fsdp`` where torch makes them public, else from its private ``_fsdp_api``;
    checked to be called as pybubble's subclasses expect, and FSDP2 to take them through its
    public ``set_custom_all_gather`` / ``set_custom_reduce_scatter``."""
    import torch.distributed.fsdp as fsdp
    private = None if hasattr(fsdp, "AllGather") else _module(FSDP_COMMS, "torch.distributed.fsdp._fully_shard._fsdp_api")
    source = fsdp if private is None else private
    classes = (getattr(source, "AllGather", None), getattr(source, "ReduceScatter", None))
    expected = (["self", "output_tensor", "input_tensor", "group", "async_op"],
                ["self", "output_tensor", "input_tensor", "group", "op", "async_op"])
    for name, cls, params in zip(("AllGather", "ReduceScatter"), classes, expected):
        if cls is None or _parameters(cls.__call__) != params:
            raise missing_seam(FSDP_COMMS, f"has no {name} called as ({', '.join(params[1:])})")
    for name in ("set_custom_all_gather", "set_custom_reduce_scatter"):
        if not hasattr(fsdp.FSDPModule, name):
            raise missing_seam(FSDP_COMMS, f"is not taken: FSDPModule has no {name}")
    return classes  # type: ignore[return-value]


def fsdp_divide_factors(module: Any) -> set[float | None]:
    """The gradient divide factors of an FSDP2 module's parameter groups (None: FSDP2's default,
    the mean over its data-parallel ranks; 1.0: the sum, as torchtitan sets it)."""
    state = getattr(module, "_get_fsdp_state", None)
    groups = getattr(state(), "_fsdp_param_groups", None) if callable(state) else None
    if groups is None or not all(hasattr(g, "gradient_divide_factor") for g in groups):
        raise missing_seam(FSDP_DIVIDE, f"is not readable on {type(module).__name__}")
    return {None if g.gradient_divide_factor is None else float(g.gradient_divide_factor) for g in groups}


def fsdp_param_dtype(module: Any) -> torch.dtype | None:
    """The dtype an FSDP2 module's mixed-precision policy computes in (None: its parameters')."""
    state = getattr(module, "_get_fsdp_state", None)
    policy = getattr(state(), "_mp_policy", None) if callable(state) else None
    if policy is None or not hasattr(policy, "param_dtype"):
        raise missing_seam(FSDP_POLICY, f"is not readable on {type(module).__name__}")
    return policy.param_dtype


def profiler_enabled() -> bool:
    """Whether torch.profiler (or the autograd profiler) records now."""
    fn = getattr(torch.autograd, "_profiler_enabled", None)
    if fn is None:
        raise missing_seam(PROFILER_ENABLED, "does not exist")
    return bool(fn())


def op_schema(target: Any) -> Any:
    """The schema of a traced node's target when it is an op (None for a Python function)."""
    if not hasattr(torch.ops.aten.add_.Tensor, "_schema"):
        raise missing_seam(OP_SCHEMA, "does not exist")
    return getattr(target, "_schema", None)


def aten_op_names(*names: str) -> frozenset[str]:
    """The default overloads' names (``"aten.<name>.default"``) of the aten ops in ``names`` that
    the installed torch has. Several start with an underscore (the attention kernels,
    ``_fused_rms_norm``); an op torch does not have cannot appear in a traced graph, so it is left
    out rather than refused."""
    return frozenset(str(getattr(torch.ops.aten, n).default) for n in names if hasattr(torch.ops.aten, n))


def cuda_sleep(cycles: int) -> None:
    """Enqueues a one-block kernel that spins ``cycles`` GPU cycles on the current stream."""
    fn = getattr(torch.cuda, "_sleep", None)
    if fn is None:
        raise missing_seam(CUDA_SLEEP, "does not exist")
    fn(int(cycles))


def check_torch_seams() -> None:
    """Resolves every seam the runtime needs (not :data:`CUDA_SLEEP`, for benchmarks and tests);
    raises ``RuntimeError`` naming the first the installed torch lacks."""
    p2p_wait()
    stage_op_names()
    _check_counts()
    pipeline_order(None)
    _functional_collectives()
    _dispatch_functions()
    fsdp_comm_classes()
    profiler_enabled()
    op_schema(None)
