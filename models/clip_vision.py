"""transformers' `CLIPVisionModel` on mmrun's portable API (PyTorch and MindSpore): Wan2.1 I2V's image encoder.

    encoder = CLIPVisionModel.from_pretrained("Wan2.1-I2V-14B-480P-Diffusers/image_encoder")
    processor = CLIPImageProcessor.from_pretrained("Wan2.1-I2V-14B-480P-Diffusers/image_processor")  # mmrun.data
    tokens = encoder.penultimate(tensors.from_numpy(processor([image])))    # (1, 257, 1280): Wan's image tokens

The directory is the one transformers writes (config.json with model_type clip_vision_model, or a whole CLIP's
config.json whose vision_config is read; model.safetensors or shards) and the parameters keep transformers' names:
`vision_model.embeddings.{class_embedding, patch_embedding.weight, position_embedding.weight}`,
`vision_model.pre_layrnorm` (transformers' spelling), `vision_model.encoder.layers.N.{self_attn.{q,k,v,out}_proj,
layer_norm1, mlp.fc1, mlp.fc2, layer_norm2}`, `vision_model.post_layernorm`. Pre-norm ViT blocks, a class token in
front of the patch tokens, learned positions, scaled dot-product attention without a mask, `hidden_act` from the
config (Wan's encoder: gelu; CLIP's default: quick_gelu). Equal to transformers 5.24 within 1e-5 in fp32
(tests/models/test_clip_vision.py), on both frameworks.

Wan conditions on `hidden_states[-2]` (diffusers' WanImageToVideoPipeline.encode_image, MindSpeed-MM's
WanVideoI2VProcessor): the output of the second-to-last layer, before any final norm; `penultimate` computes
exactly that and skips the last layer, whose output Wan never reads.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import numpy as np

from mmrun.backend import autograd, nn, ops, tensors
from mmrun.backend.errors import UsageError
from mmrun.checkpoint.formats import hf_directory
from mmrun.models.transformer_blocks import ACTIVATIONS, activation

WHAT = "the CLIP image encoder"
MODEL_TYPES = ("clip_vision_model", "clip")  # a CLIPVisionModel's own config, or a whole CLIP's (vision_config)
PREFIX = "vision_model."
TOWER_PARTS = ("embeddings", "pre_layrnorm", "encoder", "post_layernorm")
UNUSED_BUFFERS = (PREFIX + "embeddings.position_ids",)  # older transformers saved this index buffer


@dataclasses.dataclass(frozen=True)
class CLIPVisionConfig:
    """transformers' CLIPVisionConfig keys (config.json) that shape the encoder, with its defaults."""

    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 32
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.hidden_act not in ACTIVATIONS:
            raise UsageError(f"{WHAT}: config hidden_act {self.hidden_act!r} is not supported; mmrun runs "
                             f"{sorted(ACTIVATIONS)}")
        if self.hidden_size % self.num_attention_heads:
            raise UsageError(f"{WHAT}: config hidden_size {self.hidden_size} is not a multiple of "
                             f"num_attention_heads {self.num_attention_heads}; fix config.json")
        if self.image_size % self.patch_size:
            raise UsageError(f"{WHAT}: config image_size {self.image_size} is not a multiple of patch_size "
                             f"{self.patch_size}; fix config.json")

    @property
    def num_positions(self) -> int:
        """The class token plus one token per patch: 257 for Wan's 224 / 14."""
        return (self.image_size // self.patch_size) ** 2 + 1

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "config") -> "CLIPVisionConfig":
        if raw.get("model_type") not in MODEL_TYPES:
            raise UsageError(f"{WHAT}: {where} has model_type {raw.get('model_type')!r}, not one of {MODEL_TYPES}; "
                             "pass the Wan I2V Diffusers directory's image_encoder/ folder")
        if raw.get("model_type") == "clip":
            raw = raw.get("vision_config") or {}
        # The other keys (dropout, projection_dim, initializer ranges, bookkeeping) do not change inference.
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})


class CLIPVisionEmbeddings(nn.Module):
    def __init__(self, config: CLIPVisionConfig) -> None:
        super().__init__()
        self.class_embedding = nn.Parameter(ops.zeros((config.hidden_size,)))
        self.patch_embedding = nn.Conv2d(config.num_channels, config.hidden_size, config.patch_size,
                                         stride=config.patch_size, bias=False)
        self.position_embedding = nn.Embedding(config.num_positions, config.hidden_size)

    def forward(self, pixel_values):
        patches = self.patch_embedding(pixel_values)  # (b, hidden, h/p, w/p)
        patches = ops.transpose(ops.flatten(patches, 2), 1, 2)  # (b, patches, hidden)
        b, _, hidden = patches.shape
        cls = ops.reshape(self.class_embedding, (1, 1, hidden)) + ops.zeros((b, 1, hidden), patches.dtype,
                                                                             like=patches)
        return ops.cat([cls, patches], dim=1) + ops.reshape(self.position_embedding.weight,
                                                            (1, -1, hidden))


class CLIPAttention(nn.Module):
    def __init__(self, config: CLIPVisionConfig) -> None:
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def _heads(self, x):
        b, s, _ = x.shape
        return ops.transpose(ops.reshape(x, (b, s, self.heads, self.head_dim)), 1, 2)

    def forward(self, x):
        b, s, d = x.shape
        out = ops.scaled_dot_product_attention(self._heads(self.q_proj(x)), self._heads(self.k_proj(x)),
                                               self._heads(self.v_proj(x)))
        return self.out_proj(ops.reshape(ops.transpose(out, 1, 2), (b, s, d)))


class CLIPMLP(nn.Module):
    def __init__(self, config: CLIPVisionConfig) -> None:
        super().__init__()
        self.act = activation(config.hidden_act)
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class CLIPEncoderLayer(nn.Module):
    def __init__(self, config: CLIPVisionConfig) -> None:
        super().__init__()
        self.self_attn = CLIPAttention(config)
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = CLIPMLP(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x):
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):
    def __init__(self, config: CLIPVisionConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([CLIPEncoderLayer(config) for _ in range(config.num_hidden_layers)])


class CLIPVisionTransformer(nn.Module):
    def __init__(self, config: CLIPVisionConfig) -> None:
        super().__init__()
        self.embeddings = CLIPVisionEmbeddings(config)
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.encoder = CLIPEncoder(config)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class CLIPVisionModel(nn.Module):
    """transformers' CLIPVisionModel: `vision_model` (embeddings, pre_layrnorm, encoder, post_layernorm)."""

    # the layer loops models/recompute.py marks
    recompute_layers = {"vision_encoder": "vision_model.encoder.layers"}

    def __init__(self, config: CLIPVisionConfig | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.config = CLIPVisionConfig(**kwargs) if config is None else config
        self.vision_model = CLIPVisionTransformer(self.config)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: str | None = None) -> "CLIPVisionModel":
        """A transformers CLIPVisionModel directory (a Wan I2V Diffusers directory's image_encoder/); weights in
        float32, or `dtype` ("fp16", "bf16", ...) when given."""
        config = CLIPVisionConfig.from_dict(hf_directory.read_config(path, WHAT), f"{path}/config.json")
        arrays = hf_directory.read_weights(path, WHAT)
        return hf_directory.load_into(cls(config), vision_tower(arrays), WHAT, path, dtype)

    def _check(self, pixel_values) -> None:
        c = self.config
        expected = (c.num_channels, c.image_size, c.image_size)
        if len(pixel_values.shape) != 4 or tuple(pixel_values.shape[1:]) != expected:
            raise UsageError(f"{WHAT}: pixel_values of shape {tuple(pixel_values.shape)}; the encoder takes "
                             f"(batch, {', '.join(map(str, expected))}) (the image processor's crop)")

    def _states(self, pixel_values, layers: int) -> list[Any]:
        """The embeddings after pre_layrnorm, then the outputs of the first `layers` layers."""
        self._check(pixel_values)
        vision = self.vision_model
        states = [vision.pre_layrnorm(vision.embeddings(pixel_values))]
        for layer in list(vision.encoder.layers)[:layers]:
            states.append(layer(states[-1]))
        return states

    def forward(self, pixel_values, output_hidden_states: bool = False) -> dict[str, Any]:
        """transformers' outputs as a dict: last_hidden_state (b, tokens, hidden), pooler_output (b, hidden: the
        class token after post_layernorm) and, with output_hidden_states, hidden_states (the embeddings after
        pre_layrnorm, then every layer's output: num_hidden_layers + 1 entries)."""
        states = self._states(pixel_values, self.config.num_hidden_layers)
        out = {"last_hidden_state": states[-1], "pooler_output": self.vision_model.post_layernorm(states[-1][:, 0, :])}
        if output_hidden_states:
            out["hidden_states"] = tuple(states)
        return out

    def penultimate(self, pixel_values):
        """hidden_states[-2] (b, tokens, hidden), what Wan's DiT reads, without running the last layer."""
        return self._states(pixel_values, self.config.num_hidden_layers - 1)[-1]


def vision_tower(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The vision tower's tensors under the hub's names (`vision_model.` + name). transformers 4.x, which wrote the
    Wan I2V checkpoint, keeps that prefix; transformers 5 saves a CLIPVisionModel without it; a whole CLIP's
    checkpoint also holds the text tower and projections, which are left out."""
    out = {}
    for name, array in arrays.items():
        if name.split(".", 1)[0] in TOWER_PARTS:
            name = PREFIX + name
        if name.startswith(PREFIX) and name not in UNUSED_BUFFERS:
            out[name] = array
    return out


def encode_images(encoder: CLIPVisionModel, pixel_values: np.ndarray, dtype: Any = None) -> Any:
    """Wan's image tokens (b, tokens, hidden) of processed pixels (b, 3, size, size), without gradients; cast to
    `dtype` (the DiT's) when given."""
    with autograd.no_grad():
        parameter = next(iter(dict(encoder.named_parameters()).values()))
        tokens = encoder.penultimate(tensors.cast(tensors.from_numpy(pixel_values), parameter.dtype))
    return tokens if dtype is None else tensors.cast(tokens, dtype)
