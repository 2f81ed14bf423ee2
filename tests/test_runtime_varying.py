"""Data that varies per step in the runtime: samples of text and 0..N images of 1..T tiles (the
example's --data mix and --data-file), run in chunks of the pieces' shape, balanced over the
microbatches and the data-parallel replicas, refused on every rank when it does not fit. Real gloo
processes (tiny models, 3 steps) beside the unit tests of the parts."""

import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from pybubble.runtime import EncoderBatch  # noqa: E402
from pybubble.runtime.batch import Packing, packed_rows  # noqa: E402
from pybubble.placement.plan import RankPlan, rank_plan  # noqa: E402
from pybubble.placement.step_placement import MeasuredCosts, make_placement, piece_tasks, producers, task_index  # noqa: E402
from pybubble.runtime.replicas import ReplicaMoves  # noqa: E402
from pybubble.schedule.balance import balance_replica_chunks, balance_replica_stream, fill_rows, middle_room, pack_rows, row_layouts  # noqa: E402
from pybubble.schedule.scheduler import schedule_problem  # noqa: E402


PLACEMENTS = ("megatron", "coarse", "pybubble")
DATA_FILE = Path(__file__).resolve().parent / "data" / "varying_steps.jsonl"
"""Twelve samples, four per step of the tiny size: a text-only step, a step with a 32-tile sample,
then a mixed one (the file replays in order)."""
SKEWED = Path(__file__).resolve().parent / "data" / "skewed_replicas.jsonl"
"""Four samples a step: the first replica's two with 8 tiles each, the second's with 0 and 1."""
FILE_PP2 = ("--ranks", 2, "--data-file", DATA_FILE)
MIX_PP2 = ("--ranks", 2, "--data", "mix")
MIX_UNBALANCED = ("--ranks", 2, "--data", "mix", "--balance", "off")
MIX_DP2 = ("--dp", 2, "--pp", 1, "--data", "mix", "--microbatches", 4)  # pp 1: torch infers the shapes with a backward
FILE_DP2 = ("--dp", 2, "--pp", 1, "--data-file", DATA_FILE)
FILE_DP2_PP2 = ("--dp", 2, "--pp", 2, "--data-file", DATA_FILE)
MIX_DP2_PP2 = ("--dp", 2, "--pp", 2, "--data", "mix")
SKEW_DP2 = ("--dp", 2, "--pp", 1, "--data-file", SKEWED)
RUNS = {FILE_PP2: PLACEMENTS, MIX_PP2: PLACEMENTS, MIX_UNBALANCED: ("pybubble",), MIX_DP2: ("megatron", "pybubble"),
        FILE_DP2: ("pybubble",), FILE_DP2_PP2: PLACEMENTS, MIX_DP2_PP2: ("pybubble",), SKEW_DP2: ("megatron", "pybubble")}
TRAINER_RUNS = list(RUNS.items())


def costs(**kw) -> MeasuredCosts:
    base = dict(stage_fwd_s=[0.010, 0.010], stage_bwd_s=[0.020, 0.020], p2p_s=1e-4,
                piece_fwd_s=[0.001, 0.002, 0.001], piece_bwd_s=[0.002, 0.003, 0.002])
    return MeasuredCosts(**{**base, **kw})


# -- the parts ---------------------------------------------------------------------------------
def test_a_batch_runs_in_padded_chunks_and_names_what_does_not_fit():
    a, b = torch.randn(5, 3, 2), torch.randn(0, 3, 2)
    batch = EncoderBatch([a, b], images=[[2, 3], []])
    assert batch.tiles == [5, 0] and batch.chunk_counts(4) == [2, 0]
    last = batch.chunk(0, 1, 4)[0]
    assert torch.equal(last[:1], a[4:]) and torch.equal(last[1:], torch.zeros(3, 3, 2))
    example = (torch.zeros(4, 3, 2),)
    assert batch.problem(example, 2) is None
    assert batch.problem(example, 3) == "batch: 2 microbatches, the schedule runs 3"
    assert EncoderBatch([]).problem(example, 2) == "batch: 0 microbatches, the schedule runs 2 (an empty step)"
    assert "tiles of shape (3, 3)" in EncoderBatch([torch.zeros(1, 3, 3), b]).problem(example, 2)
    assert "do not count each microbatch's tiles" in EncoderBatch([a, b], images=[[2, 2], []]).problem(example, 2)
    with pytest.raises(ValueError, match="do not count the same tiles"):
        EncoderBatch([(torch.zeros(2, 1), torch.zeros(3, 1))])


def test_piece_tasks_chain_every_chunk_and_task_index_finds_them():
    c = costs()
    chunks = [2, 0, 1]
    t = piece_tasks(c, [0, 1, 1], chunks)
    n = len(c.piece_fwd_s)
    assert len(t.duration) == 2 * n * sum(chunks)
    assert list(t.microbatch) == [0] * 12 + [2] * 6
    assert list(t.phase[:12]) == [0] * 6 + [1] * 6
    for j, ch in enumerate(chunks):
        for step in range(n * ch):
            f, b = task_index(n, j, "fwd", step, chunks), task_index(n, j, "bwd", step, chunks)
            assert t.duration[f] == pytest.approx(c.piece_fwd_s[step % n] * 1e6)
            assert t.duration[b] == pytest.approx(c.piece_bwd_s[n - 1 - step % n] * 1e6)
            assert t.microbatch[f] == t.microbatch[b] == j


def test_producers_balance_chunks_and_keep_round_robin_when_even():
    assert producers("pybubble", 4, 2) == [0, 1, 0, 1]
    assert producers("pybubble", 4, 2, chunks=[1, 1, 1, 1]) == [0, 1, 0, 1]
    assert producers("pybubble", 4, 2, chunks=[5, 1, 1, 0]) == [0, 1, 1, 0]  # no encoder work: the first stage's
    assert producers("megatron", 3, 2, first_stage_rank=1, chunks=[3, 0, 2]) == [1, 1, 1]


@pytest.mark.parametrize("mode", PLACEMENTS)
def test_a_varying_step_is_planned_valid_with_each_chain_feeding_its_own_microbatch(mode):
    import pybubble

    c = costs()
    chunks = [3, 0, 1, 5]
    plan = make_placement(mode, c, 4, chunks=chunks)
    assert plan.assignment == [0, 1, 2, 3] and plan.chunks == tuple(chunks)
    if plan.problem is not None:
        assert pybubble.validate(plan.problem, plan.schedule) == []
    names = [f"p{i}" for i in range(3)]
    tasks = [t for r in range(2) for t in rank_plan(plan, r, c, names).tasks]
    assert sorted((t.chain, t.chunk, t.piece, t.phase) for t in tasks) == sorted(
        (j, k, i, ph) for j, ch in enumerate(chunks) for k in range(ch) for i in range(3) for ph in ("fwd", "bwd"))
    assert RankPlan.from_json(rank_plan(plan, 0, c, names).to_json()) == rank_plan(plan, 0, c, names)
    fixed = make_placement(mode, c, 4, chunks=[1] * 4)
    if mode != "megatron":  # more encoder work is a longer or equal step
        assert plan.schedule.step_time >= fixed.schedule.step_time * 0.999
    with pytest.raises(ValueError, match=r"chunks: 3 counts for 4 microbatches"):
        make_placement(mode, c, 4, chunks=[1, 1, 1])
    with pytest.raises(ValueError, match=r"chunks\[1\]"):
        make_placement(mode, c, 4, chunks=[1, -1, 1, 1])


def test_the_core_keeps_each_chain_on_its_own_microbatch_when_told():
    c = costs(piece_fwd_s=[0.004, 0.004, 0.004], piece_bwd_s=[0.004, 0.004, 0.004])
    plan = make_placement("pybubble", c, 4, chunks=[6, 1, 1, 1])
    problem = plan.problem
    free = schedule_problem(problem, "greedy")
    fixed = schedule_problem(problem, "greedy", fixed_assignment=True)
    assert list(fixed.assignment) == [0, 1, 2, 3]
    import pybubble

    assert pybubble.validate(problem, fixed) == [] and pybubble.validate(problem, free) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=8), st.integers(1, 4))
def test_fill_rows_fills_every_microbatch_and_stays_within_one_sample_of_even(per_row, rows):
    m = len(per_row)
    rng = np.random.default_rng(sum(per_row) + rows)
    work = rng.integers(0, 40, m * rows).astype(float)
    mb = fill_rows(work, m, rows)
    assert np.bincount(mb, minlength=m).tolist() == [rows] * m
    load = np.bincount(mb, weights=work, minlength=m)
    assert load.max() - load.min() <= work.max() + 1e-9
    assert (fill_rows(work, m, rows) == mb).all()  # the same on every rank


def test_row_layouts_fill_every_slot_and_order_as_named():
    work = np.array([9.0, 0.0, 13.0, 1.0, 5.0, 7.0, 0.0, 30.0])
    layouts = row_layouts(work, 4, 2, room=np.array([0.0, 3.0, 2.0, 1.0]))
    assert sorted(layouts) == ["balanced_ends", "balanced_room", "given", "given_ends", "given_room"]
    assert layouts["given"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    for slot in layouts.values():
        assert np.bincount(slot, minlength=4).tolist() == [2, 2, 2, 2]
    load = {n: np.bincount(s, weights=work, minlength=4) for n, s in layouts.items()}
    assert load["given_room"].argmax() == 1 and load["given_room"].argmin() == 0  # heaviest where the most room
    ends = middle_room(4)
    assert load["given_ends"][ends == ends.min()].sum() == np.sort(load["given"])[:2].sum()  # lightest first and last
    assert load["balanced_ends"].max() - load["balanced_ends"].min() <= work.max()
    assert sorted(layouts) == sorted(row_layouts(work, 4, 2, room=np.zeros(4)))
    assert "given_room" not in row_layouts(work, 4, 2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.lists(st.integers(1, 13), max_size=3), min_size=2, max_size=2), min_size=2, max_size=3))
def test_replica_moves_never_raise_the_largest_load_and_account_for_every_tile(images):
    moves = ReplicaMoves.decide(images)
    assert moves.load(True).sum() == moves.load(False).sum()
    assert moves.load(True).max() <= moves.load(False).max()
    for r in range(moves.replicas):
        assert moves.chain_tiles(r) == [int(moves.tiles[moves.kept(r, k)].sum() + moves.tiles[moves.moved_in(r, k)].sum())
                                        for k in range(moves.slots)]
        for k in range(moves.slots):
            ids = np.flatnonzero((moves.owner == r) & (moves.slot == k))
            rows = moves.tile_rows(ids, r, k)
            assert rows == list(range(sum(images[r][k])))  # the slot's tiles, each once, in order
            out = [i for o in range(moves.replicas) if o != r for i in moves.sent(r, o, k)]
            assert sorted([*moves.kept(r, k), *out]) == ids.tolist()


def test_tile_moves_drop_the_busiest_replicas_last_chunk_or_move_nothing():
    # 9 + 2 tiles against 3 in one slot, chunks of 8: the giver's last chunk (3 tiles: the 9-tile
    # image's last one and the 2-tile image) fits the taker's padding: one chunk each after
    moves = ReplicaMoves.decide([[[9, 2]], [[3]]], chunk_tiles=8)
    assert moves.chunks(False, 8).tolist() == [2, 1] and moves.chunks(True, 8).tolist() == [1, 1]
    assert moves.tiles.tolist() == [8, 1, 2, 3] and moves.runs_on.tolist() == [0, 1, 1, 1]  # the 9 split 8 + 1
    assert moves.chain_tiles(1) == [6] and moves.kept_tiles(0) == [8]
    # 7 against 1: one chunk each already, the imbalance hidden in the padding: nothing moves
    still = ReplicaMoves.decide([[[7]], [[1]]], chunk_tiles=8)
    assert (still.runs_on == still.owner).all() and still.tiles.tolist() == [7, 1]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.lists(st.integers(0, 13), max_size=3), min_size=3, max_size=3), min_size=2, max_size=4),
       st.integers(1, 8))
def test_tile_moves_never_raise_the_most_chunks_and_keep_every_images_tiles_in_order(images, chunk):
    moves = ReplicaMoves.decide(images, chunk_tiles=chunk)
    assert moves.chunks(True, chunk).max() <= moves.chunks(False, chunk).max()
    assert moves.load(True).sum() == moves.load(False).sum()
    assert ((moves.runs_on == moves.owner) | (moves.tiles > 0)).all()
    for r in range(moves.replicas):
        for k in range(moves.slots):
            ids = np.flatnonzero((moves.owner == r) & (moves.slot == k))
            assert int(moves.tiles[ids].sum()) == sum(images[r][k])
            assert moves.tile_rows(ids, r, k) == list(range(sum(images[r][k])))
            if moves.moved_in(r, k).size:  # never back into a slot it gave from
                assert not np.flatnonzero((moves.owner == r) & (moves.slot == k) & (moves.runs_on != r)).size
    again = ReplicaMoves.decide(images, chunk_tiles=chunk)
    assert (again.runs_on == moves.runs_on).all() and (again.tiles == moves.tiles).all()


def test_tile_moves_refuse_bad_counts():
    with pytest.raises(ValueError, match="tiles"):
        balance_replica_chunks(np.array([[1.5, 2.0]]), 8)
    with pytest.raises(ValueError, match="chunk"):
        balance_replica_chunks(np.array([[1.0], [2.0]]), 0)
    with pytest.raises(ValueError, match="tiles"):
        balance_replica_chunks(np.array([1.0, 2.0]), 8)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=3, max_size=16), st.integers(1, 3), st.integers(1, 8))
def test_pack_rows_fills_every_slot_with_no_more_chunks_than_given_or_balanced(tiles, rows, chunk):
    m = len(tiles) // rows
    work = np.array(tiles[:m * rows], float)
    packed = pack_rows(work, m, rows, chunk)
    assert np.bincount(packed, minlength=m).tolist() == [rows] * m
    chunks = lambda slot: np.ceil(np.bincount(slot, weights=work, minlength=m) / chunk).sum()  # noqa: E731
    assert chunks(packed) <= min(chunks(np.arange(work.size) // rows), chunks(fill_rows(work, m, rows)))
    assert chunks(packed) >= np.ceil(work.sum() / chunk)
    assert (pack_rows(work, m, rows, chunk) == packed).all()


def test_pack_rows_saves_the_padding_a_tile_balance_leaves():
    # 9, 7, 9, 7 in two slots of two: balanced by tiles 16 + 16 either way; chunks of 8 want 9 + 7
    # twice (2 + 2 chunks): the same; with 5, 3, 5, 3 and chunks of 8: 8 + 8 (1 + 1), not 10 + 6 (2 + 1)
    work = np.array([5.0, 5.0, 3.0, 3.0])
    assert np.ceil(np.bincount(np.arange(4) // 2, weights=work) / 8).sum() == 3
    packed = pack_rows(work, 2, 2, 8)
    assert np.bincount(packed, weights=work).tolist() == [8.0, 8.0]
    assert "packed_ends" in row_layouts(work, 2, 2, chunk=8) and "packed_ends" not in row_layouts(work, 2, 2)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=8), st.integers(1, 8))
def test_packed_chains_pad_only_the_last_chunk_and_run_every_slots_tiles_by_its_deadline(tiles, size):
    packed = packed_rows(tiles, size)
    assert sum(packed) == sum(tiles)
    assert sum(-(-n // size) for n in packed) == -(-sum(tiles) // size)  # only the stream's last chunk padded
    nonzero = [n for n in packed if n]
    assert all(n % size == 0 for n in nonzero[:-1])  # whole chunks but the last chain's
    assert (np.cumsum(packed) >= np.cumsum(tiles)).all()  # slot k's tiles run by chain k or an earlier one
    assert all(n == 0 or t > 0 for n, t in zip(packed, tiles))  # a chain runs only for a slot with tiles
    p = Packing.of(tiles, size)
    for k, t in enumerate(tiles):
        src = p.sources(k)
        assert sum(hi - lo for _, lo, hi in src) == t and all(g <= k for g, _, _ in src)
    for g, n in enumerate(packed):
        assert sum(hi - lo for _, lo, hi in p.parts(g)) == n and all(k >= g for k, _, _ in p.parts(g))
    assert Packing.of(tiles, None).packed == tuple(tiles)


def test_a_packed_batch_runs_the_same_tiles_in_fewer_chunks():
    # 3 + 3 + 0 + 10 tiles, chunks of 8: 1 + 1 + 0 + 2 chunks unpacked, 8 + 0 + 0 + 8 rows packed
    batch = EncoderBatch([torch.arange(n, dtype=torch.float32).add(100 * k)[:, None] for k, n in enumerate([3, 3, 0, 10])])
    p = Packing.of(batch.tiles, 8)
    assert p.packed == (8, 0, 0, 8) and sum(batch.chunk_counts(8)) == 4
    chains = p.batch(batch)
    assert chains.chunk_counts(8) == [1, 0, 0, 1]
    stream = torch.cat([chains.inputs[g][0] for g in range(4)])
    again = [torch.cat([chains.inputs[g][0][lo:hi] for g, lo, hi in p.sources(k)] or [stream[:0]]) for k in range(4)]
    assert all(torch.equal(a, x[0]) for a, x in zip(again, batch.inputs))
    assert p.sources(3) == [(0, 6, 8), (3, 0, 8)] and p.parts(0) == [(0, 0, 3), (1, 0, 3), (3, 0, 2)]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), min_size=3, max_size=3), min_size=2, max_size=4), st.integers(1, 8))
def test_stream_moves_bring_every_replica_to_the_fewest_chunks_moving_only_the_excess(tiles, chunk):
    own = np.array(tiles, float)
    moves = balance_replica_stream(own, chunk)
    load, left = own.sum(axis=1), own.copy()
    for k, a, b, n in moves.tolist():
        assert n > 0 and a != b
        left[a, k] -= n
        load[a] -= n
        load[b] += n
    assert (left >= 0).all() and load.sum() == own.sum()
    before, best = np.ceil(own.sum(axis=1) / chunk).max(), np.ceil(own.sum() / (len(tiles) * chunk))
    after = np.ceil(load / chunk).max()
    assert after == best if moves.size else before == best
    givers, takers = set(moves[:, 1].tolist()), set(moves[:, 2].tolist())
    assert not givers & takers
    moved = moves[:, 3].sum() if moves.size else 0
    assert moved == np.maximum(own.sum(axis=1) - best * chunk, 0).sum()  # the excess over the target only
    assert (balance_replica_stream(own, chunk) == moves).all()


def test_stream_moves_refuse_bad_counts():
    with pytest.raises(ValueError, match="tiles"):
        balance_replica_stream(np.array([[1.5, 2.0]]), 8)
    with pytest.raises(ValueError, match="chunk"):
        balance_replica_stream(np.array([[1.0], [2.0]]), 0)


def test_moves_even_out_an_uneven_step():
    moves = ReplicaMoves.decide([[[13, 13], [9]], [[1], []]])
    assert moves.imbalance(False) == pytest.approx(35 / 18)
    assert moves.imbalance(True) < moves.imbalance(False)
    assert moves.sent(0, 1, 0).size or moves.sent(0, 1, 1).size


# -- the trainer on real ranks ------------------------------------------------------------------
def run_id(args) -> str:
    return " ".join(map(str, args)).replace(str(DATA_FILE), "FILE").replace(str(SKEWED), "SKEWED")


@pytest.mark.parametrize("args", list(RUNS), ids=run_id)
def test_varying_data_reaches_the_single_process_parameters(trainer_reports, args):
    reports = trainer_reports(*args, modes=RUNS[args])
    reference = next(iter(reports.values()))["reference_checksum"]
    for mode, report in reports.items():
        assert report["param_checksum"] == pytest.approx(reference, rel=1e-6), mode
        data = report["data"]
        assert len(data["tiles"]) == report["ranks"] and len(data["tiles"][0]) == 3
        assert report["prediction_error"] >= 0 and len(report["predicted_steps_s"]) == 3
        for rank in data["per_rank"]:
            assert rank["encoder_s"] >= 0 and rank["llm_s"] > 0
    if DATA_FILE in args:  # the file's steps: text only, then one sample of 32 tiles (dp 1: 35 in its slot)
        tiles = reports[RUNS[args][0]]["data"]["tiles"]
        assert all(sum(step) == 0 for rank in tiles for step in rank[:1])
        # its slot over the ranks (with dp 2 its tiles may run on both replicas)
        assert max(sum(rank[1][k] for rank in tiles) for k in range(len(tiles[0][1]))) >= 32


@pytest.mark.parametrize("args", [MIX_DP2, FILE_DP2, FILE_DP2_PP2, MIX_DP2_PP2, SKEW_DP2], ids=run_id)
def test_pybubble_moves_encoder_work_to_the_replica_with_room(trainer_reports, args):
    reports = trainer_reports(*args, modes=RUNS[args])
    data = reports["pybubble"]["data"]
    spread = data["replica_imbalance"]
    assert len(spread) == 3 and all(x is not None for x in spread)
    assert all(after <= before + 1e-9 for before, after in spread)  # no move raises the largest load
    if args == SKEW_DP2:  # 16 tiles against 1: some move, every step
        assert all(before == pytest.approx(16 / 8.5) and after < before for before, after in spread)
        ran = [sum(sum(rank[s]) for rank in data["tiles"]) for s in range(3)]  # pp 1: one rank per replica
        assert ran == [17, 17, 17]  # every tile of the step ran once, on one replica or the other
    if "megatron" in reports:
        assert reports["megatron"]["data"]["replica_imbalance"] == [None] * 3  # the baseline: each replica its own
    if "--pp" in args and args[args.index("--pp") + 1] == 1:  # pp 1: each replica's chains packed (chunks of 4)
        for rank_tiles, rank_chunks in zip(data["tiles"], data["chunks"]):
            assert [sum(c) for c in rank_chunks] == [-(-sum(t) // 4) for t in rank_tiles]
        if "megatron" in reports:  # the baseline's chains stay per slot
            mega = reports["megatron"]["data"]
            assert mega["chunks"] == [[[-(-t // 4) for t in step] for step in rank] for rank in mega["tiles"]]


def test_balance_off_runs_the_samples_as_given(trainer_reports):
    data = trainer_reports(*MIX_UNBALANCED, modes=RUNS[MIX_UNBALANCED])["pybubble"]["data"]
    assert data["slot_imbalance_run"] == data["slot_imbalance_given"]
    assert data["layout"] == ["given"] * 3


def test_balance_on_takes_the_layout_the_runtime_predicts_best(trainer_reports):
    data = trainer_reports(*MIX_PP2, modes=RUNS[MIX_PP2])
    assert data["pybubble"]["data"]["layout"][0] == "given"  # step 0: no costs measured yet
    assert set(data["pybubble"]["data"]["layout"]) <= {"given", "given_ends", "given_room", "balanced_ends",
                                                        "balanced_room"}
    assert data["megatron"]["data"]["layout"] == ["given"] * 3  # the baselines run the samples as given


@pytest.mark.parametrize("fault, rank, message", [
    ("tile_shape", 1, "tiles of shape (4, 49) (torch.float32), the encoder's pieces take (4, 48)"),
    ("empty_step", 0, "batch: 0 microbatches, the schedule runs 2 (an empty step)"),
])
def test_bad_data_on_one_rank_is_refused_on_every_rank_before_the_step(trainer_cli, fault, rank, message):
    t = time.monotonic()
    r = trainer_cli("--ranks", 2, "--steps", 3, "--size", "tiny", "--data", "mix", "--mode", "pybubble", "--timeout", 10,
             "--fail-rank", rank, "--fail-step", 1, "--fault", fault, timeout=120)
    assert r.returncode == 1
    assert f"rank {rank}: error: ValueError: {message}" in r.stderr or message in r.stderr
    other = 1 - rank
    assert (f"rank {other}: error: ValueError: batch: rank {rank} refused its step's data" in r.stderr)
    assert time.monotonic() - t < 60


@pytest.mark.parametrize("lines, message", [
    (['{"tiles": [2]}', '{"tiles": [2, 0]}'], "line 2: tiles[1]"),
    (['{"tiles": [2]}', 'not json'], "line 2: not JSON"),
    (['{"tiles": [20, 13]}'], "line 1: tiles: 33 tiles in the sample, more than the limit of 32"),
    (['{"tiles": [30], "text": 20}'], "line 1: tokens: 20 text + 30 tiles x 2 = 80, more than the limit of 72"),
    ([], "no samples"),
])
def test_a_bad_data_file_exits_2_with_one_line_naming_the_line(trainer_main, tmp_path, lines, message):
    path = tmp_path / "samples.jsonl"
    path.write_text("\n".join(lines) + "\n")
    code, err = trainer_main("--size", "tiny", "--data-file", path)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and message in err


@pytest.mark.parametrize("args, message", [
    (["--data", "video"], "error: data: 'video' is not one of fixed, mix (or give --data-file)"),
    (["--data", "mix", "--data-file", "x.jsonl"], "error: data: --data mix beside --data-file: give one"),
    (["--data", "mix", "--balance", "maybe"], "error: balance: 'maybe' is not one of on, off"),
    (["--data", "mix", "--encoder", "clip"], "error: encoder: 'clip' with varying data: its class token per tile "
                                              "does not pool; use vit or timm"),
])
def test_bad_data_options_exit_2_with_one_line(trainer_main, args, message):
    code, err = trainer_main(*args)
    assert code == 2
    assert err.strip() == message
