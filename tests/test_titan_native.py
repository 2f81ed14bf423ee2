"""torchtitan's own native-resolution vision encoder (Qwen3.5's ``Qwen35VisionEncoder``) on the
runtime's packed chunks (pybubble.integrations.torchtitan.packed_vision): its layout as tensors
reproduces torchtitan's position embeddings, one chunk its forward and gradients, and the test
trainer's ``--encoder titan_vit`` trains in every mode to the parameters of torchtitan's forward
run unpacked. Needs torchtitan with its qwen3_5 model (flash-linear-attention): ``.ci/titan``
installs them; elsewhere these tests skip."""

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan.models.qwen3_5.vision_encoder",
                    reason="torchtitan with its qwen3_5 model is not installed (.ci/titan installs it)")

from pybubble.integrations.torchtitan.packed_vision import PackedTitanVision, use_segment_attention  # noqa: E402
from pybubble.runtime.packed import PackedEncoder, packed_batch, whole_images  # noqa: E402
from pybubble.testing.mllm.titan_vision import titan_tower, unpacked  # noqa: E402

PLACEMENTS = ("megatron", "coarse", "pybubble")
SIZES = Path(__file__).resolve().parent / "data" / "titan_sizes.jsonl"
"""Eight samples of images from 28 x 28 to 448 x 672 pixels, a text-only one and an 8-frame video,
sized by Qwen3.5's processor (16-pixel patches, at least 256 x 256 pixels)."""
TITAN = ("--encoder", "titan_vit", "--data-file", SIZES)
SPANNING = ("--chunk-patches", 512)
"""Chunks smaller than the 448 x 672 image (1,176 patches: 3 chunks of 6 merged-row pairs)."""
RUNS = {("--ranks", 2, *TITAN): PLACEMENTS, ("--dp", 2, "--pp", 2, *TITAN): PLACEMENTS,
        ("--dp", 2, "--pp", 1, *TITAN, "--balance", "off"): ("pybubble",),
        ("--ranks", 2, *TITAN, *SPANNING): PLACEMENTS}
TRAINER_RUNS = list(RUNS.items())
WIDTH = 3 * 2 * 16 * 16


def test_the_layout_gives_torchtitans_own_position_embeddings():
    tower = titan_tower(16, 1, 2, 8, seed=0)
    chunk = PackedTitanVision(tower, 256)
    grids = [(1, 4, 6), (2, 4, 4), (1, 6, 10)]
    index, weight, rope, segments = chunk.layout(whole_images(grids))
    learned_own, rope_own = tower.compute_position_embeddings([list(g) for g in grids], 60)
    at = 0
    for i, (t, h, w) in enumerate(grids):
        n = t * h * w
        learned = (tower.pos_embed[index[at:at + n]] * weight[at:at + n, :, None]).sum(1)
        torch.testing.assert_close(learned, learned_own[i, :n], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rope[at:at + n], rope_own[i, :n])
        assert (segments[at:at + n] == i).all()
        at += n
    assert (segments[at:] == -1).all() and (weight[at:] == 0).all()


def test_the_trainer_cuts_its_images_where_the_layout_may():
    from pybubble.runtime.packed import row_cuts
    from pybubble.testing.mllm.job import CUT_ROWS

    chunk = PackedTitanVision(titan_tower(16, 1, 2, 8, seed=0), 256)
    assert chunk.cuts([1, 8, 12]) == row_cuts([1, 8, 12], CUT_ROWS["titan_vit"]) and CUT_ROWS["titan_vit"] == 2


def test_one_chunk_gives_torchtitans_forward_and_gradients():
    tower = titan_tower(16, 2, 2, 8, seed=0)
    reference = use_segment_attention(copy.deepcopy(tower))
    encoder = PackedEncoder(PackedTitanVision(tower, 128))
    grids = [[(1, 4, 6), (2, 4, 4), (1, 6, 10)], [(1, 2, 2)]]
    g = torch.Generator().manual_seed(1)
    pixels = [[torch.randn(t * h * w, WIDTH, generator=g) for t, h, w in mb] for mb in grids]
    batch, packs = packed_batch(pixels, grids, patches=128, width=WIDTH, layout=encoder.encoder.layout)
    own = unpacked(reference)
    for k, mb in enumerate(grids):
        got, want = packs[k].tokens(encoder(*batch.inputs[k])), own(pixels[k], mb)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
        got.square().sum().backward()
        want.square().sum().backward()
        for (name, a), b in zip(tower.named_parameters(), reference.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-7, msg=name)
        tower.zero_grad(), reference.zero_grad()


def test_an_image_across_chunks_gives_torchtitans_forward_and_gradients():
    """An image larger than a chunk, cut between merged rows over a span of chunks, each attention
    over the span (pybubble.runtime.spans): torchtitan's tokens and gradients of the whole image."""
    from pybubble.runtime.segments import MicrobatchRun, split_into_pieces
    from pybubble.runtime.spans import span_backward, span_forward

    tower = titan_tower(16, 2, 2, 8, seed=0)
    reference = use_segment_attention(copy.deepcopy(tower))
    encoder = PackedEncoder(PackedTitanVision(tower, 128))
    grids = [[(1, 12, 20), (1, 2, 4)]]  # 240 patches: rows 0-6 and the small image | rows 6-12
    g = torch.Generator().manual_seed(3)
    pixels = [[torch.randn(t * h * w, WIDTH, generator=g) for t, h, w in mb] for mb in grids]
    batch, packs = packed_batch(pixels, grids, patches=128, width=WIDTH, layout=encoder.encoder.layout)
    assert packs[0].spans == (2,)
    pieces = split_into_pieces(encoder, tuple(t[0:1] for t in batch.inputs[0]))
    runs = [MicrobatchRun(pieces, tuple(t[c:c + 1] for t in batch.inputs[0])) for c in range(2)]
    for i, p in enumerate(pieces):
        if p.attentions:
            span_forward(runs, i)
        else:
            for run in runs:
                run.forward_piece(i)
    out = torch.cat([run.output() for run in runs])
    got, want = packs[0].tokens(out), unpacked(reference)(pixels[0], grids[0])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    grad = torch.zeros_like(out).reshape(-1, out.shape[-1])
    grad[packs[0].token_index] = 2 * want.detach()
    grad = grad.view_as(out)
    for c, run in enumerate(runs):
        run.output_grad = grad[c:c + 1]
    for i in reversed(range(len(pieces))):
        if pieces[i].attentions:
            span_backward(runs, i)
        else:
            for run in runs:
                run.backward_piece(i)
    want.square().sum().backward()
    for (name, a), b in zip(tower.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize("args", list(RUNS), ids=("pp2", "dp2 x pp2", "dp2 unbalanced", "pp2 spans"))
def test_every_mode_ends_with_the_parameters_of_torchtitans_forward_unpacked(trainer_reports, args):
    reports = trainer_reports(*args, modes=RUNS[args])
    for mode, report in reports.items():
        assert report["param_checksum"] == pytest.approx(report["reference_checksum"], rel=1e-6), mode
        assert report["traces"] == [[0, 0, 0]] * len(report["traces"]), mode
