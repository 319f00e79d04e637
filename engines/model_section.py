"""The keys of the YAML / model.json `model:` section that models/pretrain_transformers.py reads, and the ones
MindSpeed-MM's model files carry for its own models, which mmrun accepts and ignores (issue 29, item 4).

MindSpeed-MM reads the section loosely: each model takes what it knows. A Qwen2.5-VL model.json or a Qwen3-VL
YAML therefore carries keys for Megatron's VLMModel or MindSpeed-MM's patches (`img_context_token_id`,
`text_encoder`, `attn_implementation`, ...) that transformers' model, built from its own config.json, does not
need. Those are named in one notice; any other key is an error, with the closest key mmrun reads when there is
one (a typo of `init_from_hf_path` must not pass unseen).
"""
from __future__ import annotations

import difflib
from typing import Any, Mapping

from mmrun.engines.base import ModelConfigError

# What engines/torch/transformers_models.py reads.
READ_KEYS = ("model_id", "init_from_hf_path", "hf_config", "torch_dtype", "freeze")
# Keys of MindSpeed-MM's model files that mmrun's transformers path does not use: model.json's top level
# (examples/qwen2vl, qwen2.5vl model_*.json) and the `model:` section of its FSDP2 YAMLs (examples/*/*.yaml).
MINDSPEED_MM_KEYS = (
    # model.json (Megatron's VLMModel)
    "img_context_token_id", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
    "image_encoder", "text_decoder", "text_encoder", "video_encoder", "audio_encoder", "patch", "loss_type",
    # the FSDP2 YAMLs (transformers models with MindSpeed-MM's patches)
    "loss_cfg", "trust_remote_code", "attn_implementation", "skip_flash_attn_recompute", "skip_gdn_recompute",
    "gdn_implementation", "use_grouped_expert_matmul", "enable_gradient_checkpointing", "enable_chunk_loss",
    "chunkloss_plan", "recompute", "recompute_plan", "activation_offload_plan",
)


# MindSpeed-MM's freeze switches of the model file's sections (`image_encoder.vision_encoder.freeze`, ...) -> the
# pieces of parameter names its transformers model then freezes (every parameter whose name contains one), per
# model_id: mindspeed_mm/models/transformers/qwen3vl/qwen3vl.py's freeze() at 57069cd5 (features/mindspeed_mm_keys.yaml).
FREEZE_SWITCHES: dict[str, dict[tuple[str, ...], tuple[str, ...]]] = {
    "qwen3_vl": {("image_encoder", "vision_encoder"): ("visual.patch_embed", "visual.blocks", "visual.pos_embed"),
                 ("image_encoder", "vision_projector"): ("visual.merger",),
                 ("text_decoder",): ("language_model", "lm_head")},
}
FREEZE_SWITCHES["qwen3_vl_moe"] = FREEZE_SWITCHES["qwen3_vl"]  # the same mixin's freeze() in MindSpeed-MM


def frozen_name_pieces(model_cfg: Mapping[str, Any]) -> tuple[str, ...]:
    """The name pieces of the parameters that MindSpeed-MM's freeze switches in `model_cfg` freeze; a switch set
    true for a model_id whose switches mmrun does not know stops in one line (never dropped)."""
    on = []
    for section in {path for switches in FREEZE_SWITCHES.values() for path in switches}:
        value: Any = model_cfg
        for part in section:
            value = value.get(part) if isinstance(value, Mapping) else None
        if isinstance(value, Mapping) and value.get("freeze") is True:
            on.append(section)
    if not on:
        return ()
    model_id = model_cfg.get("model_id")
    if model_id not in FREEZE_SWITCHES:
        raise ModelConfigError(f"model: {'.'.join(sorted(on)[0])}.freeze is true for model_id {model_id!r}; mmrun "
                               f"knows MindSpeed-MM's freeze switches of {', '.join(FREEZE_SWITCHES)} only: list the "
                               "parameter prefixes to freeze in model.freeze, or set the switch false")
    return tuple(piece for section in sorted(on) for piece in FREEZE_SWITCHES[model_id][section])


def check_model_section(model_cfg: Mapping[str, Any]) -> str | None:
    """None, or the one notice naming the MindSpeed-MM keys that are ignored; raises ModelConfigError for any
    other unknown key, with a did-you-mean where a read key is close."""
    from mmrun.features.mindspeed_keys import check_values  # what features/mindspeed_mm_keys.yaml refuses

    refused = check_values("hf_yaml", {"model": dict(model_cfg)}, "")
    if refused:
        raise ModelConfigError(refused[0])
    unknown = [key for key in model_cfg if key not in READ_KEYS]
    foreign = [key for key in unknown if key in MINDSPEED_MM_KEYS]
    wrong = [key for key in unknown if key not in MINDSPEED_MM_KEYS]
    if wrong:
        hints = []
        for key in wrong:
            close = difflib.get_close_matches(str(key), READ_KEYS, n=1, cutoff=0.6)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]}?)" if close else ""))
        raise ModelConfigError(f"model: unknown key(s) {', '.join(hints)}; mmrun reads {', '.join(READ_KEYS)}, and "
                               "accepts (ignoring) MindSpeed-MM's model-file keys")
    if foreign:
        switches = (f" but their freeze switches, applied as MindSpeed-MM's {model_cfg.get('model_id')} applies them"
                    if model_cfg.get("model_id") in FREEZE_SWITCHES else "")
        return (f"model: MindSpeed-MM key(s) {', '.join(foreign)} ignored{switches}: the transformers model is built "
                "from its config.json (init_from_hf_path / hf_config)")
    return None
