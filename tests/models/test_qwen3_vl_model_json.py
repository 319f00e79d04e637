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
    ({"num_moe_experts": 8, "moe_aux_loss_coeff": -0.001},
     r"^model_8B.json: text_decoder.moe_aux_loss_coeff must be a number >= 0 .*Received: -0.001$"),
    ({"num_moe_experts": 8, "moe_aux_loss_coeff": float("nan")}, r"moe_aux_loss_coeff must be a number >= 0.*NaN$"),
    ({"num_moe_experts": 8, "moe_aux_loss_coeff": "0.01"}, r"moe_aux_loss_coeff must be int or float\. Received: \"0.01\""),
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


def test_moe_aux_loss_coeff_switches_transformers_load_balancing_loss():
    """MindSpeed-MM's model_30B.json leaves moe_aux_loss_coeff out: no aux loss. Set (> 0) on a tiny MoE json, the
    model built from it has transformers' output_router_logits with router_aux_loss_coef = the coeff: its loss and
    every gradient equal transformers' Qwen3VLMoe (output_router_logits=True) within 1e-5; 0 switches it off."""
    import numpy as np
    import torch
    import transformers

    from mmrun.backend import autograd, tensors
    from mmrun.models.qwen3_vl.modeling import Qwen3VLForConditionalGeneration

    mm_30b = json.loads((REPO / "tests/fixtures/mindspeed_mm/mindspore/qwen3vl/model_30B.json").read_text())
    assert "moe_aux_loss_coeff" not in mm_30b["text_decoder"]
    assert not Qwen3VLConfig.from_hf_config(model_json.parse_model_json(mm_30b).hf_config).text.moe.output_router_logits
    raw = json.loads((REPO / "scripts" / "qwen3vl" / "model_tiny.json").read_text())
    raw["text_decoder"].update(num_moe_experts=4, moe_router_topk=2, moe_intermediate_size=16, moe_aux_loss_coeff=0.5)
    hf_config = model_json.parse_model_json(raw, "model_tiny.json").hf_config
    config = Qwen3VLConfig.from_hf_config(hf_config)
    assert (config.text.moe.output_router_logits, config.text.moe.router_aux_loss_coef) == (True, 0.5)
    raw["text_decoder"]["moe_aux_loss_coeff"] = 0
    assert not Qwen3VLConfig.from_hf_config(model_json.parse_model_json(raw).hf_config).text.moe.output_router_logits

    torch.manual_seed(0)
    theirs = transformers.Qwen3VLMoeForConditionalGeneration(transformers.Qwen3VLMoeConfig(**hf_config)).eval()
    assert theirs.config.text_config.output_router_logits and theirs.config.text_config.router_aux_loss_coef == 0.5
    with torch.no_grad():
        for param in theirs.parameters():
            param.add_(0.1 * torch.randn_like(param))
    ours = Qwen3VLForConditionalGeneration(config).eval()
    ours.load_state_dict({name: value.detach().reshape(value.shape[0], -1) if name.endswith("patch_embed.proj.weight")
                          else value.detach().clone() for name, value in theirs.state_dict().items()})
    ids = np.random.default_rng(0).integers(10, config.text.vocab_size, (2, 12)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 9:] = 0  # a padded row: the padding leaves the aux loss too
    batch = {"input_ids": ids, "attention_mask": mask, "labels": np.where(mask == 1, ids, -100)}
    out = theirs(**{k: torch.from_numpy(v) for k, v in batch.items()})
    out.loss.backward()
    params = dict(ours.named_parameters())
    loss, grads = autograd.value_and_grad(
        lambda: ours(**{k: tensors.from_numpy(v) for k, v in batch.items()})["loss_dict"]["loss"], params.values())()
    assert float(out.aux_loss.detach()) > 0.5  # the term is there (a balanced router gives about 1)
    np.testing.assert_allclose(float(loss), float(out.loss), rtol=0, atol=1e-5)
    for (name, param), grad in zip(params.items(), grads):
        theirs_grad = dict(theirs.named_parameters())[name].grad
        expected = np.zeros(param.shape, np.float32) if theirs_grad is None else theirs_grad.numpy()
        np.testing.assert_allclose(tensors.to_numpy(grad), expected.reshape(grad.shape), rtol=0, atol=1e-5,
                                   err_msg=name)
