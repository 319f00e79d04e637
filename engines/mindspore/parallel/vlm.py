"""Qwen2-VL / Qwen2.5-VL on MindSpore, tensor-, pipeline- and sequence-parallel: one pipeline stage per process.

The model of models/qwen2_vl/modeling.py (the portable one: the same numerics) rebuilt from Megatron's parallel
layers (backend/mindspore/parallel), with MindSpeed-MM's parameter names and shards for this (TP, PP) rank
(models/vlm/mm_layout.py, the layout megatron-core's VLM on PyTorch and `mmrun convert` use too):

    image_encoder.encoder   patch_embed (Conv3d weight as a matmul), blocks.layers.N: LayerNorm/RMSNorm,
                            self_attention (linear_qkv column-parallel, per head [q k v]; 2-D vision rotary;
                            attention inside each image / frame / window; linear_proj row-parallel), mlp
                            (fc1 column-parallel, [gate_r; up_r] for Qwen2.5-VL; fc2 row-parallel)
    image_encoder.projector layernorm, 2x2 merge, encoder.linear_fc1 (column) -> GELU -> encoder.linear_fc2 (row)
    text_decoder            embedding.word_embeddings (vocab-parallel), the ViT's features put on the image
                            tokens, decoder.layers.N (RMSNorm; GQA with per-group fused [q.. k v] and M-RoPE from
                            the data pipeline's position ids; SwiGLU with [gate_r; up_r]), final_layernorm,
                            output_layer (column-parallel; the tied copy on the last stage), vocab-parallel loss

Stage 0 holds the ViT, the projector, the embedding and the first text layers (model.json's per-module
pipeline_num_layers: ViT [V, 0, ...]); the text layers' activations [s, b, h] go between stages. Sequence
parallelism splits the text decoder's sequence (as megatron-core's GPT); the ViT runs replicated over the TP
group with its weights split (its token count is the images', unrelated to the text sequence). A micro-batch
without images runs the ViT on a blank 2x2 image whose features count zero times, so every rank runs the same
collectives and the ViT's gradients reduce as with images (as MindSpeed-MM's fake image); one process skips it
(value_and_grad gives the ViT zeros, the same update).

Training is backend/mindspore/parallel/engine.py's ParallelTrainStep (1F1B, gradient finalization, norm,
AdamW). Qwen2-VL trains it compiled (mindspore.jit) on batches the entry pads to fixed shapes
(Qwen2VLFixedShapeStage: the ViT's patches in buckets with segment ids and rotary positions as tensors, nothing
read on the host); Qwen2.5-VL, Qwen3-VL and --no-ms-jit in PyNative, the shapes changing with the images.
`MindSporeVLMEngine` is the trainer's engine for it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator

import numpy as np

from mmrun.backend.errors import UsageError
from mmrun.backend.mindspore import nn, ops, tensors
from mmrun.backend.mindspore.parallel.cross_entropy import VocabParallelCrossEntropy
from mmrun.backend.mindspore.parallel.engine import ParameterRoles
from mmrun.backend.mindspore.parallel.groups import ParallelState
from mmrun.backend.mindspore.parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, divide
from mmrun.backend.mindspore.parallel.mappings import ScatterToSequenceParallelRegion
from mmrun.engines.mindspore.parallel.rank_state import RankState
from mmrun.models.vlm import vision_layout
from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig, VisionConfig
from mmrun.models.vlm.mm_layout import OUTPUT_LAYER, WORD_EMBEDDINGS, LayoutError, VLMLayout, virtual_chunks
from mmrun.models.qwen2_vl.modeling import fixed_vision_features, place_fixed_features, vision_forward
from mmrun.models.vlm.blocks import IGNORE_INDEX, merge_vision
from mmrun.models.transformer_blocks import activation, apply_rotary, multimodal_rotary, rotary_inv_freq

# A micro-batch as ParallelTrainStep takes it: the model's inputs, then the (shifted) labels and their mask.
VLM_FIELDS = ("input_ids", "position_ids", "pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
              "labels", "loss_mask")
# ... and a batch padded to fixed shapes (Qwen2VLFixedShapeStage, the compiled step).
VLM_FIXED_FIELDS = ("input_ids", "position_ids", "pixel_values", "pixel_segment_ids", "pixel_position_ids", "labels",
                    "loss_mask")
# model.json's freeze switches -> the MindSpeed-MM name prefix of the part they freeze.
FREEZE_PREFIXES = {"vision_projector": "image_encoder.projector.", "vision_encoder": "image_encoder.encoder.",
                   "text_decoder": "text_decoder.", "audio_encoder": "audio_encoder."}  # the last: Qwen2.5-Omni's


def _vision_norm(config: VisionConfig, qwen2_5: bool) -> nn.Module:
    """As the portable model: Qwen2-VL's ViT LayerNorm, Qwen2.5-VL's RMSNorm, eps 1e-6."""
    return nn.RMSNorm(config.hidden_size, eps=1e-6) if qwen2_5 else nn.LayerNorm(config.hidden_size, eps=1e-6)


class _Weight(nn.Module):
    """A module holding one weight (the patch embedding's `proj`, a Conv3d in the checkpoint)."""

    def __init__(self, *shape: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(tensors.from_numpy(np.zeros(shape, np.float32)))


# ------------------------------------------------------------------------------------------ vision

class PatchEmbed(nn.Module):
    """`proj.weight` (D, 1176): the checkpoint's Conv3d kernel (D, 3, 2, 14, 14) flattened, as mm_layout and the
    portable model keep it; kernel = stride, so on the processor's flattened patches it is one matmul."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.proj = _Weight(config.hidden_size, config.patch_dim)

    def forward(self, pixel_values):
        weight = self.proj.weight
        return ops.linear(tensors.cast(pixel_values, weight.dtype), weight)


class VisionAttention(nn.Module):
    def __init__(self, config: VisionConfig, state: ParallelState) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.heads = divide(config.num_heads, state.tensor_model_parallel_size, "number of vision attention heads")
        self.linear_qkv = ColumnParallelLinear(config.hidden_size, 3 * config.hidden_size, state)
        self.linear_proj = RowParallelLinear(config.hidden_size, config.hidden_size, state)

    def forward(self, x, cos, sin, cu_seqlens: np.ndarray):
        qkv, _ = self.linear_qkv(x)  # [n, heads/tp * 3 * head_dim], per head [q k v]
        n = qkv.shape[0]
        q, k, v = ops.split(ops.reshape(qkv, (n, self.heads, 3 * self.head_dim)), self.head_dim, dim=-1)
        # transformers rotates the vision q/k in fp32 and casts back (apply_rotary_pos_emb_vision).
        dtype = q.dtype
        q = tensors.cast(apply_rotary(tensors.cast(q, "float32"), cos, sin), dtype)
        k = tensors.cast(apply_rotary(tensors.cast(k, "float32"), cos, sin), dtype)
        # Host boundaries, or (a fixed-shape batch, the compiled step) a device tensor of segment ids.
        y = (ops.varlen_attention(q, k, v, cu_seqlens, scale=self.head_dim ** -0.5)
             if isinstance(cu_seqlens, np.ndarray) else
             ops.segment_attention(q, k, v, cu_seqlens, scale=self.head_dim ** -0.5))
        out, _ = self.linear_proj(ops.reshape(y, (n, self.heads * self.head_dim)))
        return out


class VisionMLP(nn.Module):
    """Qwen2-VL: fc2(act(fc1(x))); Qwen2.5-VL: fc2(act(gate) * up) with fc1 = [gate_r; up_r] on each rank."""

    def __init__(self, config: VisionConfig, state: ParallelState, gated: bool) -> None:
        super().__init__()
        self.gated = gated
        width = config.intermediate_size
        self.linear_fc1 = ColumnParallelLinear(config.hidden_size, 2 * width if gated else width, state)
        self.linear_fc2 = RowParallelLinear(width, config.hidden_size, state)
        self.act = activation(config.hidden_act)

    def forward(self, x):
        h, _ = self.linear_fc1(x)
        if self.gated:
            gate, up = ops.split(h, h.shape[-1] // 2, dim=-1)
            h = self.act(gate) * up
        else:
            h = self.act(h)
        out, _ = self.linear_fc2(h)
        return out


class VisionLayer(nn.Module):
    def __init__(self, config: VisionConfig, state: ParallelState, qwen2_5: bool) -> None:
        super().__init__()
        self.input_layernorm = _vision_norm(config, qwen2_5)
        self.self_attention = VisionAttention(config, state)
        self.pre_mlp_layernorm = _vision_norm(config, qwen2_5)
        self.mlp = VisionMLP(config, state, gated=qwen2_5)

    def forward(self, x, cos, sin, cu_seqlens: np.ndarray):
        x = x + self.self_attention(self.input_layernorm(x), cos, sin, cu_seqlens)
        return x + self.mlp(self.pre_mlp_layernorm(x))


class VisionBlocks(nn.Module):
    def __init__(self, config: VisionConfig, state: ParallelState, qwen2_5: bool, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([VisionLayer(config, state, qwen2_5) for _ in range(num_layers)])


class VisionEncoder(nn.Module):
    """MindSpeed-MM's image_encoder.encoder: patch embedding and the ViT blocks."""

    def __init__(self, config: VisionConfig, state: ParallelState, qwen2_5: bool, num_layers: int) -> None:
        super().__init__()
        self.config, self.qwen2_5 = config, qwen2_5
        self.patch_embed = PatchEmbed(config)
        self.blocks = VisionBlocks(config, state, qwen2_5, num_layers)
        self.inv_freq = rotary_inv_freq(config.head_dim // 2, config.rope_theta)


class ProjectorMLP(nn.Module):
    def __init__(self, merged: int, out: int, state: ParallelState) -> None:
        super().__init__()
        self.linear_fc1 = ColumnParallelLinear(merged, merged, state)
        self.linear_fc2 = RowParallelLinear(merged, out, state)
        self.act = nn.GELU()

    def forward(self, x):
        h, _ = self.linear_fc1(x)
        out, _ = self.linear_fc2(self.act(h))
        return out


class VisionProjector(nn.Module):
    """MindSpeed-MM's image_encoder.projector (HF's merger): norm, 2x2 merge, MLP to the text width."""

    def __init__(self, config: VisionConfig, state: ParallelState, qwen2_5: bool) -> None:
        super().__init__()
        self.merged = config.hidden_size * config.spatial_merge_size ** 2
        self.layernorm = _vision_norm(config, qwen2_5)
        self.encoder = ProjectorMLP(self.merged, config.out_hidden_size, state)

    def forward(self, x):
        return self.encoder(ops.reshape(self.layernorm(x), (-1, self.merged)))


class ImageEncoder(nn.Module):
    def __init__(self, config: Qwen2VLConfig, state: ParallelState, num_layers: int) -> None:
        super().__init__()
        self.encoder = VisionEncoder(config.vision, state, config.is_qwen2_5, num_layers)
        self.projector = VisionProjector(config.vision, state, config.is_qwen2_5)

    def forward(self, pixel_values, grid: np.ndarray):
        """-> (merged tokens, text hidden) in the order of the images and their merged tokens: the portable
        model's ViT forward (window order, 2-D rotary, segments) around these tensor-parallel modules."""
        encoder = self.encoder
        return vision_forward(encoder.config, encoder.qwen2_5, encoder.inv_freq, encoder.patch_embed,
                              encoder.blocks.layers, self.projector, pixel_values, grid)


# ------------------------------------------------------------------------------------------ text

class TextAttention(nn.Module):
    """GQA: linear_qkv rows per query group [q heads of the group, k, v] (whole groups per TP rank); causal."""

    def __init__(self, config: Qwen2VLConfig, state: ParallelState) -> None:
        super().__init__()
        text, tp = config.text, state.tensor_model_parallel_size
        self.head_dim = text.head_dim
        self.groups = divide(text.num_key_value_heads, tp, "number of key/value heads (num_query_groups)")
        self.per_group = text.num_attention_heads // text.num_key_value_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        qkv_rows = (text.num_attention_heads + 2 * text.num_key_value_heads) * self.head_dim
        # Qwen3-VL (qwen3_vlm.py's stage): RMSNorm on each head of q and k, biases on q/k/v and o only with
        # attention_bias; Qwen2-VL: q/k/v biases, none on o
        self.qk_norm = config.model_type in ("qwen3_vl", "qwen3_vl_moe")
        bias = getattr(text, "attention_bias", True)
        self.linear_qkv = ColumnParallelLinear(text.hidden_size, qkv_rows, state, bias=bias)
        self.linear_proj = RowParallelLinear(text.num_attention_heads * self.head_dim, text.hidden_size, state,
                                             bias=self.qk_norm and bias)
        if self.qk_norm:  # replicated: each TP rank normalises its own heads with the same weight
            self.q_layernorm = nn.RMSNorm(text.head_dim, eps=text.rms_norm_eps)
            self.k_layernorm = nn.RMSNorm(text.head_dim, eps=text.rms_norm_eps)

    def forward(self, x, cos, sin):
        qkv, _ = self.linear_qkv(x)  # [s, b, groups/tp * (per_group + 2) * head_dim]
        s, b = qkv.shape[0], qkv.shape[1]
        d = self.head_dim
        qkv = ops.reshape(qkv, (s, b, self.groups, (self.per_group + 2) * d))
        q, k, v = ops.split(qkv, [self.per_group * d, d, d], dim=3)
        q = ops.permute(ops.reshape(q, (s, b, self.groups * self.per_group, d)), (1, 2, 0, 3))  # [b, heads, s, d]
        k, v = ops.permute(k, (1, 2, 0, 3)), ops.permute(v, (1, 2, 0, 3))  # [b, groups, s, d]
        if self.qk_norm:  # RMSNorm over head_dim, before the rotary (transformers' Qwen3 attention)
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = ops.scaled_dot_product_attention(q, k, v, causal=True, scale=self.scale)  # GQA: kv heads repeated
        y = ops.reshape(ops.permute(y, (2, 0, 1, 3)), (s, b, self.groups * self.per_group * d))
        out, bias = self.linear_proj(y)  # a bias is added inside unless skip_bias_add (None then)
        return out if bias is None else out + bias


class TextMLP(nn.Module):
    """SwiGLU: linear_fc1 = [gate_r; up_r] on each rank, silu(gate) * up, linear_fc2 row-parallel."""

    def __init__(self, config: Qwen2VLConfig, state: ParallelState) -> None:
        super().__init__()
        text = config.text
        self.linear_fc1 = ColumnParallelLinear(text.hidden_size, 2 * text.intermediate_size, state, bias=False)
        self.linear_fc2 = RowParallelLinear(text.intermediate_size, text.hidden_size, state, bias=False)
        self.act = activation(text.hidden_act)

    def forward(self, x):
        h, _ = self.linear_fc1(x)
        gate, up = ops.split(h, h.shape[-1] // 2, dim=-1)
        out, _ = self.linear_fc2(self.act(gate) * up)
        return out


class TextLayer(nn.Module):
    def __init__(self, config: Qwen2VLConfig, state: ParallelState) -> None:
        super().__init__()
        eps = config.text.rms_norm_eps
        self.input_layernorm = nn.RMSNorm(config.text.hidden_size, eps=eps)
        self.self_attention = TextAttention(config, state)
        self.pre_mlp_layernorm = nn.RMSNorm(config.text.hidden_size, eps=eps)
        self.mlp = TextMLP(config, state)

    def forward(self, x, cos, sin):
        x = x + self.self_attention(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.pre_mlp_layernorm(x))


class TextBlock(nn.Module):
    def __init__(self, config: Qwen2VLConfig, state: ParallelState, num_layers: int, post_process: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList([TextLayer(config, state) for _ in range(num_layers)])
        self.post_process = post_process
        if post_process:
            self.final_layernorm = nn.RMSNorm(config.text.hidden_size, eps=config.text.rms_norm_eps)

    def forward(self, x, cos, sin):
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.final_layernorm(x) if self.post_process else x


class Embedding(nn.Module):
    def __init__(self, config: Qwen2VLConfig, state: ParallelState) -> None:
        super().__init__()
        self.word_embeddings = VocabParallelEmbedding(config.text.vocab_size, config.text.hidden_size, state)


class TextDecoder(nn.Module):
    def __init__(self, config: Qwen2VLConfig, state: ParallelState, num_layers: int) -> None:
        super().__init__()
        self.pre_process, self.post_process = state.is_first_stage, state.is_last_stage
        tied = config.tie_word_embeddings
        if self.pre_process:
            self.embedding = Embedding(config, state)
        self.decoder = TextBlock(config, state, num_layers, self.post_process)
        if self.post_process:
            # Tied on one stage: the output layer reads the word embeddings (no parameter of its own).
            self.output_layer = ColumnParallelLinear(config.text.hidden_size, config.text.vocab_size, state, bias=False,
                                                     skip_weight_param_allocation=self.pre_process and tied)
            self.uses_own_output_weight = not (self.pre_process and tied)


# ------------------------------------------------------------------------------------------ one stage

class Qwen2VLStage(RankState, nn.Module):
    """This rank's pipeline stage of the VLM, its tensor-parallel shard, named as mm_layout names it."""

    layout_error = LayoutError

    def __init__(self, config: Qwen2VLConfig, layout: VLMLayout, state: ParallelState) -> None:
        super().__init__()
        self.config, self.layout, self.state = config, layout, state
        pp_rank = state.pp_rank
        self.hidden_size = config.text.hidden_size
        self.pre_process, self.post_process = state.is_first_stage, state.is_last_stage
        vit_layers = len(layout.stage_layers("vit", pp_rank))  # the layout keeps them all on stage 0
        if self.pre_process:
            # The ViT's tokens are the images' (not the text sequence): it runs without sequence parallelism.
            self.image_encoder = ImageEncoder(config, dataclasses.replace(state, sequence_parallel=False), vit_layers)
            if state.sequence_parallel:
                self.scatter = ScatterToSequenceParallelRegion(state.group("tp"))
        self.text_decoder = TextDecoder(config, state, len(layout.stage_layers("llm", pp_rank)))
        if self.post_process:
            self.cross_entropy = VocabParallelCrossEntropy(config.text.vocab_size, state)
        self.inv_freq = rotary_inv_freq(config.text.head_dim, config.text.rope_theta)
        # plain values for mindspore.jit, which reads no attribute of the state or config dataclasses
        self.sequence_parallel = bool(state.sequence_parallel)
        self.mrope_section = tuple(config.text.mrope_section)
        self.full_blocks = tuple(config.vision.fullatt_block_indexes) if config.is_qwen2_5 else ()

    def forward(self, input_ids, position_ids, pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw,
                hidden_in=None, labels=None):
        """First stage: the batch; later ones: hidden_in [s, b, h] (with SP [s / tp, b, h]) and position_ids
        (3, b, s). Last stage: per-token loss [b, s] with labels (shifted, [b, s]), else logits [s, b, v / tp];
        other stages: the hidden states for the next."""
        x = hidden_in
        if self.pre_process:
            x = self.text_decoder.embedding.word_embeddings(input_ids)  # [b, s, h], summed over TP
            # The ViT's features on the image / video pad tokens (the portable model's merge: one gather; a
            # micro-batch without images on several ranks runs the ViT on a blank image that counts zero times).
            x = merge_vision(self.config, self.image_encoder, self.training, input_ids, x, pixel_values,
                             vision_layout.grid_array(image_grid_thw), pixel_values_videos,
                             vision_layout.grid_array(video_grid_thw))
        return self._decode(x, input_ids, position_ids, labels)

    def _decode(self, x, input_ids, position_ids, labels):
        """The text decoder of this stage: x is the first stage's embeddings [b, s, h] (the vision features
        placed), a later stage's hidden_in."""
        batch, seq = input_ids.shape
        cos, sin = multimodal_rotary(position_ids, self.inv_freq, self.mrope_section, "float32")
        cos, sin = ops.reshape(cos, (batch, 1, seq, -1)), ops.reshape(sin, (batch, 1, seq, -1))
        if self.pre_process:
            x = ops.transpose(x, 0, 1)  # [s, b, h]
            if self.sequence_parallel:
                x = self.scatter(x)
        x = self.text_decoder.decoder(x, cos, sin)
        if not self.post_process:
            return x
        decoder = self.text_decoder
        weight = (decoder.output_layer.weight if decoder.uses_own_output_weight
                  else decoder.embedding.word_embeddings.weight)
        logits, _ = decoder.output_layer(x, weight)  # [s, b, v / tp]
        if labels is None:
            return logits
        return ops.transpose(self.cross_entropy(logits, ops.transpose(labels, 0, 1)), 0, 1)

    # ------------------------------------------------------------------ what the engine needs to know

    def parameter_roles(self) -> ParameterRoles:
        """Of the parameters the optimizer holds (not frozen): split over TP, replicated but computed from part
        of the text sequence with SP (the text decoder's norms: gradients summed over TP), the tied embeddings'
        copies when the first and last stages differ."""
        names = {n for n, p in self.named_parameters() if p.requires_grad}
        pp_rank = self.state.pp_rank
        split = {n for n in names if self.layout.partition_dim(self.layout.global_name(pp_rank, n)) is not None}
        sequence = {n for n in names - split if self.state.sequence_parallel and n.startswith("text_decoder.decoder.")}
        tied = None
        if self.config.tie_word_embeddings and self.state.pipeline_model_parallel_size > 1:
            tied = WORD_EMBEDDINGS if self.pre_process else OUTPUT_LAYER if self.post_process else None
            tied = tied if tied in names else None
        return ParameterRoles(tensor_parallel=frozenset(split), sequence_parallel=frozenset(sequence),
                              tied_embedding=tied, shared_copy=OUTPUT_LAYER if tied == OUTPUT_LAYER else None)

    def freeze(self, switches: dict[str, bool]) -> list[str]:
        """model.json's freeze switches (MindSpeed-MM's model.freeze): the frozen parts' parameters get no
        gradient and no optimizer state. Returns the parts frozen."""
        for name, param in self.named_parameters():
            part = next(p for p, prefix in FREEZE_PREFIXES.items() if name.startswith(prefix))
            (nn.freeze if switches.get(part) else nn.unfreeze)([param])
        return [part for part, on in switches.items() if on]


class Qwen2VLFixedShapeStage(Qwen2VLStage):
    """The stage on batches padded to fixed shapes (models/pretrain_vlm.py fixed_shape_collate: the text to
    --seq-length, the ViT's patches to a bucket with per-frame segment ids and rotary positions), so nothing is
    read on the host and ParallelTrainStep compiles it with mindspore.jit, one graph per bucket. Qwen2-VL with
    images, as the one-process compiled step (models/qwen2_vl/modeling.py merge_fixed_vision); the padding
    attends only to itself and no token takes its features."""

    def forward(self, input_ids, position_ids, pixel_values, pixel_segment_ids, pixel_position_ids,
                hidden_in=None, labels=None):
        return self._fixed(input_ids, position_ids, pixel_values, pixel_segment_ids, pixel_position_ids, None,
                           hidden_in, labels)

    def _fixed(self, input_ids, position_ids, pixel_values, pixel_segment_ids, pixel_position_ids, pixel_window_ids,
               hidden_in, labels):
        x = hidden_in
        if self.pre_process:
            encoder = self.image_encoder.encoder
            x = self.text_decoder.embedding.word_embeddings(input_ids)
            # the ViT's blocks all sit on stage 0 (VLMLayout), so full-attention block indexes are local ones
            vision = fixed_vision_features(encoder.patch_embed, encoder.blocks.layers, self.image_encoder.projector,
                                           encoder.inv_freq, pixel_values, pixel_segment_ids, pixel_position_ids,
                                           pixel_window_ids, self.full_blocks)
            x = place_fixed_features(self.config, input_ids, x, vision)
        return self._decode(x, input_ids, position_ids, labels)


class Qwen2_5VLFixedShapeStage(Qwen2VLFixedShapeStage):
    """Qwen2.5-VL's stage on fixed-shape batches: as Qwen2VLFixedShapeStage, the window layout one more input
    (pixel_window_ids, vision_layout.window_segment_ids), as the one-process compiled step."""

    fields = VLM_FIXED_FIELDS[:5] + ("pixel_window_ids",) + VLM_FIXED_FIELDS[5:]

    def forward(self, input_ids, position_ids, pixel_values, pixel_segment_ids, pixel_position_ids, pixel_window_ids,
                hidden_in=None, labels=None):
        return self._fixed(input_ids, position_ids, pixel_values, pixel_segment_ids, pixel_position_ids,
                           pixel_window_ids, hidden_in, labels)


def fixed_stage(config: Qwen2VLConfig) -> type:
    """The fixed-shape (compiled) stage class of this Qwen2-VL family model."""
    return Qwen2_5VLFixedShapeStage if config.is_qwen2_5 else Qwen2VLFixedShapeStage


# ------------------------------------------------------------------------------------------ the step

def micro_batch(batch: dict[str, np.ndarray], fields: tuple[str, ...] | None = None) -> tuple[Any, ...]:
    """A collated batch (data/multimodal/collate.py) as VLM_FIELDS (VLM_FIXED_FIELDS when padded to fixed
    shapes): the labels shifted as the portable loss
    shifts them (token s predicts labels[s + 1]), -100 -> 0 with loss_mask 0, so Megatron's
    sum(loss * mask) / sum(mask) is the portable model's mean over label tokens."""
    labels = np.asarray(batch["labels"])
    shifted = np.full_like(labels, IGNORE_INDEX)
    shifted[:, :-1] = labels[:, 1:]
    mask = shifted != IGNORE_INDEX
    fields = fields or (VLM_FIXED_FIELDS if "pixel_segment_ids" in batch else VLM_FIELDS)
    return (*(batch.get(name) for name in fields[:-2]), np.where(mask, shifted, 0).astype(np.int64),
            mask.astype(np.float32))


def refuse_virtual_stages(spec: Any) -> None:
    """model.json's lists of lists (virtual pipeline chunks): one line, as the engine refuses
    --virtual-pipeline-model-parallel-size for the GPT (no interleaved schedule on MindSpore)."""
    for part, where in (("vit", "image_encoder.vision_encoder"), ("llm", "text_decoder")):
        layers = spec.pipeline_layers.get(part)
        if virtual_chunks(layers) > 1:
            flat = [sum(counts) for counts in zip(*layers)]
            raise UsageError(f"{spec.path}: {where}.pipeline_num_layers {layers} gives {len(layers)} virtual pipeline "
                             "chunks per stage; the MindSpore engine has no virtual pipeline stages (megatron-core on "
                             f"--ai-framework pytorch has). Give one count per stage, e.g. {flat}")


def compiles(args: Any, spec: Any) -> bool:
    """Whether the stage trains compiled (mindspore.jit) on fixed-shape batches: Qwen2-VL, Qwen2.5-VL and dense
    Qwen3-VL unless --no-ms-jit, as the entry pads their batches (vision_layout.FIXED_SHAPE_MODELS). Qwen3-VL MoE's
    split stage is not padded yet: PyNative, its shapes changing with the images."""
    return not getattr(args, "no_ms_jit", False) and spec.hf_config["model_type"] in vision_layout.FIXED_SHAPE_MODELS


def read_micro_batches(data_iterator: Iterator, count: int, state: ParallelState,
                       per_token: bool = False, fields: tuple[str, ...] | None = None) -> list[tuple[Any, ...]]:
    """`count` micro-batches from the loader as ParallelTrainStep takes them (StopIteration passes).

    per_token (--calculate-per-token-loss, Megatron's): the step's loss is the sum of every token loss of the
    global batch over its number of label tokens. ParallelTrainStep averages the micro-batch losses over
    micro-batches and data-parallel ranks, so each micro-batch's loss is its token-loss sum times
    count x dp / tokens of the global batch (`token_sum` below, the mask carrying the factor), as the portable
    entry's per-token weighting does."""
    batches = [micro_batch(next(data_iterator), fields) for _ in range(count)]
    if not per_token:
        return batches
    from mmrun import backend

    local = float(sum(b[-1].sum() for b in batches))
    # Every rank of a (TP, PP) group reads the same samples: the world's sum counts each data shard tp x pp times.
    world = float(tensors.to_numpy(backend.distributed.all_reduce(tensors.from_numpy(np.array([local], np.float32)))
                                   )[0])
    total = world / (state.tensor_model_parallel_size * state.pipeline_model_parallel_size)
    weight = np.float32(count * state.data_parallel_size / max(total, 1.0))
    return [(*b[:-1], b[-1] * weight) for b in batches]


def token_sum(per_token_loss, loss_mask):
    """The per-token loss mode's micro-batch loss: sum(loss * mask), the mask weighted by read_micro_batches."""
    from mindspore import mint

    return mint.sum(ops.reshape(per_token_loss, (-1,)) * ops.reshape(loss_mask, (-1,)))
