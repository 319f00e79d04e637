"""Qwen2-VL / Qwen2.5-VL configuration: three dataclasses, read from and written to Hugging Face's config.json.

One set of names for both model types (the Hugging Face spellings differ between them):

| mmrun `VisionConfig`    | Qwen2-VL config.json           | Qwen2.5-VL config.json |
|-------------------------|--------------------------------|------------------------|
| `hidden_size` (ViT width) | `embed_dim`                  | `hidden_size`          |
| `intermediate_size`     | `embed_dim * mlp_ratio`        | `intermediate_size`    |
| `out_hidden_size` (merger output = text hidden) | `hidden_size` | `out_hidden_size` |
| `window_size`, `fullatt_block_indexes`, `tokens_per_second` | (none: full attention) | same names |

`Qwen2VLConfig.from_hf_config(d)` reads every layout in use: transformers 4.x hub files (text fields at
the top level, `rope_scaling: {"type": "mrope", "mrope_section": [...]}`, `in_chans`) and transformers 5.x
files (`text_config` with `rope_parameters`). `to_hf_config()` writes the hub layout, which both
transformers 4.x and 5.x load (tests/models/test_hf_checkpoint.py loads it back through AutoConfig).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from mmrun.models.vlm.configuration import ACTIVATIONS, ViTShape

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
ARCHITECTURES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}


@dataclass
class VisionConfig(ViTShape):
    """The ViT and its patch merger. Defaults are Qwen2-VL-7B's (Hugging Face's)."""

    depth: int = 32
    hidden_size: int = 1280  # ViT width
    num_heads: int = 16
    intermediate_size: int = 5120  # MLP width
    out_hidden_size: int = 3584  # merger output, equal to the text model's hidden size
    hidden_act: str = "quick_gelu"
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    rope_theta: float = 10000.0
    # Qwen2.5-VL: window attention everywhere except `fullatt_block_indexes`; None = Qwen2-VL (full attention).
    window_size: int | None = None
    fullatt_block_indexes: tuple[int, ...] = ()
    tokens_per_second: float | None = None  # M-RoPE time scale of videos (Qwen2.5-VL)
    initializer_range: float = 0.02



@dataclass
class TextConfig:
    """The Qwen2 language model. Defaults are Hugging Face's."""

    vocab_size: int = 152064
    hidden_size: int = 8192
    intermediate_size: int = 29568
    num_hidden_layers: int = 80
    num_attention_heads: int = 64
    num_key_value_heads: int = 8
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1000000.0
    mrope_section: tuple[int, ...] = (16, 24, 24)  # rotary frequencies driven by the t, h, w position rows
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    bos_token_id: int | None = 151643
    eos_token_id: int | list[int] | None = 151645
    pad_token_id: int | None = None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass
class Qwen2VLConfig:
    """A whole Qwen2-VL (`model_type` "qwen2_vl") or Qwen2.5-VL ("qwen2_5_vl") model."""

    model_type: str = "qwen2_vl"
    vision: VisionConfig = field(default_factory=VisionConfig)
    text: TextConfig = field(default_factory=TextConfig)
    image_token_id: int = 151655  # <|image_pad|>
    video_token_id: int = 151656  # <|video_pad|>
    vision_start_token_id: int = 151652  # <|vision_start|>
    vision_end_token_id: int = 151653  # <|vision_end|>
    tie_word_embeddings: bool = False
    torch_dtype: str | None = None  # the checkpoint's dtype name ("bfloat16", "float32"), as config.json says

    def __post_init__(self) -> None:
        self.text.mrope_section = tuple(int(s) for s in self.text.mrope_section)
        self.vision.fullatt_block_indexes = tuple(int(i) for i in self.vision.fullatt_block_indexes)
        check(self)

    @property
    def is_qwen2_5(self) -> bool:
        return self.model_type == "qwen2_5_vl"

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> "Qwen2VLConfig":
        """From a config.json dict of either model type, transformers 4.x or 5.x layout."""
        return _from_hf(cls, config)

    def to_hf_config(self) -> dict[str, Any]:
        """config.json in the hub layout (flat text fields, `rope_scaling` with `mrope_section`)."""
        return _to_hf(self)


def check(config: Qwen2VLConfig) -> None:
    """One clear error for the first inconsistency found."""
    text, vision = config.text, config.vision
    if config.model_type not in MODEL_TYPES:
        raise ValueError(f"model_type {config.model_type!r} is not a Qwen2-VL family model; use one of {MODEL_TYPES}")
    if text.hidden_size % text.num_attention_heads:
        raise ValueError(f"text hidden_size {text.hidden_size} is not divisible by num_attention_heads "
                         f"{text.num_attention_heads}; change one of them")
    if text.num_attention_heads % text.num_key_value_heads:
        raise ValueError(f"num_attention_heads {text.num_attention_heads} is not divisible by num_key_value_heads "
                         f"{text.num_key_value_heads}; grouped-query attention needs whole groups")
    if sum(text.mrope_section) != text.head_dim // 2:
        raise ValueError(f"mrope_section {list(text.mrope_section)} sums to {sum(text.mrope_section)}, but the text "
                         f"head_dim {text.head_dim} has {text.head_dim // 2} rotary frequencies; make the sections "
                         f"sum to head_dim // 2 ({text.head_dim // 2})")
    if vision.hidden_size % vision.num_heads or vision.head_dim % 4:
        raise ValueError(f"vision hidden_size {vision.hidden_size} / num_heads {vision.num_heads} must give a head_dim "
                         "divisible by 4 (2-D rotary: half for rows, half for columns); change one of them")
    if vision.out_hidden_size != text.hidden_size:
        raise ValueError(f"the vision merger outputs {vision.out_hidden_size} features but the text hidden_size is "
                         f"{text.hidden_size}; set the merger output (Qwen2-VL vision hidden_size, Qwen2.5-VL "
                         "out_hidden_size) to the text hidden_size")
    for name, act in (("vision", vision.hidden_act), ("text", text.hidden_act)):
        if act not in ACTIVATIONS:
            raise ValueError(f"{name} hidden_act {act!r} is not implemented; use one of {ACTIVATIONS}")
    if config.is_qwen2_5:
        unit = vision.spatial_merge_size * vision.patch_size
        if vision.window_size is None or vision.window_size < unit or vision.window_size % unit:
            raise ValueError(f"Qwen2.5-VL window_size {vision.window_size} must be a positive multiple of "
                             f"spatial_merge_size * patch_size ({unit}) pixels")
        bad = [i for i in vision.fullatt_block_indexes if not 0 <= i < vision.depth]
        if bad:
            raise ValueError(f"fullatt_block_indexes {bad} are outside the {vision.depth} vision blocks; "
                             f"use indexes 0..{vision.depth - 1}")


# ---------------------------------------------------------------------------------------- config.json

_VISION_DEFAULTS = {
    "qwen2_vl": dict(depth=32, embed_dim=1280, hidden_size=3584, hidden_act="quick_gelu", mlp_ratio=4, num_heads=16),
    "qwen2_5_vl": dict(depth=32, hidden_size=3584, hidden_act="silu", intermediate_size=3420, num_heads=16,
                       tokens_per_second=4, window_size=112, out_hidden_size=3584,
                       fullatt_block_indexes=[7, 15, 23, 31]),
}
TEXT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                "attention_dropout", "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id")


def _from_hf(cls: type[Qwen2VLConfig], d: Mapping[str, Any]) -> Qwen2VLConfig:
    model_type = d.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"config.json has model_type {model_type!r}, not a Qwen2-VL family model; mmrun's "
                         f"qwen2_vl reads model_type {' or '.join(MODEL_TYPES)}")
    text_src = d.get("text_config") or {}

    def text_value(key: str, default: Any) -> Any:
        # 5.x nests the text fields in text_config; 4.x hub files keep them at the top level.
        if key in text_src and text_src[key] is not None:
            return text_src[key]
        return d.get(key, default) if d.get(key) is not None else default

    rope = (text_src.get("rope_parameters") or text_src.get("rope_scaling") or d.get("rope_parameters")
            or d.get("rope_scaling") or {})
    defaults = TextConfig()
    text = TextConfig(**{key: text_value(key, getattr(defaults, key)) for key in TEXT_FIELDS},
                      rope_theta=float(rope.get("rope_theta") or text_value("rope_theta", defaults.rope_theta)),
                      mrope_section=tuple(rope.get("mrope_section", defaults.mrope_section)))
    if text.num_key_value_heads is None:
        text.num_key_value_heads = text.num_attention_heads

    v = {**_VISION_DEFAULTS[model_type], **(d.get("vision_config") or {})}
    common = dict(depth=int(v["depth"]), num_heads=int(v["num_heads"]), hidden_act=v["hidden_act"],
                  in_channels=int(v.get("in_channels", v.get("in_chans", 3))), patch_size=int(v.get("patch_size", 14)),
                  temporal_patch_size=int(v.get("temporal_patch_size", 2)),
                  spatial_merge_size=int(v.get("spatial_merge_size", 2)),
                  rope_theta=float((v.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
                  initializer_range=float(v.get("initializer_range", 0.02)))
    if model_type == "qwen2_vl":
        width = int(v["embed_dim"])
        vision = VisionConfig(hidden_size=width, intermediate_size=int(width * v["mlp_ratio"]),
                              out_hidden_size=int(v["hidden_size"]), **common)
    else:
        vision = VisionConfig(hidden_size=int(v["hidden_size"]), intermediate_size=int(v["intermediate_size"]),
                              out_hidden_size=int(v["out_hidden_size"]), window_size=int(v["window_size"]),
                              fullatt_block_indexes=tuple(v["fullatt_block_indexes"]),
                              tokens_per_second=v["tokens_per_second"], **common)
    # Pre-5.x files may say tie_word_embeddings inside text_config only; 5.x reads it there as well.
    tie = bool(d.get("tie_word_embeddings", False) or text_src.get("tie_word_embeddings", False))
    ids = {key: int(d.get(key, text_src.get(key, getattr(Qwen2VLConfig, key))))
           for key in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")}
    dtype = d.get("torch_dtype") or d.get("dtype") or text_src.get("torch_dtype") or text_src.get("dtype")
    return cls(model_type=model_type, vision=vision, text=text, tie_word_embeddings=tie,
               torch_dtype=str(dtype) if dtype else None, **ids)


def _to_hf(config: Qwen2VLConfig) -> dict[str, Any]:
    text, vision = config.text, config.vision
    out: dict[str, Any] = {"architectures": [ARCHITECTURES[config.model_type]], "model_type": config.model_type}
    out.update({key: getattr(text, key) for key in TEXT_FIELDS})
    out["rope_theta"] = text.rope_theta
    out["rope_scaling"] = {"type": "mrope", "mrope_section": list(text.mrope_section)}
    common = dict(depth=vision.depth, num_heads=vision.num_heads, hidden_act=vision.hidden_act,
                  in_channels=vision.in_channels, patch_size=vision.patch_size,
                  temporal_patch_size=vision.temporal_patch_size, spatial_merge_size=vision.spatial_merge_size,
                  initializer_range=vision.initializer_range)
    if config.is_qwen2_5:
        out["vision_config"] = dict(common, hidden_size=vision.hidden_size, intermediate_size=vision.intermediate_size,
                                    out_hidden_size=vision.out_hidden_size, window_size=vision.window_size,
                                    fullatt_block_indexes=list(vision.fullatt_block_indexes),
                                    tokens_per_second=vision.tokens_per_second)
    else:
        if vision.intermediate_size % vision.hidden_size:
            raise ValueError(f"Qwen2-VL stores the vision MLP width as embed_dim * mlp_ratio (an integer); "
                             f"{vision.intermediate_size} is not a multiple of {vision.hidden_size}")
        out["vision_config"] = dict(common, embed_dim=vision.hidden_size, hidden_size=vision.out_hidden_size,
                                    mlp_ratio=vision.intermediate_size // vision.hidden_size)
    if vision.rope_theta != 10000.0:
        out["vision_config"]["rope_parameters"] = {"rope_type": "axial", "rope_theta": vision.rope_theta}
    out.update(image_token_id=config.image_token_id, video_token_id=config.video_token_id,
               vision_start_token_id=config.vision_start_token_id, vision_end_token_id=config.vision_end_token_id,
               tie_word_embeddings=config.tie_word_embeddings)
    if config.torch_dtype:
        out["torch_dtype"] = config.torch_dtype
    return out
