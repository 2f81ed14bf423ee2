"""Planning configs: the YAML form, presets with overrides, and errors that name the key."""

import copy

import pytest

from pybubble.config.schema import load_config

BASE = {
    "cluster": {"gpus": 3072, "gpu": "h100", "gpus_per_node": 8},
    "llm": {"preset": "gpt-175b"},
    "encoders": [{"preset": "vit-22b", "tokens_per_sample": 256, "frozen": False}],
    "training": {"global_batch": 1536, "micro_batch": 2, "seq_len": 2048},
    "llm_plan": {"dp": 48, "pp": 8, "tp": 8, "vpp": 12, "schedule": "interleaved_1f1b"},
    "memory_gb": 80,
}


def test_the_optimus_3072_gpu_config_loads(tmp_path):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(BASE))
    c = load_config(path)
    assert c.llm.hidden == 12288 and c.encoders[0].model.hidden == 6144
    assert c.microbatches == 16
    assert c.source == str(path)


def test_preset_fields_can_be_overridden():
    doc = copy.deepcopy(BASE)
    doc["llm"] = {"preset": "gpt-175b", "vocab": 50257}
    c = load_config(doc)
    assert c.llm.vocab == 50257 and c.llm.hidden == 12288


def test_explicit_models_need_their_shape():
    doc = copy.deepcopy(BASE)
    doc["llm"] = {"layers": 96, "hidden": 12288, "heads": 96}
    assert load_config(doc).llm.name == "custom"


@pytest.mark.parametrize("path,value,message", [
    (("cluster", "gpus"), 3000, r"llm_plan: dp x pp x tp = 48 x 8 x 8 = 3072, not cluster.gpus \(3000\)"),
    (("cluster", "gpus"), 0, r"cluster.gpus: 0 is not a positive integer"),
    (("cluster", "gpu"), "tpu", r"cluster.gpu: 'tpu' is not one of"),
    (("cluster", "colour"), 1, r"cluster.colour: unknown key"),
    (("llm", "preset"), "gpt-5", r"llm: .*gpt-5"),
    (("llm_plan", "schedule"), "2f2b", r"llm_plan.schedule: '2f2b' is not one of"),
    (("llm_plan", "vpp"), 13, r"llm_plan: pp x vpp = 104 is more than the LLM's 96 layers"),
    (("training", "global_batch"), 1000, r"training.global_batch: 1000 is not a multiple"),
    (("training", "micro_batch"), KeyError, r"training.micro_batch: missing"),
    (("encoders",), [], r"encoders: expected a non-empty list"),
    (("encoders", 0, "frozen"), "no", r"encoders\[0\].frozen: 'no' is not true or false"),
    (("encoders", 0, "tokens_per_sample"), -1, r"encoders\[0\].tokens_per_sample: -1"),
    (("memory_gb",), "lots", r"memory_gb: 'lots' is not a number"),
    (("llm_plan",), KeyError, r"llm_plan: missing"),
])
def test_bad_configs_name_the_key(path, value, message, replaced):
    with pytest.raises(ValueError, match=message):
        load_config(replaced(BASE, path, value))


def test_unreadable_files(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_config(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: [1, 2")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(bad)


def test_zbv_runs_two_chunks_per_stage():
    doc = {**BASE, "llm_plan": {"dp": 48, "pp": 8, "tp": 8, "schedule": "zbv"}}
    assert load_config(doc).llm_plan.vpp == 2
    with pytest.raises(ValueError, match="llm_plan.vpp: 3, but zbv runs 2 chunks per stage"):
        load_config({**BASE, "llm_plan": {"dp": 48, "pp": 8, "tp": 8, "vpp": 3, "schedule": "zbv"}})


def test_a_native_resolution_encoder_is_given_its_images_by_size():
    from pybubble.config.processors import PROCESSORS, patches

    doc = copy.deepcopy(BASE)
    doc["encoders"] = [{"preset": "vit-22b", "image": [448, 672], "images": 3},
                       {"preset": "vit-22b", "image": [16, 112, 168], "processor": "qwen2_vl"}]
    image, video = load_config(doc).encoders
    assert image.model.tokens == patches(PROCESSORS["qwen2_5_vl"].grid(448, 672)) == 1536
    assert image.images_per_sample == 3 and image.tokens_per_sample == 3 * 1536
    assert video.model.tokens == 8 * 8 * 12 and video.images_per_sample == 1  # 16 frames: 8 temporal patches


@pytest.mark.parametrize("encoder, message", [
    ({"image": [0, 28]}, r"encoders\[0\].image: height: 0 is not a positive integer"),
    ({"image": [28, 6000]}, r"encoders\[0\].image: 28 x 6000 pixels: aspect ratio 214.286, over"),
    ({"image": [28, 28], "tokens_per_sample": 8}, r"encoders\[0\].tokens_per_sample: beside image: give the images"),
    ({"image": "448x672"}, r"encoders\[0\].image: '448x672' is not \[height, width\]"),
    ({"image": [28, 28], "processor": "clip"}, r"encoders\[0\].processor: 'clip' is not one of"),
    ({"images": 2}, r"encoders\[0\].image: missing"),
    ({"image": [28, 28], "images": 0}, r"encoders\[0\].images: 0 is not a positive integer"),
])
def test_bad_images_by_size_name_the_key(encoder, message):
    doc = copy.deepcopy(BASE)
    doc["encoders"] = [{"preset": "vit-22b", **encoder}]
    with pytest.raises(ValueError, match=message):
        load_config(doc)
