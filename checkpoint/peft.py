"""LoRA on Qwen2-VL / Qwen2.5-VL: MindSpeed-MM's target names, and the adapter as PEFT writes it for transformers.

MindSpeed-MM's LoRA scripts name megatron-core's layers (`--lora-target-modules linear_qkv linear_proj linear_fc1
linear_fc2`), in the decoder, the ViT and the projector alike. mmrun's model has Hugging Face's modules; each
Megatron name selects the modules that hold the same weights (LORA_TARGETS). Megatron's fused linear_qkv and
linear_fc1 (gate and up) get one adapter per Hugging Face projection here: PEFT's layout for transformers' model,
which is what `peft` loads.

Module names: mmrun's model uses the hub's checkpoint names (`model.layers.N...`, `visual.blocks.N...`);
transformers 5 holds the same modules as `model.language_model.layers.N...` / `model.visual.blocks.N...`, and PEFT
keys an adapter by the in-memory module path. `to_peft_name` / `from_peft_name` translate (the latter also reads
adapters saved with transformers 4's names, which are the hub's).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

# MindSpeed-MM's LoRA target names -> the Hugging Face modules: the family's table (models/qwen2_vl/mm_layout.py)
from mmrun.models.qwen2_vl.mm_layout import LORA_TARGETS  # noqa: E402  (re-exported: the converters' and entry's)

# hub (mmrun's) prefix -> transformers 5's in-memory prefix, first match wins.
_PEFT_PREFIXES = (("visual.", "model.visual."), ("model.", "model.language_model."))


def to_peft_name(name: str) -> str:
    """mmrun's module / parameter name -> transformers' in-memory one (what PEFT's adapter keys name)."""
    for hub, memory in _PEFT_PREFIXES:
        if name.startswith(hub):
            return memory + name[len(hub):]
    return name


def from_peft_name(name: str) -> str:
    """An adapter's module name (transformers 5's in-memory, or transformers 4's = the hub's) -> mmrun's."""
    for hub, memory in _PEFT_PREFIXES:
        if name.startswith(memory):
            return hub + name[len(memory):]
    return name


def adapter_to_peft(adapter: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {to_peft_name(key): value for key, value in adapter.items()}


def adapter_from_peft(adapter: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {from_peft_name(key): value for key, value in adapter.items()}
