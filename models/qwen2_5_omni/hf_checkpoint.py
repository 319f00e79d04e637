"""Hugging Face Qwen2.5-Omni directories -> the thinker's config and weights in mmrun's names.

The name table (checkpoint key -> mmrun parameter):

| checkpoint key                                   | mmrun parameter                    | layout            |
|--------------------------------------------------|------------------------------------|-------------------|
| `thinker.X` (whole model as downloaded)          | `X`                                | as stored         |
| `X` (a thinker's save_pretrained)                | `X`                                | as stored         |
| `model.audio_tower.` / `model.visual.` / `model.language_model.` (transformers 5.x in memory) | `audio_tower.` / `visual.` / `model.` | as stored |
| `audio_tower.conv1.weight`, `audio_tower.conv2.weight` | same                         | Conv1d (D, C, 3) -> (D, C*3) |
| `visual.patch_embed.proj.weight`                 | same                               | Conv3d (D, 3, 2, 14, 14) -> (D, 1176) |
| `talker.*`, `token2wav.*`                        | (not read: the thinker is trained) |                   |

The flattenings keep the bytes and their order. BF16 tensors read as uint16 bits (checkpoint/formats/safetensors.py's
rule); `modeling.load_hf_weights` widens them.
"""
from __future__ import annotations

import os

import numpy as np

from mmrun.checkpoint.formats.hf_directory import holds_model, read_model_config
from mmrun.models.vlm import hf_checkpoint as vlm_checkpoint
from mmrun.models.qwen2_vl.hf_checkpoint import hf_parameter_names as qwen2_vl_names
from mmrun.models.qwen2_5_omni.configuration import MODEL_TYPES, OmniConfig

PATCH_EMBED = "visual.patch_embed.proj.weight"
AUDIO_CONVS = ("audio_tower.conv1.weight", "audio_tower.conv2.weight")
FLATTENED = AUDIO_CONVS + (PATCH_EMBED,)
SKIPPED_PREFIXES = ("talker.", "token2wav.")
_PREFIXES = (("thinker.", ""), ("model.audio_tower.", "audio_tower."), ("model.visual.", "visual."),
             ("model.language_model.", "model."))


def mmrun_name(key: str) -> str:
    """A checkpoint key's mmrun name (the table above)."""
    for stored, ours in _PREFIXES:
        if key.startswith(stored):
            key = ours + key[len(stored):]
    return key


def hf_parameter_names(config: OmniConfig) -> list[str]:
    """Every parameter name of the thinker, without building it."""
    names = []
    for name in qwen2_vl_names(config.as_qwen2_5_vl()):
        if name.endswith((".attn.qkv.weight", ".attn.qkv.bias")):
            block, kind = name.rsplit(".attn.qkv.", 1)
            names += [f"{block}.attn.{p}.{kind}" for p in ("q", "k", "v")]
        else:
            names.append(name)
    audio = "audio_tower."
    names += [audio + f"{n}.{p}" for n in ("conv1", "conv2") for p in ("weight", "bias")]
    for i in range(config.audio.num_layers):
        layer = f"{audio}layers.{i}."
        names += [layer + "self_attn.k_proj.weight"]
        names += [layer + f"self_attn.{n}.{p}" for n in ("q_proj", "v_proj", "out_proj") for p in ("weight", "bias")]
        names += [layer + f"{n}.{p}" for n in ("self_attn_layer_norm", "fc1", "fc2", "final_layer_norm")
                  for p in ("weight", "bias")]
    names += [audio + f"{n}.{p}" for n in ("ln_post", "proj") for p in ("weight", "bias")]
    names.append(audio + "audio_bos_eos_token.weight")
    return names


def is_hf_directory(path: str | os.PathLike) -> bool:
    """True when `path` holds a Qwen2.5-Omni config.json and safetensors weights."""
    return holds_model(path, MODEL_TYPES)


def load_hf_config(path: str | os.PathLike) -> OmniConfig:
    """The OmniConfig of a Hugging Face directory's config.json (one-line errors otherwise)."""
    return OmniConfig.from_hf_config(read_model_config(path, MODEL_TYPES, "Qwen2.5-Omni", "qwen2_5_omni"))


class HFWeights(vlm_checkpoint.HFWeights):
    """A thinker directory's or a whole Qwen2.5-Omni's weights, read lazily (models/vlm/hf_checkpoint.py) in
    mmrun's names (the table above); the talker's and token2wav's tensors are not read."""

    patch_embed_name = PATCH_EMBED
    other_flattened = AUDIO_CONVS
    skipped_prefixes = SKIPPED_PREFIXES
    load_config = staticmethod(lambda path: load_hf_config(path))
    parameter_names = staticmethod(lambda config: hf_parameter_names(config))
    stored_name_to_ours = staticmethod(lambda stored: mmrun_name(stored))


def open_for_model(path: str | os.PathLike, config: OmniConfig, described_by: str) -> HFWeights:
    """An --load of a thinker or whole Omni directory: its weights, read lazily, checked against `config` (the
    settings that shape the network: configuration.network_dict)."""
    from mmrun.models.qwen2_5_omni.configuration import network_dict

    return vlm_checkpoint.checked_for_model(HFWeights(path), config, described_by, network_dict)


def stored_shapes(config: OmniConfig) -> dict[str, tuple[int, ...]]:
    """The audio Conv1d kernels as a thinker directory stores them, (D, C, 3) (mmrun keeps them (D, C*3))."""
    a = config.audio
    return {AUDIO_CONVS[0]: (a.hidden_size, a.num_mel_bins, 3), AUDIO_CONVS[1]: (a.hidden_size, a.hidden_size, 3)}


def load_hf_directory(path: str | os.PathLike) -> tuple[OmniConfig, dict[str, np.ndarray]]:
    """(config, {parameter name: array}) of a thinker directory or a whole Qwen2.5-Omni, in mmrun's layout;
    the names are checked against the config (one error listing what is missing or unexpected)."""
    weights = HFWeights(path)
    return weights.config, {name: weights[name] for name in weights}
