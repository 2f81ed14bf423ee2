"""The data options (pybubble.data.sources): --data and --data-file as one group, one meaning per
source name wherever a command offers it, and the source they give."""

import argparse

import pytest

from pybubble.data.mix import MixSpec
from pybubble.data.sources import SOURCES, add_data_options, data_name, data_source
from pybubble.data.samples import Samples


def parser(sources=("workload", "mix"), default="workload") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_data_options(p, sources, default=default, file_use="drawn with replacement")
    return p


def test_each_name_has_the_tables_help_wherever_it_is_offered():
    for sources in (("workload", "mix"), ("fixed", "mix"), ("mix",)):
        actions = {a.dest: a for a in parser(sources, sources[0])._actions}
        assert actions["data"].choices == sources
        assert actions["data"].help == "; ".join(f"{s}: {SOURCES[s]}" for s in sources)
        assert actions["data_file"].help.endswith(", drawn with replacement")


def test_the_options_give_the_source(tmp_path):
    p = parser()
    args = p.parse_args([])
    assert (data_name(args), data_source(args)) == ("workload", None)
    args = p.parse_args(["--data", "mix"])
    assert data_name(args) == "mix" and data_source(args) == MixSpec()
    spec = MixSpec(text_median=8.0, text_max=16)
    assert data_source(args, mix=spec) is spec
    path = tmp_path / "samples.jsonl"
    path.write_text('{"tiles": [13], "text": 100}\n{"tiles": []}\n')
    args = p.parse_args(["--data-file", str(path)])
    samples = data_source(args, tokens_per_tile=64)
    assert data_name(args) == "file" and isinstance(samples, Samples)
    assert samples.tiles.tolist() == [13] and samples.text.tolist() == [100, 0]
    with pytest.raises(ValueError, match="line 1: tiles: 13 tiles in the sample, more than the limit of 4"):
        data_source(args, max_tiles=4)


def test_data_and_data_file_exclude_each_other_and_names_are_checked(tmp_path):
    with pytest.raises(argparse.ArgumentError, match="not allowed with argument --data"):
        parser().parse_args(["--data", "mix", "--data-file", str(tmp_path / "x.jsonl")])
    with pytest.raises(argparse.ArgumentError, match="invalid choice: 'fixed'"):
        parser().parse_args(["--data", "fixed"])
    with pytest.raises(ValueError, match="sources: 'video' not among workload, fixed, mix"):
        parser(("mix", "video"), "mix")
    with pytest.raises(ValueError, match="default: 'fixed' is not one of workload, mix"):
        parser(("workload", "mix"), "fixed")
