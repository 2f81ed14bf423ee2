"""The pybubble command line, run as a real process."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "vit_1f1b.problem.json"


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "pybubble", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


def test_schedule_then_validate_the_example(tmp_path):
    out = tmp_path / "s.json"
    r = run("schedule", EXAMPLE, "-o", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "encoder compute in bubbles" in r.stdout
    assert json.loads(out.read_text())["format"] == "pybubble.schedule/1"
    r = run("validate", EXAMPLE, out, cwd=tmp_path)
    assert r.returncode == 0 and "valid" in r.stdout


def test_validate_exits_1_on_violations(tmp_path):
    out = tmp_path / "s.json"
    assert run("schedule", EXAMPLE, "-o", out, "--policy", "coarse", cwd=tmp_path).returncode == 0
    doc = json.loads(out.read_text())
    doc["step_time"] += 1.0
    doc["start"][0] += 1e9
    out.write_text(json.dumps(doc))
    r = run("validate", EXAMPLE, out, cwd=tmp_path)
    assert r.returncode == 1
    assert "violation" in r.stdout and "step_time" in r.stdout


@pytest.mark.parametrize("content,message", [
    (None, "no such file"),
    ("{", "not valid JSON"),
    ('{"format": "pybubble.problem/1", "horizon": 1, "lanes": [], "microbatches": [], "tasks": [{"id": 1}]}',
     "tasks[0].id: 1 is not its index 0"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, content, message):
    path = tmp_path / "p.json"
    if content is not None:
        path.write_text(content)
    r = run("schedule", path, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith("error: ") and message in r.stderr
    assert "Traceback" not in r.stderr


def test_generate_writes_a_loadable_problem(tmp_path):
    out = tmp_path / "g.json"
    r = run("generate", "-o", out, "--stages", "2", "--microbatches", "3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run("schedule", out, cwd=tmp_path)
    assert r.returncode == 0
    r = run("generate", "-o", out, "--stages", "0", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: stages: 0")


def test_bubbles_prints_the_table_and_writes_trace_and_plot(tmp_path):
    trace, plot = tmp_path / "t.json", tmp_path / "g.png"
    r = run("bubbles", "--schedule", "interleaved_1f1b", "--stages", 8, "--microbatches", 32, "--chunks", 12,
            "--tp-count", 2, "--tp-duration", 20, "--dp-allgather", 3000, "--trace", trace, "--plot", plot,
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "pp_ " in r.stdout and "warmup" in r.stdout and "allgather" in r.stdout
    doc = json.loads(trace.read_text())
    assert any(e.get("cat") == "bubble" and e["name"] == "tp" for e in doc["traceEvents"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bubbles_bad_input_is_one_line(tmp_path):
    r = run("bubbles", "--schedule", "interleaved_1f1b", "--stages", 4, "--microbatches", 8, "--chunks", 2,
            "--warmup", 7, 8, 6, 4, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("error: table deadlocks:") and r.stderr.count("\n") == 1


# What a new user meets: help that teaches, --version, output that fits the terminal, a summary
# line for scripts.

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402

from pybubble.cli import build_parser  # noqa: E402
from pybubble.config.presets import ENCODERS, LLMS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
SUMMARY = re.compile(r"^(\w+): (\w+=\S+)( \w+=\S+)*$")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_version_is_the_installed_distributions(tmp_path):
    r = run("--version", cwd=tmp_path)
    assert r.returncode == 0
    assert r.stdout.strip() == f"pybubble {importlib.metadata.version('pybubble')}"


def test_top_level_help_lists_every_command_with_an_example_and_no_leaked_docstring():
    r = run("--help", cwd=ROOT.parent)  # outside the checkout: the installed package
    assert r.returncode == 0
    assert "cmd_" not in r.stdout and "``" not in r.stdout
    for name in subcommands():
        assert re.search(rf"^\s+{name}\s+\S", r.stdout, re.M) or re.search(rf"^\s+{name}\n\s+\S", r.stdout, re.M), name
    assert "examples:\n  pybubble plan examples/quickstart.yaml" in r.stdout
    assert "--version" in r.stdout


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_subcommand_and_option_is_described_with_its_default(name):
    parser = subcommands()[name]
    assert parser.description and len(parser.description.split("\n\n")[1]) > 40, "a paragraph on what it does"
    assert f"pybubble {name}" in parser.epilog, "an example"
    text = parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and len(action.help) > 10, f"{name} {action.dest}: no description"
        if action.option_strings and action.default is not None and action.default is not False:
            flag = action.option_strings[-1]
            entry = text[text.index(f"  {flag}" if f"  {flag} " in text else flag):]
            entry = entry[:entry.find("\n  -") if "\n  -" in entry else len(entry)]
            assert "default" in entry, f"{name} {flag}: default not said"
    # units: every option taking a time says it in us or ms
    for action in parser._actions:
        if action.metavar in ("US", "MS"):
            assert action.metavar.lower() in action.help, f"{name} {action.dest}: no unit"


def test_kernels_help_lists_the_presets():
    text = subcommands()["kernels"].format_help()
    flat = " ".join(text.split())
    for preset in ENCODERS + LLMS:
        assert preset in flat


def test_a_usage_error_is_one_line(tmp_path):
    r = run("bubbles", "--stages", "x", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith("error: argument --stages: invalid int value: 'x'")


def run_at(columns, *args, cwd):
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "pybubble", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env)


@pytest.mark.parametrize("args", [
    ("plan", QUICKSTART),
    ("bubbles", "--schedule", "interleaved_1f1b", "--stages", 16, "--microbatches", 32, "--chunks", 2,
     "--tp-count", 2, "--tp-duration", 60, "--dp-allgather", 3000, "--dp-reducescatter", 5000),
    ("kernels", "internvit-300m", "--micro-batch", 13, "--tp", 2),
    ("schedule", EXAMPLE),
    ("dynamic", QUICKSTART, "--steps", 2),
])
def test_output_fits_100_columns_and_ends_with_a_summary_line(tmp_path, args):
    r = run_at(100, *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.rstrip("\n").splitlines()
    too_wide = [line for line in lines if len(line.rstrip()) > 100]
    assert not too_wide, too_wide
    match = SUMMARY.match(lines[-1])
    assert match and match.group(1) == args[0], lines[-1]


def test_plan_summary_line_holds_the_figures(tmp_path):
    r = run_at(80, "plan", QUICKSTART, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    fields = dict(f.split("=") for f in r.stdout.splitlines()[-1].split(": ", 1)[1].split())
    assert set(fields) == {"step_ms", "vs_megatron", "vs_coarse", "hidden", "planner_s"}
    assert float(fields["vs_megatron"]) >= 1.15 and float(fields["vs_coarse"]) >= 1.03
    # the table's numbers are right-aligned: the step column's decimal points line up
    rows = [line for line in r.stdout.splitlines() if re.search(r"\d\.\d{3}x", line)]
    assert len(rows) == 6  # megatron, megatron_balanced, coarse, optimus, pybubble, non-colocated
    points = {line.index(".", len(line.split()[0]) + 2) for line in rows}
    assert len(points) == 1, rows


def test_plan_draws_a_window_and_rejects_a_bad_one(tmp_path):
    png = tmp_path / "w.png"
    r = run("plan", QUICKSTART, "--plot", png, "--window", "100:250", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for window, message in (("250:100", "window: start 250 is not before end 100"),
                            ("a:b", "window: 'a:b' is not START:END")):
        r = run("plan", QUICKSTART, "--plot", png, "--window", window, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.startswith(f"error: {message}"), r.stderr
        assert r.stderr.count("\n") == 1
    r = run("plan", QUICKSTART, "--window", "0:10", cwd=tmp_path)
    assert r.returncode == 2 and "window" in r.stderr and "--plot" in r.stderr
