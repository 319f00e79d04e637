"""Every key of MindSpeed-MM's real example files (tests/fixtures/mindspeed_mm/, Ascend/MindSpeed-MM at 57069cd5)
is in features/mindspeed_mm_keys.yaml with what mmrun does with it, and the readers agree with the table."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mmrun.features.mindspeed_keys import expand, load_key_table, main, walk_keys

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "mindspeed_mm"
FILES = sorted(p for p in FIXTURES.rglob("*") if p.suffix in (".json", ".yaml"))
TABLE = load_key_table()


def _read(path: Path):
    return json.loads(path.read_text(encoding="utf-8")) if path.suffix == ".json" else yaml.safe_load(path.read_text())


def _kind(path: Path) -> str:
    kind = TABLE.kind_of_file(str(path.relative_to(FIXTURES)))
    assert kind, f"{path.relative_to(FIXTURES)}: no kind of features/mindspeed_mm_keys.yaml names this file"
    return kind


def test_the_fixtures_are_the_jobs_files():
    """The ten jobs' json/yaml files and their MindSpore twins: 39 files, each with one kind."""
    assert len(FILES) == 39
    assert {_kind(p) for p in FILES} == set(TABLE.kinds)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_key_of_every_example_file_is_in_the_table(path):
    kind = _kind(path)
    missing = sorted({key for key in walk_keys(_read(path)) if TABLE.entry(kind, key) is None})
    assert not missing, (f"{path.relative_to(FIXTURES)} ({kind}): keys not in features/mindspeed_mm_keys.yaml: "
                         f"{', '.join(missing)}; say there what mmrun does with each (honoured / refused / no_effect)")


# The files of the models mmrun does not build (yet): the key that stops each (none now). Every other file runs as written.
REFUSED: dict[str, str] = {}


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_only_the_models_not_built_are_refused_by_a_value(path):
    """Every job's values pass (REFUSED names the key that stops a model mmrun does not build, when there is one)."""
    from mmrun.features.mindspeed_keys import check_values
    refusals = check_values(_kind(path), _read(path), path.name)
    expected = REFUSED.get(str(path.relative_to(FIXTURES)))
    assert [line.split(": ")[1] for line in refusals] == ([expected] if expected else []), refusals


def test_the_table_names_each_key_once_and_expands_braces():
    assert expand("a.{b,c}.{d,e}") == ["a.b.d", "a.b.e", "a.c.d", "a.c.e"]
    assert list(walk_keys({"a": {"b": [{"c": 1}, {"d": 2}]}})) == ["a", "a.b", "a.b[].c", "a.b[].d"]
    entry = TABLE.entry("hf_yaml", "data.dataset_param.basic_parameters.cache_dir")  # through `includes`
    assert entry is not None and entry.verdict == "no_effect"


def test_the_readers_lists_agree_with_the_table():
    """What the readers read is honoured, what they set aside is no_effect: the same keys, not two lists."""
    from mmrun.data.multimodal.data_config import IGNORED, SCHEMA
    from mmrun.engines.fsdp2_config import KEYS

    for section, keys in SCHEMA.items():
        for key in keys:
            entry = TABLE.entry("vlm_data", f"dataset_param.{section}.{key}")
            assert entry is None or entry.verdict == "honoured", (section, key, entry)
    for section, keys in IGNORED.items():
        for key in keys:
            entry = TABLE.entry("vlm_data", f"dataset_param.{section}.{key}" if section else f"dataset_param.{key}")
            assert entry is None or entry.verdict in ("no_effect", "refused"), (section, key, entry)
    from mmrun.models.wan.configuration import MINDSPEED_IGNORED, MINDSPEED_KEYS
    for key in MINDSPEED_IGNORED:
        entry = TABLE.entry("wan_model", f"predictor.{key}")
        assert entry is None or entry.verdict == "no_effect", (key, entry)
    for key in MINDSPEED_KEYS:
        entry = TABLE.entry("wan_model", f"predictor.{key}")
        assert entry is None or entry.verdict == "honoured", (key, entry)
    fsdp2 = TABLE.kinds["fsdp2"].entries
    for key in KEYS:
        assert key not in fsdp2 or fsdp2[key].verdict == "honoured", key
    assert {k for k, e in fsdp2.items() if e.verdict == "honoured"} <= set(KEYS) | {"moe_modules",  # read beside KEYS
                                                                                  "expert_parallel_size",
                                                                                  "reshard_local_experts"}


def test_the_command_says_what_each_key_does_and_takes_expert_parallelism(tmp_path, capsys):
    real = FIXTURES / "qwen3vl" / "fsdp2_config.yaml"
    assert main(["fsdp2", str(real)]) == 0
    out = capsys.readouterr().out
    assert "expert_parallel_size: honoured" in out
    assert "12 keys: 11 honoured, 1 no effect" in out  # moe_modules names the 30B model's experts
    changed = tmp_path / "fsdp2_config.yaml"
    changed.write_text(real.read_text().replace("expert_parallel_size: 1", "expert_parallel_size: 2"))
    assert main(["fsdp2", str(changed)]) == 0


def test_the_wan_extraction_refuses_a_sample_filter_it_does_not_build():
    """The real data.json (nothing dropped: cfg 0.0, drop_short_ratio 0.0) passes the table; caption dropout does not,
    in one line, before any model loads."""
    from mmrun.backend.errors import UsageError
    from mmrun.models.get_wan_feature import Extractor

    data = _read(FIXTURES / "wan2.1" / "feature_extract" / "data.json")
    data["dataset_param"]["preprocess_parameters"]["cfg"] = 0.1
    with pytest.raises(UsageError) as err:
        Extractor(data, {}, "data.json", "model_t2v.json", seed=0)
    assert str(err.value).startswith("data.json: dataset_param.preprocess_parameters.cfg: 0.1 is refused (accepted: "
                                     "0, 0.0, false): filtering or dropping samples")


def test_a_key_that_describes_another_architecture_stops_the_reader():
    """The family-fixed keys (the table's `fixed`, the values of every MindSpeed-MM example): the real model and
    inference files pass; a Qwen3-VL ViT given RMSNorm, or a Qwen2.5-VL decoder given biases, stops in one line."""
    from mmrun.backend.errors import UsageError
    from mmrun.features.mindspeed_keys import fixed_refusals
    from mmrun.models.qwen2_vl.model_json import parse_model_json as parse_qwen2
    from mmrun.models.qwen3_vl.model_json import parse_model_json as parse_qwen3

    for path in FILES:
        if _kind(path) in ("vlm_model", "vlm_infer"):
            raw = _read(path)
            assert fixed_refusals("vlm_model", raw, raw.get("model_id") or "qwen2_5vl", path.name) == []
    qwen3 = _read(FIXTURES / "mindspore" / "qwen3vl" / "model_8B.json")
    qwen3["image_encoder"]["vision_encoder"]["normalization"] = "RMSNorm"
    with pytest.raises(UsageError) as err:
        parse_qwen3(qwen3, "model_8B.json")
    assert str(err.value) == ("model_8B.json: image_encoder.vision_encoder.normalization: \"RMSNorm\" describes another "
                              "model: mmrun builds qwen3_vl's architecture, where it is \"LayerNorm\" (every "
                              "MindSpeed-MM example); set it so or leave it out")
    qwen25 = _read(FIXTURES / "qwen2.5vl" / "model_7b.json")
    qwen25["text_decoder"]["add_bias_linear"] = True
    with pytest.raises(UsageError, match=r"^model_7b.json: text_decoder.add_bias_linear: true describes another model"):
        parse_qwen2(qwen25, "model_7b.json")
