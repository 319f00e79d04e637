"""MindSpeed-MM's model.json (`--mm-model`) for Qwen3-VL (dense), read as it is written.

MindSpeed-MM's MindSpore twin of the Qwen3-VL job (examples/mindspore/qwen3vl/model_8B.json) carries
`model_id` "qwen3_vl", a `text_decoder` "qwen3_lm" (kv_channels, rope_scaling with mrope_interleaved,
qk_layernorm) and a "qwen3vit" vision encoder (deepstack_visual_indexes, max_position_embeddings = the
learned position table). Checked key by key as Qwen2-VL's model.json is (models/qwen2_vl/model_json.py: an
unknown key is one warning, a wrong type an error naming it); the result is a ModelJson whose `hf_config`
is a Qwen3-VL config.json (`configuration.Qwen3VLConfig.from_hf_config` reads it). A MoE text decoder
(num_moe_experts, Qwen3-VL-30B-A3B's model_30B.json) is refused in one line.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from mmrun.backend.errors import UsageError
from mmrun.models.qwen2_vl.model_json import (DEFAULT_TOKEN_IDS, SCHEMA, ModelJson, _check_section,
                                              _pipeline_layers, _require, recompute_sections)
from mmrun.models.qwen3_vl.configuration import MODEL_TYPE, MOE_REFUSAL

MODEL_IDS = ("qwen3_vl",)
# Qwen2-VL's table with the keys Qwen3-VL's model.json adds (MoE keys are listed so that the refusal, not an
# "unknown key" warning, answers them).
SCHEMA3: dict[str, dict[str, tuple[type, ...]]] = {
    **SCHEMA,
    "vision_encoder": {**SCHEMA["vision_encoder"], "deepstack_visual_indexes": (list,),
                       "max_position_embeddings": (int,), "add_bias_conv": (bool,), "bias_activation_fusion": (bool,)},
    "vision_projector": {**SCHEMA["vision_projector"], "use_postshuffle_norm": (bool,)},
    "text_decoder": {**SCHEMA["text_decoder"], "qk_layernorm": (bool,), "use_qk_norm": (bool,),
                     "moe_grouped_gemm": (bool,), "sequence_parallel": (bool,), "use_te": (bool,),
                     "num_moe_experts": (int, type(None)), "moe_router_topk": (int,), "moe_intermediate_size": (int,),
                     "norm_topk_prob": (bool,), "router_gating_in_fp32": (bool,)},
}


def is_qwen3_model_json(raw: Any) -> bool:
    return isinstance(raw, Mapping) and raw.get("model_id") in MODEL_IDS


def parse_model_json(raw: Mapping[str, Any], path: str = "model.json") -> ModelJson:
    """A Qwen3-VL model.json dict -> ModelJson; one-line UsageError (exit 2) on a wrong type, a missing section
    or what mmrun does not build (a MoE decoder, a decoder without QK-norm, a non-interleaved M-RoPE)."""
    warnings: list[str] = []
    _check_section(path, "top", raw, "the top level", warnings, SCHEMA3)
    _require(path, raw, "the top level", ("image_encoder", "text_decoder"))
    image_encoder, text = raw["image_encoder"], raw["text_decoder"]
    _check_section(path, "image_encoder", image_encoder, "image_encoder", warnings, SCHEMA3)
    _require(path, image_encoder, "image_encoder", ("vision_encoder", "vision_projector"))
    enc, proj = image_encoder["vision_encoder"], image_encoder["vision_projector"]
    for section, values, where in (("vision_encoder", enc, "image_encoder.vision_encoder"),
                                   ("vision_projector", proj, "image_encoder.vision_projector"),
                                   ("text_decoder", text, "text_decoder")):
        _check_section(path, section, values, where, warnings, SCHEMA3)
    if text.get("num_moe_experts"):
        raise UsageError(f"{path}: text_decoder.num_moe_experts {text['num_moe_experts']}: {MOE_REFUSAL}")
    if text.get("qk_layernorm") is False:
        raise UsageError(f"{path}: text_decoder.qk_layernorm is false, but Qwen3-VL's decoder normalises q and k "
                         "per head; set it true (or leave it out)")
    _require(path, text, "text_decoder", ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"))
    _require(path, enc, "image_encoder.vision_encoder", ("num_layers", "hidden_size", "num_attention_heads"))
    rope = text.get("rope_scaling") or {}
    if rope.get("mrope_interleaved") is False:
        raise UsageError(f"{path}: text_decoder.rope_scaling.mrope_interleaved is false; Qwen3-VL's M-RoPE is "
                         "interleaved: set it true (or leave it out)")
    heads = text["num_attention_heads"]
    head_dim = text.get("kv_channels") or text["hidden_size"] // heads
    mrope = text.get("mrope_section") or rope.get("mrope_section") or [24, 20, 20]
    if len(mrope) != 3 or sum(mrope) * 2 != head_dim:
        raise UsageError(f"{path}: text_decoder mrope_section {mrope} must be three numbers summing to head_dim / 2 "
                         f"= {head_dim // 2} (kv_channels {head_dim})")
    out_hidden = proj.get("hidden_size", enc.get("llm_hidden_size", text["hidden_size"]))
    if out_hidden != text["hidden_size"]:
        raise UsageError(f"{path}: image_encoder.vision_projector.hidden_size ({out_hidden}) must equal "
                         f"text_decoder.hidden_size ({text['hidden_size']}): the projector feeds the text decoder")
    ids = {key: raw.get(key, default) for key, default in DEFAULT_TOKEN_IDS.items()}
    ids["image_token_id"] = raw.get("img_context_token_id", raw.get("image_token_id", ids["image_token_id"]))
    untied = text.get("untie_embeddings_and_output_weights", False)
    text_config = {
        "hidden_size": text["hidden_size"], "intermediate_size": text.get("ffn_hidden_size", 4 * text["hidden_size"]),
        "num_hidden_layers": text["num_layers"], "num_attention_heads": heads,
        "num_key_value_heads": text.get("num_query_groups", heads) if text.get("group_query_attention") else heads,
        "head_dim": head_dim, "hidden_act": text.get("activation_func", "silu"),
        "max_position_embeddings": text.get("max_position_embeddings", 262144),
        "rms_norm_eps": text.get("layernorm_epsilon", 1e-6), "vocab_size": text["vocab_size"],
        "attention_bias": bool(text.get("add_qkv_bias", False)),
        "attention_dropout": text.get("attention_dropout", 0.0),
        "rope_parameters": {"rope_type": "default", "rope_theta": text.get("rope_theta", 5000000.0),
                            "mrope_section": list(mrope), "mrope_interleaved": True},
    }
    vision_config = {
        "depth": enc["num_layers"], "hidden_size": enc["hidden_size"], "num_heads": enc["num_attention_heads"],
        "intermediate_size": enc.get("intermediate_size", enc.get("ffn_hidden_size", 4 * enc["hidden_size"])),
        "out_hidden_size": out_hidden, "hidden_act": enc.get("activation_func", "gelu_pytorch_tanh"),
        "in_channels": enc.get("in_channels", 3), "patch_size": enc.get("patch_size", 16),
        "spatial_merge_size": enc.get("spatial_merge_size", 2),
        "temporal_patch_size": enc.get("temporal_patch_size", 2),
        "num_position_embeddings": enc.get("max_position_embeddings", 2304),
        "deepstack_visual_indexes": list(enc.get("deepstack_visual_indexes", [8, 16, 24])),
    }
    hf_config = {"model_type": MODEL_TYPE, "architectures": ["Qwen3VLForConditionalGeneration"], **ids,
                 "tie_word_embeddings": not untied, "text_config": text_config, "vision_config": vision_config}
    try:  # the model's own checks (shapes, activations, DeepStack indexes), as one line naming the file
        from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig
        Qwen3VLConfig.from_hf_config(hf_config)
    except ValueError as error:
        raise UsageError(f"{path}: {error}") from None
    freeze = {"vision_encoder": enc.get("freeze", True), "vision_projector": proj.get("freeze", False),
              "text_decoder": text.get("freeze", False)}
    sizes = {"num_layers": text["num_layers"], "hidden_size": text["hidden_size"],
             "ffn_hidden_size": text_config["intermediate_size"], "num_attention_heads": heads,
             "max_position_embeddings": text_config["max_position_embeddings"], "vocab_size": text["vocab_size"],
             "normalization": "RMSNorm", "position_embedding_type": "mrope",
             "untie_embeddings_and_output_weights": untied, "make_vocab_size_divisible_by": 1}
    pipeline_layers = {part: _pipeline_layers(path, where, section) for part, where, section in
                       (("vit", "image_encoder.vision_encoder", enc), ("llm", "text_decoder", text))}
    return ModelJson(path=path, hf_config=hf_config, freeze=freeze, sizes=sizes, warnings=warnings,
                     pipeline_layers=pipeline_layers, recompute=recompute_sections(enc, text))


def read_vlm_model_json(path: str) -> ModelJson:
    """A model.json of either family, as models/pretrain_vlm.py reads it: Qwen3-VL's (model_id qwen3_vl) here,
    the Qwen2-VL family's by models/qwen2_vl/model_json.py (for the engines and checkpoint readers that get only
    its path; the entry has already checked that it exists and is JSON)."""
    from pathlib import Path

    from mmrun.models.qwen2_vl.model_json import read_model_json

    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    return parse_model_json(raw, str(path)) if is_qwen3_model_json(raw) else read_model_json(path)


# Frameworks whose parallel engine builds Qwen3-VL split over tensor/pipeline ranks (PyTorch: megatron-core's).
SPLIT_FRAMEWORKS = ("mindspore", "pytorch")


def check_split(spec: ModelJson, framework: str, split: bool) -> None:
    """An unsplit run needs model.json's pipeline_num_layers to say one stage (one line otherwise); a split run needs
    a framework whose parallel engine builds Qwen3-VL."""
    if split and framework not in SPLIT_FRAMEWORKS:
        raise UsageError(f"tensor/pipeline parallelism of Qwen3-VL is built on --ai-framework "
                         f"{' or '.join(SPLIT_FRAMEWORKS)} only. Received: --ai-framework {framework} with a split; "
                         "train it on one of those, or unsplit (data parallelism)")
    if split:
        return
    for part, where in (("vit", "image_encoder.vision_encoder"), ("llm", "text_decoder")):
        layers = spec.pipeline_layers.get(part)
        if layers is not None and len(layers) != 1:
            raise UsageError(f"{spec.path}: {where}.pipeline_num_layers {json.dumps(layers)} splits Qwen3-VL over "
                             f"{len(layers)} pipeline stages, but the run has one (no --pipeline-model-parallel-size);"
                             f" pass --pipeline-model-parallel-size {len(layers)}, or give one entry holding every "
                             "layer")
