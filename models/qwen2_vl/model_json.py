"""MindSpeed-MM's model.json (`--mm-model`) for Qwen2-VL / Qwen2.5-VL, read as it is written.

The file is checked key by key against SCHEMA (one table: where each key may appear and the type it must
have): an unknown key is named in one warning (MindSpeed-MM ignores what its model does not read, and a
typo should not pass unseen), a wrong type is an error naming the key, what was received and what is
expected. The result is the model's Hugging Face config (the flat transformers-4 `config.json` layout that
`configuration.Qwen2VLConfig.from_hf_config` reads), MindSpeed-MM's freeze switches, and the sizes that
replace the launch script's network-size flags (MindSpeed-MM's rule: model.json wins).

    spec = read_model_json("examples/qwen2vl/model_2b.json")      # models/vlm/model_json.py, for every family
    spec.hf_config["vision_config"]["depth"], spec.freeze, spec.sizes["num_layers"]
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from mmrun.backend.errors import UsageError
from mmrun.models.vlm.model_json import (DEFAULT_TOKEN_IDS, ModelJson, check_section, read_pipeline_layers,
                                         recompute_sections, refuse_from_key_table, require)

# model.json's model_id -> the Hugging Face model_type it describes.
MODEL_TYPES = {"qwen2vl": "qwen2_vl", "qwen2_5vl": "qwen2_5_vl"}
# Megatron activation names -> transformers' hidden_act names.
VISION_ACTIVATIONS = {"quick_gelu": "quick_gelu", "gelu": "gelu", "silu": "silu", "fast_gelu": "gelu_pytorch_tanh"}
def _vision_config(path: str, model_type: str, enc: Mapping[str, Any], proj: Mapping[str, Any],
                   text_hidden: int) -> dict[str, Any]:
    require(path, enc, "image_encoder.vision_encoder", ("num_layers", "hidden_size", "num_attention_heads"))
    activation = enc.get("activation_func", "quick_gelu" if model_type == "qwen2_vl" else "silu")
    if activation not in VISION_ACTIVATIONS:
        raise UsageError(f"{path}: image_encoder.vision_encoder.activation_func must be one of "
                          f"{', '.join(VISION_ACTIVATIONS)}. Received: {activation!r}")
    out_hidden = proj.get("hidden_size", enc.get("llm_hidden_size", text_hidden))
    if out_hidden != text_hidden:
        raise UsageError(f"{path}: image_encoder.vision_projector.hidden_size ({out_hidden}) must equal "
                          f"text_decoder.hidden_size ({text_hidden}): the projector feeds the text decoder")
    common = {
        "depth": enc["num_layers"], "num_heads": enc["num_attention_heads"],
        "in_chans": enc.get("in_channels", 3), "patch_size": enc.get("patch_size", 14),
        "spatial_merge_size": enc.get("spatial_merge_size", 2),
        "temporal_patch_size": enc.get("temporal_patch_size", 2), "hidden_act": VISION_ACTIVATIONS[activation],
    }
    if model_type == "qwen2_vl":
        ffn = enc.get("ffn_hidden_size", 4 * enc["hidden_size"])
        ratio = ffn / enc["hidden_size"]
        # transformers 5.x types mlp_ratio as an int (Qwen2-VL's 4); only a width it cannot express stays a float
        return {**common, "embed_dim": enc["hidden_size"], "hidden_size": out_hidden,
                "mlp_ratio": int(ratio) if ratio.is_integer() else ratio}
    return {**common, "hidden_size": enc["hidden_size"], "out_hidden_size": out_hidden,
            "intermediate_size": enc.get("intermediate_size", enc.get("ffn_hidden_size", 4 * enc["hidden_size"])),
            "window_size": enc.get("window_attn_size", 112),
            "fullatt_block_indexes": list(enc.get("fullatt_block_indexes", [])),
            "tokens_per_second": enc.get("tokens_per_second", 2)}


def parse_model_json(raw: Mapping[str, Any], path: str = "model.json") -> ModelJson:
    """model.json's dict -> ModelJson; one-line UsageError (exit 2) on a wrong type or a missing section."""
    warnings: list[str] = []
    if not isinstance(raw, Mapping):
        raise UsageError(f"{path}: the top level must be a JSON object. Received: {type(raw).__name__}")
    check_section(path, "top", raw, "the top level", warnings)
    refuse_from_key_table(path, raw)
    model_id = raw.get("model_id")
    if model_id not in MODEL_TYPES:
        raise UsageError(f"{path}: model_id must be one of {', '.join(MODEL_TYPES)} (Qwen2-VL, Qwen2.5-VL). "
                          f"Received: {json.dumps(model_id)}")
    model_type = MODEL_TYPES[model_id]
    require(path, raw, "the top level", ("image_encoder", "text_decoder"))
    image_encoder, text = raw["image_encoder"], raw["text_decoder"]
    check_section(path, "image_encoder", image_encoder, "image_encoder", warnings)
    require(path, image_encoder, "image_encoder", ("vision_encoder", "vision_projector"))
    enc, proj = image_encoder["vision_encoder"], image_encoder["vision_projector"]
    for section, values, where in (("vision_encoder", enc, "image_encoder.vision_encoder"),
                                   ("vision_projector", proj, "image_encoder.vision_projector"),
                                   ("text_decoder", text, "text_decoder")):
        check_section(path, section, values, where, warnings)
    require(path, text, "text_decoder", ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"))
    pipeline_layers = {part: read_pipeline_layers(path, where, section) for part, where, section in
                       (("vit", "image_encoder.vision_encoder", enc), ("llm", "text_decoder", text))}
    heads = text["num_attention_heads"]
    head_dim = text.get("kv_channels") or text["hidden_size"] // heads
    mrope = text.get("mrope_section") or (text.get("rope_scaling") or {}).get("mrope_section")
    if mrope is None:
        raise UsageError(f"{path}: text_decoder.mrope_section is required (Qwen2-VL's multimodal RoPE), "
                          f"e.g. [16, 24, 24] for head_dim 128")
    if sum(mrope) * 2 != head_dim:
        raise UsageError(f"{path}: text_decoder.mrope_section {mrope} must sum to head_dim / 2 = {head_dim // 2} "
                          f"(hidden_size {text['hidden_size']} / num_attention_heads {heads} / 2)")
    kv_heads = text.get("num_query_groups", heads) if text.get("group_query_attention", False) else heads
    ids = {key: raw.get(key, default) for key, default in DEFAULT_TOKEN_IDS.items()}
    ids["image_token_id"] = raw.get("img_context_token_id", raw.get("image_token_id", ids["image_token_id"]))
    hf_config = {
        "model_type": model_type,
        "architectures": ["Qwen2VLForConditionalGeneration" if model_type == "qwen2_vl"
                          else "Qwen2_5_VLForConditionalGeneration"],
        **ids,
        "hidden_size": text["hidden_size"],
        "intermediate_size": text.get("ffn_hidden_size", 4 * text["hidden_size"]),
        "num_hidden_layers": text["num_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": text.get("max_position_embeddings", 32768),
        "rms_norm_eps": text.get("layernorm_epsilon", 1e-6),
        "rope_theta": text.get("rope_theta", 1000000.0),
        "rope_scaling": {"type": "mrope", "mrope_section": list(mrope)},
        "vocab_size": text["vocab_size"],
        "tie_word_embeddings": not text.get("untie_embeddings_and_output_weights", False),
        "attention_dropout": text.get("attention_dropout", 0.0),
        "vision_config": _vision_config(path, model_type, enc, proj, text["hidden_size"]),
    }
    freeze = {"vision_encoder": enc.get("freeze", True), "vision_projector": proj.get("freeze", False),
              "text_decoder": text.get("freeze", False)}
    sizes = {"num_layers": text["num_layers"], "hidden_size": text["hidden_size"],
             "ffn_hidden_size": hf_config["intermediate_size"], "num_attention_heads": heads,
             "max_position_embeddings": hf_config["max_position_embeddings"], "vocab_size": text["vocab_size"],
             "normalization": "RMSNorm", "position_embedding_type": "mrope",
             "untie_embeddings_and_output_weights": not hf_config["tie_word_embeddings"],
             "make_vocab_size_divisible_by": 1}
    return ModelJson(path=path, hf_config=hf_config, freeze=freeze, sizes=sizes, warnings=warnings,
                     pipeline_layers=pipeline_layers, recompute=recompute_sections(enc, text))
