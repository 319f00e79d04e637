"""WanConverter for `mmrun convert` (MindSpeed-MM's `mm-convert WanConverter ...` command lines, its option names).

    mm_to_hf             the newest checkpoint of a pretrain_sora.py run (--cfg.source_path: its --save) -> a
                         diffusers `transformer/` directory (--cfg.target_path) that WanTransformer3DModel
                         .from_pretrained loads (diffusers' or mmrun's); the config from --cfg.hf_dir (the original
                         download) or else from the run's --mm-model; LoRA adapters in the checkpoint are folded
                         into the base weights (W + B A alpha/r); the weights in hf_dir's dtype (else float32)
    lora_to_peft         the LoRA adapters of such a checkpoint -> --cfg.target_path in PEFT's layout
                         (adapter_config.json + adapter_model.safetensors: peft and diffusers load it) and in
                         diffusers' own (pytorch_lora_weights.safetensors: WanPipeline.load_lora_weights takes it)
    merge_lora_to_base   a diffusers transformer directory (--cfg.source_path) + a PEFT adapter (--cfg.lora_path)
                         -> the merged directory (--cfg.target_path); lora_alpha / r from adapter_config.json

mmrun needs no hf_to_mm: pretrain_sora.py's --load takes the diffusers directory as downloaded. Every output is
built beside its target and swapped in only when complete.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from mmrun.backend.errors import UsageError
from mmrun.models import lora
from mmrun.models.wan.configuration import WanTransformerConfig
from mmrun.models.wan.transformer import CONFIG_FILE, read_diffusers_weights, save_diffusers_directory

def _get(cfg: dict[str, Any], key: str) -> Any:
    if key not in cfg:
        given = ", ".join(f"--cfg.{k}" for k in cfg) or "no --cfg options"
        raise UsageError(f"--cfg.{key} is required. Received: {given}")
    return cfg[key]


def _checkpoint(root: str) -> Any:
    from mmrun.training.checkpoint_store import open_save_directory

    return open_save_directory(root, "pretrain_sora.py")


def _config(cfg: dict[str, Any], meta: dict[str, Any]) -> tuple[WanTransformerConfig, str | None]:
    """(the network's config, the dtype to save in): from --cfg.hf_dir's config.json, else the run's --mm-model."""
    hf_dir = cfg.get("hf_dir")
    if hf_dir:
        if not (Path(hf_dir) / CONFIG_FILE).is_file():
            raise UsageError(f"--cfg.hf_dir {hf_dir}: no {CONFIG_FILE}; pass the downloaded transformer/ directory")
        return WanTransformerConfig.from_diffusers(hf_dir), _dtype_of(hf_dir)
    mm_model = (meta.get("args") or {}).get("mm_model")
    if not mm_model or not Path(mm_model).is_file():
        raise UsageError(f"--cfg.hf_dir is required: the checkpoint's --mm-model {mm_model or '(none)'} is not "
                         "here; pass the original transformer/ directory")
    from mmrun.models.wan.model_json import read_sora_model_json

    return read_sora_model_json(mm_model).predictor, None


def _dtype_of(hf_dir: str) -> str | None:
    """The dtype of the original weights (bf16 downloads stay bf16), read from a safetensors header."""
    for file in sorted(Path(hf_dir).glob("*.safetensors")):
        header_len = int.from_bytes(file.open("rb").read(8), "little")
        with file.open("rb") as f:
            f.seek(8)
            header = json.loads(f.read(header_len))
        kinds = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
        return {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}.get(next(iter(kinds), ""), None)
    return None


_split, _lora_config = lora.split_adapter, lora.checkpoint_adapter_config


def mm_to_hf(converter: str, cfg: dict[str, Any]) -> None:
    ckpt = _checkpoint(_get(cfg, "source_path"))
    target = _get(cfg, "target_path")
    config, dtype = _config(cfg, ckpt.meta)
    base, adapter = _split(ckpt.model)
    if adapter:
        base = lora.merged_weights(base, _lora_config(ckpt.meta, adapter), adapter)
        print(f"folded {len(adapter) // 2} LoRA adapters into the base weights")
    out = save_diffusers_directory(target, config, base, dtype)
    print(f"wrote {out} from {ckpt.path} (iteration {ckpt.iteration}, {len(base)} tensors, {dtype or 'float32'})")


def lora_to_peft(converter: str, cfg: dict[str, Any]) -> None:
    ckpt = _checkpoint(_get(cfg, "source_path"))
    _, adapter = _split(ckpt.model)
    if not adapter:
        raise UsageError(f"{ckpt.path} holds no LoRA adapters (no *.lora_A.weight); it is a full fine-tune: use "
                         "mm_to_hf")
    config = _lora_config(ckpt.meta, adapter)
    out = lora.write_adapter(_get(cfg, "target_path"), config, adapter, base_model=cfg.get("hf_dir"),
                             diffusers_component="transformer")
    print(f"wrote {out} ({len(config['target_modules'])} adapted layers, r {config['r']}, "
          f"alpha {config['lora_alpha']:g}) from {ckpt.path}")


def merge_lora_to_base(converter: str, cfg: dict[str, Any]) -> None:
    source, target = _get(cfg, "source_path"), _get(cfg, "target_path")
    if not (Path(source) / CONFIG_FILE).is_file():
        raise UsageError(f"--cfg.source_path {source}: no {CONFIG_FILE}; pass the base transformer/ directory")
    config = WanTransformerConfig.from_diffusers(source)
    lora_config, adapter = lora.read_adapter(_get(cfg, "lora_path"))
    merged = lora.merged_weights(read_diffusers_weights(source, config), lora_config, adapter)
    out = save_diffusers_directory(target, config, merged, _dtype_of(source))
    print(f"wrote {out}: {source} with the adapter of {cfg['lora_path']} merged")


SUBCOMMANDS: dict[str, Callable[[str, dict[str, Any]], None]] = {
    "mm_to_hf": mm_to_hf, "lora_to_peft": lora_to_peft, "merge_lora_to_base": merge_lora_to_base}
