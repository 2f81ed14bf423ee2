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
