"""Qwen3-VL (dense) on MindSpore, tensor-, pipeline- and sequence-parallel: one pipeline stage per process.

The portable model of models/qwen3_vl/modeling.py (the same numerics) on the Qwen2-VL stage's parallel layers
(engines/mindspore/parallel/vlm.py), with MindSpeed-MM's names and shards (models/qwen3_vl/mm_layout.py):

    image_encoder.encoder   patch_embed (Conv3d weight as a matmul, with bias), pos_embed (the learned table,
                            replicated), blocks.layers.N (Qwen2-VL's LayerNorm block: column-parallel qkv per head,
                            row-parallel proj, fc1 column / fc2 row), blocks.layers.K.deepstack_layer (the DeepStack
                            merger of block K: LayerNorm after the 2x2 shuffle, fc1 column / fc2 row)
    image_encoder.projector layernorm, 2x2 merge, encoder.linear_fc1 -> GELU -> encoder.linear_fc2
    text_decoder            Qwen2-VL's decoder with q_layernorm / k_layernorm (RMSNorm over head_dim, applied per
                            head: each TP rank normalises its own heads with the replicated weight), interleaved M-RoPE

DeepStack across stages: the K-th DeepStack feature is added to the vision rows after decoder layer K. Each
feature is put on the sequence (`deepstack_rows`: zero on text rows, [s, b, h] like the hidden states, split over
TP ranks with --sequence-parallel) on the first stage; the features of layers that sit on later stages travel with
the hidden states, concatenated on the last dim ([s, b, h * (1 + carried)]), and their gradients come back the same
way, so the ViT on stage 0 gets the DeepStack gradients of every stage.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from mmrun.backend.mindspore import nn, ops, tensors
from mmrun.backend.mindspore.parallel.cross_entropy import VocabParallelCrossEntropy
from mmrun.backend.mindspore.parallel.groups import ParallelState
from mmrun.backend.mindspore.parallel.mappings import ScatterToSequenceParallelRegion
from mmrun.engines.mindspore.parallel import qwen3_moe, vlm
from mmrun.models.vlm import vision_layout
from mmrun.models.vlm.mm_layout import VLMLayout
from mmrun.models.vlm.blocks import merge_vision
from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig, VisionConfig
from mmrun.models.vlm.blocks import place_fixed_features, rotary_of_positions
from mmrun.models.qwen3_vl.modeling import deepstack_index, deepstack_rows, vision_blocks, vision_forward
from mmrun.models.transformer_blocks import interleaved_multimodal_rotary, rotary_inv_freq


class PatchEmbed(nn.Module):
    """`proj.weight` (D, 1536) and `proj.bias`: the Conv3d (kernel = stride) as one matmul over flattened patches."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.proj = vlm._Weight(config.hidden_size, config.patch_dim)
        self.proj.bias = nn.Parameter(tensors.from_numpy(np.zeros((config.hidden_size,), np.float32)))

    def forward(self, pixel_values):
        weight = self.proj.weight
        return ops.linear(tensors.cast(pixel_values, weight.dtype), weight, self.proj.bias)


class DeepstackProjector(vlm.VisionProjector):
    """A DeepStack merger: the 2x2 shuffle first, then LayerNorm over the merged width, then the projector's MLP."""

    def __init__(self, config: VisionConfig, state: ParallelState) -> None:
        super().__init__(config, state, qwen2_5=False)
        self.layernorm = nn.LayerNorm(self.merged, eps=1e-6)

    def forward(self, x):
        return self.encoder(self.layernorm(ops.reshape(x, (-1, self.merged))))


class VisionLayer(vlm.VisionLayer):
    def __init__(self, config: VisionConfig, state: ParallelState, deepstack: bool) -> None:
        super().__init__(config, state, qwen2_5=False)
        if deepstack:
            self.deepstack_layer = DeepstackProjector(config, state)


class VisionEncoder(nn.Module):
    def __init__(self, config: VisionConfig, state: ParallelState) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.pos_embed = vlm._Weight(config.num_position_embeddings, config.hidden_size)
        self.blocks = nn.Module()
        self.blocks.layers = nn.ModuleList([VisionLayer(config, state, n in config.deepstack_visual_indexes)
                                            for n in range(config.depth)])
        self.inv_freq = rotary_inv_freq(config.head_dim // 2, config.rope_theta)


class ImageEncoder(nn.Module):
    def __init__(self, config: Qwen3VLConfig, state: ParallelState) -> None:
        super().__init__()
        self.encoder = VisionEncoder(config.vision, state)
        self.projector = vlm.VisionProjector(config.vision, state, qwen2_5=False)

    def forward(self, pixel_values, grid: np.ndarray):
        """-> (merged features, [DeepStack features]) as the portable ViT's forward, on these TP modules."""
        encoder, layers = self.encoder, self.encoder.blocks.layers
        mergers = [layers[n].deepstack_layer for n in encoder.config.deepstack_visual_indexes]
        return vision_forward(encoder.config, encoder.inv_freq, encoder.patch_embed, encoder.pos_embed.weight,
                              layers, self.projector, mergers, pixel_values, grid)


def carried_levels(config: Qwen3VLConfig, layout: VLMLayout) -> list[int]:
    """The DeepStack levels (= decoder layer indexes) that sit after the first stage: sent along with the hidden
    states, in level order."""
    first = layout.stage_layers("llm", 0)
    return [k for k in range(len(config.vision.deepstack_visual_indexes)) if k not in first]


class Qwen3VLStage(vlm.Qwen2VLStage):
    """This rank's pipeline stage of Qwen3-VL, its tensor-parallel shard, named as mm_layout names it."""

    def __init__(self, config: Qwen3VLConfig, layout: VLMLayout, state: ParallelState,
                 experts: qwen3_moe.ExpertParallel | None = None) -> None:
        super(vlm.Qwen2VLStage, self).__init__()  # RankState and nn.Module, as Qwen2VLStage's own __init__
        self.config, self.layout, self.state = config, layout, state
        pp_rank = state.pp_rank
        self.hidden_size = config.text.hidden_size
        self.pre_process, self.post_process = state.is_first_stage, state.is_last_stage
        if self.pre_process:
            # The ViT's tokens are the images' (not the text sequence): it runs without sequence parallelism.
            self.image_encoder = ImageEncoder(config, dataclasses.replace(state, sequence_parallel=False))
            if state.sequence_parallel:
                self.scatter = ScatterToSequenceParallelRegion(state.group("tp"))
        self.layers = layout.stage_layers("llm", pp_rank)
        self.text_decoder = vlm.TextDecoder(config, state, len(self.layers))  # QK-norm: vlm.TextAttention
        if config.text.moe is not None:  # Qwen3-VL MoE: the sparse layers' experts over TP x EP (qwen3_moe.py)
            self.experts = experts or qwen3_moe.ExpertParallel.build(1, state)
            qwen3_moe.place_sparse_layers(self, self.experts)
        if self.post_process:
            self.cross_entropy = VocabParallelCrossEntropy(config.text.vocab_size, state)
        self.inv_freq = rotary_inv_freq(config.text.head_dim, config.text.rope_theta)
        self.carried = tuple(carried_levels(config, layout))
        # plain values for mindspore.jit (the fixed-shape stage), as Qwen2VLStage's
        self.sequence_parallel = bool(state.sequence_parallel)
        self.mrope_section = tuple(config.text.mrope_section)
        self.layer_numbers = tuple(self.layers)

    def freeze(self, switches: dict[str, bool]) -> list[str]:
        """As Qwen2VLStage.freeze, but the ViT's learned positions and DeepStack mergers always train (the portable
        model's NEVER_FROZEN_PREFIXES, as MindSpeed-MM's Qwen3-VL)."""
        frozen = super().freeze(switches)
        nn.unfreeze([p for n, p in self.named_parameters()
                     if n.startswith("image_encoder.encoder.pos_embed.") or ".deepstack_layer." in n])
        return frozen

    def parameter_roles(self):
        roles = super().parameter_roles()
        names = {n for n, p in self.named_parameters() if p.requires_grad}
        extra = qwen3_moe.expert_roles(self, names) if self.config.text.moe is not None else {}
        return dataclasses.replace(roles, **extra) if extra else roles

    @property
    def message_size(self) -> int:
        """The last dim of the activations sent between stages: the hidden size, and one per carried level."""
        return self.hidden_size * (1 + len(self.carried))

    def forward(self, input_ids, position_ids, pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw,
                hidden_in=None, labels=None):
        """As Qwen2VLStage.forward, the DeepStack features added after decoder layers 0, 1, ... and the carried ones
        sent on (module docstring)."""
        embedded = (self._embed(input_ids, pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw)
                    if self.pre_process else None)
        return self._decode_levels(embedded, input_ids, position_ids, hidden_in, labels)

    def _decode_levels(self, embedded, input_ids, position_ids, hidden_in, labels):
        """The text decoder of this stage, from the first stage's (embeddings, DeepStack levels) or hidden_in."""
        batch, seq = input_ids.shape
        cos, sin = interleaved_multimodal_rotary(position_ids, self.inv_freq, self.mrope_section, "float32")
        cos, sin = ops.reshape(cos, (batch, 1, seq, -1)), ops.reshape(sin, (batch, 1, seq, -1))
        if self.pre_process:
            x, keys, values = embedded
        else:
            parts = ops.split(hidden_in, self.hidden_size, dim=-1)
            x, keys, values = parts[0], self.carried, parts[1:]
        for layer, index in zip(self.text_decoder.decoder.layers, self.layer_numbers):
            x = layer(x, cos, sin)
            if index in keys:  # DeepStack level `index` (keys: static level numbers, values: their rows)
                x = x + values[keys.index(index)]
        if not self.post_process:
            return ops.cat([x] + [values[keys.index(k)] for k in self.carried], dim=-1) if self.carried else x
        decoder = self.text_decoder
        x = decoder.decoder.final_layernorm(x)
        weight = (decoder.output_layer.weight if decoder.uses_own_output_weight
                  else decoder.embedding.word_embeddings.weight)
        logits, _ = decoder.output_layer(x, weight)  # [s, b, v / tp]
        if labels is None:
            return logits
        return ops.transpose(self.cross_entropy(logits, ops.transpose(labels, 0, 1)), 0, 1)

    def _embed(self, input_ids, pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw):
        """[s, b, h] embeddings with the vision features merged, and {level: [s, b, h] DeepStack rows}, both split
        over the sequence with --sequence-parallel. Without images (a blank ViT run), no DeepStack rows."""
        config = self.config
        image_grid, video_grid = vision_layout.grid_array(image_grid_thw), vision_layout.grid_array(video_grid_thw)
        deepstack: list = []

        def visual(pixels, grid):  # merge_vision's ViT call: keep the DeepStack features beside the merged ones
            merged, stacked = self.image_encoder(pixels, grid)
            deepstack.append(stacked)
            return merged

        x = self.text_decoder.embedding.word_embeddings(input_ids)  # [b, s, h], summed over TP
        x = merge_vision(config, visual, self.training, input_ids, x, pixel_values, image_grid, pixel_values_videos,
                         video_grid)
        levels = {}
        if pixel_values is not None or pixel_values_videos is not None:
            unit = config.vision.spatial_merge_size ** 2
            images = 0 if pixel_values is None else int(vision_layout.patch_counts(image_grid).sum()) // unit
            index = deepstack_index(config, input_ids, images)
            levels = {k: self._sequence(deepstack_rows(index, features, x)) for k, features in enumerate(deepstack[0])}
        elif self.carried:
            # a blank ViT run: its features count zero times, the carried messages hold zeros
            zero = ops.zeros(tuple(x.shape), dtype=x.dtype, like=x)
            levels = {k: self._sequence(zero) for k in self.carried}
        return self._sequence(x), tuple(levels), [levels[k] for k in levels]

    def _sequence(self, rows):
        """[b, s, h] -> [s, b, h], this rank's part of the sequence with --sequence-parallel."""
        rows = ops.transpose(rows, 0, 1)
        return self.scatter(rows) if self.sequence_parallel else rows



class Qwen3VLFixedShapeStage(Qwen3VLStage):
    """Qwen3-VL's stage on batches padded to fixed shapes (models/pretrain_vlm.py fixed_shape_collate: the text to
    --seq-length, the patches to a bucket with their segment ids, rotary positions and learned-position taps,
    models/qwen3_vl/modeling.py fixed_vision_inputs), so ParallelTrainStep compiles it with mindspore.jit, as the
    one-process compiled step (Qwen3VLForConditionalGeneration.embed_fixed): the padding attends only to itself
    and no token takes its features or DeepStack rows."""

    fields = vlm.VLM_FIXED_FIELDS[:5] + ("pixel_tap_indices", "pixel_tap_weights") + vlm.VLM_FIXED_FIELDS[5:]

    def forward(self, input_ids, position_ids, pixel_values, pixel_segment_ids, pixel_position_ids, pixel_tap_indices,
                pixel_tap_weights, hidden_in=None, labels=None):
        embedded = (self._embed_fixed(input_ids, pixel_values, pixel_segment_ids, pixel_position_ids,
                                      pixel_tap_indices, pixel_tap_weights) if self.pre_process else None)
        return self._decode_levels(embedded, input_ids, position_ids, hidden_in, labels)

    def _embed_fixed(self, input_ids, pixel_values, segment_ids, positions, tap_indices, tap_weights):
        config, encoder = self.config, self.image_encoder.encoder
        layers = encoder.blocks.layers
        mergers = [layers[n].deepstack_layer for n in config.vision.deepstack_visual_indexes]
        cos, sin = rotary_of_positions(positions, encoder.inv_freq)
        merged, deepstack = vision_blocks(config.vision, encoder.patch_embed, encoder.pos_embed.weight, layers,
                                          self.image_encoder.projector, mergers, pixel_values, tap_indices,
                                          tap_weights, cos, sin, segment_ids)
        x = place_fixed_features(config, input_ids, self.text_decoder.embedding.word_embeddings(input_ids), merged)
        index = deepstack_index(config, input_ids, 0)
        rows = [self._sequence(deepstack_rows(index, features, x)) for features in deepstack]
        return self._sequence(x), tuple(range(len(config.vision.deepstack_visual_indexes))), rows
