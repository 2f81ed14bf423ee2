"""Hostile input through the CLI and the API: every finding of the hostile-input review as a
regression test. Bad input ends in one ``error:`` line naming the file and the field (CLI, exit 2)
or a ValueError (API); never a traceback, a hang, a blown-up memory, a lost file or a message that
prints an unbounded value."""

import json
import re
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import pybubble
from pybubble.config import limits
from pybubble.config.checks import SHOWN_CHARS, integer, positive_int, shown
from pybubble.costs.roofline import CostModel
from pybubble.config.documents import read_json, write_document

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
PROBLEM = ROOT / "examples" / "vit_1f1b.problem.json"


def run(*args, cwd, limit_bytes=None, timeout=120):
    """`pybubble ARGS` as a process; with `limit_bytes`, files it writes may not grow beyond that
    (RLIMIT_FSIZE: a write past it fails as on a full disk)."""
    def limited():
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return subprocess.run([sys.executable, "-m", "pybubble", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, preexec_fn=limited, timeout=timeout)


def one_error_line(r, *words):
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def config_text(**changes):
    doc = yaml.safe_load(QUICKSTART.read_text())
    for path, value in changes.items():
        *head, last = path.split("__")
        target = doc
        for k in head:
            target = target[k]
        target[last] = value
    return yaml.safe_dump(doc)


# ---- configs ------------------------------------------------------------------------------------

# the "billion laughs": nine lists of nine references, 9**9 strings through 72 aliases
BOMB = "\n".join(["  - &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
                 + [f"  - &{x} [{', '.join([f'*{p}'] * 9)}]" for p, x in zip("abcdefgh", "bcdefghi")])


def test_a_yaml_alias_bomb_in_a_checked_field_is_a_short_error(tmp_path):
    doc = yaml.safe_load(config_text())
    doc.pop("memory_gb", None)
    path = tmp_path / "bomb.yaml"
    path.write_text(yaml.safe_dump(doc) + "memory_gb:\n" + BOMB + "\n")
    assert len(yaml.safe_load(path.read_text())["memory_gb"][-1]) == 9  # it is valid YAML
    line = one_error_line(run("plan", path, cwd=tmp_path, timeout=60), str(path), "memory_gb", "is not a number")
    assert len(line) < 300


def test_too_many_yaml_aliases_are_refused(tmp_path):
    path = tmp_path / "aliases.yaml"
    refs = ", ".join(["*x"] * (limits.MAX_YAML_ALIASES + 1))
    path.write_text(config_text() + f"extra: &x [1]\nmore: [{refs}]\n")
    with pytest.raises(ValueError, match=rf"{path}: {limits.MAX_YAML_ALIASES + 1} YAML aliases, more than the limit"):
        pybubble.load_config(path)


@pytest.mark.parametrize("field", ["cluster__gpus", "training__global_batch", "llm__layers", "llm_plan__dp",
                                   "encoders__0__tokens_per_sample", "memory_gb"])
def test_a_400_digit_integer_in_a_number_field_is_an_error_naming_it(tmp_path, field):
    doc = yaml.safe_load(config_text())
    *head, last = field.split("__")
    target = doc
    for k in head:
        target = target[int(k)] if k.isdigit() else target[k]
    target[last] = 10**400
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(doc))
    name = field.replace("__0__", "[0].").replace("__", ".")
    with pytest.raises(ValueError, match=rf"{path}: .*{name.split('.')[-1]}") as e:
        pybubble.load_config(path)
    assert len(str(e.value)) < 200
    one_error_line(run("plan", path, cwd=tmp_path), str(path))


def test_a_preset_that_is_not_a_name(tmp_path):
    with pytest.raises(ValueError, match=r"llm: unknown preset \[7\]"):
        pybubble.load_config({**yaml.safe_load(QUICKSTART.read_text()), "llm": {"preset": [7]}})


def test_a_batch_too_large_to_plan_is_refused_before_any_work(tmp_path):
    path = tmp_path / "batch.yaml"
    path.write_text(config_text(training__global_batch=2_000_000))
    one_error_line(run("plan", path, cwd=tmp_path, timeout=60), str(path), "training.global_batch", "limit")


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_documents_nested_100000_deep(tmp_path, suffix):
    path = tmp_path / f"deep{suffix}"
    path.write_text("a: [" * 100_000 if suffix == ".yaml" else "[" * 100_000 + "]" * 100_000)
    command = ("plan",) if suffix == ".yaml" else ("schedule",)
    line = one_error_line(run(*command, path, cwd=tmp_path), str(path))
    assert "nested deeper" in line or "not valid YAML" in line


def test_nesting_just_past_the_limit_is_named():
    doc = current = []
    for _ in range(limits.MAX_NESTING):
        current.append([])
        current = current[0]
    with pytest.raises(ValueError, match="nested deeper than the limit"):
        pybubble.load_problem({"format": "pybubble.problem/1", "horizon": 1.0, "lanes": doc})


def test_yaml_syntax_errors_take_one_line_naming_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("cluster: {gpus: 8\nllm: [\n")
    line = one_error_line(run("plan", path, cwd=tmp_path), str(path), "not valid YAML", "line")
    assert "\n" not in line


@pytest.mark.parametrize("command,suffix", [("plan", ".yaml"), ("schedule", ".json")])
def test_non_utf8_input_names_the_file(tmp_path, command, suffix):
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes(b"\xff\xfe not utf-8")
    one_error_line(run(command, path, cwd=tmp_path), str(path), "not UTF-8")


def test_a_file_over_the_size_limit_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:  # sparse: no disk used
        f.truncate(limits.MAX_DOCUMENT_BYTES + 1)
    with pytest.raises(ValueError, match=rf"{path}: larger than the limit"):
        read_json(path)
    one_error_line(run("schedule", path, cwd=tmp_path), str(path), "larger than the limit")


def test_config_errors_name_the_file_and_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(config_text(llm_plan__tp=-1))
    one_error_line(run("plan", path, cwd=tmp_path), f"{path}: llm_plan.tp: -1")


def test_problem_errors_name_the_file_and_the_field(tmp_path):
    doc = json.loads(PROBLEM.read_text())
    doc["tasks"][3]["lane"] = "x"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    one_error_line(run("schedule", path, cwd=tmp_path), f"{path}: tasks[3].lane: 'x' is not an integer")



def _json_fields():
    """(loader, document, path in it, the field its error names) for every integer and float field
    kind of the JSON documents pybubble reads."""
    problem = json.loads(PROBLEM.read_text())
    schedule = pybubble.schedule_problem(pybubble.load_problem(problem)).to_dict()
    calibration = {"format": "pybubble.calibration/1", "compute_factor": 0.9,
                   "kinds": {"gemm": {"compute_efficiency": 0.8, "memory_efficiency": 0.8, "overhead_us": 5.0}}}
    calibrated = lambda source: CostModel("h100", calibration=source)  # noqa: E731
    return [(pybubble.load_schedule, schedule, ("assignment", 0), "assignment[0]"),
            (pybubble.load_schedule, schedule, ("start", 1), "start[1]"),
            (pybubble.load_schedule, schedule, ("step_time",), "step_time"),
            (pybubble.load_problem, problem, ("tasks", 3, "lane"), "tasks[3].lane"),
            (pybubble.load_problem, problem, ("tasks", 3, "after", 0), "tasks[3].after[0]"),
            (pybubble.load_problem, problem, ("tasks", 3, "duration"), "tasks[3].duration"),
            (pybubble.load_problem, problem, ("tasks", 3, "id"), "tasks[3].id"),
            (pybubble.load_problem, problem, ("microbatches", 0, "forward_needed"), "forward_needed"),
            (pybubble.load_problem, problem, ("lanes", 0, "compute_free", 0, 1), "compute_free"),
            (pybubble.load_problem, problem, ("horizon",), "horizon"),
            (calibrated, calibration, ("compute_factor",), "compute_factor"),
            (calibrated, calibration, ("kinds", "gemm", "overhead_us"), "kinds.gemm.overhead_us")]


INTEGER_FIELDS = ("assignment[0]", "tasks[3].lane", "tasks[3].after[0]", "tasks[3].id")


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**64, 10**400, -(10**400)],
                         ids=["2**63", "-2**63-1", "2**64", "10**400", "-10**400"])
@pytest.mark.parametrize("case", range(len(_json_fields())))
def test_an_integer_of_any_size_in_a_json_document_is_a_value_error_naming_the_field(tmp_path, case, value):
    """Issue 23: 2**63 in a schedule's assignment gave OverflowError from load_schedule, not
    ValueError. Every loader refuses integers beyond 64 bits in integer fields, and beyond a float's
    range in float fields (where 2**63 is a number like any other), naming the field."""
    loader, doc, where, name = _json_fields()[case]
    if name not in INTEGER_FIELDS and abs(value) < 10**400:
        return  # a valid float; whether it is in range for the field is the field's own check
    doc = json.loads(json.dumps(doc))
    target = doc
    for k in where[:-1]:
        target = target[k]
    target[where[-1]] = value
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc))
    for source in (path, doc):
        with pytest.raises(ValueError, match=re.escape(name)) as e:
            loader(source)
        assert len(str(e.value)) < 300
    if loader is pybubble.load_schedule:
        one_error_line(run("validate", PROBLEM, path, cwd=tmp_path), f"{path}: {name}")
    elif loader is pybubble.load_problem:
        one_error_line(run("schedule", path, cwd=tmp_path), f"{path}: ")


def test_checked_integers_are_64_bit():
    """The one check every integer read passes through refuses what no int64 holds, bounds or not."""
    assert integer(2**63 - 1, "x") == 2**63 - 1 and integer(-(2**63), "x") == -(2**63)
    for value, kwargs in [(2**63, {}), (-(2**63) - 1, {}), (2**63, {"minimum": 0}), (10**400, {"maximum": 10**500})]:
        with pytest.raises(ValueError, match=r"^x: .* out of range"):
            integer(value, "x", **kwargs)
    with pytest.raises(ValueError, match="more than the limit"):
        positive_int(10**400, "x", limit=10)
    with pytest.raises(ValueError, match="out of range"):
        positive_int(2**63, "x")


# ---- the pipeline simulator's tables --------------------------------------------------------------

@pytest.mark.parametrize("args", [("--microbatches", 1_000_000_000), ("--stages", 3_000_000_000),
                                  ("--schedule", "zbv", "--stages", 5000)])
def test_tables_too_large_to_build_are_refused_before_building(tmp_path, args):
    one_error_line(run("bubbles", *args, cwd=tmp_path, timeout=60), "table:", "limit")


# ---- messages never print an unbounded value ------------------------------------------------------

def test_shown_values_are_bounded():
    nested = [1]
    for _ in range(30):
        nested = [nested] * 10  # 10**30 leaves through shared references
    for value in (nested, "x" * 10**6, 10**400, {i: i for i in range(10**5)}, b"\x00" * 10**6):
        assert len(shown(value)) <= SHOWN_CHARS
    big = 10**5000  # longer than Python will print
    assert shown(big)


# ---- files are written whole or not at all --------------------------------------------------------

def _filled(path: Path, size: int) -> bytes:
    data = (b"previous good file\n" * (size // 19 + 1))[:size]
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("option", ["--json", "--trace", "--plot"])
def test_a_failed_write_leaves_the_previous_file_whole(tmp_path, option):
    out = tmp_path / ("out.png" if option == "--plot" else "out.json")
    before = _filled(out, 100)
    # files may grow to 300 bytes: less than any of these outputs, more than the old file
    r = run("plan", QUICKSTART, option, out, cwd=tmp_path, limit_bytes=300)
    one_error_line(r)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no temporary file left behind


def test_a_failed_schedule_write_leaves_the_previous_file_whole(tmp_path):
    out = tmp_path / "s.json"
    before = _filled(out, 100)
    one_error_line(run("schedule", PROBLEM, "-o", out, cwd=tmp_path, limit_bytes=300))
    assert out.read_bytes() == before


def test_documents_are_always_finite_json(tmp_path):
    path = tmp_path / "doc.json"
    with pytest.raises(ValueError, match="not finite"):
        write_document(path, {"format": "x", "value": float("inf")})
    assert not path.exists()
    write_document(path, {"format": "x", "value": 1.5})
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the file")) == \
        {"format": "x", "value": 1.5}


def test_plot_without_extension_writes_the_named_file_as_png(tmp_path):
    r = run("bubbles", "--stages", 2, "--microbatches", 2, "--plot", tmp_path / "step", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "step").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {tmp_path / 'step'}" in r.stdout


def test_encoder_tasks_over_the_limit_are_refused_before_they_are_built():
    from pybubble.costs.roofline import CostModel
    from pybubble.problem.encoder import EncoderPlan, EncoderWork

    work = EncoderWork(pybubble.presets.encoder("vit-22b"), plan=EncoderPlan(pp_enc=1, tp_enc=1, pp_llm=1, tp_llm=1),
                       micro_batch=1, costs=CostModel("h100"))
    per_microbatch = len(work.tasks([1]))
    with pytest.raises(ValueError, match="partition: .* kernel tasks, more than the limit"):
        work.tasks([limits.MAX_TASKS // per_microbatch + 1])
    assert np.all(work.tasks([2]).duration > 0)


def test_docs_list_every_limit_with_its_value():
    text = (ROOT / "docs" / "formats.md").read_text()
    for name in limits.__all__:
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"docs/formats.md does not list {name}"
        assert f"{getattr(limits, name):,}" in row, f"docs/formats.md gives another value for {name}"


def test_docs_list_every_limit_of_the_core_with_its_value():
    from pybubble import _core

    text = (ROOT / "docs" / "formats.md").read_text()
    for key, value in _core.LIMITS.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{key}` |")), None)
        assert row is not None, f"docs/formats.md does not list LIMITS['{key}']"
        shown_value = f"{value:,}" if isinstance(value, int) else f"{value:g}".replace("e+", "e")
        assert shown_value in row, f"docs/formats.md gives another value for LIMITS['{key}']"


def test_many_stages_simulate_and_print_in_seconds(tmp_path):
    """200,000 pipeline ranks and one microbatch: the core simulates it in linear time and the table
    shows its first and last stages (the hang the review found)."""
    r = run("bubbles", "--stages", 200_000, "--microbatches", 1, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "199999" in r.stdout and "..." in r.stdout and "stages not shown" in r.stdout
