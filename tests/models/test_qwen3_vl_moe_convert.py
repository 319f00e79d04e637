"""`mmrun convert Qwen3VLMegatronConverter` on the MoE variant (qwen3_vl_moe; MindSpeed-MM's converter of that name
takes both, checkpoint/vlm_model/converters/qwen3vl_megatron.py): a bf16 transformers Qwen3VLMoe directory -> TP=2 x
PP=2 x EP=2 (megatron-core's local expert numbers per expert-parallel rank) -> resplit to EP=3 alone -> back to a
Hugging Face directory with the original bytes, which transformers loads; an EP that does not divide the experts
is one line, exit 2."""
from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import load_file

from mmrun.checkpoint.convert_cli import main
from tests.models.test_qwen3_vl_convert import _tensors

CONVERTER = "Qwen3VLMegatronConverter"


def test_moe_hf_to_tp_pp_ep_split_to_ep3_to_hf_is_bit_exact_and_loads_in_transformers(tiny3, tmp_path, capsys):
    import torch
    import transformers

    original = tmp_path / "hf"
    tiny3.hf_moe_model().to(torch.bfloat16).save_pretrained(original)
    assert main([CONVERTER, "hf_to_mm", "--cfg.mm_dir", str(tmp_path / "mm"), "--cfg.hf_config.hf_dir", str(original),
                 "--cfg.parallel_config.tp_size", "2", "--cfg.parallel_config.vit_pp_layers", "[[3,0]]",
                 "--cfg.parallel_config.llm_pp_layers", "[[2,1]]", "--cfg.parallel_config.ep_size", "2"]) == 0
    release = tmp_path / "mm" / "release"
    assert sorted(p.name for p in release.iterdir()) == [f"mp_rank_{t:02d}_{p:03d}_{e:03d}" for t in range(2)
                                                          for p in range(2) for e in range(2)]
    hf = {name: torch.from_numpy(a.astype(np.uint16).view(np.int16)).view(torch.bfloat16).float().numpy()
          if a.dtype == np.uint16 else a for name, a in _tensors(original).items()}
    # TP rank 1, stage 1 (decoder layer 2 is its local layer 0), EP rank 1: global experts 3, 4, 5 as local 0, 1, 2
    shard = load_file(release / "mp_rank_01_001_001" / "model.safetensors")
    experts = sorted(n for n in shard if ".local_experts." in n)
    assert experts == [f"text_decoder.decoder.layers.0.mlp.experts.local_experts.{k}.linear_fc{f}.weight"
                       for k in range(3) for f in (1, 2)]
    gate_up, down = (hf[f"model.language_model.layers.2.mlp.experts.{n}"] for n in ("gate_up_proj", "down_proj"))
    inter = gate_up.shape[1] // 2  # (experts, 2 x moe_intermediate, hidden): [gate; up]; TP rank 1 takes each half's
    half = inter // 2              # second half (GLU), and down_proj's second column half (row-parallel)
    for k in range(3):
        fc1 = shard[f"text_decoder.decoder.layers.0.mlp.experts.local_experts.{k}.linear_fc1.weight"]
        assert np.array_equal(fc1, np.concatenate([gate_up[3 + k, half:inter], gate_up[3 + k, inter + half:]]))
        fc2 = shard[f"text_decoder.decoder.layers.0.mlp.experts.local_experts.{k}.linear_fc2.weight"]
        assert np.array_equal(fc2, down[3 + k][:, half:])
    assert np.array_equal(shard["text_decoder.decoder.layers.0.mlp.router.weight"],
                          hf["model.language_model.layers.2.mlp.gate.weight"])  # replicated on every rank
    # the dense middle layer (mlp_only_layers [1]) keeps megatron-core's dense MLP names, on every EP rank
    stage0 = load_file(release / "mp_rank_00_000_001" / "model.safetensors")
    assert "text_decoder.decoder.layers.1.mlp.linear_fc1.weight" in stage0
    assert "text_decoder.decoder.layers.0.mlp.experts.local_experts.2.linear_fc2.weight" in stage0
    assert json.loads((release / "mp_rank_00_000_001" / "meta.json").read_text())["parallel"]["ep_rank"] == 1

    assert main([CONVERTER, "resplit", "--cfg.source_dir", str(tmp_path / "mm"), "--cfg.target_dir",
                 str(tmp_path / "ep3"), "--cfg.target_parallel_config.ep_size", "3"]) == 0
    assert sorted(p.name for p in (tmp_path / "ep3" / "release").iterdir()) == [
        "mp_rank_00_000", "mp_rank_00_001", "mp_rank_00_002"]  # megatron-core's names: no pipeline stage, EP rank
    capsys.readouterr()
    assert main([CONVERTER, "mm_to_hf", "--cfg.save_hf_dir", str(tmp_path / "back"), "--cfg.mm_dir",
                 str(tmp_path / "ep3"), "--cfg.hf_config.hf_dir", str(original), "--cfg.parallel_config.ep_size",
                 "2"]) == 2  # a checkpoint split for another EP
    err = capsys.readouterr().err
    assert "ep_size 2 does not match" in err and "pass ep_size 3" in err and err.count("\n") == 1, err
    assert main([CONVERTER, "mm_to_hf", "--cfg.save_hf_dir", str(tmp_path / "back"), "--cfg.mm_dir",
                 str(tmp_path / "ep3"), "--cfg.hf_config.hf_dir", str(original), "--cfg.parallel_config.ep_size",
                 "3"]) == 0
    before, after = _tensors(original), _tensors(tmp_path / "back")
    assert sorted(before) == sorted(after)
    for name in before:  # the same bytes (bf16 through mmrun's fp32 checkpoints is exact)
        assert before[name].dtype == after[name].dtype and np.array_equal(before[name].view(np.uint8),
                                                                          after[name].view(np.uint8)), name
    loaded = transformers.Qwen3VLMoeForConditionalGeneration.from_pretrained(tmp_path / "back")
    assert torch.equal(loaded.model.language_model.layers[2].mlp.experts.gate_up_proj.float(),
                       torch.from_numpy(gate_up))
    capsys.readouterr()


def test_an_ep_size_that_does_not_divide_the_experts_is_one_line_exit_2(tiny3, tmp_path, capsys):
    tiny3.hf_moe_model().save_pretrained(tmp_path / "hf")
    capsys.readouterr()
    assert main([CONVERTER, "hf_to_mm", "--cfg.mm_dir", str(tmp_path / "mm"), "--cfg.hf_config.hf_dir",
                 str(tmp_path / "hf"), "--cfg.parallel_config.ep_size", "4"]) == 2
    err = capsys.readouterr().err
    assert "expert-parallel size 4 does not divide the model's 6 experts" in err and err.count("\n") == 1, err
    assert not (tmp_path / "mm").exists()
