"""Native-resolution encoders in the runtime: images of any size packed into chunks of a fixed
number of patches (pybubble.runtime.packed), their layout as tensors, so that the pieces traced once
serve every step; transformers' own Qwen2.5-VL vision tower trained by the runtime in every mode
(the test trainer's --encoder qwen2_5_vl) to the parameters of the tower run unsplit; data in
pixels (files and the native mix) and its refusals. Real gloo processes (tiny models, 3 steps)
beside the unit tests of the parts."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybubble.data.files import read_samples
from pybubble.data.mix import NativeMixSpec, native_mix
from pybubble.data.pixels import PROCESSORS, patches

torch = pytest.importorskip("torch")

from pybubble.runtime.packed import pack_images, packed_batch, row_cuts, whole_images  # noqa: E402

PLACEMENTS = ("megatron", "coarse", "pybubble")
NATIVE = Path(__file__).resolve().parent / "data" / "native_sizes.jsonl"
"""Eight samples, four per step of the tiny size (the file replays in order): images of 8 sizes from
28 x 28 to 448 x 672 pixels (one or two per sample), a text-only sample and a 16-frame video."""
QWEN = ("--encoder", "qwen2_5_vl", "--data-file", NATIVE)
PP2 = ("--ranks", 2, *QWEN)
DP2 = ("--dp", 2, "--pp", 1, *QWEN)
DP2_PP2 = ("--dp", 2, "--pp", 2, *QWEN)
SPANNING = ("--chunk-patches", 512)
"""Chunks of a third of the largest image (448 x 672 pixels: 1,536 patches), which spans 4 of them."""
RUNS = {PP2: PLACEMENTS, DP2: PLACEMENTS, DP2_PP2: PLACEMENTS,
        **{(*args, "--balance", "off"): ("pybubble",) for args in (PP2, DP2, DP2_PP2)},
        ("--ranks", 2, "--encoder", "qwen2_5_vl", "--data", "mix"): ("pybubble",),
        (*PP2, *SPANNING): PLACEMENTS, (*DP2, *SPANNING): ("pybubble",), (*DP2_PP2, *SPANNING): PLACEMENTS}
TRAINER_RUNS = list(RUNS.items())


def qwen_vision():
    """pybubble.testing.mllm.qwen_vision, or a skip where transformers has no Qwen2.5-VL layout helpers."""
    from pybubble.testing.mllm.vision_libraries import import_vision_libraries

    import_vision_libraries()
    pytest.importorskip("transformers.vision_utils", reason="transformers without Qwen2.5-VL's vision_utils")
    from pybubble.testing.mllm import qwen_vision as module

    return module


# -- the parts ---------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=64), max_size=30), st.integers(min_value=64, max_value=200))
def test_images_are_packed_once_each_within_chunks(sizes, size):
    chunks, spans = pack_images(sizes, size)
    assert sorted(i for c in chunks for i, _, _ in c) == list(range(len(sizes)))
    assert all((a, b) == (0, sizes[i]) for c in chunks for i, a, b in c) and spans == [1] * len(chunks)
    assert all(c and sum(sizes[i] for i, _, _ in c) <= size for c in chunks)
    assert len(chunks) >= -(-sum(sizes) // size)
    # first-fit decreasing: no chunk but the last could take the next chunk's smallest image
    for a, b in zip(chunks, chunks[1:]):
        assert size - sum(sizes[i] for i, _, _ in a) < min(sizes[i] for i, _, _ in b)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 12), st.integers(1, 12)), max_size=12),
       st.integers(min_value=4, max_value=12))
def test_images_larger_than_a_chunk_span_consecutive_chunks_cut_at_their_rows(grids, rows):
    """An image larger than a chunk (of ``rows`` rows of the widest image's 48 patches) spans chunks
    of its own, cut at every 4 rows and between frames; every image's parts cover it once, in
    order; a span's chunks are consecutive and hold one image larger than a chunk."""
    size = rows * 48
    grids = [(t, 4 * h, 4 * w) for t, h, w in grids]
    sizes = [t * h * w for t, h, w in grids]
    assume = [p for p in sizes if p > size]
    cuts = [row_cuts(g, 4) for g in grids]
    chunks, spans = pack_images(sizes, size, cuts=cuts)
    assert sum(spans) == len(chunks) and all(g >= 1 for g in spans)
    assert all(sum(b - a for _, a, b in c) <= size for c in chunks)
    at = [0] * len(sizes)
    for c in chunks:
        for i, a, b in c:
            assert a == at[i] and a < b and (a == 0 or a in cuts[i]) and (b == sizes[i] or b in cuts[i])
            at[i] = b
    assert at == sizes
    starts = np.cumsum([0, *spans])
    for g, s0 in zip(spans, starts):
        images = {i for c in chunks[s0:s0 + g] for i, _, _ in c}
        big = [i for i in images if sizes[i] > size]
        assert (g == 1 and not big) or (g > 1 and len(big) == 1 and all(chunks[s0 + k][0][0] == big[0]
                                                                         for k in range(g)))
    assert len([g for g in spans if g > 1]) == len(assume)


def test_an_image_larger_than_a_chunk_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"microbatch 1: images\[2\]: 300 patches, but a chunk holds 256"):
        pack_images([4, 8, 300], 256, "microbatch 1: images")


def test_packed_chunks_give_transformers_own_tower_tokens_of_every_microbatch():
    qv = qwen_vision()
    torch.manual_seed(0)
    tower, reference = qv.qwen_tower(16, 2, 2, 8), qv.qwen_tower(16, 2, 2, 8, "sdpa")
    reference.load_state_dict(tower.state_dict())
    from pybubble.runtime.packed import PackedEncoder

    encoder = PackedEncoder(qv.PackedQwenVision(tower, 128))
    grids = [[(1, 4, 4), (1, 8, 8), (1, 4, 6), (2, 4, 4), (1, 4, 4)], [], [(1, 6, 8)]]
    g = torch.Generator().manual_seed(1)
    pixels = [[torch.randn(t * h * w, 1176, generator=g) for t, h, w in mb] for mb in grids]
    batch, packs = packed_batch(pixels, grids, patches=128, width=1176, layout=encoder.encoder.layout)
    assert batch.tiles == [2, 0, 1] and batch.images == [[1, 1], [], [1]]  # chunks: the units balancing moves
    assert all(t.shape[1:] == u.shape[1:] for x in batch.inputs for t, u in zip(x, batch.inputs[0]))  # one shape
    for k, mb in enumerate(grids):
        if mb:
            got = packs[k].tokens(encoder(*batch.inputs[k]))
            want = reference(torch.cat(pixels[k]), grid_thw=torch.tensor(mb)).pooler_output
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class _ReadsItsLayout(torch.nn.Module):
    """transformers' Qwen2.5-VL tower with its own attention: it splits the sequence by Python lengths
    read from ``cu_seqlens``, so a trace would serve the traced layout only."""

    def __init__(self, tower):
        super().__init__()
        self.tower = tower

    def forward(self, pixels, position_ids, cu_seqlens, window_index, cu_window_seqlens):
        return self.tower(pixels, grid_thw=None, position_ids=position_ids, cu_seqlens=cu_seqlens,
                          window_index=window_index, cu_window_seqlens=cu_window_seqlens, max_seqlen=128,
                          max_window_seqlen=128).pooler_output


def test_an_encoder_that_reads_its_layout_as_values_is_refused_by_the_runtime(world_of_one):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from pybubble.runtime import EncoderRuntime
    from pybubble.runtime.packed import PackedEncoder, check_traceable

    qv = qwen_vision()
    torch.manual_seed(0)
    good = PackedEncoder(qv.PackedQwenVision(qv.qwen_tower(16, 1, 2, 8), 128))
    example = (torch.zeros(1, 128, 1176), *(t[None] for t in good.encoder.layout(whole_images([(1, 4, 4), (1, 8, 8)]))))
    check_traceable(good, example)  # block attention from tensors: one trace serves every layout
    bad = PackedEncoder(_ReadsItsLayout(qv.qwen_tower(16, 1, 2, 8, "sdpa")))
    with pytest.raises(ValueError, match=r"encoder: its layout inputs are read as Python values.*sdpa_attention"):
        check_traceable(bad, example)
    stage = PipelineStage(torch.nn.Linear(4, 4), 0, 1, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"encoder: its layout inputs are read as Python values"):
        EncoderRuntime(bad, stage=stage, schedule=Schedule1F1B(stage, 2, loss_fn=lambda y, t: y.sum()), example=example)


def test_packed_batch_refuses_pixels_that_do_not_match_their_grid():
    with pytest.raises(ValueError, match=r"microbatch 0 image 1 has shape \(15, 6\), its grid \(1, 4, 4\) has 16"):
        packed_batch([[torch.zeros(16, 6), torch.zeros(15, 6)]], [[(1, 4, 4), (1, 4, 4)]], patches=64, width=6,
                     layout=lambda parts, chunk: ())
    with pytest.raises(ValueError, match="patches: 66 is not a multiple of the merge's 4"):
        packed_batch([[]], [[]], patches=66, width=6, layout=lambda parts, chunk: ())


def test_a_packed_layout_refuses_a_batch_of_fewer_chunks_than_its_slots_fill():
    from pybubble.placement.slots import SlotLayout
    from pybubble.runtime import EncoderBatch

    layout = SlotLayout.as_given([300, 100, 0, 20], 2, per_chunk=256)  # slots of 400 and 20 patches
    assert layout.slot_tiles == [400, 20] and layout.fewest_chunks == [2, 1]
    example = (torch.zeros(1, 8),)
    ok = EncoderBatch([torch.zeros(2, 8), torch.zeros(1, 8)])
    assert ok.problem(example, 2, layout) is None
    short = EncoderBatch([torch.zeros(1, 8), torch.zeros(1, 8)])
    assert short.problem(example, 2, layout) == ("batch: chunks per microbatch [1, 1], fewer than the layout lay_out "
                                                 "chose ('given') fills, [2, 1]")


# -- data in pixels ----------------------------------------------------------------------------
def test_a_data_file_in_pixels_gives_each_image_its_grid_and_tokens():
    samples = read_samples(NATIVE)
    qwen = PROCESSORS["qwen2_5_vl"]
    assert samples.images.tolist() == [1, 1, 0, 2, 1, 1, 1, 2]
    assert [tuple(g) for g in samples.grids[:2]] == [(1, 4, 4), (1, 32, 48)]  # 28 x 28 is resized up to 56 x 56
    assert tuple(samples.grids[4]) == (8, 8, 12)  # 16 frames of 112 x 168: 8 temporal patches
    assert samples.tiles.tolist() == [qwen.tokens(tuple(g)) for g in samples.grids]
    assert samples.tokens().tolist() == (samples.text + samples.sample_tiles).tolist()  # a tile is one token
    taken = samples.take(np.array([4, 0]))
    assert taken.grids.tolist() == [samples.grids[4].tolist(), samples.grids[0].tolist()]


@pytest.mark.parametrize("lines, kwargs, message", [
    (['{"images": [[0, 28]]}'], {}, r"line 1: images\[0\]: height: 0 is not a positive integer"),
    (['{"images": [[28, 6000]]}'], {}, r"line 1: images\[0\]: 28 x 6000 pixels: aspect ratio 214.286, over"),
    (['{"videos": [[112, 112]]}'], {}, r"line 1: videos\[0\]: \[112, 112\] is not \[frames, height, width\]"),
    (['{"images": [[28, 28]]}', '{"tiles": [2]}'], {}, r"line 2: a sample in tiles in a file of samples in pixels"),
    (['{"images": [[448, 672]]}'], {"max_patches": 1024}, r"line 1: image 0: grid \(1, 32, 48\) of 1536 patches"),
    (['{"images": [[448, 672]], "text": 10}'], {"max_tokens": 390},
     r"line 1: tokens: 10 text \+ 384 image tokens = 394, more than the limit of 390"),
])
def test_bad_lines_in_pixels_are_refused_naming_the_line(tmp_path, lines, kwargs, message):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=message):
        read_samples(path, **kwargs)


def test_the_native_mix_is_drawn_from_its_seed_by_the_processors_rules():
    a, b = native_mix(64, seed=3), native_mix(64, seed=3)
    assert a.grids.tolist() == b.grids.tolist() and a.text.tolist() == b.text.tolist()
    assert native_mix(64, seed=4).grids.tolist() != a.grids.tolist()
    assert a.tiles.tolist() == [PROCESSORS["qwen2_5_vl"].tokens(tuple(g)) for g in a.grids]
    small = native_mix(64, seed=3, spec=NativeMixSpec(scale=0.25))
    assert max(patches(tuple(g)) for g in small.grids) < max(patches(tuple(g)) for g in a.grids)
    with pytest.raises(ValueError, match="sizes: probabilities sum to"):
        NativeMixSpec(sizes=((28, 28, 0.5),))


@pytest.mark.parametrize("lines, args, message", [
    (['{"images": [[28, 28]], "text": 1}', '{"images": [[-5, 28]]}'], (),
     r"line 2: images[0]: height: -5 is not a positive integer"),
    (['{"images": [[28, 5700]]}'], (), "line 1: images[0]: 28 x 5700 pixels: aspect ratio 203.571"),
    (['{"images": [[448, 672], [448, 336]], "text": 5}'], (),
     "line 1: tokens: 5 text + 576 image tokens = 581, more than the limit of 520"),
    (['{"images": [[448, 672]]}'], ("--chunk-patches", 128),
     "line 1: image 0: grid (1, 32, 48): 4 rows of 48 patches (192) cannot be cut, more than the limit of 128"),
    (['{"images": [[28, 28]]', '{"text": 2}'], (), "line 1: not JSON"),
    (['{"tiles": [2]}'], (), "samples in tiles, but the encoder takes pixels"),
])
def test_bad_data_in_pixels_exits_2_with_one_line_naming_the_line(trainer_main, tmp_path, lines, args, message):
    path = tmp_path / "samples.jsonl"
    path.write_text("\n".join(lines) + "\n")
    code, err = trainer_main("--size", "tiny", "--encoder", "qwen2_5_vl", "--data-file", path, *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and message in err


@pytest.mark.parametrize("args, message", [
    (["--encoder", "qwen2_5_vl"], "error: encoder: 'qwen2_5_vl' takes images at native resolution: give --data mix or "
                                  "--data-file"),
    (["--data", "mix", "--encoder", "qwen2_5_vl", "--chunk-patches", "6"],
     "error: chunk_patches: 6 is not a multiple of the merger's 4"),
    (["--data", "mix", "--chunk-patches", "64"], "error: chunk_patches: 64 is not >= 1 with a native-resolution encoder"),
])
def test_bad_native_options_exit_2_with_one_line(trainer_main, args, message):
    code, err = trainer_main(*args)
    assert code == 2
    assert err.strip().startswith(message)


# -- the runtime, on real processes ----------------------------------------------------------------
@pytest.mark.parametrize("args", list(RUNS), ids=("pp2", "dp2", "dp2 x pp2", "pp2 unbalanced", "dp2 unbalanced",
                                                  "dp2 x pp2 unbalanced", "pp2 mix", "pp2 spans", "dp2 spans",
                                                  "dp2 x pp2 spans"))
def test_every_mode_ends_with_the_parameters_of_the_tower_run_unsplit(trainer_reports, args):
    reports = trainer_reports(*args, modes=RUNS[args])
    for mode, report in reports.items():
        assert report["param_checksum"] == pytest.approx(report["reference_checksum"], rel=1e-6), mode
        assert report["encoder"] == "qwen2_5_vl"


def test_balance_lays_the_samples_out_by_their_patches(trainer_reports):
    balanced = trainer_reports(*PP2, modes=RUNS[PP2])
    assert balanced["pybubble"]["data"]["layout"][0] == "given"  # step 0: no costs measured yet
    assert set(balanced["pybubble"]["data"]["layout"][1:]) - {"given"}  # later: a balanced layout
    for mode in ("megatron", "coarse"):  # the baselines run the samples as given
        assert balanced[mode]["data"]["layout"] == ["given"] * 3
    off = trainer_reports(*PP2, "--balance", "off", modes=("pybubble",))["pybubble"]["data"]
    assert off["layout"] == ["given"] * 3 and off["slot_imbalance_run"] == off["slot_imbalance_given"]


@pytest.mark.parametrize("args", [(*PP2, *SPANNING), (*DP2, *SPANNING), (*DP2_PP2, *SPANNING)],
                         ids=("pp2", "dp2", "dp2 x pp2"))
def test_images_larger_than_a_chunk_ran_across_the_chunks_of_their_spans(trainer_reports, args):
    """With chunks smaller than the largest images, the runs above (parameters equal to the tower
    unsplit) ran those images over spans of several chunks: the step records' spans."""
    reports = trainer_reports(*args, modes=RUNS[args])
    for mode, report in reports.items():
        spans = [s for rank in report["data"]["spans"] for s in rank if s]
        assert max(g for step in spans for chain in step for g in chain) == 4, mode  # the 448 x 672 image
        assert report["traces"] == [[0, 0, 0]] * len(report["traces"]), mode


@pytest.mark.parametrize("args", [PP2, DP2, DP2_PP2], ids=("pp2", "dp2", "dp2 x pp2"))
def test_the_pieces_are_traced_once_and_every_step_runs_in_chunks_of_their_shape(trainer_reports, args):
    reports = trainer_reports(*args, modes=RUNS[args])
    for mode, report in reports.items():
        assert report["traces"] == [[0, 0, 0]] * len(report["traces"]), mode  # no rank traced during a step
        data = report["data"]
        assert data["chunk_tiles"] == 1  # a chunk of packed patches is the pieces' unit
        for rank_tiles, rank_chunks in zip(data["tiles"], data["chunks"]):
            assert rank_tiles == rank_chunks and any(sum(step) for step in rank_tiles)
