"""Hugging Face Qwen2-VL / Qwen2.5-VL directories: read them into mmrun's names, write them back.

A directory holds config.json and model.safetensors, or shards model-0000i-of-0000n.safetensors listed by
model.safetensors.index.json. Keys may be in the hub layout (`visual.*`, `model.layers.*`, `lm_head.weight`;
what every published checkpoint and transformers' save_pretrained write) or in transformers 5.x's
in-memory layout (`model.visual.*`, `model.language_model.*`); both read into the hub names, which are
mmrun's parameter names. Tied models (tie_word_embeddings) have no lm_head.weight.

Arrays are numpy in mmrun's layout: the same as the checkpoint except `visual.patch_embed.proj.weight`,
whose Conv3d kernel (D, 3, 2, 14, 14) is flattened to the Linear's (D, 1176) (same bytes, same order).
BF16 tensors read as their raw bits (np.uint16) and are written back as BF16, byte-identical per tensor. The
safetensors format, bf16 and the directory writer are the checkpoint room's (checkpoint/formats/), shared by every
family; the writes are atomic there (a reader never sees a half-written checkpoint).
"""
from __future__ import annotations

import os

import numpy as np

from mmrun.checkpoint.formats.hf_directory import NotAnHFDirectoryError, holds_model, read_model_config  # noqa: F401
from mmrun.models.qwen2_vl.configuration import MODEL_TYPES, Qwen2VLConfig
from mmrun.models.vlm import hf_checkpoint as vlm_checkpoint
# The writer serves every Qwen vision-language family (models/vlm/hf_checkpoint.py).
from mmrun.models.vlm.hf_checkpoint import save_hf_directory, write_hf_directory  # noqa: F401

PATCH_EMBED = "visual.patch_embed.proj.weight"
# transformers 5.x in-memory prefixes -> hub prefixes (its _checkpoint_conversion_mapping, reversed).
_IN_MEMORY_PREFIXES = (("model.visual.", "visual."), ("model.language_model.", "model."))


# ------------------------------------------------------------------------------------------ names

def hf_parameter_names(config: Qwen2VLConfig) -> list[str]:
    """Every parameter name of the model (= hub checkpoint keys), without building it."""
    v, t = config.vision, config.text
    norm = ("weight",) if config.is_qwen2_5 else ("weight", "bias")
    mlp = (("gate_proj", "up_proj", "down_proj") if config.is_qwen2_5 else ("fc1", "fc2"))
    names = [PATCH_EMBED]
    for i in range(v.depth):
        block = f"visual.blocks.{i}."
        names += [block + f"{n}.{p}" for n in ("norm1", "norm2") for p in norm]
        names += [block + f"attn.{n}.{p}" for n in ("qkv", "proj") for p in ("weight", "bias")]
        names += [block + f"mlp.{n}.{p}" for n in mlp for p in ("weight", "bias")]
    names += [f"visual.merger.ln_q.{p}" for p in norm]
    names += [f"visual.merger.mlp.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")]
    names.append("model.embed_tokens.weight")
    for i in range(t.num_hidden_layers):
        layer = f"model.layers.{i}."
        names += [layer + f"self_attn.{n}.{p}" for n in ("q_proj", "k_proj", "v_proj") for p in ("weight", "bias")]
        names += [layer + "self_attn.o_proj.weight", layer + "input_layernorm.weight",
                  layer + "post_attention_layernorm.weight"]
        names += [layer + f"mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
    names.append("model.norm.weight")
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def _hub_name(name: str) -> str:
    for memory, hub in _IN_MEMORY_PREFIXES:
        if name.startswith(memory):
            return hub + name[len(memory):]
    return name


# ------------------------------------------------------------------------------------------ read

def is_hf_directory(path: str | os.PathLike) -> bool:
    """True when `path` holds a Qwen2-VL family model config.json and safetensors weights."""
    return holds_model(path, MODEL_TYPES)


def load_hf_config(path: str | os.PathLike) -> Qwen2VLConfig:
    """The Qwen2VLConfig of a Hugging Face directory's config.json (one-line errors otherwise)."""
    return Qwen2VLConfig.from_hf_config(read_model_config(path, MODEL_TYPES, "a Qwen2-VL family model", "qwen2_vl"))


class HFWeights(vlm_checkpoint.HFWeights):
    """A Qwen2-VL / Qwen2.5-VL directory's weights, read lazily (models/vlm/hf_checkpoint.py), hub or in-memory
    names read as the hub's."""

    patch_embed_name = PATCH_EMBED
    load_config = staticmethod(lambda path: load_hf_config(path))
    parameter_names = staticmethod(lambda config: hf_parameter_names(config))
    stored_name_to_ours = staticmethod(lambda stored: _hub_name(stored))


def open_for_model(path: str | os.PathLike, config: Qwen2VLConfig, described_by: str) -> HFWeights:
    """A training run's --load of an HF directory: its weights, read lazily, checked against `config`
    (vlm_checkpoint.checked_for_model)."""
    return vlm_checkpoint.checked_for_model(HFWeights(path), config, described_by)


def load_hf_directory(path: str | os.PathLike) -> tuple[Qwen2VLConfig, dict[str, np.ndarray]]:
    """(config, {parameter name: array}) of a Hugging Face directory, in mmrun's layout (module docstring)."""
    weights = HFWeights(path)
    return weights.config, dict(weights)


