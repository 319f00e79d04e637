"""`mmrun convert Qwen2_5_OmniConverter` (MindSpeed-MM's converter name and names for Qwen2.5-Omni's thinker,
models/qwen2_5_omni/mm_layout.py): a bf16 thinker directory written by transformers -> a TP=2 x PP=2 split ->
resplit to TP=2 alone -> back to a thinker directory, whose tensors are the original bytes and which transformers
loads; a whole Qwen2.5-Omni (thinker.* keys, a talker) converts to the same split."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from mmrun.checkpoint.convert_cli import main

CONVERTER = "Qwen2_5_OmniConverter"


def _tensors(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of a directory's safetensors files, bf16 as its uint16 bits."""
    from mmrun.checkpoint.formats.safetensors import read_safetensors

    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(read_safetensors(file))
    return out


def _split(tmp_path: Path, source: Path, target: str) -> list[str]:
    return [CONVERTER, "hf_to_mm", "--cfg.mm_dir", str(tmp_path / target), "--cfg.hf_config.hf_dir", str(source),
            "--cfg.parallel_config.tp_size", "2", "--cfg.parallel_config.vit_pp_layers", "[[2,0]]",
            "--cfg.parallel_config.llm_pp_layers", "[[1,1]]", "--cfg.parallel_config.audio_pp_layers", "[[2,0]]"]


def test_hf_to_split_to_resplit_to_hf_is_bit_exact_and_loads_in_transformers(tiny_omni, tmp_path, capsys):
    import torch
    import transformers

    from mmrun.models.qwen2_5_omni.hf_checkpoint import load_hf_config
    from mmrun.models.vlm.mm_layout import VLMLayout

    original = tmp_path / "hf"
    thinker = tiny_omni.hf_model().to(torch.bfloat16)
    thinker.save_pretrained(original)
    (original / "tokenizer_config.json").write_text("{}")  # a side file the conversion copies back
    config = load_hf_config(original)
    assert main(_split(tmp_path, original, "mm")) == 0
    layout = VLMLayout.build(config, tp=2, pp=2, vit_pp_layers=[2, 0], llm_pp_layers=[1, 1])
    shards = {}
    for tp_rank in range(2):
        for pp_rank in range(2):
            rank_dir = tmp_path / "mm" / "release" / f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
            shards[tp_rank, pp_rank] = load_file(rank_dir / "model.safetensors")
            assert {n: t.shape for n, t in shards[tp_rank, pp_rank].items()} == layout.rank_shapes(tp_rank, pp_rank)
    stage0, stage1 = shards[1, 0], shards[1, 1]
    assert not any(n.startswith("audio_encoder.") for n in stage1)  # the audio encoder sits on stage 0
    # MindSpeed-MM's names; the audio qkv column-parallel (per head [q; k; v], 2 of 4 heads a rank), fc1 column-,
    # linear_proj row-parallel, the bias of k zeros (the audio attention has none)
    layer = "audio_encoder.encoder.blocks.layers.1."
    d, ffn = 32, 48
    assert stage0[layer + "self_attention.linear_qkv.weight"].shape == (3 * d // 2, d)
    assert stage0[layer + "mlp.linear_fc1.weight"].shape == (ffn // 2, d)
    assert stage0[layer + "self_attention.linear_proj.weight"].shape == (d, d // 2)
    bias = stage0[layer + "self_attention.linear_qkv.bias"].reshape(2, 3, d // 4)  # 2 heads: [q_h; k_h; v_h]
    assert not bias[:, 1].any() and bias[:, 0].any() and bias[:, 2].any()
    assert stage0["audio_encoder.encoder.conv1.weight"].shape == (d, 8 * 3)  # Conv1d kept flattened, replicated
    assert stage0["image_encoder.encoder.blocks.layers.0.self_attention.linear_qkv.weight"].shape == (3 * d // 2, d)
    assert stage0["image_encoder.encoder.blocks.layers.0.mlp.linear_fc1.weight"].shape == (48, d)  # [gate; up] / 2

    assert main([CONVERTER, "resplit", "--cfg.source_dir", str(tmp_path / "mm"), "--cfg.target_dir",
                 str(tmp_path / "tp2"), "--cfg.target_parallel_config.tp_size", "2"]) == 0
    assert main([CONVERTER, "mm_to_hf", "--cfg.save_hf_dir", str(tmp_path / "back"), "--cfg.mm_dir",
                 str(tmp_path / "tp2"), "--cfg.hf_config.hf_dir", str(original)]) == 0
    before, after = _tensors(original), _tensors(tmp_path / "back")
    assert sorted(before) == sorted(after) and len(before) > 100
    for name in before:  # the same bytes (bf16 through mmrun's fp32 checkpoints is exact)
        assert before[name].dtype == after[name].dtype and before[name].shape == after[name].shape, name
        assert np.array_equal(before[name].view(np.uint8), after[name].view(np.uint8)), name
    assert (tmp_path / "back" / "tokenizer_config.json").is_file()
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == "qwen2_5_omni_thinker"
    loaded = transformers.Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(tmp_path / "back")
    assert loaded.config.audio_config.n_window == 4
    theirs = dict(thinker.named_parameters())
    for name, param in loaded.named_parameters():
        assert torch.equal(param, theirs[name]), name

    # a whole Qwen2.5-Omni as downloaded (thinker.* keys, a talker tensor skipped): the same split
    whole = tiny_omni.whole_model_dir(thinker.float(), tmp_path / "whole")
    assert main(_split(tmp_path, whole, "mm_whole")) == 0
    first = load_file(tmp_path / "mm_whole" / "release" / "mp_rank_01_000" / "model.safetensors")
    assert sorted(first) == sorted(stage0)
    for name, array in first.items():
        np.testing.assert_array_equal(array, stage0[name], err_msg=name)
    capsys.readouterr()


@pytest.mark.parametrize("option, value, words", [
    ("audio_pp_layers", "[[0,2]]", "keeps the whole audio encoder (2 layers) on the first pipeline stage; give [[2, 0]]"),
    ("tp_size", "3", "is not divisible by --tensor-model-parallel-size 3"),
])
def test_a_split_mmrun_cannot_hold_is_one_line_exit_2(tiny_omni, tmp_path, capsys, option, value, words):
    tiny_omni.hf_model().save_pretrained(tmp_path / "hf")
    capsys.readouterr()
    args = _split(tmp_path, tmp_path / "hf", "mm")
    args[args.index(f"--cfg.parallel_config.{option}") + 1] = value
    assert main(args) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert not (tmp_path / "mm").exists()
