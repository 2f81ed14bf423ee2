"""Groundwork of native-resolution encoders: transformers' own Qwen2.5-VL vision tower, cut into
kernel-level pieces once on one layout of a chunk's images, repeats transformers' forward and
gradients on other layouts of the same chunk (other image sizes, a video, padding), its layout
coming in as tensors (pybubble.testing.mllm.qwen_vision)."""

import pytest
import torch

from pybubble.testing.mllm.model import import_vision_libraries

PATCHES, BOUNDARIES, PATCH_DIM = 128, 16, 3 * 2 * 14 * 14
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


def test_one_trace_serves_every_layout_of_the_chunk(towers):
    from pybubble.runtime.segments import MicrobatchRun, split_into_pieces
    from pybubble.testing.mllm.qwen_vision import PackedQwenVision, packed_layout, padded_grids

    tower, reference = towers
    encoder = PackedQwenVision(tower, PATCHES)
    pixels = torch.randn(PATCHES, PATCH_DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    traced = packed_layout(padded_grids(LAYOUTS["three images"], PATCHES), tower.config, BOUNDARIES)
    pieces = split_into_pieces(encoder, (pixels, *traced.tensors()))
    assert len(pieces) > 4 * 4  # kernel-level: several per block
    for name, grids in LAYOUTS.items():
        layout = packed_layout(padded_grids(grids, PATCHES), tower.config, BOUNDARIES)
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


def test_padding_and_boundaries_that_do_not_fit_are_refused(towers):
    from pybubble.testing.mllm.qwen_vision import packed_layout, padded_grids

    with pytest.raises(ValueError, match="grids: 144 patches for a chunk of 128"):
        padded_grids([[1, 12, 12]], PATCHES)
    with pytest.raises(ValueError, match="a multiple of 4"):
        padded_grids([[1, 2, 3]], PATCHES)
    with pytest.raises(ValueError, match="cu_seqlens: 33 boundaries, more than the fixed 16"):
        packed_layout([[1, 2, 2]] * 32, towers[0].config, BOUNDARIES)
