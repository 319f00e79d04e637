"""Qwen2.5-Omni's thinker configuration: the Qwen2.5-VL vision tower and Qwen2 decoder configs of
mmrun's Qwen2-VL family (models/qwen2_vl/configuration.py) plus the Whisper-style audio encoder's and the
TMRoPE constants, read from a Hugging Face config.json.

Two layouts are read: a thinker directory (`model_type` "qwen2_5_omni_thinker", what
Qwen2_5OmniThinkerForConditionalGeneration.save_pretrained writes) and the whole model as downloaded
(`model_type` "qwen2_5_omni", the thinker's fields under `thinker_config`; the talker and token2wav are not
read: MindSpeed-MM's fine-tune trains the thinker only, `enable_audio_output` false).

| mmrun `AudioConfig`   | Hugging Face `audio_config` |
|-----------------------|-----------------------------|
| `num_mel_bins`        | `num_mel_bins` (128)        |
| `num_layers`          | `encoder_layers`            |
| `num_heads`           | `encoder_attention_heads`   |
| `hidden_size`         | `d_model`                   |
| `intermediate_size`   | `encoder_ffn_dim`           |
| `max_source_positions`, `n_window`, `output_dim`, `activation_function` | same names |
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from mmrun.models.qwen2_vl.configuration import TEXT_FIELDS, Qwen2VLConfig, TextConfig, VisionConfig, check

THINKER_MODEL_TYPE = "qwen2_5_omni_thinker"
MODEL_TYPES = (THINKER_MODEL_TYPE, "qwen2_5_omni")
THINKER_ARCHITECTURE = "Qwen2_5OmniThinkerForConditionalGeneration"


@dataclass
class AudioConfig:
    """The audio encoder (conv front end, sinusoidal positions, transformer, pooling, projection). Defaults are
    Qwen2.5-Omni-7B's."""

    num_mel_bins: int = 128
    num_layers: int = 32
    num_heads: int = 20
    hidden_size: int = 1280  # d_model
    intermediate_size: int = 5120  # encoder_ffn_dim
    activation_function: str = "gelu"
    max_source_positions: int = 1500  # rows of the sinusoid table: frames of one chunk after the stride-2 conv
    n_window: int = 100  # a chunk is 2 * n_window mel frames (2 s at 100 frames/s); attention stays in a chunk
    output_dim: int = 3584  # the text hidden size
    scale_embedding: bool = False
    initializer_range: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass
class OmniConfig:
    """Qwen2.5-Omni's thinker: vision (Qwen2.5-VL's ViT), text (Qwen2), audio, and the special tokens."""

    vision: VisionConfig = field(default_factory=lambda: VisionConfig(
        hidden_size=1280, intermediate_size=3420, out_hidden_size=3584, hidden_act="silu", window_size=112,
        fullatt_block_indexes=(7, 15, 23, 31)))
    text: TextConfig = field(default_factory=lambda: TextConfig(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, rms_norm_eps=1e-6))
    audio: AudioConfig = field(default_factory=AudioConfig)
    audio_token_id: int = 151646  # <|AUDIO|>
    image_token_id: int = 151655  # <|IMAGE|>
    video_token_id: int = 151656  # <|VIDEO|>
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    audio_start_token_id: int = 151647
    audio_end_token_id: int = 151648
    position_id_per_seconds: int = 25  # TMRoPE: temporal positions per second of video or audio
    seconds_per_chunk: int = 2  # audio-in-video: video and audio interleave in chunks of this many seconds
    tie_word_embeddings: bool = False
    torch_dtype: str | None = None

    def __post_init__(self) -> None:
        self.text.mrope_section = tuple(int(s) for s in self.text.mrope_section)
        self.vision.fullatt_block_indexes = tuple(int(i) for i in self.vision.fullatt_block_indexes)
        check(self.as_qwen2_5_vl())  # the vision tower and decoder are Qwen2.5-VL's: the same rules hold
        audio = self.audio
        if audio.hidden_size % audio.num_heads:
            raise ValueError(f"audio d_model {audio.hidden_size} is not divisible by encoder_attention_heads "
                             f"{audio.num_heads}; change one of them")
        if audio.output_dim != self.text.hidden_size:
            raise ValueError(f"the audio encoder outputs {audio.output_dim} features but the text hidden_size is "
                             f"{self.text.hidden_size}; set audio_config.output_dim to the text hidden_size")

    @property
    def model_type(self) -> str:
        """The thinker's config.json model_type: what the family table (models/families.py) knows it by."""
        return THINKER_MODEL_TYPE

    @property
    def is_qwen2_5(self) -> bool:
        """Its ViT is Qwen2.5-VL's (gated MLP, RMSNorm): what the shared split (models/vlm/mm_layout.py) asks."""
        return True

    def as_qwen2_5_vl(self) -> Qwen2VLConfig:
        """The Qwen2.5-VL config of this model's vision tower and decoder (what the Qwen2-VL family's blocks take)."""
        return Qwen2VLConfig(model_type="qwen2_5_vl", vision=self.vision, text=self.text,
                             image_token_id=self.image_token_id, video_token_id=self.video_token_id,
                             vision_start_token_id=self.vision_start_token_id,
                             vision_end_token_id=self.vision_end_token_id,
                             tie_word_embeddings=self.tie_word_embeddings)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> "OmniConfig":
        """From a thinker's or a whole Qwen2.5-Omni's config.json dict."""
        return _from_hf(cls, config)

    def to_hf_config(self) -> dict[str, Any]:
        """The thinker's config.json (transformers 5.x layout, which transformers loads back)."""
        return _to_hf(self)


# ---------------------------------------------------------------------------------------- config.json

_AUDIO_KEYS = {"num_mel_bins": "num_mel_bins", "num_layers": "encoder_layers", "num_heads": "encoder_attention_heads",
               "hidden_size": "d_model", "intermediate_size": "encoder_ffn_dim",
               "activation_function": "activation_function", "max_source_positions": "max_source_positions",
               "n_window": "n_window", "output_dim": "output_dim", "scale_embedding": "scale_embedding",
               "initializer_range": "initializer_range"}
# thinker config.json key -> OmniConfig field (transformers spells the pad tokens *_index)
_ID_KEYS = {"audio_token_index": "audio_token_id", "image_token_index": "image_token_id",
            "video_token_index": "video_token_id", "vision_start_token_id": "vision_start_token_id",
            "vision_end_token_id": "vision_end_token_id", "audio_start_token_id": "audio_start_token_id",
            "audio_end_token_id": "audio_end_token_id", "position_id_per_seconds": "position_id_per_seconds",
            "seconds_per_chunk": "seconds_per_chunk"}


def thinker_dict(d: Mapping[str, Any]) -> Mapping[str, Any]:
    """The thinker's part of a config.json dict of either layout (one-line error for another model)."""
    model_type = d.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"config.json has model_type {model_type!r}, not Qwen2.5-Omni; mmrun's qwen2_5_omni reads "
                         f"model_type {' or '.join(MODEL_TYPES)}")
    return d["thinker_config"] if model_type == "qwen2_5_omni" else d


def _from_hf(cls: type[OmniConfig], d: Mapping[str, Any]) -> OmniConfig:
    t = thinker_dict(d)
    text_src = t.get("text_config") or {}
    defaults = OmniConfig().text
    rope = text_src.get("rope_parameters") or text_src.get("rope_scaling") or {}
    text = TextConfig(**{k: text_src.get(k, getattr(defaults, k)) if text_src.get(k) is not None
                         else getattr(defaults, k) for k in TEXT_FIELDS},
                      rope_theta=float(rope.get("rope_theta") or text_src.get("rope_theta") or defaults.rope_theta),
                      mrope_section=tuple(rope.get("mrope_section", defaults.mrope_section)))
    v = {**_vision_hf(OmniConfig().vision), **(t.get("vision_config") or {})}
    vision = VisionConfig(
        depth=int(v["depth"]), hidden_size=int(v["hidden_size"]), num_heads=int(v["num_heads"]),
        intermediate_size=int(v["intermediate_size"]), out_hidden_size=int(v["out_hidden_size"]),
        hidden_act=v["hidden_act"], in_channels=int(v.get("in_channels", 3)), patch_size=int(v["patch_size"]),
        temporal_patch_size=int(v["temporal_patch_size"]), spatial_merge_size=int(v["spatial_merge_size"]),
        window_size=int(v["window_size"]), fullatt_block_indexes=tuple(v["fullatt_block_indexes"]),
        rope_theta=float((v.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        initializer_range=float(v.get("initializer_range", 0.02)))
    a = t.get("audio_config") or {}
    audio_defaults = AudioConfig()
    audio = AudioConfig(**{ours: a.get(theirs, getattr(audio_defaults, ours)) for ours, theirs in _AUDIO_KEYS.items()})
    ids = {ours: int(t[theirs]) for theirs, ours in _ID_KEYS.items() if t.get(theirs) is not None}
    dtype = t.get("torch_dtype") or t.get("dtype") or d.get("torch_dtype") or d.get("dtype")
    return cls(vision=vision, text=text, audio=audio, tie_word_embeddings=bool(t.get("tie_word_embeddings", False)),
               torch_dtype=str(dtype) if dtype else None, **ids)


def _vision_hf(vision: VisionConfig) -> dict[str, Any]:
    return dict(depth=vision.depth, hidden_size=vision.hidden_size, num_heads=vision.num_heads,
                intermediate_size=vision.intermediate_size, out_hidden_size=vision.out_hidden_size,
                hidden_act=vision.hidden_act, in_channels=vision.in_channels, patch_size=vision.patch_size,
                temporal_patch_size=vision.temporal_patch_size, spatial_merge_size=vision.spatial_merge_size,
                window_size=vision.window_size, fullatt_block_indexes=list(vision.fullatt_block_indexes),
                initializer_range=vision.initializer_range,
                rope_parameters={"rope_type": "axial", "rope_theta": vision.rope_theta})


def _to_hf(config: OmniConfig) -> dict[str, Any]:
    text = config.text
    text_out = {k: getattr(text, k) for k in TEXT_FIELDS}
    text_out.update(model_type="qwen2_5_omni_text", tie_word_embeddings=config.tie_word_embeddings,
                    rope_parameters={"rope_type": "default", "rope_theta": text.rope_theta,
                                     "mrope_section": list(text.mrope_section)})
    audio_out = {theirs: getattr(config.audio, ours) for ours, theirs in _AUDIO_KEYS.items()}
    audio_out["model_type"] = "qwen2_5_omni_audio_encoder"
    out: dict[str, Any] = {"architectures": [THINKER_ARCHITECTURE], "model_type": "qwen2_5_omni_thinker",
                           "text_config": text_out, "audio_config": audio_out,
                           "vision_config": {**_vision_hf(config.vision), "model_type": "qwen2_5_omni_vision_encoder"},
                           "tie_word_embeddings": config.tie_word_embeddings}
    out.update({theirs: getattr(config, ours) for theirs, ours in _ID_KEYS.items()})
    if config.torch_dtype:
        out["torch_dtype"] = config.torch_dtype
    return out


# config.json keys that do not change the network's weights or what it computes from a sequence that fits
NOT_NETWORK = ("torch_dtype", "dtype", "architectures", "max_position_embeddings", "initializer_range", "bos_token_id",
               "eos_token_id", "pad_token_id")


def network_dict(config: OmniConfig) -> dict[str, Any]:
    """The thinker config.json without NOT_NETWORK's keys, at every level: two models whose network_dicts are equal
    load each other's weights and compute the same (a downloaded config.json's max_position_embeddings may be
    another than MindSpeed-MM's model.json's)."""
    def strip(d: Mapping[str, Any]) -> dict[str, Any]:
        return {k: strip(v) if isinstance(v, Mapping) else v for k, v in d.items() if k not in NOT_NETWORK}
    return strip(config.to_hf_config())
