"""Groundwork of native-resolution encoders: transformers' own Qwen2.5-VL vision tower, cut into
kernel-level pieces once on one layout of a chunk's images, repeats transformers' forward and
gradients on other layouts of the same chunk (other image sizes, a video, padding), its layout
coming in as tensors (pybubble.testing.mllm.qwen_vision); images larger than a chunk span several,
their attention run over the span's chunks (pybubble.runtime.spans)."""

import pytest
import torch

from pybubble.testing.mllm.model import import_vision_libraries

PATCHES, PATCH_DIM = 128, 3 * 2 * 14 * 14
LAYOUTS = {
    "three images": [[1, 8, 8], [1, 4, 12], [1, 4, 4]],  # 128 patches: the traced layout
    "two images and padding": [[1, 4, 4], [1, 12, 8]],  # 112 + 16 of padding
    "a video and an image": [[2, 4, 4], [1, 8, 8]],  # 32 + 64 + 32 of padding
}


@pytest.fixture(scope="module")
def towers():
    import_vision_libraries()
    try:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
        import transformers.vision_utils  # noqa: F401  (the layout's precomputed tensors)
    except ImportError as e:
        pytest.skip(f"transformers without Qwen2.5-VL: {e}")
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

    fields = dict(depth=4, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=32, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1, 3],
                  in_channels=3)
    config = Qwen2_5_VLVisionConfig(**fields)
    torch.manual_seed(0)
    tower = Qwen2_5_VisionTransformerPretrainedModel(config).double()
    reference = Qwen2_5_VisionTransformerPretrainedModel(  # sdpa: one block at a time, split by Python lengths
        type(config)(**fields, attn_implementation="sdpa")).double()
    reference.load_state_dict(tower.state_dict())
    return tower, reference


def whole(grids):
    from pybubble.runtime.packed import whole_images

    return whole_images(grids)


def test_one_trace_serves_every_layout_of_the_chunk(towers):
    from pybubble.runtime.segments import MicrobatchRun, split_into_pieces
    from pybubble.testing.mllm.qwen_vision import PackedQwenVision, packed_layout

    tower, reference = towers
    encoder = PackedQwenVision(tower, PATCHES)
    pixels = torch.randn(PATCHES, PATCH_DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    traced = packed_layout(whole(LAYOUTS["three images"]), tower.config, PATCHES)
    pieces = split_into_pieces(encoder, (pixels, *traced.tensors()))
    assert len(pieces) > 4 * 4  # kernel-level: several per block
    for name, grids in LAYOUTS.items():
        layout = packed_layout(whole(grids), tower.config, PATCHES, chunk=3)
        assert [t.shape for t in layout.tensors()] == [t.shape for t in traced.tensors()]  # the pieces' fixed shapes
        real = sum(t * h * w for t, h, w in grids)
        tower.zero_grad(), reference.zero_grad()
        run = MicrobatchRun(pieces, (pixels, *layout.tensors()))
        for i in range(len(pieces)):
            run.forward_piece(i)
        out = run.output()
        want = reference(pixels[:real], grid_thw=torch.tensor(grids)).pooler_output
        assert torch.allclose(out[:real // 4], want, rtol=1e-10, atol=1e-12), name  # padding's rows come last
        grad = torch.zeros_like(out)
        grad[:real // 4] = torch.linspace(-1, 1, want.numel(), dtype=torch.float64).view_as(want)
        run.output_grad = grad
        for i in reversed(range(len(pieces))):
            run.backward_piece(i)
        (want * grad[:real // 4]).sum().backward()
        for (n, mine), theirs in zip(tower.named_parameters(), reference.parameters()):
            assert torch.allclose(mine.grad, theirs.grad, rtol=1e-9, atol=1e-12), f"{name}: {n}"


def test_padding_that_does_not_fit_is_refused(towers):
    from pybubble.testing.mllm.qwen_vision import padded_grids

    with pytest.raises(ValueError, match="grids: 144 patches for a chunk of 128"):
        padded_grids([[1, 12, 12]], PATCHES)
    with pytest.raises(ValueError, match="a multiple of 4"):
        padded_grids([[1, 2, 3]], PATCHES)


SPANNING = {  # each microbatch's grids: an image larger than a chunk of 128 patches, and others
    "two chunks, a video in the room": [[1, 16, 12], [2, 4, 4], [1, 4, 4]],  # 192: rows 0-8 | 8-16
    "three chunks": [[1, 40, 8], [1, 8, 12]],  # 320: 128 | 128 | 64, then a chunk of its own
    "a video's frame across chunks": [[2, 12, 8], [1, 4, 8]],  # 192: frame 0 and rows 0-4 of frame 1 | the rest
}


@pytest.mark.parametrize("unsplit", [False, True], ids=["kernel pieces", "unsplit"])
def test_an_image_across_chunks_repeats_the_unsplit_tower(towers, unsplit):
    """The tower traced on one chunk runs images larger than a chunk over the chunks of their
    span, each attention over the span at once (spans.span_forward / span_backward): the images'
    tokens and every parameter's gradient are those of transformers' own forward on the whole
    images (and with the pieces merged into one, as the baselines run the encoder, too)."""
    from pybubble.runtime.packed import packed_batch
    from pybubble.runtime.segments import MicrobatchRun, merge_pieces, split_into_pieces
    from pybubble.runtime.spans import span_backward, span_forward
    from pybubble.testing.mllm.qwen_vision import PackedQwenVision

    tower, reference = towers
    encoder = PackedQwenVision(tower, PATCHES)
    gen = torch.Generator().manual_seed(2)
    pixels = [[torch.randn(t * h * w, PATCH_DIM, dtype=torch.float64, generator=gen) for t, h, w in grids]
              for grids in SPANNING.values()]
    batch, packs = packed_batch(pixels, list(SPANNING.values()), patches=PATCHES, width=PATCH_DIM,
                                layout=encoder.layout)
    assert [p.spans for p in packs] == [(2,), (3, 1), (2,)]
    assert batch.images == [[2], [3, 1], [2]]
    pieces = split_into_pieces(encoder, tuple(t[0] for t in batch.chunk(0, 0, 1)))
    if unsplit:
        pieces = merge_pieces(pieces, [len(pieces)])
    assert sum(p.attentions for p in pieces) == 4  # one per block
    for k, (name, grids) in enumerate(SPANNING.items()):
        tower.zero_grad(), reference.zero_grad()
        runs, c0 = [], 0
        for g in packs[k].spans:
            span = [MicrobatchRun(pieces, tuple(t[c] for t in batch.inputs[k])) for c in range(c0, c0 + g)]
            for i, p in enumerate(pieces):
                if p.attentions and g > 1:
                    span_forward(span, i)
                else:
                    for run in span:
                        run.forward_piece(i)
            runs.append(span)
            c0 += g
        out = torch.stack([run.output() for span in runs for run in span])
        mine = packs[k].tokens(out)
        want = reference(torch.cat(pixels[k]), grid_thw=torch.tensor(grids)).pooler_output
        assert torch.allclose(mine, want, rtol=1e-10, atol=1e-12), name
        grad = torch.linspace(-1, 1, want.numel(), dtype=torch.float64).view_as(want)
        full = torch.zeros(out.numel() // out.shape[-1], out.shape[-1], dtype=torch.float64)
        full[packs[k].token_index] = grad
        full = full.view_as(out)
        for span in runs:
            for run in span:
                run.output_grad = full[runs_index(runs, run)]
            for i in reversed(range(len(pieces))):
                if pieces[i].attentions and len(span) > 1:
                    span_backward(span, i)
                else:
                    for run in span:
                        run.backward_piece(i)
        (want * grad).sum().backward()
        for (n, p), theirs in zip(tower.named_parameters(), reference.parameters()):
            scale = theirs.grad.abs().max()  # float64: the span's sums in another order, 1e-9 of the largest
            assert (p.grad - theirs.grad).abs().max() <= 1e-8 * scale, f"{name}: {n}"


def runs_index(runs, run):
    """The chunk index of ``run`` among the spans' runs."""
    return [r for span in runs for r in span].index(run)


def test_an_image_that_cannot_be_cut_into_chunks_is_refused():
    from pybubble.runtime.packed import pack_images, row_cuts

    with pytest.raises(ValueError, match=r"images\[0\]: 300 patches, but a chunk holds 128"):
        pack_images([300], 128)
    assert row_cuts([2, 6, 4], 4) == [16, 24, 40]  # rows 4 of frame 0, frame 1, its row 4
    with pytest.raises(ValueError, match=r"images\[1\]: its rows from patch 0 to the next place it may be cut "
                                         r"\(160\) are more than a chunk's 128 patches"):
        pack_images([16, 320], 128, cuts=[[], row_cuts([1, 8, 40], 4)])


def test_the_trainer_cuts_its_images_where_the_towers_layout_may(towers):
    # the test trainer reads its data file before it builds the encoder: its cut rows come from the
    # tower's sizes, and are the layout's own
    from pybubble.runtime.packed import row_cuts
    from pybubble.testing.mllm.job import CUT_ROWS
    from pybubble.testing.mllm.qwen_vision import QwenLayout, qwen_tower

    layout = QwenLayout(qwen_tower(16, 2, 2, 16).config, PATCHES)
    assert layout.window_rows == CUT_ROWS["qwen2_5_vl"] == 4
    assert layout.cuts([2, 12, 8]) == row_cuts([2, 12, 8], CUT_ROWS["qwen2_5_vl"])
