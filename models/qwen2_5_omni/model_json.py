"""MindSpeed-MM's Qwen2.5-Omni model.json (examples/qwen2.5omni/model_7b.json) -> the thinker's Hugging Face config.

The file is Qwen2.5-VL's model.json (model_id "qwen2_5vl", image_encoder, text_decoder: read and checked by
models/qwen2_vl/model_json.py) plus an `audio_encoder.audio_encoder` section and text_decoder.model_id
"qwen2_5_omni_thinker". MindSpeed-MM's Omni code fixes the image / video / audio pad ids to the Omni tokenizer's
(151655, 151656, 151646) and reads vision_start_token_id / audio_start_token_id from model.json; so here (its
img_context_token_id, 151656 in the example, is not read). Freeze switches: vision encoder, projector, text decoder
as Qwen2.5-VL's, and `audio_encoder` (default frozen, as the example).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from mmrun.backend.errors import UsageError
from mmrun.models.qwen2_vl import model_json as vl_json
from mmrun.models.vlm import model_json as shared_json

TEXT_MODEL_ID = "qwen2_5_omni_thinker"
NUMBER = shared_json.NUMBER
AUDIO_SCHEMA: dict[str, tuple[type, ...]] = {
    "model_id": (str,), "num_layers": (int,), "hidden_size": (int,), "ffn_hidden_size": (int,),
    "gated_linear_unit": (bool,), "num_attention_heads": (int,), "hidden_dropout": NUMBER, "attention_dropout": NUMBER,
    "normalization": (str,), "fp16": (bool,), "bf16": (bool,), "params_dtype": (str,), "activation_func": (str,),
    "freeze": (bool,), "use_fused_rotary_pos_emb": (bool,), "post_layer_norm": (bool,), "pipeline_num_layers": (list,),
    "d_model": (int,), "num_mel_bins": (int,), "max_source_positions": (int,), "n_window": (int,),
    "scale_embedding": (bool,), "output_dim": (int,), "attention_mask_type": (str,),
}
# Omni's fixed token ids (MindSpeed-MM's qwen2_5_omni_position) and the two model.json may set
FIXED_IDS = {"image_token_index": 151655, "video_token_index": 151656, "audio_token_index": 151646,
             "vision_end_token_id": 151653, "audio_end_token_id": 151648}
JSON_IDS = {"vision_start_token_id": 151652, "audio_start_token_id": 151647}


def claims(raw: Any) -> bool:
    """Whether a model.json is Qwen2.5-Omni's: MindSpeed-MM's says model_id qwen2_5vl, with an audio encoder (the
    family table asks this before the model_id)."""
    return is_omni_model_json(raw)


def is_omni_model_json(raw: Any) -> bool:
    return (isinstance(raw, Mapping) and isinstance(raw.get("audio_encoder"), Mapping)
            and isinstance(raw.get("text_decoder"), Mapping)
            and raw["text_decoder"].get("model_id") == TEXT_MODEL_ID)


def parse_model_json(raw: Mapping[str, Any], path: str = "model.json") -> shared_json.ModelJson:
    """The thinker's config.json dict (model_type qwen2_5_omni_thinker) as ModelJson.hf_config, with the freeze
    switches (audio_encoder added), the training sizes and the pipeline layer lists."""
    base = vl_json.parse_model_json({**raw, "audio_encoder": None}, path)
    section = raw["audio_encoder"].get("audio_encoder")
    if not isinstance(section, Mapping):
        raise UsageError(f"{path}: audio_encoder.audio_encoder must be an object (the audio encoder's settings). "
                         f"Received: {type(section).__name__}")
    extra = sorted(set(raw["audio_encoder"]) - {"audio_encoder", "tp", "pp", "cp"})
    if extra:
        base.warnings.append(f"{path}: unknown key(s) in audio_encoder: {', '.join(extra)} (mmrun does not read them)")
    shared_json.check_section(path, "audio_encoder", section, "audio_encoder.audio_encoder", base.warnings,
                           {"audio_encoder": AUDIO_SCHEMA})
    width = section.get("d_model", section.get("hidden_size", 1280))
    flat = base.hf_config
    if section.get("output_dim", flat["hidden_size"]) != flat["hidden_size"]:
        raise UsageError(f"{path}: audio_encoder.audio_encoder.output_dim ({section['output_dim']}) must equal "
                         f"text_decoder.hidden_size ({flat['hidden_size']}): the audio features feed the decoder")
    audio = {"d_model": width, "encoder_layers": section.get("num_layers", 32),
             "encoder_attention_heads": section.get("num_attention_heads", 20),
             "encoder_ffn_dim": section.get("ffn_hidden_size", 4 * width),
             "num_mel_bins": section.get("num_mel_bins", 128),
             "max_source_positions": section.get("max_source_positions", 1500),
             "n_window": section.get("n_window", 100), "output_dim": flat["hidden_size"],
             "scale_embedding": section.get("scale_embedding", False),
             "activation_function": section.get("activation_func", "gelu")}
    v = flat["vision_config"]
    vision = {"depth": v["depth"], "hidden_size": v["hidden_size"], "num_heads": v["num_heads"],
              "intermediate_size": v["intermediate_size"], "out_hidden_size": v["out_hidden_size"],
              "hidden_act": v["hidden_act"], "in_channels": v["in_chans"], "patch_size": v["patch_size"],
              "spatial_merge_size": v["spatial_merge_size"], "temporal_patch_size": v["temporal_patch_size"],
              "window_size": v["window_size"], "fullatt_block_indexes": v["fullatt_block_indexes"]}
    text = {k: flat[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads", "hidden_act", "max_position_embeddings",
                                 "rms_norm_eps", "attention_dropout")}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": flat["rope_theta"],
                               "mrope_section": flat["rope_scaling"]["mrope_section"]}
    hf_config = {"model_type": "qwen2_5_omni_thinker", "architectures": ["Qwen2_5OmniThinkerForConditionalGeneration"],
                 "text_config": text, "vision_config": vision, "audio_config": audio,
                 "tie_word_embeddings": flat["tie_word_embeddings"], **FIXED_IDS,
                 **{key: raw.get(key, default) for key, default in JSON_IDS.items()},
                 "position_id_per_seconds": 25, "seconds_per_chunk": 2}
    freeze = {**base.freeze, "audio_encoder": section.get("freeze", True)}
    return shared_json.ModelJson(path=path, hf_config=hf_config, freeze=freeze, sizes=base.sizes, warnings=base.warnings,
                             recompute=base.recompute,
                             pipeline_layers={**base.pipeline_layers,
                                              "audio": shared_json.read_pipeline_layers(path, "audio_encoder.audio_encoder",
                                                                                section)})


def check_split(spec: shared_json.ModelJson, split: Mapping[str, str], lora: bool) -> None:
    """One line (exit 2) for what a run of this model.json asks that is not built: LoRA, the audio encoder beyond
    stage 0. `split`: the split flags given above 1 (a split trains on megatron-core or MindSpore's parallel engine,
    the audio encoder and ViT on stage 0: engines/*/omni_vlm.py)."""
    path = spec.path
    if lora:
        raise UsageError(f"{path}: LoRA is not built for Qwen2.5-Omni; drop the --lora-* flags")
    if not split:
        return
    audio = spec.pipeline_layers.get("audio")
    layers = int(spec.hf_config["audio_config"]["encoder_layers"])
    flat = [n for chunk in audio for n in (chunk if isinstance(chunk, list) else [chunk])] if audio else []
    if audio is not None and (not flat or flat[0] != layers or any(flat[1:])):
        raise UsageError(f"{path}: audio_encoder.audio_encoder.pipeline_num_layers {list(audio)}: mmrun keeps the "
                         f"whole audio encoder ({layers} layers) on the first pipeline stage, beside the ViT; give "
                         f"[{layers}, 0, ...] (one count per stage; lists per virtual chunk: {layers} in the first)")


def warn_all(spec: shared_json.ModelJson, warn: Callable[[str], None]) -> None:
    for line in spec.warnings:
        warn(line)


def check_token_ids(spec: shared_json.ModelJson, dataset: Any) -> Any:
    """The dataset's TMRoPE settings, after checking that model.json's token ids are the tokenizer's (a mismatch
    would put features on text tokens) and that the vocabulary fits; returns dataset.rope_config."""
    config, ids = spec.hf_config, dataset.token_ids
    pairs = (("image_token_index", "image_pad"), ("video_token_index", "video_pad"), ("audio_token_index", "audio_pad"),
             ("vision_start_token_id", "vision_start"), ("audio_start_token_id", "audio_start"))
    for key, name in pairs:
        if config[key] != ids[name]:
            raise UsageError(f"{spec.path}: the model's {key} is {config[key]} but the tokenizer of --mm-data gives "
                             f"{name} the id {ids[name]}; use the Qwen2.5-Omni tokenizer (model.json and "
                             "tokenizer.json must agree)")
    if dataset.tokenizer.vocab_size > config["text_config"]["vocab_size"]:
        raise UsageError(f"{spec.path}: text_decoder.vocab_size {config['text_config']['vocab_size']} is smaller "
                         f"than the tokenizer's {dataset.tokenizer.vocab_size} tokens; raise it")
    return dataset.rope_config
