"""MindSpeed-MM's Qwen3-VL model.json read by mmrun: the 8B file's values give Qwen3-VL-8B's config, what is not built (Megatron's MoE aux loss, a pipeline split, no QK-norm) or cannot route (top-k above the experts) is refused in one line."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from mmrun.backend.errors import UsageError
from mmrun.models.qwen3_vl import model_json
from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig

REPO = Path(__file__).resolve().parents[2]
# The values of MindSpeed-MM's examples/mindspore/qwen3vl/model_8B.json (HEAD 57069cd5) that shape the model.
MM_8B = {
    "model_id": "qwen3_vl", "img_context_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "text_decoder": {
        "model_id": "qwen3_lm", "add_qkv_bias": False, "kv_channels": 128, "activation_func": "silu",
        "hidden_size": 4096, "ffn_hidden_size": 12288, "max_position_embeddings": 262144, "num_attention_heads": 32,
        "num_layers": 36, "num_query_groups": 8, "layernorm_epsilon": 1e-06, "group_query_attention": True,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000, "vocab_size": 151936, "pipeline_num_layers": [6, 10, 10, 10],
        "untie_embeddings_and_output_weights": True, "qk_layernorm": True, "use_qk_norm": True, "use_te": False,
        "moe_grouped_gemm": False},
    "image_encoder": {
        "vision_encoder": {
            "model_id": "qwen3vit", "deepstack_visual_indexes": [8, 16, 24], "num_layers": 27,
            "activation_func": "gelu_pytorch_tanh", "hidden_size": 1152, "in_channels": 3, "ffn_hidden_size": 4304,
            "num_attention_heads": 16, "max_position_embeddings": 2304, "llm_hidden_size": 4096, "patch_size": 16,
            "spatial_merge_size": 2, "temporal_patch_size": 2, "add_bias_conv": True, "freeze": True,
            "pipeline_num_layers": [27, 0, 0, 0], "intermediate_size": 4304},
        "vision_projector": {"model_id": "lnmlp", "input_size": 1152, "hidden_size": 4096, "ffn_hidden_size": 4608,
                             "freeze": True, "use_postshuffle_norm": False}},
    "text_encoder": None, "video_encoder": None,
}


def test_mindspeed_mm_8b_model_json_is_qwen3_vl_8b():
    spec = model_json.parse_model_json(MM_8B, "model_8B.json")
    assert spec.warnings == []  # every key of MindSpeed-MM's file is known
    config = Qwen3VLConfig.from_hf_config(spec.hf_config)
    text, vision = config.text, config.vision
    assert (text.num_hidden_layers, text.hidden_size, text.head_dim, text.num_key_value_heads) == (36, 4096, 128, 8)
    assert text.mrope_section == (24, 20, 20) and text.rope_theta == 5e6 and not config.tie_word_embeddings
    assert (vision.depth, vision.num_position_embeddings, vision.deepstack_visual_indexes) == (27, 2304, (8, 16, 24))
    assert spec.freeze == {"vision_encoder": True, "vision_projector": True, "text_decoder": False}
    with pytest.raises(UsageError, match=r"splits Qwen3-VL over 4 pipeline stages.*pipeline-model-parallel-size 4"):
        model_json.check_split(spec, "mindspore", split=False)
    for framework in ("mindspore", "pytorch"):  # MindSpeed-MM's PP=4 twin: both parallel engines build it
        model_json.check_split(spec, framework, split=True)


@pytest.mark.parametrize("change, message", [
    ({"num_moe_experts": 8, "moe_router_topk": 9},
     r"^model_8B.json: num_experts_per_tok \(moe_router_topk\) 9 must be between 1 and num_experts \(num_moe_experts\) 8"),
    ({"num_moe_experts": 8, "moe_aux_loss_coeff": 0.001}, r"moe_aux_loss_coeff 0.001: Megatron's per-layer"),
    ({"qk_layernorm": False}, r"qk_layernorm is false"),
    ({"kv_channels": 64}, r"mrope_section \[24, 20, 20\] must be three numbers summing to head_dim / 2 = 32"),
])
def test_what_is_not_qwen3_vl_dense_is_refused_in_one_line(change, message):
    raw = copy.deepcopy(MM_8B)
    raw["text_decoder"].update(change)
    with pytest.raises(UsageError, match=message):
        model_json.parse_model_json(raw, "model_8B.json")


def test_the_tiny_model_json_reads_and_is_one_stage():
    raw = json.loads((REPO / "scripts" / "qwen3vl" / "model_tiny.json").read_text())
    spec = model_json.parse_model_json(raw, "model_tiny.json")
    model_json.check_split(spec, "pytorch", split=False)
    assert spec.warnings == [] and Qwen3VLConfig.from_hf_config(spec.hf_config).vision.num_grid_per_side == 4
