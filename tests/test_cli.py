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
    assert "encoder compute hidden" in r.stdout
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
    assert "pp_warmup" in r.stdout and "dp_allgather" in r.stdout
    doc = json.loads(trace.read_text())
    assert any(e.get("cat") == "bubble" and e["name"] == "tp" for e in doc["traceEvents"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bubbles_bad_input_is_one_line(tmp_path):
    r = run("bubbles", "--schedule", "interleaved_1f1b", "--stages", 4, "--microbatches", 8, "--chunks", 2,
            "--warmup", 7, 8, 6, 4, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("error: table deadlocks:") and r.stderr.count("\n") == 1
