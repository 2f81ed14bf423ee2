"""Fuzzing the loaders: arbitrary JSON and YAML documents, bytes, and valid documents with one value
replaced by anything, through every reader of a file. Each must give a ValueError or a valid result,
never another exception (the CLI turns a ValueError into one ``error:`` line and exit 2)."""

import copy
import json
from pathlib import Path

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import pybubble
from pybubble.costs.roofline import CostModel
from pybubble.problem.generated import random_problem

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-(10**400), 10**400),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
                    st.sampled_from(["h100", "vit-l-14", "llama-3-8b", "1f1b", "interleaved_1f1b", "compute", "fwd",
                                     "pybubble.problem/1", "pybubble.schedule/1", "pybubble.calibration/1"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                      max_leaves=20)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def loaders():
    return {
        ".json": [pybubble.load_problem, pybubble.load_schedule, lambda p: CostModel("h100", calibration=p)],
        ".yaml": [pybubble.load_config],
    }


def paths_in(doc):
    """Every path (keys and indices) to a value inside `doc`."""
    out, stack = [], [((), doc)]
    while stack:
        path, node = stack.pop()
        out.append(path)
        if isinstance(node, dict):
            stack += [(path + (k,), v) for k, v in node.items()]
        elif isinstance(node, list):
            stack += [(path + (i,), v) for i, v in enumerate(node)]
    return out


def replaced(doc, path, value):
    doc = copy.deepcopy(doc)
    if not path:
        return value
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    return doc


def loads_or_value_error(loader, path):
    try:
        result = loader(path)
    except ValueError:
        return None
    return result


@FUZZ
@given(value=VALUES, suffix=st.sampled_from([".json", ".yaml"]))
def test_arbitrary_documents_load_or_raise_value_error(tmp_path, value, suffix):
    path = tmp_path / f"doc{suffix}"
    path.write_text(json.dumps(value) if suffix == ".json" else yaml.safe_dump(value))
    for loader in loaders()[suffix]:
        loads_or_value_error(loader, path)


@FUZZ
@given(data=st.binary(max_size=200), suffix=st.sampled_from([".json", ".yaml"]))
def test_arbitrary_bytes_load_or_raise_value_error(tmp_path, data, suffix):
    path = tmp_path / f"doc{suffix}"
    path.write_bytes(data)
    for loader in loaders()[suffix]:
        loads_or_value_error(loader, path)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_config_with_one_value_replaced_loads_or_raises_value_error(tmp_path, data):
    path_in_doc = data.draw(st.sampled_from(paths_in(QUICKSTART)))
    doc = replaced(QUICKSTART, path_in_doc, data.draw(VALUES))
    as_file = tmp_path / "cfg.yaml"
    as_file.write_text(yaml.safe_dump(doc))
    for config in (loads_or_value_error(pybubble.load_config, doc), loads_or_value_error(pybubble.load_config, as_file)):
        if config is not None:
            assert config.microbatches >= 1 and config.cluster.gpus == (
                config.llm_plan.dp * config.llm_plan.pp * config.llm_plan.tp)


SCHEDULE_FIELDS = ("step_time", "shift_front", "shift_back", "start", "assignment", "format")


@FUZZ
@given(seed=st.integers(0, 10_000), field=st.sampled_from(SCHEDULE_FIELDS), index=st.none() | st.integers(0, 10**6),
       value=VALUES)
# issue 23: load_schedule raised OverflowError (not ValueError) for a 64-bit overflow in assignment
@example(seed=0, field="assignment", index=0, value=2**63)
@example(seed=0, field="assignment", index=0, value=-(10**400))
def test_a_schedule_with_one_value_replaced_loads_and_validates_or_raises_value_error(tmp_path, seed, field, index,
                                                                                      value):
    """A schedule with its field `field` (or, for a list and an `index`, one entry of it) replaced."""
    problem = random_problem(seed)
    doc = pybubble.schedule_problem(problem).to_dict()
    entries = doc[field]
    path_in_doc = (field, index % len(entries)) if isinstance(entries, list) and entries and index is not None else (field,)
    doc = replaced(doc, path_in_doc, value)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    sched = loads_or_value_error(pybubble.load_schedule, path)
    if sched is not None:
        try:
            violations = pybubble.validate(problem, sched)
        except ValueError:
            return
        assert isinstance(violations, list) and all(isinstance(v, str) for v in violations)


@settings(max_examples=40, deadline=None)
@given(pp=st.sampled_from([1, 2, 3, 4, 8]), tp=st.sampled_from([1, 2, 4, 8]), dp=st.sampled_from([1, 2]),
       vpp=st.sampled_from([1, 2, 3]), schedule=st.sampled_from(["gpipe", "1f1b", "zb_h1", "zbv"]),
       micro_batch=st.sampled_from([1, 2, 4]), microbatches=st.sampled_from([1, 2, 3, 8, 16]),
       llm=st.sampled_from(["llama-3-8b", "gpt-11b", "qwen2.5-7b"]), layers=st.sampled_from([None, 1, 3, 8, 24]),
       encoders=st.lists(st.tuples(st.sampled_from(["vit-3b", "vit-l-14", "siglip-so400m", "vit-g-14"]),
                                   st.sampled_from([64, 256, 4096]), st.booleans()), min_size=1, max_size=2),
       memory_gb=st.sampled_from([10, 80]))
def test_consistent_configs_plan_or_raise_value_error(pp, tp, dp, vpp, schedule, micro_batch, microbatches, llm, layers,
                                                       encoders, memory_gb):
    """Configs that load (a consistent plan of odd sizes) plan to a valid schedule, or say why not."""
    doc = {"cluster": {"gpus": dp * pp * tp}, "llm": {"preset": llm, **({"layers": layers} if layers else {})},
           "encoders": [{"preset": e, "tokens_per_sample": t, "frozen": f} for e, t, f in encoders],
           "training": {"global_batch": dp * micro_batch * microbatches, "micro_batch": micro_batch, "seq_len": 1024},
           "llm_plan": {"dp": dp, "pp": pp, "tp": tp, "vpp": vpp,
                        "schedule": "interleaved_1f1b" if vpp > 1 else schedule},
           "memory_gb": memory_gb}
    try:
        report = pybubble.plan(pybubble.load_config(doc), workers=1)
    except ValueError:
        return
    best = report.best
    assert pybubble.validate(best.problem, best.schedule) == []
    # kernel-level filling never loses to the same work placed before and after the LLM
    assert best.step_time <= report.baselines["coarse"].step_time * (1 + 1e-12)
    assert all(row.step_time > 0 and row.memory_bytes > 0 for row in report.rows())
