"""MindSpeed-MM's model.json read as it is written: the HF config it describes, freeze switches, sizes, and
one-line errors for what is wrong (no framework needed)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from mmrun.backend.errors import UsageError
from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig
from mmrun.models.qwen2_vl.model_json import parse_model_json
from mmrun.models.vlm.model_json import read_model_json

ROOT = Path(__file__).resolve().parents[2]
TINY = json.loads((ROOT / "scripts" / "qwen2vl" / "model_tiny.json").read_text())

# MindSpeed-MM's examples/qwen2.5vl/model_3b.json (public), as published.
QWEN25_3B = {
    "model_id": "qwen2_5vl", "img_context_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "image_encoder": {
        "vision_encoder": {
            "model_id": "qwen2vit", "num_layers": 32, "hidden_size": 1280, "ffn_hidden_size": 3420,
            "llm_hidden_size": 1280, "gated_linear_unit": True, "num_attention_heads": 16, "hidden_dropout": 0.0,
            "attention_dropout": 0.0, "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "layernorm_epsilon": 1e-06, "normalization": "RMSNorm", "fp16": False,
            "bf16": True, "params_dtype": "bf16", "activation_func": "silu", "freeze": True,
            "use_fused_rotary_pos_emb": True, "post_layer_norm": False, "pipeline_num_layers": [32],
            "intermediate_size": 3420, "tokens_per_second": 2, "window_attn_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31], "attention_mask_type": "general"},
        "vision_projector": {
            "model_id": "lnmlp", "num_layers": 1, "gated_linear_unit": False, "bias_activation_fusion": False,
            "add_bias_linear": True, "input_size": 1280, "hidden_size": 2048, "ffn_hidden_size": 5120,
            "activation_func": "gelu", "bf16": True, "params_dtype": "bf16", "freeze": True,
            "layernorm_epsilon": 1e-06, "normalization": "RMSNorm"}},
    "text_decoder": {
        "model_id": "qwen2_5_lm", "num_layers": 36, "pipeline_num_layers": [36], "hidden_size": 2048,
        "ffn_hidden_size": 11008, "num_attention_heads": 16, "seq_length": 1024, "max_position_embeddings": 128000,
        "vocab_size": 151936, "rope_theta": 1000000.0, "untie_embeddings_and_output_weights": False,
        "disable_bias_linear": True, "attention_dropout": 0.0, "init_method_std": 0.01, "hidden_dropout": 0.0,
        "position_embedding_type": "mrope", "normalization": "RMSNorm", "activation_func": "silu",
        "use_fused_rotary_pos_emb": True, "attention_softmax_in_fp32": True, "params_dtype": "bf16", "bf16": True,
        "parallel_output": True, "group_query_attention": True, "num_query_groups": 2, "mrope_section": [16, 24, 24],
        "rope_scaling": None, "gated_linear_unit": True, "layernorm_epsilon": 1e-06, "add_bias_linear": False,
        "add_qkv_bias": True, "use_remove_padding": False},
    "text_encoder": None, "video_encoder": None,
}


def test_mindspeed_mm_qwen25vl_3b_reads_as_the_hugging_face_model():
    spec = parse_model_json(QWEN25_3B)
    assert spec.warnings == []
    config = Qwen2VLConfig.from_hf_config(spec.hf_config)
    assert config.model_type == "qwen2_5_vl" and config.is_qwen2_5
    assert (config.text.num_hidden_layers, config.text.hidden_size, config.text.num_key_value_heads) == (36, 2048, 2)
    assert config.vision.depth == 32 and tuple(config.vision.fullatt_block_indexes) == (7, 15, 23, 31)
    assert config.image_token_id == 151655 and config.tie_word_embeddings
    assert spec.freeze == {"vision_encoder": True, "vision_projector": True, "text_decoder": False}
    assert spec.sizes["num_layers"] == 36 and spec.sizes["ffn_hidden_size"] == 11008


def test_the_demo_model_json_is_a_qwen2vl_with_mindspeed_mm_defaults_for_what_it_leaves_out():
    spec = parse_model_json(TINY)
    config = Qwen2VLConfig.from_hf_config(spec.hf_config)
    assert config.model_type == "qwen2_vl" and config.vision.hidden_act == "quick_gelu"
    assert spec.hf_config["vision_config"]["mlp_ratio"] == 2 and isinstance(spec.hf_config["vision_config"]["mlp_ratio"], int)


@pytest.mark.parametrize("path, value, message", [
    (("text_decoder", "num_layers"), "2", "text_decoder.num_layers must be int. Received: \"2\""),
    (("image_encoder", "vision_encoder", "freeze"), 1, "image_encoder.vision_encoder.freeze must be bool. Received: 1"),
    (("text_decoder", "mrope_section"), [4, 2, 1], "mrope_section [4, 2, 1] must sum to head_dim / 2 = 8"),
    (("model_id",), "llava", "model_id must be one of qwen2vl, qwen2_5vl"),
    (("text_decoder", "pipeline_num_layers"), [[1], 1], "pipeline_num_layers must be a list of layer counts"),
    (("text_decoder", "pipeline_num_layers"), [[1], []], "or one such list per virtual pipeline chunk"),
    (("image_encoder", "vision_projector", "hidden_size"), 32, "must equal text_decoder.hidden_size (64)"),
])
def test_wrong_values_are_one_line_errors_naming_the_key(path, value, message):
    raw = copy.deepcopy(TINY)
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(UsageError) as err:
        parse_model_json(raw, "model.json")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_unknown_keys_are_named_in_one_warning(tmp_path):
    raw = copy.deepcopy(TINY)
    raw["text_decoder"]["num_layer"] = 3  # a typo of num_layers
    file = tmp_path / "model.json"
    file.write_text(json.dumps(raw))
    warnings: list[str] = []
    read_model_json(file, warn=warnings.append)
    assert warnings == [f"{file}: unknown key(s) in text_decoder: num_layer (mmrun does not read them)"]


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        read_model_json(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{\"model_id\": ")
    with pytest.raises(UsageError, match="not valid JSON"):
        read_model_json(tmp_path / "bad.json")


def test_pipeline_num_layers_are_read_per_stage_for_the_parallel_engines():
    raw = copy.deepcopy(TINY)
    raw["image_encoder"]["vision_encoder"]["pipeline_num_layers"] = [2, 0]
    raw["text_decoder"]["pipeline_num_layers"] = [1, 1]
    assert parse_model_json(raw).pipeline_layers == {"vit": [2, 0], "llm": [1, 1]}
    del raw["text_decoder"]["pipeline_num_layers"]
    assert parse_model_json(raw).pipeline_layers["llm"] is None
    raw["text_decoder"]["pipeline_num_layers"] = [[1, 0], [0, 1]]  # virtual pipeline chunks (MindSpeed-MM's form)
    assert parse_model_json(raw).pipeline_layers["llm"] == [[1, 0], [0, 1]]
