"""Hugging Face Qwen3-VL directories (dense and MoE) read into mmrun's names (= the checkpoint keys).

The lazy reader, the --load check and the writer are the Qwen vision-language families' (models/vlm/hf_checkpoint.py): each tensor read lazily from its byte offsets, BF16 as uint16 bits. Qwen3-VL checkpoints already
use transformers' in-memory names (`model.visual.*`, `model.language_model.*`, `lm_head.weight`), so no
renaming; only `model.visual.patch_embed.proj.weight`, the Conv3d kernel (D, 3, 2, 16, 16), is read flattened
to the Linear's (D, 1536) (same bytes, same order).
"""
from __future__ import annotations

import os
import numpy as np

from mmrun.checkpoint.formats.hf_directory import holds_model, read_model_config
from mmrun.models.vlm import hf_checkpoint as vlm_checkpoint
from mmrun.models.qwen3_vl.configuration import MODEL_TYPES, Qwen3VLConfig

PATCH_EMBED = "model.visual.patch_embed.proj.weight"


def hf_parameter_names(config: Qwen3VLConfig) -> list[str]:
    """Every parameter name of the model (= checkpoint keys), without building it."""
    v, t = config.vision, config.text
    both = ("weight", "bias")
    names = [PATCH_EMBED, "model.visual.patch_embed.proj.bias", "model.visual.pos_embed.weight"]
    for i in range(v.depth):
        block = f"model.visual.blocks.{i}."
        names += [block + f"{n}.{p}" for n in ("norm1", "norm2", "attn.qkv", "attn.proj", "mlp.linear_fc1",
                                               "mlp.linear_fc2") for p in both]
    for merger in ["model.visual.merger."] + [f"model.visual.deepstack_merger_list.{k}."
                                              for k in range(len(v.deepstack_visual_indexes))]:
        names += [merger + f"{n}.{p}" for n in ("norm", "linear_fc1", "linear_fc2") for p in both]
    text = "model.language_model."
    names.append(text + "embed_tokens.weight")
    bias = ("weight", "bias") if t.attention_bias else ("weight",)
    for i in range(t.num_hidden_layers):
        layer = f"{text}layers.{i}."
        names += [layer + f"self_attn.{n}.{p}" for n in ("q_proj", "k_proj", "v_proj", "o_proj") for p in bias]
        names += [layer + f"self_attn.{n}.weight" for n in ("q_norm", "k_norm")]
        names += [layer + "input_layernorm.weight", layer + "post_attention_layernorm.weight"]
        if t.moe is not None and t.moe.is_sparse(i):  # the MoE variant: router and fused experts (moe.py)
            names += [layer + n for n in ("mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj")]
        else:
            names += [layer + f"mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
    names.append(text + "norm.weight")
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def is_hf_directory(path: str | os.PathLike) -> bool:
    """True when `path` holds a Qwen3-VL config.json and safetensors weights."""
    return holds_model(path, MODEL_TYPES)


def load_hf_config(path: str | os.PathLike) -> Qwen3VLConfig:
    """The Qwen3VLConfig of a Hugging Face directory's config.json (one-line errors otherwise)."""
    return Qwen3VLConfig.from_hf_config(read_model_config(path, MODEL_TYPES, "Qwen3-VL", "qwen3_vl"))


class HFWeights(vlm_checkpoint.HFWeights):
    """A Qwen3-VL directory's weights, read lazily one tensor at a time (`weights[name]`), the names checked
    against its config at once from the files' headers (models/vlm/hf_checkpoint.py)."""

    patch_embed_name = PATCH_EMBED
    load_config = staticmethod(lambda path: load_hf_config(path))
    parameter_names = staticmethod(lambda config: hf_parameter_names(config))

    def __getitem__(self, name: str) -> np.ndarray:
        array = super().__getitem__(name)
        moe = self.config.text.moe
        if moe is not None and name.endswith(EXPERT_SUFFIXES):
            return experts_in_memory_layout(name, array, moe.moe_intermediate_size, self.config.text.hidden_size)
        return array


# The MoE variant's fused experts. The hub's Qwen3-VL MoE checkpoints store them as (experts, hidden, 2 x
# moe_intermediate) and (experts, moe_intermediate, hidden); transformers 5 keeps (and save_pretrained writes)
# their transpose, (experts, 2 x moe_intermediate, hidden) and (experts, hidden, moe_intermediate), the model's
# layout here. As transformers' loader (conversion_mapping "qwen3_vl_moe", Transpose(1, 2, check_dims=True)):
# a tensor already in the model's shape is kept, another is transposed.
EXPERT_SUFFIXES = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def experts_in_memory_layout(name: str, array: np.ndarray, intermediate: int, hidden: int) -> np.ndarray:
    experts = array.shape[0]
    expected = ((experts, 2 * intermediate, hidden) if name.endswith("gate_up_proj")
                else (experts, hidden, intermediate))
    if array.shape == expected:
        return array
    if array.ndim == 3 and array.shape[::-1][:2] == expected[1:]:
        return np.ascontiguousarray(array.transpose(0, 2, 1))
    raise ValueError(f"{name} has shape {array.shape}, not {expected} (or its transpose, the hub's layout); the "
                     "checkpoint does not match its config.json's num_experts / moe_intermediate_size / hidden_size")


def load_hf_directory(path: str | os.PathLike) -> tuple[Qwen3VLConfig, dict[str, np.ndarray]]:
    """(config, {parameter name: array}) of a Hugging Face Qwen3-VL directory, in mmrun's layout."""
    weights = HFWeights(path)
    return weights.config, dict(weights)


def open_for_model(path: str | os.PathLike, config: Qwen3VLConfig, described_by: str) -> HFWeights:
    """A training run's --load of a Qwen3-VL directory: its weights (read lazily), after checking that its
    config.json describes `config`'s network (`described_by`: where that came from, e.g. model.json's path)."""
    return vlm_checkpoint.checked_for_model(HFWeights(path), config, described_by, network=_network)


# The MoE variant's settings that change how the network is trained or computed, not its weights: model.json's
# router_gating_in_fp32 (transformers' config.json has no such key) or an aux loss may differ from the checkpoint's.
RUN_SETTINGS = ("router_gating_in_fp32", "output_router_logits", "router_aux_loss_coef")


def _network(config: Qwen3VLConfig) -> dict:
    hf = vlm_checkpoint.structure(config.to_hf_config())
    hf["text_config"] = {k: v for k, v in hf["text_config"].items() if k not in RUN_SETTINGS}
    return hf
