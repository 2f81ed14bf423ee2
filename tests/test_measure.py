"""pybubble measure: idle per rank and kind from torch.profiler Chrome traces (synthetic traces with
known answers, CPU/gloo and CUDA/NCCL shaped), the prediction beside it, and bad input."""

import gzip
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict

import pytest

from pybubble.measure.bubbles import RankTrace, compare, measure, predicted_bubbles, rank_bubbles, transfer_posts
from pybubble.measure.trace_reader import Trace


def x(name, ts, dur, cat="cpu_op", tid=1, pid=7):
    """An event; times in units of 10 us (gaps under 100 us are host glue, not idle)."""
    return {"ph": "X", "name": name, "cat": cat, "ts": 10 * ts, "dur": 10 * dur, "pid": pid, "tid": tid}


def cpu_rank(rank, world=2):
    """A stage of a 2-stage 1F1B step on gloo, times in us: ops annotated as pybubble's adapter
    and torch's runtime name them, a wait with a task inside, a gradient all-reduce."""
    ev = [
        x("aten::mm", 0, 100), x("PP:0F0", 0, 100, "user_annotation"),          # busy 0-100
        # idle 100-300 (warm-up: before the first backward), the recv posted 100-300 on gloo's thread
        x("gloo:recv", 100, 200, "user_annotation", tid=2),
        x("pybubble:wait", 100, 200, "user_annotation"),
        x("pybubble:task:e0f.0", 150, 50, "user_annotation"), x("aten::addmm", 150, 50),  # a task in the wait: busy
        x("PP:0B0", 300, 200, "user_annotation"), x("aten::mm", 300, 150),      # the op's own glue 450-500 is busy
        # idle 500-600 (steady), then the last forward
        x("PP:0F1", 600, 100, "user_annotation"), x("aten::mm", 600, 100),
        # idle 700-800 (cool-down), the last backward
        x("PP:0B1", 800, 100, "user_annotation"), x("aten::mm", 800, 100),
        # all-reduce: the op posts, the main thread waits 920-1000 (collective), gloo's thread works
        x("c10d::allreduce_", 900, 20), x("gloo:all_reduce", 930, 60, "user_annotation", tid=3),
        x("aten::add_", 1000, 10),
    ]
    return {"traceEvents": ev, "distributedInfo": {"rank": rank, "world_size": world}}


def write(tmp_path, docs):
    for r, doc in enumerate(docs):
        (tmp_path / f"rank{r}.json").write_text(json.dumps(doc))
    return tmp_path


def test_cpu_trace_idle_by_kind(tmp_path):
    peer = cpu_rank(1)
    peer["traceEvents"].append(x("gloo:send", 250, 60, "user_annotation", tid=2))  # the peer sends 250-310
    ranks = measure(write(tmp_path, [cpu_rank(0), peer]))
    r = ranks[0]
    assert r.device == "cpu" and r.span == 10100
    assert r.idle_by_kind == {"warmup": 1500, "steady": 1000, "cooldown": 1000, "collective": 800}
    assert r.idle == 4300 and r.busy == 10100 - 4300
    # The wait's idle is the pipeline's, the all-reduce's data parallel; 500-600 and 700-800 are in
    # no wait (no annotation, nothing posted).
    assert r.idle_by_parallelism == {"pp": 1500, "dp": 800, "tp": 0, "other": 2000}
    # Rank 0's receive (100-300) and the peer's send (250-310) both posted 250-300: transferring.
    assert r.transferring == 500 and r.waiting == 3800


def test_waits_split_idle_by_parallelism(tmp_path):
    """The runtime's waits inside ops and hooks that enclose them (autograd's, FSDP's): the waits
    are idle but for the tasks run in them, each by its kind, a data-parallel wait inside a
    tensor-parallel one the data-parallel's; the glue around a wait's annotation goes with it."""
    note = lambda name, ts, dur: x(name, ts, dur, "user_annotation")  # noqa: E731
    ev = [
        # the step's barrier: idle 10-100
        note("pybubble:sync", 0, 100), x("c10d::barrier", 0, 10), x("gloo:barrier", 0, 95, "user_annotation", tid=3),
        note("PP:0F0", 100, 1000), x("autograd::engine::evaluate_function: X", 100, 1000),
        # a TP wait (idle 200-400), a DP wait inside another TP wait (idle 500-550 and 600-700 DP,
        # 700-710 TP), the host blocked in the functional collective's wait_tensor
        note("pybubble:tp_wait", 200, 200), x("_c10d_functional::wait_tensor", 205, 190),
        x("gloo:all_reduce", 200, 200, "user_annotation", tid=3),
        note("pybubble:tp_wait", 500, 210), note("FSDP::all_gather (blocks.0)", 495, 220),
        note("pybubble:dp_wait", 500, 200), note("pybubble:task:e0f.0", 550, 50), x("aten::addmm", 550, 50),
        x("gloo:all_gather", 500, 200, "user_annotation", tid=3),
        # a pipeline wait (idle 1110-1400) whose annotation opens 5 after the op and closes 5 before the next
        x("aten::mm", 1100, 10), note("pybubble:wait", 1115, 280), note("PP:0B0", 1400, 100), x("aten::mm", 1400, 100),
    ]
    [r] = measure(write(tmp_path, [{"traceEvents": ev}]))
    assert r.idle == 10 * (90 + 200 + 50 + 110 + 290)
    assert r.idle_by_parallelism == {"pp": 2900, "dp": 1500, "tp": 2100, "other": 900}
    assert r.idle_by_kind["collective"] == 10 * (90 + 200 + 160)  # FSDP::all_gather names a collective


def test_cuda_trace_counts_gpu_kernels_and_nccl(tmp_path):
    k = lambda name, ts, dur: x(name, ts, dur, cat="kernel", tid=7)  # noqa: E731
    a = lambda name, ts, dur: x(name, ts, dur, cat="gpu_user_annotation", tid=7)  # noqa: E731
    doc = {"traceEvents": [
        x("cudaLaunchKernel", 0, 5, "cuda_runtime"),
        k("ampere_sgemm", 0, 100), a("PP:0F0", 0, 100),
        k("ncclDevKernel_SendRecv", 100, 150),            # idle for compute 100-300: warm-up
        k("ampere_sgemm", 300, 200), a("PP:0B0", 300, 200),
        k("ncclDevKernel_AllReduce_Sum_f32", 500, 100),   # collective 500-600
        k("ampere_sgemm", 600, 50), a("PP:0F1", 600, 50),
    ]}
    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    [r] = measure(tmp_path / "rank0.json")
    assert r.device == "cuda" and r.span == 6500 and r.busy == 3500
    assert r.idle_by_kind == {"warmup": 2000, "steady": 0, "cooldown": 0, "collective": 1000}
    assert r.waiting is None  # one rank's trace: transfers not separable


def test_prediction_from_a_timeline_trace_and_a_config(tmp_path):
    import pybubble

    tl = pybubble.simulate_pipeline("1f1b", ranks=2, microbatches=4, fwd=100.0, bwd=200.0)
    pybubble.save_trace(tl, tmp_path / "plan.json")
    step, stages = predicted_bubbles(tmp_path / "plan.json")
    assert step == pytest.approx(tl.step_time)
    for s, kinds in tl.bubble_time().items():
        assert stages[s]["warmup"] == pytest.approx(kinds["pp_warmup"])
        assert stages[s]["cooldown"] == pytest.approx(kinds["pp_cooldown"])
    (tmp_path / "t").mkdir()
    ranks = measure(write(tmp_path / "t", [cpu_rank(0), cpu_rank(1)]))
    rows = compare(ranks, predicted_bubbles(tmp_path / "plan.json"))["ranks"]
    assert rows[0]["kinds"]["warmup"]["measured_us"] == 1500
    assert rows[1]["kinds"]["warmup"]["error"] == pytest.approx(1500 / tl.bubble_time()[1]["pp_warmup"] - 1)


def test_prediction_from_a_planning_config():
    from pathlib import Path

    config = Path(__file__).resolve().parents[1] / "examples" / "quickstart.yaml"
    step, stages = predicted_bubbles(config)
    assert step > 0 and len(stages) >= 2
    assert all(set(k) == {"warmup", "steady", "cooldown", "collective"} for k in stages.values())
    assert sum(stages[1].values()) > 0


def cli(*args):
    # Run outside the source tree so that the installed package (with its extension) is imported.
    return subprocess.run([sys.executable, "-m", "pybubble", "measure", *map(str, args)], capture_output=True,
                          text=True, timeout=60, cwd=tempfile.gettempdir())


def test_cli_prints_writes_json_and_a_plot(tmp_path):
    (tmp_path / "traces").mkdir()
    folder = write(tmp_path / "traces", [cpu_rank(0), cpu_rank(1)])
    r = cli(folder, "--json", tmp_path / "m.json", "--plot", tmp_path / "m.png")
    assert r.returncode == 0, r.stderr
    assert "measure: ranks=2 " in r.stdout and "cooldown" in r.stdout
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["format"] == "pybubble.measure/1" and len(doc["ranks"]) == 2
    assert (tmp_path / "m.png").stat().st_size > 1000


PROFILED = {"dp": (("--dp", 2, "--pp", 2), ("megatron",), "cpu", True), "tp": (("--tp", 2), ("megatron",), "cpu", True)}
"""The test trainer's profiled runs these tests measure (megatron: the waits are not filled),
beside pp2_reports' pipeline alone."""
TRAINER_RUNS = list(PROFILED.values())


def measured_by_parallelism(prof, tmp_path):
    """`pybubble measure --json` of the traces in `prof`: its ranks, each one's split summing to its idle."""
    r = cli(prof, "--json", tmp_path / "m.json")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^rank +idle +pp +dp +tp +other$", r.stdout, re.M) and " tp_ms=" in r.stdout.splitlines()[-1]
    ranks = json.loads((tmp_path / "m.json").read_text())["ranks"]
    for rank in ranks:
        assert set(rank["idle_by_parallelism"]) == {"pp", "dp", "tp", "other"}
        assert sum(rank["idle_by_parallelism"].values()) == pytest.approx(rank["idle"], rel=1e-9)
    return [rank["idle_by_parallelism"] for rank in ranks]


def test_a_pipeline_alone_waits_for_no_collective_of_dp_or_tp(tmp_path, pp2_reports):
    split = measured_by_parallelism(pp2_reports["megatron"]["profile_dir"], tmp_path)
    assert len(split) == 2 and all(s["dp"] == 0 and s["tp"] == 0 for s in split)
    assert sum(s["pp"] for s in split) > 0


@pytest.mark.parametrize("kind", ["dp", "tp"])
def test_data_and_tensor_parallel_ranks_wait_for_their_collectives(tmp_path, trainer_reports, kind):
    """dp 2 x pp 2 (FSDP2) and tp 2 alone: idle in the kind's collectives (a rank that reaches each
    of them last waits in none), none in the other kind's."""
    args, modes, device, profile = PROFILED[kind]
    prof = trainer_reports(*args, modes=modes, device=device, profile=profile, timeout=300)["megatron"]["profile_dir"]
    split = measured_by_parallelism(prof, tmp_path)
    assert sum(s[kind] for s in split) > 0 and all(s["tp" if kind == "dp" else "dp"] == 0 for s in split), split


GOOD = json.dumps(cpu_rank(0)).encode()
GZIPPED = gzip.compress(GOOD)


@pytest.mark.parametrize("content, message", [
    (b"not json {", r"not valid JSON: lexical error"),
    (json.dumps({"traceEvents": []}).encode(), r"no trace events"),
    (b"", r"empty file"),
    (GOOD[:len(GOOD) // 2], r"not valid JSON: it ends early \(truncated\)"),  # truncated
    (GZIPPED[:len(GZIPPED) // 2], r"not a valid gzip file"),  # a truncated gzip stream
    (GZIPPED[:40] + bytes(b ^ 0x55 for b in GZIPPED[40:80]) + GZIPPED[80:], r"not (a valid gzip file|valid JSON)"),
    (gzip.compress(b""), r"empty file"),
    (json.dumps({"schemaVersion": 1, "traceEvents": {"ph": "X"}}).encode(), r"no trace events"),  # wrong schema
    (json.dumps([1, "x", None]).encode(), r"no trace events"),
    (json.dumps(42).encode(), r"no trace events"),
    (json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": "soon", "dur": 1}]}).encode(),
     r"traceEvents\[0\]\.ts: 'soon' is not a number"),
    (json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1, "dur": 10**400}]}).encode(),
     r"not valid JSON: parse error: integer overflow"),
    (json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1, "dur": 1, "pid": [1]}]}).encode(),
     r"traceEvents\[0\]: pid \[1\] and tid None are not numbers or names"),
    (json.dumps({**cpu_rank(0), "distributedInfo": {"rank": 0, "world_size": "two"}}).encode(),
     r"distributedInfo.world_size: 'two' is not an integer"),
    (GOOD + b" {}", r"not valid JSON: parse error: trailing garbage"),
    (json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1, "dur": float("inf")}]}).encode(),
     r"not valid JSON"),
    (json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1, "dur": 2**1100}]}).encode(),
     r"not valid JSON: parse error: integer overflow"),
], ids=["not-json", "no-events", "empty", "truncated", "gzip-truncated", "gzip-corrupted", "gzip-empty",
        "events-not-a-list", "list-of-non-events", "a-number", "ts-a-string", "dur-400-digits", "pid-a-list",
        "world-size-a-string", "trailing-garbage", "dur-infinity", "dur-1100-bits"])
@pytest.mark.parametrize("name", ["rank0.json", "rank0.json.gz"])
def test_bad_traces_exit_2_with_one_line(tmp_path, content, message, name):
    """Truncated, gzip-corrupted, wrong-schema and empty traces, with either suffix (gzip is told by
    its first bytes): a ValueError naming the file; from the CLI, one error line and exit 2."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(str(path)) + ": " + message):
        measure(path)
    r = cli(path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), r.stderr
    assert re.search(message, lines[0]), lines[0]


def test_a_trace_streams_as_json_parses_it_whole(tmp_path):
    """The streaming reader gives the events and fields that json.load gives, fields before or
    after the events, from a plain or a gzipped file (whatever its name), or a bare list."""
    doc = cpu_rank(1, world=2)
    doc["traceEvents"] += [{"ph": "s", "id": 3, "ts": 1.5, "cat": "ac2g"}, {"ph": "M", "name": "thread_name",
                                                                          "args": {"name": "main", "deep": [[{}]]}}]
    for name, data, head in [("a.json", json.dumps(doc), False),
                             ("b.json", json.dumps({"distributedInfo": doc["distributedInfo"], **doc}), True),
                             ("c.json.gz", gzip.compress(json.dumps(doc).encode()), False),
                             ("d.json", gzip.compress(json.dumps(doc).encode()), False)]:
        path = tmp_path / name
        path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
        trace = Trace(path)
        assert trace.gzipped == isinstance(data, bytes)
        assert list(trace.events()) == json.loads(json.dumps(doc))["traceEvents"]
        assert trace.fields == {"distributedInfo": {"rank": 1, "world_size": 2}}
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(doc["traceEvents"]))
    trace = Trace(bare)
    assert list(trace.events()) == doc["traceEvents"] and trace.fields == {}


def test_measure_streams_plain_and_gzipped_traces_alike(tmp_path):
    """A folder of gzipped traces measures as the same traces in plain JSON, and as the whole-file
    reading: the events measure keeps, read as a stream, are those of json.load's document."""
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir(), packed.mkdir()
    docs = [cpu_rank(0), cpu_rank(1)]
    write(plain, docs)
    for r, doc in enumerate(docs):
        (packed / f"rank{r}.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    streamed, zipped = measure(plain), measure(packed)
    whole = [json.loads((plain / f"rank{r}.json").read_text())["traceEvents"] for r in range(2)]
    traces = [RankTrace.of_events(events) for events in whole]
    posts = [transfer_posts(t)[0] for t in traces]
    expected = [rank_bubbles(traces[r], r, posts[1 - r]) for r in range(2)]
    assert [asdict(r) for r in streamed] == [asdict(r) for r in zipped] == [asdict(r) for r in expected]
    assert streamed[0].idle_by_kind == {"warmup": 1500, "steady": 1000, "cooldown": 1000, "collective": 800}


def test_measure_keeps_only_the_events_it_uses(tmp_path):
    """CUDA launches, flow arrows, Python frames and metadata are dropped as the trace is read."""
    doc = cpu_rank(0)
    doc["traceEvents"] += [x("cudaLaunchKernel", 0, 1, "cuda_runtime"), x("train.py(12): step", 0, 1, "python_function"),
                           {"ph": "f", "id": 1, "ts": 0, "cat": "ac2g"}, x("ProfilerStep#3", 0, 1010, "other")]
    kept = RankTrace.of_events(doc["traceEvents"])
    assert len(kept.start) == len(cpu_rank(0)["traceEvents"]) + 1  # the step, whatever its category
    assert "ProfilerStep#3" in kept.names


def test_one_trace_file_is_measured_alone(tmp_path):
    """A single file is that rank's measurement even when its distributedInfo names a larger world."""
    path = tmp_path / "rank1.json"
    path.write_text(json.dumps(cpu_rank(1, world=4)))
    [r] = measure(path)
    assert r.rank == 1 and r.idle_by_kind["warmup"] == 1500


def test_a_missing_rank_exits_2_with_one_line(tmp_path):
    (tmp_path / "rank0.json").write_text(json.dumps(cpu_rank(0, world=3)))
    (tmp_path / "rank2.json").write_text(json.dumps(cpu_rank(2, world=3)))
    r = cli(tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: ranks: rank 1 missing (traces of ranks [0, 2], world size 3)"


def test_prediction_with_other_stages_is_refused(tmp_path):
    import pybubble

    pybubble.save_trace(pybubble.simulate_pipeline("1f1b", ranks=4, microbatches=4, fwd=1.0, bwd=2.0),
                        tmp_path / "plan.json")
    (tmp_path / "t").mkdir()
    write(tmp_path / "t", [cpu_rank(0), cpu_rank(1)])
    r = cli(tmp_path / "t", "--predict", tmp_path / "plan.json")
    assert r.returncode == 2
    assert r.stderr.strip() == "error: predict: 4 pipeline stages predicted, 2 ranks measured"


def test_measure_does_not_import_torch():
    code = "import sys, pybubble.measure.bubbles, pybubble.cli; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=tempfile.gettempdir())
    assert r.stdout.strip() == "False", r.stderr


TRICKY = json.dumps({"traceEvents": [{"ph": "X", "name": 'a"[[{\\' * 40 + "]" * 90, "args": {"x": ["\\\\\"[{" * 30, [[]]]}},
                                     {"name": "\\" * 7 + "[" * 80 + '"' + "\\\\" * 5}] * 4}).encode()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 65536])
def test_nesting_is_tracked_outside_strings_across_reads_of_any_size(size):
    """Brackets, quotes and backslashes inside strings (escaped quotes, runs of backslashes cut
    between two reads) do not count as nesting; the depth ends at 0."""
    import io

    from pybubble.measure.trace_reader import _Nesting

    stream = _Nesting(io.BytesIO(TRICKY), "t.json")
    assert b"".join(iter(lambda: stream.read(size), b"")) == TRICKY
    assert stream.depth == 0 and not stream.in_string


@pytest.mark.parametrize("depth, ok", [(64, True), (65, False), (1_000_000, False)])
def test_a_trace_nested_past_the_limit_is_refused_as_it_is_read(tmp_path, depth, ok):
    """ijson's memory grows with the square of the nesting (a prefix per level): a small file
    nested a million deep is refused at the limit of pybubble's documents, not read."""
    inner = "[" * (depth - 3) + "]" * (depth - 3)
    path = tmp_path / "deep.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1, "dur": 1, "args": ' + inner + "}]}")
    if ok:
        assert len(list(Trace(path).events())) == 1
    else:
        with pytest.raises(ValueError, match=re.escape(f"{path}: nested deeper than the limit of 64 levels")):
            list(Trace(path).events())
