"""Qwen2-VL and Qwen2.5-VL written once against the portable API (`mmrun.backend`): PyTorch and MindSpore.

Equal to transformers' Qwen2VLForConditionalGeneration / Qwen2_5_VLForConditionalGeneration (fp32 logits,
loss and gradients within 1e-5, tests/models/test_qwen2_vl_vs_transformers.py), with parameter names equal
to the Hugging Face hub checkpoint keys on both frameworks:

    visual.patch_embed.proj.weight            (D, 3*2*14*14): the checkpoint's Conv3d kernel, flattened
    visual.blocks.N.{norm1,norm2,attn.qkv,attn.proj,mlp.fc1,mlp.fc2 | mlp.gate_proj,mlp.up_proj,mlp.down_proj}
    visual.merger.{ln_q,mlp.0,mlp.2}
    model.embed_tokens.weight, model.layers.N.{input_layernorm,self_attn.{q,k,v,o}_proj,
        post_attention_layernorm,mlp.{gate,up,down}_proj}, model.norm.weight
    lm_head.weight                            only when tie_word_embeddings is False

How it differs in form (not in result) from transformers:
- The patch embedding is a Linear over the processor's pre-flattened patches (N, 1176): a Conv3d whose
  kernel equals its stride is exactly that matmul (one GEMM, cheaper than a convolution on any device; MindSpore
  2.10's `mint` Conv3d does not run on the CPU, though `ops.conv3d` does).
- ViT attention never crosses images or frames: `ops.varlen_attention` over the segment boundaries
  (no N x N mask); Qwen2.5-VL's windows are segments too.
- Vision features replace the <|image_pad|>/<|video_pad|> embeddings in place by one gather from
  [text embeddings; vision features] with an index built by cumsum on the device (no masked_scatter).
- Text attention is causal only: the data pipeline pads on the right and labels padding -100, so real
  tokens never see padding (logits at padded positions differ from transformers', which masks them).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mmrun.backend import nn, ops, tensors
from mmrun.data.multimodal.rope_index import get_rope_index
from mmrun.models.vlm import vision_layout
from mmrun.models.vlm.blocks import (VisionAttention, VisionPatchEmbed, causal_lm_loss, freeze_parts, host_array,
                                     merge_vision, place_fixed_features, rotary_of_positions, vision_rotary)
from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig, TextConfig, VisionConfig
from mmrun.models.qwen2_vl.mm_layout import MINDSPEED_MM_MODULES
from mmrun.models.transformer_blocks import (GQASelfAttention, SwiGLUMLP, activation,
                                             multimodal_rotary, rotary_inv_freq)


# ------------------------------------------------------------------------------------------ vision


class VisionMLP(nn.Module):
    """fc2(act(fc1(x))): Qwen2-VL's ViT MLP (quick_gelu)."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = activation(config.hidden_act)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _vision_norm(config: VisionConfig, qwen2_5: bool, size: int | None = None):
    """Qwen2-VL's ViT uses LayerNorm, Qwen2.5-VL's RMSNorm; both with eps 1e-6 (fixed in transformers)."""
    size = config.hidden_size if size is None else size
    return nn.RMSNorm(size, eps=1e-6) if qwen2_5 else nn.LayerNorm(size, eps=1e-6)


class VisionBlock(nn.Module):
    def __init__(self, config: VisionConfig, qwen2_5: bool) -> None:
        super().__init__()
        self.norm1 = _vision_norm(config, qwen2_5)
        self.norm2 = _vision_norm(config, qwen2_5)
        self.attn = VisionAttention(config)
        self.mlp = (SwiGLUMLP(config.hidden_size, config.intermediate_size, config.hidden_act, bias=True)
                    if qwen2_5 else VisionMLP(config))

    def forward(self, x, cos, sin, cu_seqlens: np.ndarray):
        x = x + self.attn(self.norm1(x), cos, sin, cu_seqlens)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """ln_q, then each 2x2 group of patches as one (4*D) vector -> mlp.0 -> GELU -> mlp.2 (text hidden)."""

    def __init__(self, config: VisionConfig, qwen2_5: bool) -> None:
        super().__init__()
        self.merged_size = config.hidden_size * config.spatial_merge_size ** 2
        self.ln_q = _vision_norm(config, qwen2_5)
        self.mlp = nn.ModuleList([nn.Linear(self.merged_size, self.merged_size), nn.GELU(),
                                  nn.Linear(self.merged_size, config.out_hidden_size)])

    def forward(self, x):
        x = ops.reshape(self.ln_q(x), (-1, self.merged_size))
        for layer in self.mlp:
            x = layer(x)
        return x


class Qwen2VisionTransformer(nn.Module):
    """The ViT + merger: pixel_values (patches, 1176), grid (n, 3) numpy -> (patches / 4, text hidden), in
    the order of the images and their merged tokens."""

    def __init__(self, config: VisionConfig, qwen2_5: bool) -> None:
        super().__init__()
        self.config, self.qwen2_5 = config, qwen2_5
        self.patch_embed = VisionPatchEmbed(config)
        self.blocks = nn.ModuleList([VisionBlock(config, qwen2_5) for _ in range(config.depth)])
        self.merger = PatchMerger(config, qwen2_5)
        self.inv_freq = rotary_inv_freq(config.head_dim // 2, config.rope_theta)  # numpy: no buffers in the API

    def forward(self, pixel_values, grid: np.ndarray):
        return vision_forward(self.config, self.qwen2_5, self.inv_freq, self.patch_embed, self.blocks, self.merger,
                              pixel_values, grid)


def vision_forward(config: VisionConfig, qwen2_5: bool, inv_freq: np.ndarray, patch_embed: Any, blocks: Any,
                   merger: Any, pixel_values: Any, grid: np.ndarray) -> Any:
    """The ViT + merger's forward around its modules (this model's, or a tensor-parallel ViT's with the same
    calls: patch_embed(pixels), block(x, cos, sin, cu_seqlens), merger(x)): pixel_values (patches, 1176) and
    grid (n, 3) numpy -> (patches / 4, text hidden), in the order of the images and their merged tokens."""
    merge, unit = config.spatial_merge_size, config.spatial_merge_size ** 2
    total = int(vision_layout.patch_counts(grid).sum())
    if pixel_values.shape[0] != total or pixel_values.shape[-1] != config.patch_dim:
        raise ValueError(f"pixel_values {tuple(pixel_values.shape)} do not fit grid_thw {grid.tolist()}: expected "
                         f"({total}, {config.patch_dim}); pass the image processor's pixel_values with its grid_thw")
    x = patch_embed(pixel_values)
    positions = vision_layout.rotary_position_ids(grid, merge)
    frames = vision_layout.frame_cu_seqlens(grid)
    order = windows = None
    if qwen2_5:
        order, windows = vision_layout.window_index(grid, merge, config.window_size, config.patch_size)
        # Regroup the patches window by window (whole 2x2 groups move), positions alike.
        x = ops.reshape(ops.embedding(tensors.from_numpy(order), ops.reshape(x, (total // unit, -1))), (total, -1))
        positions = positions.reshape(total // unit, unit, 2)[order].reshape(total, 2)
    cos, sin = vision_rotary(positions, inv_freq)
    for index, block in enumerate(blocks):
        full = not qwen2_5 or index in config.fullatt_block_indexes
        x = block(x, cos, sin, frames if full else windows)
    merged = merger(x)
    if order is not None:
        merged = ops.embedding(tensors.from_numpy(np.argsort(order)), merged)  # back to image order
    return merged


# ------------------------------------------------------------------------------------------ text

class Qwen2DecoderLayer(nn.Module):
    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = GQASelfAttention(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                                          config.attention_dropout)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size, config.hidden_act)

    def forward(self, x, cos, sin, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2TextModel(nn.Module):
    """embed_tokens, decoder layers with M-RoPE, final norm. forward(embeds (B, S, H), position_ids (3, B, S))."""

    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Qwen2DecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.inv_freq = rotary_inv_freq(config.head_dim, config.rope_theta)

    def forward(self, embeds, position_ids, cache=None):
        """cache: generation's KV cache (generation.KVCache, one LayerCache per layer) or None (training)."""
        cos, sin = multimodal_rotary(position_ids, self.inv_freq, self.config.mrope_section, embeds.dtype)
        x = embeds
        for index, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if cache is None else cache.layer(index))
        return self.norm(x)


# ------------------------------------------------------------------------------------------ whole model

class Qwen2VLForConditionalGeneration(nn.Module):
    """Qwen2-VL / Qwen2.5-VL (config.model_type) for training: forward returns logits and the loss.

    forward(input_ids (B, S), attention_mask=None, labels=None, pixel_values=None (patches, 1176),
            image_grid_thw=None (images, 3), pixel_values_videos=None, video_grid_thw=None,
            second_per_grid_ts=None, position_ids=None (3, B, S), calculate_per_token_loss=False, **ignored)
    -> {"logits": (B, S, vocab), "loss_dict": {...}}

    loss_dict: {} without labels; {"loss": fp32 mean of the shifted cross-entropy over the micro-batch's
    tokens whose next-token label is not -100} by default; with calculate_per_token_loss=True (MindSpeed-MM's
    --calculate-per-token-loss) {"loss": fp32 sum over those tokens, "num_tokens": int64 count of them}.
    The loss is shifted here (token s predicts labels[s + 1]), as transformers' and MindSpeed-MM's.

    position_ids: when None, M-RoPE positions come from `get_rope_index` on the host (the data pipeline
    normally sends them). attention_mask is only read there: attention is causal, padding on the right.
    grid_thw tensors are copied to the host once per call (segment lengths, window layout).
    """

    # the layer loops models/recompute.py marks
    recompute_layers = {"vision_encoder": "visual.blocks", "text_decoder": "model.layers"}
    # MindSpeed-MM's module paths in an FSDP2 file -> ours (engines/fsdp2_config.plan_modules reads it)
    mindspeed_mm_modules = MINDSPEED_MM_MODULES

    # merge_vision's blank_on_one_process: an engine whose optimizer skips a parameter without a gradient sets it
    # (engines/torch/fsdp2: torch's AdamW), so that one process keeps the blank ViT pass of a text-only batch
    blank_vision_on_one_process = False

    def __init__(self, config: Qwen2VLConfig) -> None:
        super().__init__()
        self.config = config
        self.visual = Qwen2VisionTransformer(config.vision, config.is_qwen2_5)
        self.model = Qwen2TextModel(config.text)
        # Tied (Qwen2-VL-2B): the output layer is embed_tokens.weight and there is no lm_head parameter.
        self.lm_head = (None if config.tie_word_embeddings
                        else nn.Linear(config.text.hidden_size, config.text.vocab_size, bias=False))

    # -------------------------------------------------------------------------------- forward

    def forward(self, input_ids, attention_mask=None, labels=None, pixel_values=None, image_grid_thw=None,
                pixel_values_videos=None, video_grid_thw=None, second_per_grid_ts=None, position_ids=None,
                calculate_per_token_loss: bool = False, pixel_segment_ids=None, pixel_position_ids=None,
                pixel_window_ids=None, **ignored):
        embeds = self.model.embed_tokens(input_ids)
        if pixel_segment_ids is not None:  # a fixed-shape batch (vision_layout.fixed_layout): nothing on the host
            embeds = merge_fixed_vision(self.config, self.visual, input_ids, embeds, pixel_values, pixel_segment_ids,
                                        pixel_position_ids, pixel_window_ids)
        else:
            embeds, position_ids = self._merge_grids(input_ids, attention_mask, embeds, pixel_values, image_grid_thw,
                                                     pixel_values_videos, video_grid_thw, second_per_grid_ts,
                                                     position_ids)
        hidden = self.model(embeds, position_ids)
        # lm_head called as a module, not through its weight: FSDP2 (MindSpeed-MM's fsdp2_config.yaml wraps
        # text_decoder.output_layer on its own) gathers a unit's parameters in the unit's forward
        logits = (ops.linear(hidden, self.model.embed_tokens.weight) if self.lm_head is None
                  else self.lm_head(hidden))
        loss_dict = {} if labels is None else causal_lm_loss(logits, labels, calculate_per_token_loss)
        return {"logits": logits, "loss_dict": loss_dict}

    def _merge_grids(self, input_ids, attention_mask, embeds, pixel_values, image_grid_thw, pixel_values_videos,
                     video_grid_thw, second_per_grid_ts, position_ids):
        """merge_vision with the grids read on the host, and the M-RoPE positions when not given."""
        image_grid, video_grid = vision_layout.grid_array(image_grid_thw), vision_layout.grid_array(video_grid_thw)
        embeds = self._merge_vision(input_ids, embeds, pixel_values, image_grid, pixel_values_videos, video_grid)
        if position_ids is None:
            position_ids = self._rope_positions(input_ids, attention_mask, image_grid, video_grid, second_per_grid_ts)
        return embeds, position_ids

    def _merge_vision(self, input_ids, embeds, pixel_values, image_grid, pixel_values_videos, video_grid):
        return merge_vision(self.config, self.visual, self.training, input_ids, embeds, pixel_values, image_grid,
                            pixel_values_videos, video_grid, self.blank_vision_on_one_process)

    def _rope_positions(self, input_ids, attention_mask, image_grid, video_grid, second_per_grid_ts):
        """position_ids (3, B, S) on the device from the data pipeline's get_rope_index (host numpy)."""
        positions, _ = rope_index(self.config, input_ids, image_grid, video_grid, attention_mask, second_per_grid_ts)
        return tensors.from_numpy(np.asarray(positions, dtype=np.int64))

    # -------------------------------------------------------------------------------- training helpers

    def freeze(self, vision_encoder: bool = True, vision_projector: bool = False, text_decoder: bool = False) -> dict:
        """Set which parts train, as MindSpeed-MM's model.freeze (defaults: ViT frozen, merger and LLM trained):
        vision encoder = visual.* except visual.merger.*, projector = visual.merger.*, text decoder =
        model.* and lm_head. A frozen part gets requires_grad False (no gradient, no optimizer state);
        the others requires_grad True. Returns {part: number of parameters} frozen."""
        return freeze_parts(self, {"vision_encoder": vision_encoder, "vision_projector": vision_projector,
                                   "text_decoder": text_decoder})


def rope_index(config: Qwen2VLConfig, input_ids, image_grid, video_grid, attention_mask=None,
               second_per_grid_ts=None) -> tuple[np.ndarray, np.ndarray]:
    """The data pipeline's get_rope_index for this model's config (inputs as tensors or numpy, copied to the
    host): (position_ids (3, B, S), rope_deltas (B, 1)), numpy int64."""
    return get_rope_index(
        host_array(input_ids), image_grid, video_grid, host_array(attention_mask),
        spatial_merge_size=config.vision.spatial_merge_size, image_token_id=config.image_token_id,
        video_token_id=config.video_token_id, vision_start_token_id=config.vision_start_token_id,
        second_per_grid_ts=host_array(second_per_grid_ts),
        tokens_per_second=config.vision.tokens_per_second if config.is_qwen2_5 else None)


def merge_fixed_vision(config: Qwen2VLConfig, visual: Any, input_ids, embeds, pixel_values, segment_ids, positions,
                       window_ids=None):
    """merge_vision for a batch padded to fixed shapes (images then videos): the patches padded to a bucket, their
    per-frame segment ids and rotary positions as device tensors (vision_layout.fixed_layout), and for
    Qwen2.5-VL their window ids (vision_layout.window_segment_ids), so nothing depends on the images' sizes and
    the step compiles once per bucket. The data path checked tokens against features. The padding attends only
    to itself and no token takes its features: no loss, no gradient."""
    vision = fixed_vision_features(visual.patch_embed, visual.blocks, visual.merger, visual.inv_freq, pixel_values,
                                   segment_ids, positions, window_ids, config.vision.fullatt_block_indexes)
    return place_fixed_features(config, input_ids, embeds, vision)


def fixed_vision_features(patch_embed: Any, blocks: Any, merger: Any, inv_freq: np.ndarray, pixel_values,
                          segment_ids, positions, window_ids=None, full_blocks: tuple[int, ...] = ()):
    """The ViT on a fixed-shape batch, from its pieces (this model's, or the tensor-parallel stage's in
    engines/mindspore/parallel/vlm.py): merged features (patches / merge^2, text width). With window_ids
    (Qwen2.5-VL), blocks other than full_blocks attend within windows, in the patches' own order."""
    x = patch_embed(pixel_values)
    cos, sin = rotary_of_positions(positions, inv_freq)
    for index, block in enumerate(blocks):
        x = block(x, cos, sin, segment_ids if window_ids is None or index in full_blocks else window_ids)
    return merger(x)


def fixed_vision_inputs(config: Qwen2VLConfig, grid: np.ndarray | None, patches: int) -> dict[str, np.ndarray]:
    """The fixed-shape batch's inputs beyond vision_layout.fixed_layout's (the data path, on the host): Qwen2.5-VL's
    window ids, nothing for Qwen2-VL."""
    if not config.is_qwen2_5:
        return {}
    vision = config.vision
    return {"pixel_window_ids": vision_layout.window_segment_ids(grid, vision.spatial_merge_size, vision.window_size,
                                                                 vision.patch_size, patches)}


# ------------------------------------------------------------------------------------------ weights


def load_hf_weights(model: Qwen2VLForConditionalGeneration, arrays: Mapping[str, np.ndarray]) -> None:
    """Load `hf_checkpoint.load_hf_directory`'s arrays (mmrun layout, bf16 as uint16 bits) into the model,
    strictly: a missing or unexpected name is an error naming it."""
    from mmrun.checkpoint.formats.safetensors import to_float_arrays
    model.load_state_dict(tensors.state_dict_from_numpy(to_float_arrays(arrays)))


def from_pretrained(path: str) -> Qwen2VLForConditionalGeneration:
    """A model built from a Hugging Face Qwen2-VL / Qwen2.5-VL directory, its weights loaded (fp32 where
    the checkpoint is bf16: cast the model afterwards for mixed precision)."""
    from mmrun.models.qwen2_vl.hf_checkpoint import load_hf_directory
    config, arrays = load_hf_directory(path)
    model = Qwen2VLForConditionalGeneration(config)
    load_hf_weights(model, arrays)
    return model
