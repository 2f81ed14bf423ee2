"""Native-resolution images as patches: pybubble's processor rules against HF transformers' own
(``smart_resize`` of Qwen2-VL's image processor), and data lines in pixels."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybubble.data.pixels import MAX_ASPECT, PROCESSORS, VisionProcessor, patches, pixel_sample


def hf_smart_resize():
    """transformers' ``smart_resize`` (Qwen2-VL's image processor)."""
    from pybubble.testing.mllm.model import import_vision_libraries

    import_vision_libraries()
    try:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
    except ImportError as e:
        pytest.skip(f"transformers without Qwen2-VL's image processor: {e}")
    return smart_resize


SIDES = st.integers(min_value=1, max_value=20000)


@settings(max_examples=400, deadline=None)
@given(SIDES, SIDES)
def test_resize_is_transformers_smart_resize(height, width):
    theirs, mine = hf_smart_resize(), PROCESSORS["qwen2_5_vl"]
    try:
        want = theirs(height, width, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
    except ValueError as e:
        assert "aspect ratio" in str(e)
        with pytest.raises(ValueError, match="aspect ratio .* over the processor's limit of 200"):
            mine.resize(height, width)
        return
    assert mine.resize(height, width) == want


@settings(max_examples=200, deadline=None)
@given(SIDES, SIDES, st.integers(min_value=1, max_value=64))
def test_a_grid_is_whole_merged_patches_within_the_pixel_bounds(height, width, frames):
    p = VisionProcessor()
    if max(height, width) / min(height, width) > MAX_ASPECT:
        return
    t, rows, cols = p.grid(height, width, frames)
    assert t == math.ceil(frames / 2) and rows % p.merge == 0 and cols % p.merge == 0
    area = rows * cols * p.patch ** 2
    assert area >= p.min_pixels
    assert area <= p.max_pixels or p.merge in (rows, cols)  # over only where a side is one merged patch
    assert p.tokens((t, rows, cols)) * p.merge ** 2 == patches((t, rows, cols))


def test_the_processors_sizes():
    p = PROCESSORS["qwen2_5_vl"]
    assert p.grid(28, 28) == (1, 4, 4) and p.tokens((1, 4, 4)) == 4  # below min_pixels: resized to 56 x 56
    assert p.grid(448, 672) == (1, 32, 48) and p.tokens((1, 32, 48)) == 384
    assert p.grid(448, 672, 16) == (8, 32, 48)  # a 16-frame video: 8 temporal patches


@pytest.mark.parametrize("doc,message", [
    ({"images": [[0, 28]]}, r"images\[0\]: height: 0 is not a positive integer"),
    ({"images": [[28, -5]]}, r"images\[0\]: width: -5 is not a positive integer"),
    ({"images": [[10, 2100]]}, r"images\[0\]: 10 x 2100 pixels: aspect ratio 210, over the processor's limit"),
    ({"images": [[28]]}, r"images\[0\]: \[28\] is not \[height, width\]"),
    ({"videos": [[0, 28, 28]]}, r"videos\[0\]: frames: 0 is not a positive integer"),
    ({"videos": [[28, 28]]}, r"videos\[0\]: \[28, 28\] is not \[frames, height, width\]"),
    ({"images": "28x28"}, "images: expected a list, got str"),
    ({"text": -1}, "text: -1"),
])
def test_bad_lines_are_refused_naming_the_line_and_field(doc, message):
    with pytest.raises(ValueError, match=f"data.jsonl line 3: {message}"):
        pixel_sample(doc, "data.jsonl line 3", VisionProcessor())


def test_a_line_gives_its_images_then_its_videos():
    grids, text = pixel_sample({"images": [[28, 28], [448, 672]], "videos": [[16, 224, 224]], "text": 40},
                               "line 1", VisionProcessor())
    assert grids == [(1, 4, 4), (1, 32, 48), (8, 16, 16)] and text == 40
    assert pixel_sample({}, "line 2", VisionProcessor()) == ([], 0)  # text only


def test_a_processor_with_bad_fields_is_refused():
    with pytest.raises(ValueError, match="merge: 0 is not a positive integer"):
        VisionProcessor(merge=0)
    with pytest.raises(ValueError, match="min_pixels: 100 is more than max_pixels 10"):
        VisionProcessor(min_pixels=100, max_pixels=10)
