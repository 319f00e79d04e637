"""`mmrun convert Qwen3VLMegatronConverter` (MindSpeed-MM's mcore names for Qwen3-VL, models/qwen3_vl/mm_layout.py):
a bf16 Hugging Face directory written by transformers -> a TP=2 x PP=2 split -> resplit to TP=2 alone -> back to a
Hugging Face directory, whose tensors are the original bytes and which transformers loads."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from mmrun.checkpoint.convert_cli import main


def _tensors(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of a directory's safetensors files, bf16 as its uint16 bits."""
    from mmrun.checkpoint.formats.safetensors import read_safetensors

    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(read_safetensors(file))
    return out


def test_hf_to_split_to_resplit_to_hf_is_bit_exact_and_loads_in_transformers(tiny3, tmp_path, capsys):
    import torch
    import transformers

    from mmrun.models.vlm.mm_layout import VLMLayout
    from mmrun.models.qwen3_vl.hf_checkpoint import load_hf_config

    original = tmp_path / "hf"
    model = tiny3.hf_model().to(torch.bfloat16)
    model.save_pretrained(original)
    (original / "tokenizer_config.json").write_text("{}")  # a side file the conversion copies back
    config = load_hf_config(original)
    converter = "Qwen3VLMegatronConverter"
    assert main([converter, "hf_to_mm", "--cfg.mm_dir", str(tmp_path / "mm"), "--cfg.hf_config.hf_dir", str(original),
                 "--cfg.parallel_config.tp_size", "2", "--cfg.parallel_config.vit_pp_layers", "[[3,0]]",
                 "--cfg.parallel_config.llm_pp_layers", "[[1,1]]"]) == 0
    layout = VLMLayout.build(config, tp=2, pp=2, vit_pp_layers=[3, 0], llm_pp_layers=[1, 1])
    for tp_rank in range(2):
        for pp_rank in range(2):
            rank_dir = tmp_path / "mm" / "release" / f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
            shard = load_file(rank_dir / "model.safetensors")
            assert {n: t.shape for n, t in shard.items()} == layout.rank_shapes(tp_rank, pp_rank)
    stage0 = load_file(tmp_path / "mm" / "release" / "mp_rank_01_000" / "model.safetensors")
    # MindSpeed-MM's names: the DeepStack merger of block 2 lives with that block, column-parallel fc1
    merged = config.vision.hidden_size * 4
    assert stage0["image_encoder.encoder.blocks.layers.2.deepstack_layer.encoder.linear_fc1.weight"].shape == (
        merged // 2, merged)
    assert "image_encoder.encoder.pos_embed.weight" in stage0
    assert "text_decoder.decoder.layers.0.self_attention.q_layernorm.weight" in stage0

    assert main([converter, "resplit", "--cfg.source_dir", str(tmp_path / "mm"), "--cfg.target_dir",
                 str(tmp_path / "tp2"), "--cfg.target_parallel_config.tp_size", "2"]) == 0
    assert main([converter, "mm_to_hf", "--cfg.save_hf_dir", str(tmp_path / "back"), "--cfg.mm_dir",
                 str(tmp_path / "tp2"), "--cfg.hf_config.hf_dir", str(original)]) == 0
    before, after = _tensors(original), _tensors(tmp_path / "back")
    assert sorted(before) == sorted(after)
    for name in before:  # the same bytes (bf16 through mmrun's fp32 checkpoints is exact)
        assert before[name].dtype == after[name].dtype and np.array_equal(before[name].view(np.uint8),
                                                                          after[name].view(np.uint8)), name
    assert (tmp_path / "back" / "tokenizer_config.json").is_file()
    loaded = transformers.Qwen3VLForConditionalGeneration.from_pretrained(tmp_path / "back")
    assert loaded.config.vision_config.deepstack_visual_indexes == [0, 2]
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == "qwen3_vl"
    capsys.readouterr()


def test_the_qwen2_converter_refuses_a_qwen3_directory_in_one_line(tiny3, tmp_path, capsys):
    tiny3.hf_model().save_pretrained(tmp_path / "hf")
    capsys.readouterr()  # transformers' progress bar
    assert main(["Qwen2VLConverter", "hf_to_mm", "--cfg.mm_dir", str(tmp_path / "mm"), "--cfg.hf_config.hf_dir",
                 str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "not a Qwen2-VL family model" in err and err.count("\n") == 1, err
    assert not (tmp_path / "mm").exists()

