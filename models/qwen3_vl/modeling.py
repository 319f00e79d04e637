"""Qwen3-VL written once against the portable API (`mmrun.backend`): PyTorch and MindSpore. The MoE variant
(config.text.moe) is this model with sparse decoder MLPs from models/qwen3_vl/moe.py.

Equal to transformers' Qwen3VLForConditionalGeneration (fp32 logits, loss and gradients within 1e-5,
tests/models/test_qwen3_vl_vs_transformers.py), with parameter names equal to its checkpoint keys:

    model.visual.patch_embed.proj.{weight (D, 3*2*16*16): the Conv3d kernel flattened, bias}
    model.visual.pos_embed.weight                     learned positions, a square grid resampled per image
    model.visual.blocks.N.{norm1,norm2,attn.qkv,attn.proj,mlp.linear_fc1,mlp.linear_fc2}
    model.visual.merger.{norm,linear_fc1,linear_fc2}, model.visual.deepstack_merger_list.K.{same}
    model.language_model.embed_tokens.weight, model.language_model.layers.N.{input_layernorm,
        self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, post_attention_layernorm, mlp.{gate,up,down}_proj},
    model.language_model.norm.weight, lm_head.weight (only when tie_word_embeddings is False)

What Qwen3-VL adds to Qwen2-VL, and where it lives here:
- ViT: a learned position table (num_position_embeddings = side x side) bilinearly resampled
  (align_corners) to each image's grid, four taps per patch, computed on the host (`position_taps`);
  patch-embedding bias; LayerNorm blocks with a gelu-tanh MLP; the same 2-D rotary as Qwen2-VL.
- DeepStack: the outputs of blocks `deepstack_visual_indexes` each go through their own merger (LayerNorm
  after the 2x2 shuffle) and are ADDED to the hidden states of the vision tokens after decoder layers
  0, 1, 2, ... (`deepstack_add`).
- Text: Qwen3 decoder (explicit head_dim, RMSNorm on each head of q and k, optional attention bias) with
  interleaved M-RoPE (`transformer_blocks.interleaved_multimodal_rotary`).
Shared with Qwen2-VL (imported, not copied): the ViT attention, rotary tables and host-side layout, the
vision-token merge (`merge_vision`: one gather), the loss (`causal_lm_loss`), the M-RoPE position rule
(`get_rope_index`, with each video frame its own grid, as Qwen3-VL's timestamps separate frames).
"""
from __future__ import annotations

import functools
from typing import Any, Mapping

import numpy as np

from mmrun.backend import nn, ops, tensors
from mmrun.data.multimodal.rope_index import get_rope_index, per_frame_grids
from mmrun.models.vlm import vision_layout
from mmrun.models.vlm.blocks import (VisionAttention, VisionPatchEmbed, causal_lm_loss, freeze_parts, host_array,
                                     merge_vision, place_fixed_features, rotary_of_positions, vision_rotary)
from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig, TextConfig, VisionConfig
from mmrun.models.qwen3_vl.moe import add_aux_loss  # at the top: mindspore.jit parses no import in forward
from mmrun.models.transformer_blocks import (GQASelfAttention, SwiGLUMLP, activation,
                                             interleaved_multimodal_rotary, rotary_inv_freq)

# The three parts `freeze` switches, by parameter-name prefix (MindSpeed-MM's names for them). MindSpeed-MM's
# Qwen3-VL ViT keeps its learned positions and DeepStack layers trainable when the encoder is frozen
# (qwen3vl_vit_model.py, unfreeze_param_names): so does `freeze` here.
VISION_PROJECTOR_PREFIX = "model.visual.merger."
VISION_ENCODER_PREFIX = "model.visual."
NEVER_FROZEN_PREFIXES = ("model.visual.pos_embed.", "model.visual.deepstack_merger_list.")


# ------------------------------------------------------------------------------------------ vision

class Qwen3VisionPatchEmbed(VisionPatchEmbed):
    """Qwen2-VL's patch Linear (the Conv3d kernel flattened) with the bias Qwen3-VL's Conv3d has."""

    def __init__(self, config: VisionConfig) -> None:
        nn.Module.__init__(self)
        self.proj = nn.Linear(config.patch_dim, config.hidden_size, bias=True)


class Qwen3VisionMLP(nn.Module):
    """linear_fc2(act(linear_fc1(x))), both with bias."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.linear_fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = activation(config.hidden_act)

    def forward(self, x):
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class Qwen3VisionBlock(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=1e-6)
        self.attn = VisionAttention(config)
        self.mlp = Qwen3VisionMLP(config)

    def forward(self, x, cos, sin, cu_seqlens: np.ndarray):
        x = x + self.attn(self.norm1(x), cos, sin, cu_seqlens)
        return x + self.mlp(self.norm2(x))


class Qwen3PatchMerger(nn.Module):
    """Each 2x2 group of patches as one (4*D) vector -> linear_fc1 -> GELU -> linear_fc2 (text hidden). The
    main merger normalises each patch before the shuffle (norm over D), the DeepStack mergers after it (4*D)."""

    def __init__(self, config: VisionConfig, postshuffle_norm: bool) -> None:
        super().__init__()
        self.merged_size = config.hidden_size * config.spatial_merge_size ** 2
        self.postshuffle_norm = postshuffle_norm
        self.norm = nn.LayerNorm(self.merged_size if postshuffle_norm else config.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.merged_size, self.merged_size)
        self.linear_fc2 = nn.Linear(self.merged_size, config.out_hidden_size)

    def forward(self, x):
        if self.postshuffle_norm:
            x = self.norm(ops.reshape(x, (-1, self.merged_size)))
        else:
            x = ops.reshape(self.norm(x), (-1, self.merged_size))
        return self.linear_fc2(ops.gelu(self.linear_fc1(x)))


def position_taps(grid: np.ndarray, side: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear resampling (align_corners) of the side x side learned position table to each image's (h, w)
    grid: (patches, 4) int64 rows of the table and (patches, 4) float32 weights, patches in 2x2-merge order and
    repeated per frame. transformers' get_vision_interpolation_indices_and_weights(mode="bilinear",
    align_corners=True), in the same float32 operations."""
    indices, weights = [], []
    positions = vision_layout.rotary_position_ids(grid, merge)  # (row, column) per patch, same order
    counts = vision_layout.patch_counts(grid)
    heights, widths = np.repeat(grid[:, 1], counts), np.repeat(grid[:, 2], counts)
    axis = []
    for coordinate, size in ((positions[:, 0], heights), (positions[:, 1], widths)):
        source = (coordinate.astype(np.float32) * np.float32(side - 1)
                  / np.maximum(size - 1, 1).astype(np.float32))
        floor = np.floor(source)
        taps = np.clip(floor.astype(np.int64)[:, None] + np.arange(2), 0, side - 1)
        distance = np.abs((source[:, None] - floor[:, None]) - np.arange(2, dtype=np.float32))
        axis.append((taps, np.maximum(np.float32(1) - distance, np.float32(0)).astype(np.float32)))
    (h_taps, h_weights), (w_taps, w_weights) = axis
    indices = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
    weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4).astype(np.float32)
    return indices, weights


class Qwen3VisionTransformer(nn.Module):
    """The ViT + mergers: forward(pixel_values (patches, 1536), grid (n, 3) numpy) -> (features (patches / 4,
    text hidden), [DeepStack features, one per deepstack_visual_indexes entry, same shape])."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = Qwen3VisionPatchEmbed(config)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, config.hidden_size)
        self.blocks = nn.ModuleList([Qwen3VisionBlock(config) for _ in range(config.depth)])
        self.merger = Qwen3PatchMerger(config, postshuffle_norm=False)
        self.deepstack_merger_list = nn.ModuleList([Qwen3PatchMerger(config, postshuffle_norm=True)
                                                    for _ in config.deepstack_visual_indexes])
        self.inv_freq = rotary_inv_freq(config.head_dim // 2, config.rope_theta)  # numpy: no buffers in the API

    def forward(self, pixel_values, grid: np.ndarray):
        return vision_forward(self.config, self.inv_freq, self.patch_embed, self.pos_embed.weight, self.blocks,
                              self.merger, self.deepstack_merger_list, pixel_values, grid)


def vision_forward(config: VisionConfig, inv_freq: np.ndarray, patch_embed: Any, pos_table: Any, blocks: Any,
                   merger: Any, deepstack_mergers: Any, pixel_values: Any, grid: np.ndarray) -> tuple[Any, list]:
    """The ViT + mergers' forward around its modules (this model's, or a tensor-parallel ViT's with the same calls:
    patch_embed(pixels), block(x, cos, sin, cu_seqlens), merger(x), deepstack_mergers[k](x)); pos_table is the
    learned position table (side*side, D). -> (merged features, [DeepStack features, one per index])."""
    merge = config.spatial_merge_size
    total = int(vision_layout.patch_counts(grid).sum())
    if pixel_values.shape[0] != total or pixel_values.shape[-1] != config.patch_dim:
        raise ValueError(f"pixel_values {tuple(pixel_values.shape)} do not fit grid_thw {grid.tolist()}: expected "
                         f"({total}, {config.patch_dim}); pass the image processor's pixel_values with its grid")
    indices, weights, positions, segments = host_layout(grid, config.num_grid_per_side, merge)
    cos, sin = vision_rotary(positions, inv_freq)
    return vision_blocks(config, patch_embed, pos_table, blocks, merger, deepstack_mergers, pixel_values,
                         tensors.from_numpy(indices), tensors.from_numpy(weights), cos, sin, segments.copy())


def host_layout(grid: np.ndarray, side: int, merge: int) -> tuple[np.ndarray, ...]:
    """vision_forward's host arrays of a grid: position_taps' (indices, weights), the rotary (row, column) ids and
    the frames' cu_seqlens; kept per grid (read-only), as the same image sizes recur (a text-only training
    batch's blank image on every step)."""
    grid = np.ascontiguousarray(grid, dtype=np.int64)
    return _host_layout(grid.tobytes(), grid.shape[0], side, merge)


@functools.lru_cache(maxsize=64)
def _host_layout(grid_bytes: bytes, rows: int, side: int, merge: int) -> tuple[np.ndarray, ...]:
    grid = np.frombuffer(grid_bytes, dtype=np.int64).reshape(rows, 3)
    out = (*position_taps(grid, side, merge), vision_layout.rotary_position_ids(grid, merge),
           vision_layout.frame_cu_seqlens(grid))
    for array in out:
        array.setflags(write=False)
    return out


def vision_blocks(config: VisionConfig, patch_embed: Any, pos_table: Any, blocks: Any, merger: Any,
                  deepstack_mergers: Any, pixel_values: Any, tap_indices: Any, tap_weights: Any, cos: Any, sin: Any,
                  segments: Any) -> tuple[Any, list]:
    """vision_forward after the host layout: the position taps (patches, 4) as device tensors, the rotary tables,
    and the attention segments (host boundaries, or a fixed-shape batch's device segment ids)."""
    total = pixel_values.shape[0]
    x = patch_embed(pixel_values)
    taps = ops.reshape(ops.embedding(ops.reshape(tap_indices, (-1,)), pos_table), (total, 4, -1))
    # fp32 weights, as transformers' (a bf16 table's taps are promoted, summed in fp32, then cast back)
    if taps.dtype != tensors.float32:
        taps = tensors.cast(taps, "float32")
    if tap_weights.dtype != tensors.float32:  # a bf16 run's get_batch casts the fixed-shape batch's floats
        tap_weights = tensors.cast(tap_weights, "float32")
    positions = ops.sum(taps * ops.reshape(tap_weights, (total, 4, 1)), dim=1)
    x = x + tensors.cast(positions, x.dtype)
    deepstack = []
    for index, block in enumerate(blocks):
        x = block(x, cos, sin, segments)
        if index in config.deepstack_visual_indexes:
            deepstack.append(deepstack_mergers[config.deepstack_visual_indexes.index(index)](x))
    return merger(x), deepstack


def fixed_vision_inputs(config: Qwen3VLConfig, grid: np.ndarray | None, patches: int) -> dict[str, np.ndarray]:
    """The fixed-shape batch's inputs beyond vision_layout.fixed_layout's (the data path, on the host): the learned
    positions' bilinear taps of the patches (position_taps), padded to `patches` (row 0, weight 0)."""
    grid = np.zeros((0, 3), np.int64) if grid is None else grid
    indices, weights = position_taps(grid, config.vision.num_grid_per_side, config.vision.spatial_merge_size)
    pad = patches - indices.shape[0]
    return {"pixel_tap_indices": np.concatenate([indices, np.zeros((pad, 4), np.int64)]),
            "pixel_tap_weights": np.concatenate([weights, np.zeros((pad, 4), np.float32)])}


# ------------------------------------------------------------------------------------------ text

class Qwen3DecoderLayer(nn.Module):
    """One decoder layer; `index` picks, for the MoE variant, a sparse block (models/qwen3_vl/moe.py) as its mlp."""

    def __init__(self, config: TextConfig, index: int = 0) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = GQASelfAttention(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                                          config.attention_dropout, qkv_bias=config.attention_bias,
                                          head_dim=config.head_dim, qk_norm_eps=config.rms_norm_eps,
                                          o_bias=config.attention_bias)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.sparse = config.moe is not None and config.moe.is_sparse(index)
        if self.sparse:
            from mmrun.models.qwen3_vl.moe import SparseMoeBlock
            self.mlp = SparseMoeBlock(config)
        else:
            self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size, config.hidden_act)

    def forward(self, x, cos, sin, cache=None, router_logits=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        hidden = self.post_attention_layernorm(x)
        return x + (self.mlp(hidden, router_logits) if self.sparse else self.mlp(hidden))


class Qwen3TextModel(nn.Module):
    """embed_tokens, decoder layers with interleaved M-RoPE and DeepStack, final norm.
    forward(embeds (B, S, H), position_ids (3, B, S), deepstack=None, cache=None) where deepstack is (index,
    tables) from `deepstack_index`: after layer i < len(tables), the vision rows get tables[i] added; cache is
    generation's KV cache (vlm.generation.KVCache) or None (training); router_logits, a list the MoE
    variant's sparse layers append their router logits to (for the load-balancing loss), or None."""

    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Qwen3DecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.inv_freq = rotary_inv_freq(config.head_dim, config.rope_theta)

    def forward(self, embeds, position_ids, deepstack=None, cache=None, router_logits=None):
        cos, sin = interleaved_multimodal_rotary(position_ids, self.inv_freq, self.config.mrope_section, embeds.dtype)
        x = embeds
        for index, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if cache is None else cache.layer(index), router_logits)
            if deepstack is not None and index < len(deepstack[1]):
                x = deepstack_add(x, deepstack[0], deepstack[1][index])
        return self.norm(x)


def deepstack_index(config: Qwen3VLConfig, input_ids, image_features: int | None):
    """(B*S,) int64 on the device: 0 for a text row, 1 + k for the k-th vision feature (images first, then
    videos after the `image_features` image rows; None: as many as image tokens, counted on the device, for a
    fixed-shape batch): the rows of [zero row; features] each position adds."""
    batch, seq = input_ids.shape
    ids = ops.reshape(input_ids, (batch * seq,))
    is_image = tensors.cast(ids == config.image_token_id, "int64")
    is_video = tensors.cast(ids == config.video_token_id, "int64")
    if image_features is None:
        image_features = ops.sum(is_image)
    return is_image * ops.cumsum(is_image, 0) + is_video * (image_features + ops.cumsum(is_video, 0))


def deepstack_add(hidden, index, features):
    """hidden (B, S, H) with features[k] added to the k-th vision row, by one gather (text rows add zero)."""
    return hidden + deepstack_rows(index, features, hidden)


def deepstack_rows(index, features, like):
    """(B, S, H) of like's shape and dtype: features[k] on the k-th vision row, zero on text rows (one gather)."""
    batch, seq, size = like.shape
    table = ops.cat([ops.zeros((1, size), dtype=like.dtype, like=like),
                     tensors.cast(features, like.dtype) if features.dtype != like.dtype else features], dim=0)
    return ops.reshape(ops.embedding(index, table), (batch, seq, size))


class Qwen3VLModel(nn.Module):
    """`model.visual` and `model.language_model`: the names transformers' checkpoints use."""

    def __init__(self, config: Qwen3VLConfig) -> None:
        super().__init__()
        self.visual = Qwen3VisionTransformer(config.vision)
        self.language_model = Qwen3TextModel(config.text)


# ------------------------------------------------------------------------------------------ whole model

class Qwen3VLForConditionalGeneration(nn.Module):
    """Dense Qwen3-VL for training: forward returns logits and the loss, as mmrun's Qwen2-VL does.

    forward(input_ids (B, S), attention_mask=None, labels=None, pixel_values=None (patches, 1536),
            image_grid_thw=None (images, 3), pixel_values_videos=None, video_grid_thw=None, position_ids=None
            (3, B, S), calculate_per_token_loss=False, **ignored) -> {"logits": (B, S, vocab), "loss_dict"}

    loss_dict as Qwen2VLForConditionalGeneration's (models/qwen2_vl/modeling.py): {} without labels, else
    the shifted fp32 cross-entropy mean (or sum and num_tokens with calculate_per_token_loss).
    position_ids: when None, from `get_rope_index` on the host. Attention is causal, padding on the right.
    """

    # the layer loops models/recompute.py marks
    recompute_layers = {"vision_encoder": "model.visual.blocks", "text_decoder": "model.language_model.layers"}

    # merge_vision's blank_on_one_process: an engine whose optimizer skips a parameter without a gradient sets it
    # (engines/torch/fsdp2: torch's AdamW), so that one process keeps the blank ViT pass of a text-only batch
    blank_vision_on_one_process = False

    def __init__(self, config: Qwen3VLConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Qwen3VLModel(config)
        self.lm_head = (None if config.tie_word_embeddings
                        else nn.Linear(config.text.hidden_size, config.text.vocab_size, bias=False))

    def forward(self, input_ids, attention_mask=None, labels=None, pixel_values=None, image_grid_thw=None,
                pixel_values_videos=None, video_grid_thw=None, position_ids=None,
                calculate_per_token_loss: bool = False, pixel_segment_ids=None, pixel_position_ids=None,
                pixel_tap_indices=None, pixel_tap_weights=None, **ignored):
        image_grid, video_grid = vision_layout.grid_array(image_grid_thw), vision_layout.grid_array(video_grid_thw)
        text = self.model.language_model
        if pixel_segment_ids is not None:  # a fixed-shape batch (fixed_layout, fixed_vision_inputs): no host reads
            embeds, injection = self.embed_fixed(input_ids, pixel_values, pixel_segment_ids, pixel_position_ids,
                                                 pixel_tap_indices, pixel_tap_weights)
        else:
            embeds, injection = self.embed(input_ids, pixel_values, image_grid, pixel_values_videos, video_grid)
        if position_ids is None:
            position_ids = tensors.from_numpy(rope_index(self.config, input_ids, image_grid, video_grid,
                                                         attention_mask)[0])
        moe = self.config.text.moe
        router_logits = [] if labels is not None and moe is not None and moe.output_router_logits else None
        hidden = text(embeds, position_ids, injection, router_logits=router_logits)
        weight = text.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = ops.linear(hidden, weight)
        loss_dict = {} if labels is None else causal_lm_loss(logits, labels, calculate_per_token_loss)
        if router_logits:  # the MoE variant's load-balancing loss, as transformers adds it
            loss_dict = add_aux_loss(loss_dict, router_logits, moe, attention_mask)
        return {"logits": logits, "loss_dict": loss_dict}

    def embed(self, input_ids, pixel_values, image_grid, pixel_values_videos, video_grid):
        """(embeds (B, S, H) with the vision features in place, DeepStack's (index, tables) or None): the
        text decoder's inputs, for training and for generation's prompt (grids as numpy)."""
        text = self.model.language_model
        deepstack: list = []

        def visual(pixels, grid):  # merge_vision's ViT call: keep the DeepStack features beside the merged ones
            merged, stacked = self.model.visual(pixels, grid)
            deepstack.extend(stacked)
            return merged

        embeds = merge_vision(self.config, visual, self.training, input_ids, text.embed_tokens(input_ids), pixel_values,
                              image_grid, pixel_values_videos, video_grid, self.blank_vision_on_one_process)
        injection = None
        if deepstack and (pixel_values is not None or pixel_values_videos is not None):
            unit = self.config.vision.spatial_merge_size ** 2
            images = 0 if pixel_values is None else int(vision_layout.patch_counts(image_grid).sum()) // unit
            injection = (deepstack_index(self.config, input_ids, images), deepstack)
        elif deepstack:  # merge_vision's blank ViT run: its DeepStack mergers count zero times too, so that they
            # have gradients (zeros) on every rank, as the ViT has: DDP and FSDP2 then reduce the same tensors
            embeds = embeds + tensors.cast(sum(ops.sum(f) for f in deepstack), embeds.dtype) * 0.0
        return embeds, injection

    def embed_fixed(self, input_ids, pixel_values, segment_ids, positions, tap_indices, tap_weights):
        """embed for a batch padded to fixed shapes (images then videos; MindSpore's compiled step): the patches
        padded to a bucket with their segment ids, rotary positions and position taps as device tensors, so nothing
        depends on the images' sizes. The data path checked tokens against features; the padding attends only to itself and
        no token takes its features (DeepStack's too): no loss, no gradient."""
        visual = self.model.visual
        cos, sin = rotary_of_positions(positions, visual.inv_freq)
        merged, deepstack = vision_blocks(self.config.vision, visual.patch_embed, visual.pos_embed.weight,
                                          visual.blocks, visual.merger, visual.deepstack_merger_list, pixel_values,
                                          tap_indices, tap_weights, cos, sin, segment_ids)
        embeds = place_fixed_features(self.config, input_ids, self.model.language_model.embed_tokens(input_ids),
                                      merged)
        return embeds, (deepstack_index(self.config, input_ids, None), deepstack) if deepstack else None

    def freeze(self, vision_encoder: bool = True, vision_projector: bool = False, text_decoder: bool = False) -> dict:
        """MindSpeed-MM's model.freeze (defaults: ViT frozen, merger and LLM trained); returns {part: number of
        parameters frozen}. The ViT's learned positions and DeepStack mergers always train, as there."""
        return freeze_parts(self, {"vision_encoder": vision_encoder, "vision_projector": vision_projector,
                                   "text_decoder": text_decoder},
                            (VISION_ENCODER_PREFIX, VISION_PROJECTOR_PREFIX), NEVER_FROZEN_PREFIXES)


def rope_index(config: Qwen3VLConfig, input_ids, image_grid, video_grid, attention_mask=None
               ) -> tuple[np.ndarray, np.ndarray]:
    """(position_ids (3, B, S), rope_deltas (B, 1)), numpy int64, on the host. Qwen3-VL separates video frames
    by timestamp text, each frame its own <|vision_start|> block: Qwen2-VL's rule over one (1, h, w) grid per
    frame is Qwen3-VL's."""
    positions, deltas = get_rope_index(
        host_array(input_ids), image_grid, per_frame_grids(video_grid), host_array(attention_mask),
        spatial_merge_size=config.vision.spatial_merge_size, image_token_id=config.image_token_id,
        video_token_id=config.video_token_id, vision_start_token_id=config.vision_start_token_id)
    return np.asarray(positions, dtype=np.int64), np.asarray(deltas, dtype=np.int64)


# ------------------------------------------------------------------------------------------ weights

def load_hf_weights(model: Qwen3VLForConditionalGeneration, arrays: Mapping[str, np.ndarray]) -> None:
    """Load `hf_checkpoint.load_hf_directory`'s arrays (bf16 as uint16 bits) strictly: a missing or unexpected
    name is an error naming it."""
    from mmrun.checkpoint.formats.safetensors import to_float_arrays
    model.load_state_dict(tensors.state_dict_from_numpy(to_float_arrays(arrays)))


def from_pretrained(path: str) -> Qwen3VLForConditionalGeneration:
    """A model built from a Hugging Face Qwen3-VL directory, its weights loaded (fp32 where the checkpoint is
    bf16: cast the model afterwards for mixed precision)."""
    from mmrun.models.qwen3_vl.hf_checkpoint import load_hf_directory
    config, arrays = load_hf_directory(path)
    model = Qwen3VLForConditionalGeneration(config)
    load_hf_weights(model, arrays)
    return model
