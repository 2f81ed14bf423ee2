"""MLLM samples as tiles: the mix's shares, the data file's reader and its refusals, packing."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybubble.data.files import read_samples
from pybubble.data.mix import MixSpec, mix
from pybubble.data.samples import Samples
from pybubble.schedule.balance import pack_microbatches


def test_the_mix_has_its_shares_on_a_large_draw():
    spec = MixSpec()
    s = mix(40_000, seed=0)
    images = s.images
    # multi-image samples have 2..6 images, videos 8..32 frames: the image count tells the kind
    assert spec.multi_images[1] < spec.video_frames[0]
    video = images >= spec.video_frames[0]
    shares = {"text_only": (images == 0).mean(), "single_image": (images == 1).mean(),
              "multi_image": ((images >= 2) & ~video).mean(), "video": video.mean()}
    for kind, share in shares.items():
        assert share == pytest.approx(getattr(spec, kind), abs=0.01), kind
    single = s.tiles[np.repeat(images == 1, images)]
    for tiles, p in spec.single_tiles:
        assert (single == tiles).mean() == pytest.approx(p, abs=0.01), tiles
    assert set(np.unique(single)) == {t for t, _ in spec.single_tiles}
    # frames are one tile each; a multi-image sample's images share its tile budget
    assert (s.tiles[np.repeat(video, images)] == 1).all()
    multi = (images >= 2) & ~video
    per_image_cap = np.maximum(1, spec.multi_tile_budget // images[multi])
    assert (s.take(np.flatnonzero(multi)).sample_tiles <= per_image_cap * images[multi]).all()
    assert s.text.min() >= 1 and s.text.max() <= spec.text_max


def test_the_mix_is_reproducible_from_its_seed():
    a, b, c = mix(500, seed=7), mix(500, seed=7), mix(500, seed=8)
    assert np.array_equal(a.tiles, b.tiles) and np.array_equal(a.text, b.text)
    assert not np.array_equal(a.images, c.images)


@pytest.mark.parametrize("field,value,message", [
    ("video", 0.5, "shares sum to"),
    ("single_tiles", ((1, 0.5), (4, 0.4)), "single_tiles: probabilities sum to"),
    ("single_tiles", ((0, 1.0),), r"single_tiles\[0\].tiles: 0"),
    ("multi_images", (1, 4), r"multi_images\[0\]: 1"),
    ("video_frames", (8, 4), r"video_frames\[1\]: 4"),
])
def test_bad_mixes_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        MixSpec(**{field: value})


def test_samples_count_their_tiles_and_tokens_and_take_whole_samples():
    s = Samples.of([[1, 13], [], [4]], text=[10, 20, 30])
    assert s.sample_tiles.tolist() == [14, 0, 4]
    assert s.tokens(256).tolist() == [10 + 14 * 256, 20, 30 + 4 * 256]
    assert s.image_sample.tolist() == [0, 0, 2]
    t = s.take(np.array([2, 0, 2]))
    assert t.tiles.tolist() == [4, 1, 13, 4] and t.images.tolist() == [1, 2, 1] and t.text.tolist() == [30, 10, 30]
    batch = s.to_batch(256)
    assert [x.tolist() for x in batch.image_tokens] == [[256, 13 * 256], [], [1024]]
    with pytest.raises(ValueError, match=r"tiles\[1\]: 0"):
        Samples.of([[1, 0]])
    with pytest.raises(ValueError, match="images: 2 in all, but 3 tile counts"):
        Samples(tiles=np.array([1, 2, 3]), images=np.array([1, 1]), text=np.array([0, 0]))


@pytest.mark.parametrize("lines,kwargs,message", [
    (['{"tiles": [1]}', '{"tiles": [1, 2]'], {}, r"line 2: not JSON"),
    (['{"tiles": [1]}', '{"tiles": [1, 2.5]}'], {}, r"line 2: tiles\[1\]: 2.5 is not an integer"),
    (['{"tiles": ["3"]}'], {}, r"line 1: tiles\[0\]: '3' is not an integer"),
    (['{"tiles": [1]}', "", '{"tiles": [4, 0]}'], {}, r"line 3: tiles\[1\]: 0 is not a positive integer"),
    (['{"tiles": [-2]}'], {}, r"line 1: tiles\[0\]: -2 is not a positive integer"),
    (['{"tiles": [1]}', '{"tiles": [13, 13, 6]}'], {"max_tiles": 24}, r"line 2: tiles: 32 tiles .* limit of 24"),
    (['{"tiles": [4], "text": 100}'], {"max_tokens": 1024, "tokens_per_tile": 256},
     r"line 1: tokens: 100 text \+ 4 tiles x 256 = 1124, more than the limit of 1024"),
    (['{"tiles": [1], "text": -5}'], {}, r"line 1: text: -5 is not an integer >= 0"),
    (['{"images": [1]}'], {}, r"line 1: images\[0\]: expected a list, got int"),
    (['{"words": 3}'], {}, r"line 1: tiles: missing"),
    (['{"tiles": 3}'], {}, r"line 1: tiles: expected a list"),
    (["[1, 2]"], {}, r"line 1: expected an object"),
    (["", "  "], {}, r"no samples \(an empty file\)"),
])
def test_bad_data_files_name_the_line_and_the_field(tmp_path, lines, kwargs, message):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=message) as e:
        read_samples(path, **kwargs)
    assert str(e.value).startswith(str(path))


def test_a_good_data_file_is_read_and_replayed(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"tiles": [13], "text": 40, "id": "a"}\n\n{"tiles": []}\n{"tiles": [1, 1, 1], "text": 7}\n')
    s = read_samples(path, max_tiles=13, max_tokens=13 * 256 + 40)
    assert s.images.tolist() == [1, 0, 3] and s.tiles.tolist() == [13, 1, 1, 1] and s.text.tolist() == [40, 0, 7]
    d = s.draw(300, np.random.default_rng(0))
    assert len(d) == 300 and set(d.sample_tiles.tolist()) == {13, 0, 3}
    with pytest.raises(ValueError, match="no such file"):
        read_samples(tmp_path / "missing.jsonl")


@given(st.lists(st.integers(0, 600), min_size=1, max_size=80), st.integers(1, 12), st.integers(0, 2**31))
@settings(max_examples=120, deadline=None)
def test_packing_keeps_every_microbatch_within_the_sequence(tokens, m, seed):
    t = np.array(tokens, np.int64)
    limit = 1200
    encoder = np.random.default_rng(seed).lognormal(0, 1, t.size)
    try:
        a = pack_microbatches(t, m, limit, encoder=encoder)
    except ValueError as e:
        # worst-fit decreasing always packs when every sample is at most half a sequence and all
        # of them at most half the microbatches' room
        assert "do not pack" in str(e)
        assert t.max() > limit // 2 or t.sum() > m * limit // 2
        return
    assert a.shape == t.shape and a.min() >= 0 and a.max() < m
    assert np.bincount(a, weights=t, minlength=m).max() <= limit


def test_packing_refuses_a_sample_longer_than_a_sequence():
    with pytest.raises(ValueError, match=r"tokens\[2\]: a sample of 5000 tokens does not fit in one sequence of 4096"):
        pack_microbatches(np.array([10, 20, 5000]), 2, 4096)
    s = Samples.of([[13], [1], [4, 4]], text=[0, 0, 0])
    a = s.pack(2, 13 * 256, 256)
    assert np.bincount(a, weights=s.tokens(256), minlength=2).max() <= 13 * 256
