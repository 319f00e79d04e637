"""Qwen3-VL (dense) configuration: three dataclasses, read from and written to Hugging Face's config.json.

The names are transformers' `Qwen3VLVisionConfig` / `Qwen3VLTextConfig` / `Qwen3VLConfig` fields. A hub
config.json nests the text fields in `text_config` with the rotary settings in `rope_scaling` (transformers
4.57) or `rope_parameters` (5.x): `rope_theta`, `mrope_section` and `mrope_interleaved` (true for every
Qwen3-VL; the interleaved layout is the only one built). The vision rotary theta sits in
`vision_config.rope_parameters` (default 10000).

The MoE variant (`qwen3_vl_moe`, Qwen3-VL-30B-A3B / 235B-A22B) is the same config with `TextConfig.moe` set
(`MoeConfig`: transformers' Qwen3VLMoeTextConfig fields); its decoder's sparse blocks are models/qwen3_vl/moe.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from mmrun.backend.errors import UsageError
from mmrun.models.vlm.configuration import ACTIVATIONS, ViTShape

MODEL_TYPE = "qwen3_vl"
MOE_MODEL_TYPE = "qwen3_vl_moe"
ARCHITECTURE = "Qwen3VLForConditionalGeneration"
MOE_ARCHITECTURE = "Qwen3VLMoeForConditionalGeneration"
MODEL_TYPES = (MODEL_TYPE, MOE_MODEL_TYPE)


@dataclass
class VisionConfig(ViTShape):
    """The ViT, its patch merger and DeepStack mergers. Defaults are transformers' (Qwen3-VL-4B's shape)."""

    depth: int = 27
    hidden_size: int = 1152  # ViT width
    num_heads: int = 16
    intermediate_size: int = 4304  # MLP width
    out_hidden_size: int = 3584  # merger output, equal to the text model's hidden size
    hidden_act: str = "gelu_pytorch_tanh"
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    num_position_embeddings: int = 2304  # a square table (48 x 48) of learned positions, resampled per image
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)  # blocks whose output feeds decoder layers 0, 1, 2
    rope_theta: float = 10000.0
    initializer_range: float = 0.02

    @property
    def num_grid_per_side(self) -> int:
        return int(self.num_position_embeddings ** 0.5)


@dataclass
class MoeConfig:
    """The mixture-of-experts part of the text decoder (Qwen3-VL-30B-A3B / 235B-A22B). Field names and defaults are
    transformers' Qwen3VLMoeTextConfig's; `norm_topk_prob` (renormalise the top-k weights; transformers always does)
    and `router_gating_in_fp32` (the gate's matmul in fp32 too; the softmax always is) are MindSpeed-MM's keys."""

    num_experts: int = 60
    num_experts_per_tok: int = 4
    moe_intermediate_size: int = 1408
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    norm_topk_prob: bool = True
    router_gating_in_fp32: bool = False
    output_router_logits: bool = False  # add router_aux_loss_coef x the load-balancing loss to the loss
    router_aux_loss_coef: float = 0.001

    def is_sparse(self, layer: int) -> bool:
        """Whether decoder layer `layer` has experts (transformers' rule) or a dense MLP."""
        return (layer not in self.mlp_only_layers and self.num_experts > 0
                and (layer + 1) % self.decoder_sparse_step == 0)


MOE_FIELDS = tuple(MoeConfig.__dataclass_fields__)


@dataclass
class TextConfig:
    """The Qwen3 language model (QK-norm, explicit head_dim, interleaved M-RoPE). Defaults are transformers'."""

    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 22016
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 128000
    rms_norm_eps: float = 1e-6
    rope_theta: float = 500000.0
    mrope_section: tuple[int, ...] = (24, 20, 20)  # rotary frequencies driven by the t, h, w rows (interleaved)
    attention_bias: bool = False
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    moe: MoeConfig | None = None  # the MoE variant's experts (model_type qwen3_vl_moe); None: dense


@dataclass
class Qwen3VLConfig:
    """A whole dense Qwen3-VL model."""

    vision: VisionConfig = field(default_factory=VisionConfig)
    text: TextConfig = field(default_factory=TextConfig)
    image_token_id: int = 151655  # <|image_pad|>
    video_token_id: int = 151656  # <|video_pad|>
    vision_start_token_id: int = 151652  # <|vision_start|>
    vision_end_token_id: int = 151653  # <|vision_end|>
    tie_word_embeddings: bool = False
    torch_dtype: str | None = None  # the checkpoint's dtype name, as config.json says
    model_type: str = MODEL_TYPE

    def __post_init__(self) -> None:
        self.text.mrope_section = tuple(int(s) for s in self.text.mrope_section)
        self.vision.deepstack_visual_indexes = tuple(int(i) for i in self.vision.deepstack_visual_indexes)
        if self.text.moe is not None:
            self.text.moe.mlp_only_layers = tuple(int(i) for i in self.text.moe.mlp_only_layers)
        check(self)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> "Qwen3VLConfig":
        """From a config.json dict (transformers 4.57 or 5.x layout)."""
        return _from_hf(cls, config)

    def to_hf_config(self) -> dict[str, Any]:
        """config.json in the hub layout, which transformers' AutoConfig loads."""
        return _to_hf(self)


def check(config: Qwen3VLConfig) -> None:
    """One clear error for the first inconsistency found."""
    text, vision = config.text, config.vision
    if config.model_type not in MODEL_TYPES:
        raise ValueError(f"model_type {config.model_type!r} is not Qwen3-VL; use {MODEL_TYPE!r} or {MOE_MODEL_TYPE!r}")
    if (config.model_type == MOE_MODEL_TYPE) != (text.moe is not None):
        raise ValueError(f"model_type {config.model_type!r} with text moe {text.moe}: {MOE_MODEL_TYPE!r} goes with "
                         f"experts (num_experts), {MODEL_TYPE!r} without")
    if text.moe is not None:
        check_moe(text.moe)
    if text.num_attention_heads % text.num_key_value_heads:
        raise ValueError(f"num_attention_heads {text.num_attention_heads} is not divisible by num_key_value_heads "
                         f"{text.num_key_value_heads}; grouped-query attention needs whole groups")
    if len(text.mrope_section) != 3 or sum(text.mrope_section) != text.head_dim // 2:
        raise ValueError(f"mrope_section {list(text.mrope_section)} must be three numbers summing to head_dim // 2 "
                         f"({text.head_dim // 2}, head_dim {text.head_dim}); fix rope_scaling.mrope_section")
    if vision.hidden_size % vision.num_heads or vision.head_dim % 4:
        raise ValueError(f"vision hidden_size {vision.hidden_size} / num_heads {vision.num_heads} must give a head_dim "
                         "divisible by 4 (2-D rotary: half for rows, half for columns); change one of them")
    if vision.num_grid_per_side ** 2 != vision.num_position_embeddings:
        raise ValueError(f"vision num_position_embeddings {vision.num_position_embeddings} is not a square number; "
                         "the learned positions form a square grid (e.g. 2304 = 48 x 48)")
    if vision.out_hidden_size != text.hidden_size:
        raise ValueError(f"the vision merger outputs {vision.out_hidden_size} features but the text hidden_size is "
                         f"{text.hidden_size}; set vision_config.out_hidden_size to the text hidden_size")
    bad = [i for i in vision.deepstack_visual_indexes if not 0 <= i < vision.depth]
    if bad or len(vision.deepstack_visual_indexes) > text.num_hidden_layers:
        raise ValueError(f"deepstack_visual_indexes {list(vision.deepstack_visual_indexes)} must name vision blocks "
                         f"0..{vision.depth - 1}, at most one per decoder layer ({text.num_hidden_layers})")
    for name, act in (("vision", vision.hidden_act), ("text", text.hidden_act)):
        if act not in ACTIVATIONS:
            raise ValueError(f"{name} hidden_act {act!r} is not implemented; use one of {ACTIVATIONS}")


def check_moe(moe: MoeConfig) -> None:
    """One line (UsageError, exit 2) for experts that cannot route."""
    if moe.num_experts < 1 or not 1 <= moe.num_experts_per_tok <= moe.num_experts:
        raise UsageError(f"num_experts_per_tok (moe_router_topk) {moe.num_experts_per_tok} must be between 1 and "
                         f"num_experts (num_moe_experts) {moe.num_experts}; each token is routed to that many experts")
    if moe.decoder_sparse_step < 1:
        raise UsageError(f"decoder_sparse_step {moe.decoder_sparse_step} must be 1 or more (1: every layer has experts)")
    coef = moe.router_aux_loss_coef
    if moe.output_router_logits and (isinstance(coef, bool) or not isinstance(coef, (int, float))
                                     or not math.isfinite(coef) or coef < 0):
        raise UsageError(f"router_aux_loss_coef (moe_aux_loss_coeff) {coef!r} must be a number >= 0 when "
                         "output_router_logits is set (the load-balancing loss's weight)")


# ---------------------------------------------------------------------------------------- config.json

_TEXT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                "attention_bias", "attention_dropout", "initializer_range", "bos_token_id", "eos_token_id",
                "pad_token_id")
_VISION_FIELDS = ("depth", "hidden_size", "num_heads", "intermediate_size", "out_hidden_size", "hidden_act",
                  "in_channels", "patch_size", "temporal_patch_size", "spatial_merge_size",
                  "num_position_embeddings", "initializer_range")
_IDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def _from_hf(cls: type[Qwen3VLConfig], d: Mapping[str, Any]) -> Qwen3VLConfig:
    model_type = d.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"config.json has model_type {model_type!r}, not Qwen3-VL; mmrun's qwen3_vl reads "
                         f"model_type {MODEL_TYPE!r} or {MOE_MODEL_TYPE!r}")
    t = dict(d.get("text_config") or {})
    rope = t.get("rope_parameters") or t.get("rope_scaling") or {}
    if rope.get("mrope_interleaved") is False:
        raise ValueError("config.json says mrope_interleaved false; Qwen3-VL's M-RoPE is interleaved (the only "
                         "layout mmrun builds for it): set it true or use a Qwen2-VL model")
    text_defaults = TextConfig()
    values = {key: t[key] if t.get(key) is not None else getattr(text_defaults, key) for key in _TEXT_FIELDS}
    if t.get("num_key_value_heads") is None:
        values["num_key_value_heads"] = values["num_attention_heads"]
    text = TextConfig(**values, rope_theta=float(rope.get("rope_theta") or t.get("rope_theta")
                                                 or text_defaults.rope_theta),
                      mrope_section=tuple(rope.get("mrope_section") or text_defaults.mrope_section))
    if model_type == MOE_MODEL_TYPE:
        if t.get("num_experts") is None and t.get("num_local_experts") is not None:
            t["num_experts"] = t["num_local_experts"]  # transformers 5 writes num_experts by that name
        moe_defaults = MoeConfig()
        text.moe = MoeConfig(**{key: t[key] if t.get(key) is not None else getattr(moe_defaults, key)
                                for key in MOE_FIELDS})
    v = dict(d.get("vision_config") or {})
    vision_defaults = VisionConfig()
    vision = VisionConfig(
        **{key: v[key] if v.get(key) is not None else getattr(vision_defaults, key) for key in _VISION_FIELDS},
        deepstack_visual_indexes=tuple(v.get("deepstack_visual_indexes", vision_defaults.deepstack_visual_indexes)),
        rope_theta=float((v.get("rope_parameters") or {}).get("rope_theta", vision_defaults.rope_theta)))
    # transformers 5 ties by the top-level key; the text config's (default true for the MoE) only where it is absent
    tie = bool(d["tie_word_embeddings"] if "tie_word_embeddings" in d else t.get("tie_word_embeddings", False))
    ids = {key: int(d.get(key, t.get(key, getattr(Qwen3VLConfig, key)))) for key in _IDS}
    dtype = d.get("torch_dtype") or d.get("dtype") or t.get("torch_dtype") or t.get("dtype")
    return cls(vision=vision, text=text, tie_word_embeddings=tie, torch_dtype=str(dtype) if dtype else None,
               model_type=model_type, **ids)


def _to_hf(config: Qwen3VLConfig) -> dict[str, Any]:
    text, vision = config.text, config.vision
    text_config = {key: getattr(text, key) for key in _TEXT_FIELDS}
    model_type = config.model_type
    text_config.update(model_type=f"{model_type}_text", rope_parameters={
        "rope_type": "default", "rope_theta": text.rope_theta, "mrope_section": list(text.mrope_section),
        "mrope_interleaved": True})
    if text.moe is not None:
        text_config.update({key: getattr(text.moe, key) for key in MOE_FIELDS},
                           mlp_only_layers=list(text.moe.mlp_only_layers))
    vision_config = {key: getattr(vision, key) for key in _VISION_FIELDS}
    vision_config.update(model_type=f"{model_type}_vision", deepstack_visual_indexes=list(vision.deepstack_visual_indexes),
                         rope_parameters={"rope_type": "axial", "rope_theta": vision.rope_theta})
    architecture = MOE_ARCHITECTURE if text.moe is not None else ARCHITECTURE
    out: dict[str, Any] = {"architectures": [architecture], "model_type": model_type, "text_config": text_config,
                           "vision_config": vision_config, "tie_word_embeddings": config.tie_word_embeddings}
    out.update({key: getattr(config, key) for key in _IDS})
    if config.torch_dtype:
        out["torch_dtype"] = config.torch_dtype
    return out
