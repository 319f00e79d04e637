"""Wan2.1's diffusion transformer written once against the portable API (`mmrun.backend`): PyTorch and MindSpore.

Equal to diffusers' `WanTransformer3DModel` (outputs and parameter gradients within 1e-5 in fp32, text-to-video
and image-to-video; tests/models/test_wan_transformer.py), called with diffusers' argument names and with
parameter names equal to diffusers' state-dict keys on both frameworks, so a diffusers `transformer/`
directory loads by name and `save_pretrained` writes one diffusers loads:

    patch_embedding.{weight (hidden, in, pt, ph, pw), bias}
    condition_embedder.{time_embedder.linear_1, time_embedder.linear_2, time_proj,
                        text_embedder.linear_1, text_embedder.linear_2}
    condition_embedder.image_embedder.{norm1, ff.net.0.proj, ff.net.2, norm2[, pos_embed]}      (i2v)
    blocks.N.{scale_shift_table, attn1.*, attn2.*, norm2 (cross_attn_norm), ffn.net.0.proj, ffn.net.2}
        attnX.{to_q, to_k, to_v, to_out.0, norm_q, norm_k}[attn2: add_k_proj, add_v_proj, norm_added_k]
    norm_out (no weights), proj_out, scale_shift_table

How it differs in form (not in result) from diffusers:
- The patch embedding, a Conv3d whose kernel equals its stride, is a reshape and one matmul with the kernel
  flattened (the same numbers as a Conv3d, one portable op on both frameworks; MindSpore's CPU does have
  ops.conv3d); the parameter keeps the Conv3d's shape and name. As the
  Conv3d does, a frame / row / column remainder that fills no whole patch is dropped.
- The rotary embedding (WanRotaryPosEmbed: the head dim split into frame, row and column parts) is real
  cos/sin of float64 tables computed on the host (no complex dtype: MindSpore), applied to channel pairs.
- Image tokens (i2v) come as their own argument to cross-attention instead of being concatenated before the
  text and cut off again at 512 text tokens, so prompts of any length work.
- The timestep frequencies are exp() rounded from float64 on the host, identical on both frameworks (torch's
  float32 exp is one ulp off for 2 of 128 frequencies at freq_dim 256).
"""
from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from mmrun.backend import nn, ops, tensors
from mmrun.common.atomic_write import remove_stale_temporaries, replace_directory, temporary_name
from mmrun.checkpoint.formats.safetensors import SafetensorsFile, SafetensorsWriter, bf16_bits_to_float32, \
    float32_to_bf16_bits, to_float_arrays
from mmrun.models.wan.configuration import DIFFUSERS_CLASS, WanConfigError, WanTransformerConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "diffusion_pytorch_model.safetensors"
WEIGHTS_INDEX = "diffusion_pytorch_model.safetensors.index.json"
# diffusers' _keys_to_ignore_on_load_unexpected for this model: a norm some older conversions carry.
IGNORED_KEYS = ("norm_added_q",)
SAVE_DTYPES = ("float32", "bfloat16", "float16")
ROPE_THETA = 10000.0
TIME_MAX_PERIOD = 10000


def _float32(x: Any) -> Any:
    return tensors.cast(x, "float32")


def _param(shape: tuple[int, ...], std: float) -> Any:
    """A new parameter drawn N(0, std) from the framework's seeded generator."""
    param = nn.Parameter(tensors.from_numpy(np.zeros(shape, np.float32)))
    nn.normal_(param, 0.0, std)
    return param


def _layer_norm(x: Any, eps: float) -> Any:
    """diffusers' FP32LayerNorm without weights: normalised in fp32, returned in fp32."""
    return ops.layer_norm(_float32(x), (x.shape[-1],), None, None, eps)


def _fp32_layer_norm(norm: Any, x: Any) -> Any:
    """diffusers' FP32LayerNorm with weights (`norm`, an nn.LayerNorm): computed in fp32 (ops.layer_norm upcasts
    fp16/bf16 input and weights), returned in x's dtype."""
    return ops.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


# ------------------------------------------------------------------------------------------ tables (host)

@functools.lru_cache(maxsize=8)
def timestep_frequencies(freq_dim: int) -> np.ndarray:
    """exp(-ln(10000) * i / half) for i < half: diffusers' get_timestep_embedding with
    downscale_freq_shift 0, the exponent in float32 as torch computes it, exp() rounded from float64."""
    half = freq_dim // 2
    exponent = np.float32(-math.log(TIME_MAX_PERIOD)) * np.arange(half, dtype=np.float32) / np.float32(half)
    return np.exp(exponent.astype(np.float64)).astype(np.float32)


@functools.lru_cache(maxsize=4)  # one entry per clip shape in use; a 1.3B 81-frame 480p grid's is 17 MB
def rotary_tables(rope_dims: tuple[int, int, int], max_seq_len: int, grid: tuple[int, int, int]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (frames*rows*cols, head_dim // 2) float32 for a (frames, rows, cols) patch grid, tokens in
    (frame, row, col) order: diffusers' WanRotaryPosEmbed (float64 angles, rounded to float32), one angle per
    channel pair: the frame part's frequencies, then the row's, then the column's."""
    for size in grid:
        if size > max_seq_len:
            raise ValueError(f"a patch grid of {grid} (frames, rows, columns) exceeds rope_max_seq_len {max_seq_len}; "
                             "use smaller clips or a model with a larger rope_max_seq_len")
    parts = []
    for axis, dim in enumerate(rope_dims):
        inv = 1.0 / (ROPE_THETA ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
        angles = np.outer(np.arange(grid[axis], dtype=np.float64), inv)  # (size, dim // 2)
        shape = [1, 1, 1, dim // 2]
        shape[axis] = grid[axis]
        parts.append(np.broadcast_to(angles.reshape(shape), tuple(grid) + (dim // 2,)))
    angles = np.concatenate(parts, axis=-1).reshape(int(np.prod(grid)), -1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rotary(x: Any, cos: Any, sin: Any) -> Any:
    """x (b, s, heads, d) with channel pairs (2i, 2i+1) turned by the angles of cos/sin (1, s, 1, d/2, 1):
    (x1 cos - x2 sin, x1 sin + x2 cos), as diffusers' WanAttnProcessor; the result in x's dtype."""
    b, s, heads, d = x.shape
    x1, x2 = ops.split(ops.reshape(x, (b, s, heads, d // 2, 2)), 1, dim=-1)
    out = ops.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return tensors.cast(ops.reshape(out, (b, s, heads, d)), x.dtype)


# ------------------------------------------------------------------------------------------ layers

class PatchEmbedding3D(nn.Module):
    """Conv3d(in, hidden, kernel = stride = patch) as a matmul: (b, c, f, h, w) -> (b, patches, hidden), patches
    in (frame, row, column) order. `weight` has the Conv3d's shape (hidden, in, pt, ph, pw)."""

    def __init__(self, in_channels: int, hidden: int, patch_size: tuple[int, int, int]) -> None:
        super().__init__()
        self.patch_size = tuple(patch_size)
        fan_in = in_channels * math.prod(patch_size)
        # torch's Conv3d init U(+-1/sqrt(fan_in)) has this variance.
        self.weight = _param((hidden, in_channels) + self.patch_size, 1.0 / math.sqrt(3.0 * fan_in))
        self.bias = _param((hidden,), 1.0 / math.sqrt(3.0 * fan_in))

    def forward(self, x):
        b, c, f, h, w = x.shape
        pt, ph, pw = self.patch_size
        grid = (f // pt, h // ph, w // pw)
        for dim, (size, patch) in enumerate(zip((f, h, w), self.patch_size)):
            if size % patch:  # the Conv3d's stride leaves the remainder out
                x = ops.split(x, [size - size % patch, size % patch], dim=dim + 2)[0]
        x = ops.reshape(x, (b, c, grid[0], pt, grid[1], ph, grid[2], pw))
        x = ops.reshape(ops.permute(x, (0, 2, 4, 6, 1, 3, 5, 7)), (b, math.prod(grid), c * pt * ph * pw))
        if x.dtype != self.weight.dtype:
            x = tensors.cast(x, self.weight.dtype)
        return ops.linear(x, ops.reshape(self.weight, (self.weight.shape[0], -1)), self.bias)


class GELUProjection(nn.Module):
    """gelu(proj(x)): diffusers' GELU activation module (its `proj` Linear)."""

    def __init__(self, dim_in: int, dim_out: int, approximate: str) -> None:
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out)
        self.approximate = approximate

    def forward(self, x):
        return ops.gelu(self.proj(x), approximate=self.approximate)


class FeedForward(nn.Module):
    """diffusers' FeedForward with a GELU: net.0 (proj + gelu), net.1 (dropout 0), net.2 (Linear)."""

    def __init__(self, dim: int, inner_dim: int, dim_out: int, approximate: str) -> None:
        super().__init__()
        self.net = nn.ModuleList([GELUProjection(dim, inner_dim, approximate), nn.Dropout(0.0),
                                  nn.Linear(inner_dim, dim_out)])

    def forward(self, x):
        for layer in self.net:
            x = layer(x)
        return x


class TwoLayerMLP(nn.Module):
    """linear_2(act(linear_1(x))): diffusers' TimestepEmbedding (silu) and PixArtAlphaTextProjection (tanh gelu)."""

    def __init__(self, dim_in: int, dim: int, activation: str) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(dim_in, dim)
        self.linear_2 = nn.Linear(dim, dim)
        self.activation = activation

    def forward(self, x):
        x = self.linear_1(x)
        x = ops.silu(x) if self.activation == "silu" else ops.gelu(x, approximate="tanh")
        return self.linear_2(x)


class WanImageEmbedding(nn.Module):
    """CLIP image tokens (b, 257, image_dim) -> (b, 257, hidden): LayerNorm, GELU MLP, LayerNorm (both norms
    computed in fp32, eps 1e-5: diffusers' FP32LayerNorm defaults); flf2v adds learned positions first."""

    def __init__(self, in_features: int, out_features: int, pos_embed_seq_len: int | None) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(in_features, eps=1e-5)
        self.ff = FeedForward(in_features, in_features, out_features, approximate="none")
        self.norm2 = nn.LayerNorm(out_features, eps=1e-5)
        self.pos_embed = None
        if pos_embed_seq_len is not None:
            self.pos_embed = nn.Parameter(tensors.from_numpy(np.zeros((1, pos_embed_seq_len, in_features), np.float32)))

    def forward(self, x):
        if self.pos_embed is not None:  # first and last frame: two images' tokens as one sequence
            b, seq, dim = x.shape
            x = ops.reshape(x, (-1, 2 * seq, dim)) + self.pos_embed
        return _fp32_layer_norm(self.norm2, self.ff(_fp32_layer_norm(self.norm1, x)))


class WanTimeTextImageEmbedding(nn.Module):
    """Timestep -> (temb, the six modulation vectors); prompt embeddings -> hidden; CLIP tokens -> hidden."""

    def __init__(self, config: WanTransformerConfig) -> None:
        super().__init__()
        dim = config.inner_dim
        self.freq_dim = config.freq_dim
        self.time_embedder = TwoLayerMLP(config.freq_dim, dim, "silu")
        self.time_proj = nn.Linear(dim, 6 * dim)
        self.text_embedder = TwoLayerMLP(config.text_dim, dim, "gelu_tanh")
        self.image_embedder = None
        if config.image_dim is not None:
            self.image_embedder = WanImageEmbedding(config.image_dim, dim, config.pos_embed_seq_len)

    def forward(self, timestep, encoder_hidden_states, encoder_hidden_states_image=None):
        b = timestep.shape[0]
        freqs = timestep_frequencies(self.freq_dim)
        angles = ops.reshape(_float32(timestep), (b, 1)) * ops.reshape(tensors.from_numpy(freqs), (1, -1))
        sinusoid = ops.cat([ops.cos(angles), ops.sin(angles)], dim=-1)  # flip_sin_to_cos: cos first
        weight = self.time_embedder.linear_1.weight
        temb = self.time_embedder(sinusoid if weight.dtype == sinusoid.dtype else tensors.cast(sinusoid, weight.dtype))
        temb = tensors.cast(temb, encoder_hidden_states.dtype)
        timestep_proj = self.time_proj(ops.silu(temb))
        context = self.text_embedder(encoder_hidden_states)
        image = None
        if encoder_hidden_states_image is not None:
            image = self.image_embedder(encoder_hidden_states_image)
        return temb, ops.reshape(timestep_proj, (b, 6, -1)), context, image


class WanAttention(nn.Module):
    """Multi-head attention with RMSNorm over all heads' queries and keys (diffusers' WanAttention):
    self-attention with rotary positions, or cross-attention to the prompt (plus, in i2v, a second
    attention to the image tokens through add_k_proj/add_v_proj, added to the first)."""

    def __init__(self, dim: int, heads: int, head_dim: int, eps: float, added_kv_proj_dim: int | None = None) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])  # diffusers' to_out.1 is a dropout of 0
        self.norm_q = nn.RMSNorm(inner, eps=eps)
        self.norm_k = nn.RMSNorm(inner, eps=eps)
        self.add_k_proj = self.add_v_proj = self.norm_added_k = None
        if added_kv_proj_dim is not None:
            self.add_k_proj = nn.Linear(added_kv_proj_dim, inner)
            self.add_v_proj = nn.Linear(added_kv_proj_dim, inner)
            self.norm_added_k = nn.RMSNorm(inner, eps=eps)

    def _heads(self, x):
        """(b, s, inner) -> (b, s, heads, head_dim)."""
        return ops.reshape(x, (x.shape[0], x.shape[1], self.heads, self.head_dim))

    def _attend(self, q, k, v):
        """q, k, v (b, s, heads, d) -> (b, s_q, heads * d)."""
        y = ops.scaled_dot_product_attention(ops.transpose(q, 1, 2), ops.transpose(k, 1, 2), ops.transpose(v, 1, 2))
        y = ops.transpose(y, 1, 2)
        return ops.reshape(y, (y.shape[0], y.shape[1], self.heads * self.head_dim))

    def forward(self, x, context=None, cos=None, sin=None, context_image=None):
        source = x if context is None else context
        q = self._heads(self.norm_q(self.to_q(x)))
        k = self._heads(self.norm_k(self.to_k(source)))
        v = self._heads(self.to_v(source))
        if cos is not None:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = self._attend(q, k, v)
        if context_image is not None:
            k_image = self._heads(self.norm_added_k(self.add_k_proj(context_image)))
            y = y + self._attend(q, k_image, self._heads(self.add_v_proj(context_image)))
        return self.to_out[0](y)


class WanTransformerBlock(nn.Module):
    """Self-attention, cross-attention, feed-forward; the first and last modulated by the timestep (shift,
    scale, gate from scale_shift_table + temb), normalisation and residuals in fp32 as diffusers does."""

    def __init__(self, config: WanTransformerConfig) -> None:
        super().__init__()
        dim, heads = config.inner_dim, config.num_attention_heads
        self.eps = config.eps
        self.attn1 = WanAttention(dim, heads, config.attention_head_dim, config.eps)
        self.attn2 = WanAttention(dim, heads, config.attention_head_dim, config.eps, config.added_kv_proj_dim)
        self.norm2 = nn.LayerNorm(dim, eps=config.eps) if config.cross_attn_norm else None
        self.ffn = FeedForward(dim, config.ffn_dim, dim, approximate="tanh")
        self.scale_shift_table = _param((1, 6, dim), 1.0 / math.sqrt(dim))

    def forward(self, x, context, context_image, timestep_proj, cos, sin):
        dtype = x.dtype
        shift, scale, gate, c_shift, c_scale, c_gate = ops.split(self.scale_shift_table + _float32(timestep_proj),
                                                                 1, dim=1)
        h = tensors.cast(_layer_norm(x, self.eps) * (1.0 + scale) + shift, dtype)
        x = tensors.cast(_float32(x) + self.attn1(h, None, cos, sin) * gate, dtype)
        h = x if self.norm2 is None else _fp32_layer_norm(self.norm2, x)
        x = x + self.attn2(h, context, None, None, context_image)
        h = tensors.cast(_layer_norm(x, self.eps) * (1.0 + c_scale) + c_shift, dtype)
        return tensors.cast(_float32(x) + _float32(self.ffn(h)) * c_gate, dtype)


# ------------------------------------------------------------------------------------------ the model

class WanTransformer3DModel(nn.Module):
    """Wan2.1's DiT. forward(hidden_states (b, in_channels, f, h, w), timestep (b,), encoder_hidden_states
    (b, L, text_dim), encoder_hidden_states_image (b, 257, image_dim) for i2v) -> (b, out_channels, f, h, w)
    (the latent's size cut down to whole patches, as diffusers' Conv3d does)."""

    # the layer loops models/recompute.py marks
    recompute_layers = {"predictor": "blocks"}

    def __init__(self, config: WanTransformerConfig) -> None:
        super().__init__()
        if not isinstance(config, WanTransformerConfig):
            raise TypeError(f"WanTransformer3DModel takes a WanTransformerConfig, not {type(config).__name__}; "
                            "build one with WanTransformerConfig.from_diffusers(...) or from_mindspeed(...)")
        self.config = config
        dim = config.inner_dim
        self.patch_embedding = PatchEmbedding3D(config.in_channels, dim, config.patch_size)
        self.condition_embedder = WanTimeTextImageEmbedding(config)
        self.blocks = nn.ModuleList([WanTransformerBlock(config) for _ in range(config.num_layers)])
        self.proj_out = nn.Linear(dim, config.out_channels * math.prod(config.patch_size))
        self.scale_shift_table = _param((1, 2, dim), 1.0 / math.sqrt(dim))

    def forward(self, hidden_states, timestep, encoder_hidden_states, encoder_hidden_states_image=None):
        config = self.config
        b, _, f, h, w = hidden_states.shape
        pt, ph, pw = config.patch_size
        grid = (f // pt, h // ph, w // pw)
        if (encoder_hidden_states_image is None) != (config.image_dim is None):
            raise ValueError(f"this Wan transformer is {config.model_type}: "
                             + ("pass encoder_hidden_states_image (the CLIP image tokens)" if config.image_dim
                                else "it takes no encoder_hidden_states_image"))
        if tuple(timestep.shape) != (b,):
            raise ValueError(f"timestep has shape {tuple(timestep.shape)}; pass one timestep per sample, shape ({b},) "
                             "(Wan2.2's per-token timesteps are not supported)")
        if min(grid) == 0:
            raise ValueError(f"hidden_states {tuple(hidden_states.shape)} hold no whole patch of {config.patch_size}")
        cos, sin = rotary_tables(config.rope_dims, config.rope_max_seq_len, grid)
        n, half = cos.shape
        cos = ops.reshape(tensors.from_numpy(cos), (1, n, 1, half, 1))
        sin = ops.reshape(tensors.from_numpy(sin), (1, n, 1, half, 1))

        x = self.patch_embedding(hidden_states)
        temb, timestep_proj, context, context_image = self.condition_embedder(
            timestep, encoder_hidden_states, encoder_hidden_states_image)
        for block in self.blocks:
            x = block(x, context, context_image, timestep_proj, cos, sin)

        shift, scale = ops.split(self.scale_shift_table + ops.reshape(temb, (b, 1, -1)), 1, dim=1)
        x = tensors.cast(_layer_norm(x, config.eps) * (1.0 + scale) + shift, x.dtype)
        x = self.proj_out(x)
        # (b, f*h*w, pt*ph*pw*out) -> (b, out, f*pt, h*ph, w*pw)
        x = ops.reshape(x, (b, grid[0], grid[1], grid[2], pt, ph, pw, -1))
        x = ops.permute(x, (0, 7, 1, 4, 2, 5, 3, 6))
        return ops.reshape(x, (b, x.shape[1], grid[0] * pt, grid[1] * ph, grid[2] * pw))

    # ------------------------------------------------------------------ diffusers directories

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "WanTransformer3DModel":
        """A model built from a diffusers `transformer/` directory (config.json, and
        diffusion_pytorch_model.safetensors or its shards with their index), weights loaded in fp32 (bf16
        and fp16 checkpoints widen exactly; cast the model afterwards for mixed precision)."""
        config = WanTransformerConfig.from_diffusers(path)
        weights = DiffusersWeights(path, config)  # checked before the model is built
        model = cls(config)
        load_diffusers_weights(model, weights)
        return model

    def save_pretrained(self, path: str | os.PathLike, dtype: str | None = None) -> Path:
        """Write config.json and diffusion_pytorch_model.safetensors that diffusers'
        WanTransformer3DModel.from_pretrained loads; `dtype` "float32" | "bfloat16" | "float16" converts the
        weights (None: as they are, bf16 parameters as bf16). The directory is built beside `path` and
        swapped in at once; an existing `path` is replaced only when it is empty or a Wan transformer
        directory itself. Returns the directory."""
        return save_diffusers_directory(path, self.config, self.state_dict(), dtype)


# ------------------------------------------------------------------------------------------ checkpoints

def parameter_shapes(config: WanTransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter name (= diffusers' state-dict key) and shape, without building the model."""
    dim, patch = config.inner_dim, tuple(config.patch_size)
    shapes: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (dim, config.in_channels) + patch, "patch_embedding.bias": (dim,),
        "scale_shift_table": (1, 2, dim),
        "proj_out.weight": (config.out_channels * math.prod(patch), dim),
        "proj_out.bias": (config.out_channels * math.prod(patch),)}

    def linear(name: str, n_in: int, n_out: int) -> None:
        shapes[name + ".weight"], shapes[name + ".bias"] = (n_out, n_in), (n_out,)

    cond = "condition_embedder."
    linear(cond + "time_embedder.linear_1", config.freq_dim, dim)
    linear(cond + "time_embedder.linear_2", dim, dim)
    linear(cond + "time_proj", dim, 6 * dim)
    linear(cond + "text_embedder.linear_1", config.text_dim, dim)
    linear(cond + "text_embedder.linear_2", dim, dim)
    if config.image_dim is not None:
        image = cond + "image_embedder."
        for norm, size in (("norm1", config.image_dim), ("norm2", dim)):
            shapes[f"{image}{norm}.weight"] = shapes[f"{image}{norm}.bias"] = (size,)
        linear(image + "ff.net.0.proj", config.image_dim, config.image_dim)
        linear(image + "ff.net.2", config.image_dim, dim)
        if config.pos_embed_seq_len is not None:
            shapes[image + "pos_embed"] = (1, config.pos_embed_seq_len, config.image_dim)
    for i in range(config.num_layers):
        block = f"blocks.{i}."
        shapes[block + "scale_shift_table"] = (1, 6, dim)
        for attn in ("attn1", "attn2"):
            for proj in ("to_q", "to_k", "to_v", "to_out.0"):
                linear(f"{block}{attn}.{proj}", dim, dim)
            shapes[f"{block}{attn}.norm_q.weight"] = shapes[f"{block}{attn}.norm_k.weight"] = (dim,)
        if config.added_kv_proj_dim is not None:
            linear(block + "attn2.add_k_proj", config.added_kv_proj_dim, dim)
            linear(block + "attn2.add_v_proj", config.added_kv_proj_dim, dim)
            shapes[block + "attn2.norm_added_k.weight"] = (dim,)
        if config.cross_attn_norm:
            shapes[block + "norm2.weight"] = shapes[block + "norm2.bias"] = (dim,)
        linear(block + "ffn.net.0.proj", dim, config.ffn_dim)
        linear(block + "ffn.net.2", config.ffn_dim, dim)
    return shapes


# Wan2.1's own initialisation (its WanModel.init_weights; diffusers and MindSpeed-MM keep torch's defaults), as
# rules on diffusers' parameter names, the first that matches wins: (test, rule).
INIT_RULES: tuple[tuple[str, str], ...] = (
    (r"\.bias$|pos_embed$", "zeros"),
    (r"(^|\.)norm[^.]*\.weight$", "ones"),  # norm_q, norm_k, norm_added_k, the LayerNorms
    (r"scale_shift_table$", "modulation"),  # N(0, 1/dim), as diffusers' constructor draws it
    (r"^proj_out\.weight$", "zeros"),  # Wan's head starts at zero
    (r"\.(time|text)_embedder\.", "normal_0.02"),
    (r"", "xavier_uniform"),  # every other Linear, and the patch embedding's kernel as (hidden, in * patch)
)


def initial_value(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Parameter `name`'s initial value by INIT_RULES, drawn by numpy from (seed, name): the same on every
    framework and whatever the order in which parameters are visited."""
    rule = next(rule for pattern, rule in INIT_RULES if re.search(pattern, name))
    if rule == "zeros":
        return np.zeros(shape, np.float32)
    if rule == "ones":
        return np.ones(shape, np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if rule == "modulation":
        return (rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(np.float32)
    if rule == "normal_0.02":
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)
    fan_out, fan_in = shape[0], int(np.prod(shape[1:]))
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, shape).astype(np.float32)


def initial_state(config: WanTransformerConfig, seed: int) -> dict[str, np.ndarray]:
    """Every parameter's initial value (initial_value), without building the model."""
    return {name: initial_value(name, shape, seed) for name, shape in parameter_shapes(config).items()}


def init_weights(model: WanTransformer3DModel, seed: int) -> None:
    """Wan2.1's initialisation, deterministic and framework-independent (initial_value): PyTorch and MindSpore
    start training from identical weights for the same seed."""
    load_diffusers_weights(model, initial_state(model.config, seed))


def _weight_files(path: Path) -> list[Path]:
    if (path / WEIGHTS_INDEX).is_file():
        try:
            weight_map = json.loads((path / WEIGHTS_INDEX).read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as error:
            raise WanConfigError(f"{path / WEIGHTS_INDEX} is not a safetensors index ({error!r}); restore the "
                                 "file") from None
        return [path / name for name in sorted(set(weight_map.values()))]
    if (path / WEIGHTS_FILE).is_file():
        return [path / WEIGHTS_FILE]
    raise WanConfigError(f"{path} has no {WEIGHTS_FILE} or {WEIGHTS_INDEX}; mmrun reads safetensors weights only "
                         "(re-save the model with diffusers' save_pretrained(safe_serialization=True))")


class DiffusersWeights(Mapping[str, np.ndarray]):
    """A diffusers Wan transformer directory's weights (one file or shards with their index), read lazily one
    tensor at a time (`weights[name]`: float32, bf16 and fp16 widened exactly). The names and shapes are
    checked against `config` from the files' headers alone, before any tensor is read."""

    def __init__(self, path: str | os.PathLike, config: WanTransformerConfig) -> None:
        self.path, self.config = Path(path), config
        expected = parameter_shapes(config)
        self._where: dict[str, SafetensorsFile] = {}
        for file in _weight_files(self.path):
            opened = SafetensorsFile(file)
            self._where.update({name: opened for name in opened if not any(part in name for part in IGNORED_KEYS)})
        missing = sorted(set(expected) - set(self._where))
        unexpected = sorted(set(self._where) - set(expected))
        wrong = sorted(n for n in set(expected) & set(self._where) if self._where[n].shape(n) != expected[n])
        if missing or unexpected or wrong:
            shown = "; ".join(f"{label} {len(keys)}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
                              for label, keys in (("missing", missing), ("unexpected", unexpected),
                                                  ("of another shape", wrong)) if keys)
            raise WanConfigError(f"{self.path} does not hold the weights of its config.json's {config.model_type} "
                                 f"model ({shown}); pass the directory diffusers saved with that config")

    def __getitem__(self, name: str) -> np.ndarray:
        array = to_float_arrays({name: self._where[name][name]})[name]
        return array.astype(np.float32, copy=False)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def read_diffusers_weights(path: str | os.PathLike, config: WanTransformerConfig) -> dict[str, np.ndarray]:
    """{parameter name: float32 array} of a diffusers Wan transformer directory (DiffusersWeights, all read)."""
    return dict(DiffusersWeights(path, config))


def load_diffusers_weights(model: WanTransformer3DModel, weights: Mapping[str, np.ndarray]) -> None:
    """Copy `weights` (every parameter, by name) into the model a block at a time, so memory holds the model
    and one block's arrays, never a second copy of the model."""
    groups: dict[str, list[str]] = {}
    for name in weights:
        groups.setdefault(".".join(name.split(".")[:2]) if name.startswith("blocks.") else "", []).append(name)
    for names in groups.values():
        model.load_state_dict(tensors.state_dict_from_numpy({n: weights[n] for n in names}), strict=False)


def is_diffusers_directory(path: str | os.PathLike) -> bool:
    """True for a directory whose config.json names diffusers' WanTransformer3DModel."""
    try:
        return json.loads((Path(path) / CONFIG_FILE).read_text()).get("_class_name") == DIFFUSERS_CLASS
    except (OSError, ValueError, AttributeError):
        return False


def _stored_dtype(value: Any, dtype: str | None) -> np.dtype:
    """The numpy dtype a parameter is written in: `dtype`'s, or its own (bf16 as uint16 bits, see hf_checkpoint)."""
    name = "bfloat16" if isinstance(value, np.ndarray) and value.dtype == np.uint16 else str(value.dtype).lower()
    if dtype is None:
        dtype = "bfloat16" if "bfloat16" in name else "float16" if "float16" in name else "float32"
    return np.dtype(np.uint16 if dtype == "bfloat16" else dtype)


def _stored(array: np.ndarray, stored: np.dtype) -> np.ndarray:
    if array.dtype == np.uint16:  # bf16 bits given
        array = bf16_bits_to_float32(array)
    if stored == np.uint16:  # bf16 bits, rounded to nearest even
        return float32_to_bf16_bits(array.astype(np.float32, copy=False))
    return array.astype(stored, copy=False)


def save_diffusers_directory(path: str | os.PathLike, config: WanTransformerConfig, state: Mapping[str, Any],
                             dtype: str | None = None) -> Path:
    """config.json + diffusion_pytorch_model.safetensors from a state dict of framework tensors or numpy arrays,
    streamed: each tensor goes to the file as it is converted, so memory holds one at a time. Written into a
    directory beside `path` that is then swapped in at once (common/atomic_write.py)."""
    if dtype is not None and dtype not in SAVE_DTYPES:
        raise WanConfigError(f"save dtype {dtype!r} is not one of {', '.join(SAVE_DTYPES)} (or None: as they are)")
    path = Path(path)
    if path.exists() and not (path.is_dir() and (not any(path.iterdir()) or is_diffusers_directory(path))):
        raise WanConfigError(f"refusing to replace {path}: it exists and is not a diffusers Wan transformer "
                             "directory; name a new directory")
    expected = parameter_shapes(config)
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise WanConfigError(f"the state to save does not fit its config (missing {missing[:3]}, unexpected "
                             f"{unexpected[:3]}); save a state dict of a model built from that config")
    specs = {name: (_stored_dtype(value, dtype), expected[name]) for name, value in state.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    staging = Path(tempfile.mkdtemp(prefix=temporary_name(path), dir=path.parent))
    writer = None
    try:
        (staging / CONFIG_FILE).write_text(json.dumps(config.to_diffusers(), indent=2) + "\n")
        writer = SafetensorsWriter(staging / WEIGHTS_FILE, specs)
        for name, value in state.items():
            array = value if isinstance(value, np.ndarray) else tensors.to_numpy(value)
            writer.write(name, _stored(array, specs[name][0]).reshape(expected[name]))
        writer.close()
        return replace_directory(staging, path)
    except BaseException:
        if writer is not None:
            writer.abort()
        shutil.rmtree(staging, ignore_errors=True)
        raise
