"""MindSpeed-MM's model.json (`--mm-model`) for Qwen2-VL / Qwen2.5-VL, read as it is written.

The file is checked key by key against SCHEMA (one table: where each key may appear and the type it must
have): an unknown key is named in one warning (MindSpeed-MM ignores what its model does not read, and a
typo should not pass unseen), a wrong type is an error naming the key, what was received and what is
expected. The result is the model's Hugging Face config (the flat transformers-4 `config.json` layout that
`configuration.Qwen2VLConfig.from_hf_config` reads), MindSpeed-MM's freeze switches, and the sizes that
replace the launch script's network-size flags (MindSpeed-MM's rule: model.json wins).

    spec = read_model_json("examples/qwen2vl/model_2b.json")
    spec.hf_config["vision_config"]["depth"], spec.freeze, spec.sizes["num_layers"]
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from mmrun.backend.errors import UsageError

NUMBER = (int, float)
OPTIONAL_LIST = (list, type(None))

# section -> key -> accepted Python types. Keys MindSpeed-MM's examples carry that change nothing in mmrun
# (dtype switches: the launch script's --bf16/--fp16 decide; fusion switches: the feature gate judges the
# flags; pipeline/recompute: checked below) are listed so that they are not reported as unknown.
SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "top": {
        "model_id": (str,), "img_context_token_id": (int,), "video_token_id": (int,),
        "vision_start_token_id": (int,), "vision_end_token_id": (int,), "image_token_id": (int,),
        "image_encoder": (dict,), "text_decoder": (dict,), "text_encoder": (dict, type(None)),
        "video_encoder": (dict, type(None)), "audio_encoder": (dict, type(None)), "patch": (dict,),
        "loss_type": (str, type(None)),
    },
    "image_encoder": {"vision_encoder": (dict,), "vision_projector": (dict,)},
    "vision_encoder": {
        "model_id": (str,), "num_layers": (int,), "hidden_size": (int,), "ffn_hidden_size": (int,),
        "llm_hidden_size": (int,), "gated_linear_unit": (bool,), "num_attention_heads": (int,),
        "hidden_dropout": NUMBER, "attention_dropout": NUMBER, "in_channels": (int,), "patch_size": (int,),
        "spatial_merge_size": (int,), "temporal_patch_size": (int,), "layernorm_epsilon": NUMBER,
        "normalization": (str,), "activation_func": (str,), "freeze": (bool,), "post_layer_norm": (bool,),
        "pipeline_num_layers": (list,), "intermediate_size": (int,), "tokens_per_second": NUMBER,
        "window_attn_size": (int,), "fullatt_block_indexes": (list,), "attention_mask_type": (str,),
        "fp16": (bool,), "bf16": (bool,), "params_dtype": (str,), "use_fused_rotary_pos_emb": (bool,),
        "recompute_granularity": (str, type(None)), "recompute_method": (str, type(None)),
        "recompute_num_layers": (int, type(None)), "canonical_model": (bool,), "add_qkv_bias": (bool,),
        "add_bias_linear": (bool,), "init_method_std": NUMBER, "rope_theta": NUMBER,
    },
    "vision_projector": {
        "model_id": (str,), "num_layers": (int,), "gated_linear_unit": (bool,), "bias_activation_fusion": (bool,),
        "add_bias_linear": (bool,), "input_size": (int,), "hidden_size": (int,), "ffn_hidden_size": (int,),
        "activation_func": (str,), "bf16": (bool,), "fp16": (bool,), "params_dtype": (str,), "freeze": (bool,),
        "layernorm_epsilon": NUMBER, "normalization": (str,),
    },
    "text_decoder": {
        "model_id": (str,), "num_layers": (int,), "pipeline_num_layers": (list,), "hidden_size": (int,),
        "ffn_hidden_size": (int,), "num_attention_heads": (int,), "seq_length": (int,),
        "max_position_embeddings": (int,), "vocab_size": (int,), "rope_theta": NUMBER,
        "untie_embeddings_and_output_weights": (bool,), "disable_bias_linear": (bool,),
        "attention_dropout": NUMBER, "init_method_std": NUMBER, "hidden_dropout": NUMBER,
        "position_embedding_type": (str,), "normalization": (str,), "activation_func": (str,),
        "use_fused_rotary_pos_emb": (bool,), "attention_softmax_in_fp32": (bool,), "params_dtype": (str,),
        "bf16": (bool,), "fp16": (bool,), "parallel_output": (bool,), "group_query_attention": (bool,),
        "num_query_groups": (int,), "mrope_section": (list,), "rope_scaling": (dict, type(None)),
        "gated_linear_unit": (bool,), "layernorm_epsilon": NUMBER, "add_bias_linear": (bool,),
        "add_qkv_bias": (bool,), "use_remove_padding": (bool,), "freeze": (bool,), "canonical_model": (bool,),
        "kv_channels": (int, type(None)), "recompute_granularity": (str, type(None)),
        "recompute_method": (str, type(None)), "recompute_num_layers": (int, type(None)),
        # MindSpeed-MM's inference / evaluation json (inference_qwen2_5_vl_7b.json)
        "is_encoder_decoder": (bool,), "sequence_parallel": (bool,), "tokenizer_type": (str,), "use_infer_fa": (bool,),
    },
}

# model.json's model_id -> the Hugging Face model_type it describes.
MODEL_TYPES = {"qwen2vl": "qwen2_vl", "qwen2_5vl": "qwen2_5_vl"}
# Megatron activation names -> transformers' hidden_act names.
VISION_ACTIVATIONS = {"quick_gelu": "quick_gelu", "gelu": "gelu", "silu": "silu", "fast_gelu": "gelu_pytorch_tanh"}
# Token ids of Qwen2-VL's tokenizer, used where model.json leaves them out (as MindSpeed-MM's code does).
DEFAULT_TOKEN_IDS = {"vision_start_token_id": 151652, "vision_end_token_id": 151653,
                     "image_token_id": 151655, "video_token_id": 151656}


@dataclass
class ModelJson:
    """What model.json says: the HF config, the freeze switches, the sizes for the training arguments."""

    path: str
    hf_config: dict[str, Any]
    freeze: dict[str, bool]
    sizes: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    # {"vit": [...], "llm": [...]}: pipeline_num_layers per module (one count per stage, or one such list per
    # virtual pipeline chunk), None where absent
    pipeline_layers: dict[str, list[Any] | None] = field(default_factory=dict)
    # {"vision_encoder": {...}, "text_decoder": {...}}: each section's recompute_* keys (models/recompute.py)
    recompute: dict[str, dict[str, Any]] = field(default_factory=dict)


def _check_section(path: str, section: str, values: Mapping[str, Any], where: str, warnings: list[str],
                   schemas: Mapping[str, Mapping[str, tuple[type, ...]]] = SCHEMA) -> None:
    schema = schemas[section]
    unknown = sorted(set(values) - set(schema))
    if unknown:
        warnings.append(f"{path}: unknown key(s) in {where}: {', '.join(unknown)} (mmrun does not read them)")
    for key, value in values.items():
        allowed = schema.get(key)
        # bool is an int in Python: a true/false where a number is expected is a mistake, not a number.
        wrong = allowed is not None and (not isinstance(value, allowed)
                                         or (isinstance(value, bool) and bool not in allowed))
        if wrong:
            names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            raise UsageError(f"{path}: {where}.{key} must be {names}. Received: {json.dumps(value)}")


def _require(path: str, values: Mapping[str, Any], where: str, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in values]
    if missing:
        raise UsageError(f"{path}: {where} needs {', '.join(missing)}. Received keys: {', '.join(sorted(values))}")


def _pipeline_layers(path: str, where: str, section: Mapping[str, Any]) -> list[Any] | None:
    """pipeline_num_layers: one layer count per pipeline stage, or (virtual pipeline stages) one such list per
    virtual chunk, as MindSpeed-MM writes them; None when absent. Lengths and sums are checked against the run's
    --pipeline-model-parallel-size / --virtual-pipeline-model-parallel-size by the parallel layout
    (models/qwen2_vl/mm_layout.py) once the arguments are known; here only the form."""
    layers = section.get("pipeline_num_layers")
    if layers is None:
        return None

    def counts(values: Any) -> bool:
        return isinstance(values, list) and bool(values) and all(
            isinstance(n, int) and not isinstance(n, bool) for n in values)

    if not (counts(layers) or (isinstance(layers, list) and layers and all(counts(chunk) for chunk in layers))):
        raise UsageError(f"{path}: {where}.pipeline_num_layers must be a list of layer counts, one per pipeline "
                          "stage, or one such list per virtual pipeline chunk ([[2, 0], [0, 0]]). Received: "
                          f"{json.dumps(layers)}")
    return [list(chunk) if isinstance(chunk, list) else chunk for chunk in layers]


def _vision_config(path: str, model_type: str, enc: Mapping[str, Any], proj: Mapping[str, Any],
                   text_hidden: int) -> dict[str, Any]:
    _require(path, enc, "image_encoder.vision_encoder", ("num_layers", "hidden_size", "num_attention_heads"))
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
    _check_section(path, "top", raw, "the top level", warnings)
    model_id = raw.get("model_id")
    if model_id not in MODEL_TYPES:
        raise UsageError(f"{path}: model_id must be one of {', '.join(MODEL_TYPES)} (Qwen2-VL, Qwen2.5-VL). "
                          f"Received: {json.dumps(model_id)}")
    model_type = MODEL_TYPES[model_id]
    _require(path, raw, "the top level", ("image_encoder", "text_decoder"))
    image_encoder, text = raw["image_encoder"], raw["text_decoder"]
    _check_section(path, "image_encoder", image_encoder, "image_encoder", warnings)
    _require(path, image_encoder, "image_encoder", ("vision_encoder", "vision_projector"))
    enc, proj = image_encoder["vision_encoder"], image_encoder["vision_projector"]
    for section, values, where in (("vision_encoder", enc, "image_encoder.vision_encoder"),
                                   ("vision_projector", proj, "image_encoder.vision_projector"),
                                   ("text_decoder", text, "text_decoder")):
        _check_section(path, section, values, where, warnings)
    _require(path, text, "text_decoder", ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"))
    pipeline_layers = {part: _pipeline_layers(path, where, section) for part, where, section in
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


def recompute_sections(vision: Mapping[str, Any], text: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """MindSpeed-MM's per-module recompute keys, by the module names the models' `recompute_layers` use."""
    return {name: {k: v for k, v in section.items() if k.startswith("recompute_")}
            for name, section in (("vision_encoder", vision), ("text_decoder", text))}


def read_model_json(path: str | Path, warn: Callable[[str], None] | None = None) -> ModelJson:
    """Read and check a model.json file; warnings go to `warn` (one line each)."""
    text = _read_text(path, "--mm-model")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
                          "fix the file") from None
    spec = parse_model_json(raw, str(path))
    for line in spec.warnings:
        (warn or (lambda message: None))(line)
    return spec


def _read_text(path: str | Path, flag: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{flag} {path}: no such file; pass the path of MindSpeed-MM's model.json")
    return p.read_text(encoding="utf-8")

