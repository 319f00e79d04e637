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
    run_vision_tower_on_every_batch(model)
    for prefix in model_cfg.get("freeze") or ():
        for name, param in model.named_parameters():
            if name == prefix or name.startswith(prefix + "."):
                param.requires_grad_(False)
    pieces = frozen_name_pieces(model_cfg)  # MindSpeed-MM's switches (image_encoder.vision_encoder.freeze, ...)
    for name, param in model.named_parameters():
        if any(piece in name for piece in pieces):
            param.requires_grad_(False)
    return model


def _tensors_of(value: Any) -> list[torch.Tensor]:
    """Every tensor in a model output (a ModelOutput, tuple, list or dict, nested), in order."""
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors_of(item)]
    return []


def _dummy_image(vision_config: Any, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest image the Qwen-VL vision towers take: one frame of merge x merge patches, all zeros
    (pixel_values (patches, channels * temporal_patch * patch**2), image_grid_thw [[1, merge, merge]])."""
    merge = int(getattr(vision_config, "spatial_merge_size", 2))
    width = (int(getattr(vision_config, "in_channels", getattr(vision_config, "in_chans", 3)))
             * int(getattr(vision_config, "temporal_patch_size", 2)) * int(vision_config.patch_size) ** 2)
    return (torch.zeros(merge * merge, width, dtype=dtype, device=device),
            torch.tensor([[1, merge, merge]], dtype=torch.long, device=device))


def run_vision_tower_on_every_batch(model: torch.nn.Module) -> bool:
    """Make a vision-language model run its vision tower on every forward, also on a text-only batch: there it
    runs on a dummy image (_dummy_image) right before the language model, and its outputs join the language
    model's input embeddings multiplied by zero. So every rank runs the same collectives whatever its data
    (FSDP2 all-gathers the tower's shards, DDP waits for its gradients): a rank with a text-only micro-batch
    beside one with an image no longer aborts gloo (sizes differ) or hangs NCCL. The result is unchanged (the
    tower's gradients of such a batch are zeros, where they would be absent), as MindSpeed-MM's collator adds
    a fake image for the same reason. Returns whether the model has such a tower (transformers' Qwen2-VL,
    Qwen2.5-VL, Qwen3-VL layout: a module with .visual, .language_model and get_image_features)."""
    inner = next((m for m in model.modules() if all(hasattr(m, a) for a in ("visual", "language_model",
                                                                             "get_image_features"))), None)
    if inner is None or getattr(getattr(inner, "config", None), "vision_config", None) is None:
        return False
    state = {"has_vision_input": False}

    def note_inputs(_module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        state["has_vision_input"] = any(kwargs.get(k) is not None for k in ("pixel_values", "pixel_values_videos"))

    def add_dummy(_module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        embeds = kwargs.get("inputs_embeds")
        if state["has_vision_input"] or embeds is None:
            return None
        if not inner.training and not (torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1):
            return None  # one process evaluating or generating: no other rank to keep in step
        weight = next(inner.visual.parameters())
        pixels, grid = _dummy_image(inner.config.vision_config, weight.dtype, embeds.device)
        outputs = _tensors_of(inner.get_image_features(pixels, grid, return_dict=True))
        zero = sum(t.float().sum() for t in outputs if t.is_floating_point()) * 0.0
        return args, {**kwargs, "inputs_embeds": embeds + zero.to(embeds.dtype)}

    inner.register_forward_pre_hook(note_inputs, with_kwargs=True)
    inner.language_model.register_forward_pre_hook(add_dummy, with_kwargs=True)
    return True


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
