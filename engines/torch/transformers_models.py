"""Hugging Face transformers models as they are, for models/pretrain_transformers.py (PyTorch only).

MindSpeed-MM's ModelHub maps a `model_id` of model.json to a class; this is its counterpart:

    @register_model("my_vlm")                 # a user's own class (a transformers PreTrainedModel subclass)
    class MyVLM(Qwen2VLForConditionalGeneration): ...

    model = build_model({"init_from_hf_path": "ckpt/hf/Qwen2-VL-2B"})              # config + weights
    model = build_model({"model_id": "qwen2", "hf_config": {"model_type": "qwen2", ...}})  # config only, random

Which class: a registered `model_id` first; else the config's own `architectures[0]` when transformers
has it; else AutoModelForImageTextToText for a vision-language config (one with a `vision_config`),
AutoModelForCausalLM otherwise. Nothing is ever downloaded: `init_from_hf_path` must be a local
directory (HF_HUB_OFFLINE is set for the call).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from mmrun.engines.base import ModelConfigError  # noqa: F401 - raised here, caught by the entry
from mmrun.engines.model_section import check_model_section, frozen_name_pieces

MODEL_HUB: dict[str, type] = {}



def register_model(name: str) -> Callable[[type], type]:
    """Register a class under `model_id` name (MindSpeed-MM's ModelHub.MODEL_MAPPINGS entry)."""
    def register(cls: type) -> type:
        MODEL_HUB[name] = cls
        return cls
    return register


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a model directory is read, never fetched
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _config(model_cfg: Mapping[str, Any]) -> Any:
    from transformers import AutoConfig

    path = model_cfg.get("init_from_hf_path")
    if path:
        if not (Path(path) / "config.json").is_file():
            raise ModelConfigError(f"model: init_from_hf_path {path} has no config.json; pass a local Hugging Face "
                                   "model directory (config.json + *.safetensors)")
        return AutoConfig.from_pretrained(path)
    inline = model_cfg.get("hf_config")
    if not isinstance(inline, Mapping) or "model_type" not in inline:
        raise ModelConfigError("model: give init_from_hf_path (a Hugging Face directory) or hf_config (a config.json "
                               "mapping with model_type). Received keys: " + ", ".join(sorted(model_cfg)) or "none")
    values = dict(inline)
    return AutoConfig.for_model(values.pop("model_type"), **values)


def model_class(model_cfg: Mapping[str, Any], config: Any) -> type:
    import transformers

    model_id = model_cfg.get("model_id")
    if model_id and model_id in MODEL_HUB:
        return MODEL_HUB[model_id]
    for name in getattr(config, "architectures", None) or ():
        if hasattr(transformers, name):
            return getattr(transformers, name)
    if getattr(config, "vision_config", None) is not None:
        return transformers.AutoModelForImageTextToText._model_mapping[type(config)]
    return transformers.AutoModelForCausalLM._model_mapping[type(config)]


def build_model(model_cfg: Mapping[str, Any]) -> torch.nn.Module:
    """model.json -> a transformers model in fp32 on the host (the engine places and shards it)."""
    check_model_section(model_cfg)  # typos raise; MindSpeed-MM's own keys are the entry's notice
    _offline()
    config = _config(model_cfg)
    try:
        cls = model_class(model_cfg, config)
    except KeyError:
        raise ModelConfigError(f"model: no transformers class for model_type {config.model_type!r}; register one with "
                               "mmrun.engines.torch.transformers_models.register_model and name it in model_id") from None
    dtype = getattr(torch, str(model_cfg.get("torch_dtype", "float32")))
    path = model_cfg.get("init_from_hf_path")
    if path:
        model = cls.from_pretrained(path, config=config, dtype=dtype, local_files_only=True)
    else:
        model = cls._from_config(config, dtype=dtype)
    # Training never reads a KV cache, and recompute breaks with one: the recomputed forward appends its
    # keys/values to the cache a second time (measured: reentrant recompute of a Qwen2 layer changed
    # the k/v gradients by 7e-2). transformers' own gradient checkpointing turns it off the same way.
    for config_part in (model.config, getattr(model.config, "text_config", None)):
        if config_part is not None and hasattr(config_part, "use_cache"):
            config_part.use_cache = False
    for prefix in model_cfg.get("freeze") or ():
        for name, param in model.named_parameters():
            if name == prefix or name.startswith(prefix + "."):
                param.requires_grad_(False)
    pieces = frozen_name_pieces(model_cfg)  # MindSpeed-MM's switches (image_encoder.vision_encoder.freeze, ...)
    for name, param in model.named_parameters():
        if any(piece in name for piece in pieces):
            param.requires_grad_(False)
    return model


def save_hf_directory(config_dict: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor], out: str | Path) -> Path:
    """A Hugging Face directory (config.json + model.safetensors in transformers' on-disk names) from a
    config and the model's in-memory state dict: the class is rebuilt from the config and saves itself."""
    _offline()
    values = dict(config_dict)
    from transformers import AutoConfig

    config = AutoConfig.for_model(values.pop("model_type"), **values)
    model = model_class({}, config)._from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(dict(state_dict), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [m for m in missing if m not in tied]
    if missing or unexpected:
        raise ModelConfigError(f"the checkpoint does not fit {type(model).__name__}: missing {missing[:3]}, "
                               f"unexpected {list(unexpected)[:3]}")
    model.save_pretrained(str(out))
    return Path(out)
