"""`mmrun convert` reads mm-convert's command lines; what it cannot do is one line and exit 2, nothing written.
(The conversions themselves: tests/models/test_convert_parallel.py, and tests/training/test_pretrain_vlm.py on a
trained checkpoint.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmrun.checkpoint.convert_cli import main, parse_options
from mmrun.models.vlm.model_json import read_model_json

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hf_dir(tmp_path) -> Path:
    """A Hugging Face directory's config.json (the demo model's); enough for every check before the weights."""
    folder = tmp_path / "hf"
    folder.mkdir()
    config = read_model_json(ROOT / "scripts" / "qwen2vl" / "model_tiny.json").hf_config
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_options_are_mm_converts_dotted_keys_with_json_values(tmp_path):
    (tmp_path / "c.yaml").write_text("cfg:\n  mm_dir: from_file\n  parallel_config:\n    tp_size: 2\n")
    cfg = parse_options(["--cfg.parallel_config.llm_pp_layers", "[[12,16]]", "--cfg.hf_config.hf_dir=ckpt/hf",
                         "--config", str(tmp_path / "c.yaml"), "--cfg.mm_dir", "ckpt/mm"])
    assert cfg == {"mm_dir": "ckpt/mm", "hf_config": {"hf_dir": "ckpt/hf"},
                   "parallel_config": {"llm_pp_layers": [[12, 16]], "tp_size": 2}}


@pytest.mark.parametrize("argv, message", [
    (["LlavaConverter", "hf_to_mm"], "unknown converter 'LlavaConverter'"),
    (["Qwen2VLConverter", "hf_to_megatron"], "unknown subcommand 'hf_to_megatron' of Qwen2VLConverter"),
    (["Qwen2VLConverter", "hf_to_mm", "--cfg.hf_config.hf_dir", "x"], "--cfg.mm_dir is required"),
    (["Qwen2VLConverter", "hf_to_mm", "--mm_dir", "x"], "unrecognized option '--mm_dir'"),
    (["Qwen2VLConverter", "resplit", "--cfg.mm_dir", "x"], "--cfg.source_dir is required"),
    (["Qwen2VLConverter", "resplit", "--cfg.source_dir", "nowhere", "--cfg.target_dir", "x"],
     "--cfg.source_dir nowhere: no such directory"),
])
def test_usage_errors(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, message", [
    (["Qwen2_5_VLConverter", "hf_to_mm"], "Qwen2_5_VLConverter converts model_type qwen2_5_vl, but"),
    (["Qwen2VLConverter", "hf_to_mm", "--cfg.parallel_config.tp_size", "0"], "tp_size must be a positive integer"),
    (["Qwen2VLConverter", "hf_to_mm", "--cfg.parallel_config.llm_pp_layers", "[[3]]"],
     "sums to 3, but the text decoder has 2 layers"),
    (["Qwen2VLConverter", "hf_to_mm", "--cfg.parallel_config.vit_pp_layers", "[[1,1]]"],
     "puts ViT layers after the first stage"),
    (["Qwen2VLConverter", "hf_to_mm", "--cfg.parallel_config.llm_pp_layers", "[[1,x]]"],
     "llm_pp_layers must be a list of layer counts per pipeline stage such as [[12,16]] (one list per virtual "
     "pipeline chunk, each as long as the others). Received: \"[[1,x]]\""),
])
def test_what_cannot_be_converted_writes_nothing(argv, message, hf_dir, tmp_path, capsys):
    mm_dir = tmp_path / "mm"
    assert main([*argv, "--cfg.mm_dir", str(mm_dir), "--cfg.hf_config.hf_dir", str(hf_dir)]) == 2
    assert message in capsys.readouterr().err
    assert not mm_dir.exists()


def test_a_directory_that_is_not_a_hugging_face_model(tmp_path, capsys):
    assert main(["Qwen2VLConverter", "hf_to_mm", "--cfg.mm_dir", str(tmp_path / "mm"), "--cfg.hf_config.hf_dir",
                 str(tmp_path)]) == 2
    assert "has no config.json" in capsys.readouterr().err


def test_mm_to_hf_needs_a_checkpoint(hf_dir, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["Qwen2VLConverter", "mm_to_hf", "--cfg.save_hf_dir", str(tmp_path / "out"), "--cfg.mm_dir",
                 str(tmp_path / "empty"), "--cfg.hf_config.hf_dir", str(hf_dir)]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
