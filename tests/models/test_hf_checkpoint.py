"""Hugging Face directories: config layouts, mmrun -> transformers, byte-identical round trips, clear errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mmrun.checkpoint.formats import safetensors
from mmrun.models.qwen2_vl import hf_checkpoint
from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig

# transformers 4.x hub layout (Qwen/Qwen2-VL-7B-Instruct's config.json, fields trimmed to what matters)
QWEN2_VL_7B_HUB = {
    "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl", "hidden_size": 3584,
    "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656,
    "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3,
                      "hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
                      "temporal_patch_size": 2},
}
QWEN2_5_VL_3B_HUB = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "hidden_size": 2048,
    "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
    "hidden_act": "silu", "max_position_embeddings": 128000, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 151936,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "image_token_id": 151655, "video_token_id": 151656,
    "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14,
                      "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
}


def _raw_tensors(path):
    """name -> raw bytes of every tensor, read by the safetensors library itself."""
    import torch
    from safetensors import safe_open

    out = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                out[name] = (str(tensor.dtype), tuple(tensor.shape), tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return out


def _hf_config_back(tmp_path, config: Qwen2VLConfig):
    """The config as transformers reads our config.json."""
    import transformers

    folder = tmp_path / "config-only"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config.to_hf_config()))
    return transformers.AutoConfig.from_pretrained(folder)


@pytest.mark.parametrize("hub", [QWEN2_VL_7B_HUB, QWEN2_5_VL_3B_HUB], ids=["qwen2_vl_7b", "qwen2_5_vl_3b"])
def test_hub_configs_read_and_transformers_reads_ours_back(tmp_path, hub):
    pytest.importorskip("transformers")
    config = Qwen2VLConfig.from_hf_config(hub)
    v, t = config.vision, config.text
    assert (t.hidden_size, t.num_key_value_heads, t.mrope_section, t.rope_theta) == (
        hub["hidden_size"], hub["num_key_value_heads"], (16, 24, 24), 1e6)
    assert config.tie_word_embeddings is hub["tie_word_embeddings"] and config.torch_dtype == "bfloat16"
    if config.is_qwen2_5:
        assert (v.hidden_size, v.intermediate_size, v.out_hidden_size, v.window_size, v.fullatt_block_indexes,
                v.tokens_per_second) == (1280, 3420, 2048, 112, (7, 15, 23, 31), 2)
    else:
        assert (v.hidden_size, v.intermediate_size, v.out_hidden_size, v.hidden_act) == (1280, 5120, 3584, "quick_gelu")
    back = _hf_config_back(tmp_path, config)
    assert back.model_type == hub["model_type"]
    assert back.text_config.hidden_size == t.hidden_size and back.text_config.num_hidden_layers == t.num_hidden_layers
    assert back.text_config.rope_parameters["mrope_section"] == [16, 24, 24]
    assert back.text_config.rope_parameters["rope_theta"] == 1e6
    assert back.tie_word_embeddings is hub["tie_word_embeddings"]
    assert back.vision_config.depth == 32 and back.vision_config.num_heads == 16
    assert Qwen2VLConfig.from_hf_config(back.to_dict()) == config  # transformers 5.x layout reads the same


def test_mrope_sections_must_cover_half_the_head_dim():
    bad = {**QWEN2_VL_7B_HUB, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 16]}}
    with pytest.raises(ValueError, match=r"mrope_section \[16, 24, 16\] sums to 56, but the text head_dim 128 has "
                                         r"64 rotary frequencies; make the sections sum to head_dim // 2 \(64\)"):
        Qwen2VLConfig.from_hf_config(bad)


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
def test_saved_directory_loads_in_transformers_with_the_same_logits(tmp_path, tiny, worker, hf_dirs, model_type):
    import torch
    import transformers

    from mmrun.backend import tensors
    from mmrun.models.qwen2_vl import Qwen2VLForConditionalGeneration, init_weights, save_hf_directory

    config, _ = hf_checkpoint.load_hf_directory(hf_dirs[model_type])
    model = Qwen2VLForConditionalGeneration(config)
    init_weights(model, seed=5)  # weights transformers has never seen
    out_dir = save_hf_directory(tmp_path / "saved", config, tensors.state_dict_to_numpy(model.state_dict()),
                                copy_files_from=hf_dirs[model_type])
    assert (out_dir / "generation_config.json").is_file() and hf_checkpoint.is_hf_directory(out_dir)
    hf = transformers.AutoModelForImageTextToText.from_pretrained(out_dir).eval()
    batch = tiny.image_batch()
    positions = tiny.hf_position_ids(hf, batch)
    with torch.no_grad():
        theirs = hf(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits.numpy()
    ours = worker.forward_backward(model, {**batch, "position_ids": positions})["logits"]
    real = batch["attention_mask"] == 1
    np.testing.assert_allclose(ours[real], theirs[real], rtol=0, atol=1e-5)


def test_round_trip_is_byte_identical_fp32_and_bf16_sharded(tmp_path, tiny, hf_dirs):
    import torch
    import transformers

    # fp32, one file, tied (Qwen2-VL: no lm_head on disk)
    config, arrays = hf_checkpoint.load_hf_directory(hf_dirs["qwen2_vl"])
    assert arrays["visual.patch_embed.proj.weight"].shape == (32, 1176) and "lm_head.weight" not in arrays
    out = hf_checkpoint.save_hf_directory(tmp_path / "fp32", config, arrays)
    assert _raw_tensors(out) == _raw_tensors(hf_dirs["qwen2_vl"])
    # bf16, untied, written by transformers; saved back in 3+ shards
    bf16_dir = tmp_path / "bf16-hf"
    bf16_model = tiny.hf_model("qwen2_5_vl").to(torch.bfloat16)  # its own copy: the session's stays fp32
    bf16_model.save_pretrained(bf16_dir)
    config, arrays = hf_checkpoint.load_hf_directory(bf16_dir)
    assert arrays["lm_head.weight"].dtype == np.uint16 and config.torch_dtype == "bfloat16"
    out = hf_checkpoint.save_hf_directory(tmp_path / "bf16", config, arrays, max_shard_bytes=40_000)
    assert len(list(out.glob("model-*-of-*.safetensors"))) >= 3 and (out / "model.safetensors.index.json").is_file()
    assert _raw_tensors(out) == _raw_tensors(bf16_dir)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    reloaded = transformers.AutoModelForImageTextToText.from_pretrained(out, dtype=torch.bfloat16)
    theirs = bf16_model.state_dict()
    for name, value in reloaded.state_dict().items():
        assert torch.equal(value, theirs[name]), name
    # fp32 -> bf16 on the way out rounds as torch does
    wide = safetensors.to_float_arrays(arrays)
    again = hf_checkpoint.save_hf_directory(tmp_path / "bf16-again", config, wide, dtype="bfloat16")
    assert _raw_tensors(again) == _raw_tensors(bf16_dir)


def test_bf16_rounding_is_torchs():
    import torch

    values = np.concatenate([np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 1e3,
                             np.array([np.inf, -np.inf, 0.0, -0.0, 1e-40, 3.4e38, 1.00390625], np.float32)])
    ours = safetensors.float32_to_bf16_bits(values)
    expected = torch.from_numpy(values).to(torch.bfloat16)
    np.testing.assert_array_equal(ours, expected.view(torch.int16).numpy().view(np.uint16))
    np.testing.assert_array_equal(safetensors.bf16_bits_to_float32(ours), expected.float().numpy())
    # NaN stays NaN (its payload is not kept: torch's vectorised and scalar casts disagree on it anyway)
    assert np.isnan(safetensors.bf16_bits_to_float32(safetensors.float32_to_bf16_bits(np.float32([np.nan]))))[0]


def test_transformers_5_in_memory_key_layout_reads_the_same(tmp_path, hf_models, hf_dirs):
    state = {k: v.numpy() for k, v in hf_models["qwen2_5_vl"].state_dict().items()}  # model.visual.*, model.language_model.*
    assert any(k.startswith("model.language_model.") for k in state)
    folder = tmp_path / "in-memory"
    folder.mkdir()
    (folder / "config.json").write_text((hf_dirs["qwen2_5_vl"] / "config.json").read_text())
    safetensors.write_safetensors(folder / "model.safetensors", state)
    _, ours = hf_checkpoint.load_hf_directory(folder)
    _, hub = hf_checkpoint.load_hf_directory(hf_dirs["qwen2_5_vl"])
    assert sorted(ours) == sorted(hub)
    for name in hub:
        np.testing.assert_array_equal(ours[name], hub[name])


def test_not_a_qwen2_vl_directory_is_one_clear_line(tmp_path, hf_dirs):
    with pytest.raises(hf_checkpoint.NotAnHFDirectoryError, match=r"has no config.json, so it is not a Hugging Face"):
        hf_checkpoint.load_hf_directory(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava"}))
    with pytest.raises(ValueError, match=r"config.json has model_type 'llava', not a Qwen2-VL family model; mmrun's "
                                         r"qwen2_vl reads model_type qwen2_vl or qwen2_5_vl"):
        hf_checkpoint.load_hf_directory(tmp_path)
    (tmp_path / "config.json").write_text((hf_dirs["qwen2_vl"] / "config.json").read_text())
    with pytest.raises(ValueError, match=r"has no model.safetensors or model.safetensors.index.json"):
        hf_checkpoint.load_hf_directory(tmp_path)
    with pytest.raises(ValueError, match=r"is not a directory"):
        hf_checkpoint.load_hf_directory(tmp_path / "config.json")
    assert not hf_checkpoint.is_hf_directory(tmp_path) and hf_checkpoint.is_hf_directory(hf_dirs["qwen2_vl"])


def test_saving_refuses_to_replace_a_foreign_directory_and_names_wrong_tensors(tmp_path, hf_dirs):
    config, arrays = hf_checkpoint.load_hf_directory(hf_dirs["qwen2_vl"])
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="refusing to replace .* it exists and is not a Hugging Face Qwen2-VL"):
        hf_checkpoint.save_hf_directory(tmp_path, config, arrays)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    broken = {k: v for k, v in arrays.items() if k != "model.norm.weight"}
    broken["lm_head.weight"] = arrays["model.embed_tokens.weight"]  # tied config: no lm_head expected
    with pytest.raises(ValueError, match=r"\(missing 1: model.norm.weight; unexpected 1: lm_head.weight\)"):
        hf_checkpoint.save_hf_directory(tmp_path / "new", config, broken)
    assert not (tmp_path / "new").exists() and not list(tmp_path.glob(".new*"))


def test_a_training_load_checks_the_network_and_reads_each_tensor_when_asked(tmp_path, tiny):
    """open_for_model: what --load of an HF directory does on every rank of a split run (the dtype it was saved in
    does not count; another network is one line naming the first differences)."""
    import dataclasses

    import torch

    bf16_dir = tmp_path / "bf16"
    tiny.hf_model("qwen2_vl").to(torch.bfloat16).save_pretrained(bf16_dir)
    config = hf_checkpoint.load_hf_config(bf16_dir)
    weights = hf_checkpoint.open_for_model(bf16_dir, dataclasses.replace(config, torch_dtype="float32"), "model.json")
    norm = weights.read_float("model.norm.weight")
    assert weights["model.norm.weight"].dtype == np.uint16 and norm.dtype == np.float32
    np.testing.assert_array_equal(norm, safetensors.bf16_bits_to_float32(weights["model.norm.weight"]))
    layers = config.text.num_hidden_layers
    other = dataclasses.replace(config, text=dataclasses.replace(config.text, num_hidden_layers=layers + 1))
    with pytest.raises(ValueError, match=rf"--load .*bf16: its config.json describes another model than model.json "
                                         rf"\(num_hidden_layers: checkpoint {layers}, model.json {layers + 1}\)"):
        hf_checkpoint.open_for_model(bf16_dir, other, "model.json")
