"""Qwen3-VL (dense) on megatron-core: tensor, pipeline and sequence parallelism on PyTorch.

Qwen2-VL's stage (engines/torch/megatron_core/vlm.py: megatron-core's TransformerBlock for the ViT, its MLP for the
mergers, GPTModel for the decoder) with what Qwen3-VL adds, named as models/qwen3_vl/mm_layout.py names it (MindSpeed-
MM's Qwen3VLMegatronConverter), so the same converted checkpoint loads here and on MindSpore's parallel engine:

    image_encoder.encoder   patch_embed.proj.{weight, bias} (the Conv3d as one matmul), pos_embed.weight (the learned
                            table, resampled per image on the host: modeling.position_taps), blocks.layers.N (Qwen2-VL's
                            LayerNorm block, gelu-tanh MLP), blocks.layers.K.deepstack_layer (the DeepStack merger of
                            block K: LayerNorm after the 2x2 shuffle, megatron-core MLP fc1 column- / fc2 row-parallel)
    image_encoder.projector Qwen2-VL's merger
    text_decoder            GPTModel with qk_layernorm (TorchNorm RMSNorm over head_dim on each TP rank's heads; the
                            finalizer sums their gradients over TP by name) and Qwen3-VL's interleaved M-RoPE in place
                            of megatron-core's sectioned one (it has no interleaved variant in 0.16)

DeepStack: the K-th DeepStack feature is added to the vision rows after decoder layer K, by a forward hook on that
layer. The features are put on the sequence on the first stage (`deepstack_rows`: zero on text rows, [s, b, h],
this rank's rows with --sequence-parallel); those of layers on later stages travel with the hidden states,
concatenated on the last dim ([s, b, h * (1 + carried)]; the 1F1B schedule sends each shape first, as
variable_seq_lengths has it), and their gradients come back the same way to the ViT on stage 0 (the MindSpore
engine's scheme, engines/mindspore/parallel/qwen3_vlm.py).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mmrun.backend.errors import UsageError
from mmrun.engines.torch.megatron_core import qwen3_vl_moe, vlm


def check_qwen3(args: Any, layout: Any) -> None:
    """One line for what this engine does not build for Qwen3-VL."""
    refused = {
        "--virtual-pipeline-model-parallel-size": (
            layout.vpp > 1, f"{layout.vpp}", "the interleaved schedule sends fixed [s, b, h] shapes, DeepStack "
            "features travel with the hidden states", "1 (plain 1F1B pipeline stages)"),
        "text_decoder.add_qkv_bias": (
            layout.config.text.attention_bias, "true", "megatron-core ties o_proj's bias to the MLP's "
            "(add_bias_linear)", "false (Qwen3-VL's released models)"),
    }
    for what, (bad, value, why, fix) in refused.items():
        if bad:
            raise UsageError(f"Qwen3-VL on megatron-core: {what} {value} is not built ({why}). Received: {what} "
                             f"{value}; set it to {fix}, or train on --ai-framework mindspore")
    qwen3_vl_moe.check(args, layout)  # the MoE variant's experts


class InterleavedMRoPE(torch.nn.Module):
    """Qwen3-VL's interleaved M-RoPE as megatron-core's rotary_pos_emb: forward(position_ids (3, B, S),
    mrope_section) -> angles [S, B, 1, head_dim] (rotate_half's two halves), each frequency from the row
    transformer_blocks.interleaved_mrope_table gives it (the portable model's rule)."""

    def __init__(self, head_dim: int, rope_theta: float, mrope_section: list[int]) -> None:
        from mmrun.models.transformer_blocks import interleaved_mrope_table, rotary_inv_freq

        super().__init__()
        self.table = torch.from_numpy(interleaved_mrope_table(rotary_inv_freq(head_dim, rope_theta), mrope_section))

    def forward(self, position_ids: torch.Tensor, mrope_section: Any = None, **ignored: Any) -> torch.Tensor:
        table = self.table.to(position_ids.device)
        freqs = (position_ids.float()[..., None] * table[:, None, None, :]).sum(0)  # (B, S, half), exact sums
        return torch.cat([freqs, freqs], dim=-1).transpose(0, 1)[:, :, None, :].contiguous()


class DeepstackMerger(vlm.VisionProjector):
    """A DeepStack merger: the 2x2 shuffle first, then LayerNorm over the merged width, then the projector's MLP."""

    def __init__(self, config: Any, vision: Any) -> None:
        super().__init__(config, vision)
        self.layernorm = vlm.TorchNorm(config, self.merged, eps=1e-6)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out, bias = self.encoder(self.layernorm(hidden.reshape(-1, self.merged)))
        return out if bias is None else out + bias


class VisionEncoder(vlm.VisionEncoder):
    """Qwen2-VL's ViT blocks with Qwen3-VL's patch bias, learned positions and DeepStack mergers:
    forward(pixels, grid) -> (hidden after the last block, [DeepStack features])."""

    def __init__(self, config: Any, vision: Any, projector_config: Any) -> None:
        super().__init__(config, vision, qwen2_5=False)
        self.patch_embed.proj.bias = torch.nn.Parameter(torch.zeros(vision.hidden_size, dtype=config.params_dtype))
        self.pos_embed = torch.nn.Module()
        self.pos_embed.weight = torch.nn.Parameter(
            torch.empty(vision.num_position_embeddings, vision.hidden_size, dtype=config.params_dtype))
        for index in vision.deepstack_visual_indexes:
            self.blocks.layers[index].deepstack_layer = DeepstackMerger(projector_config, vision)

    def forward(self, pixel_values: torch.Tensor, grid: np.ndarray) -> tuple[torch.Tensor, list[torch.Tensor]]:
        from mmrun.models.vlm import vision_layout
        from mmrun.models.qwen3_vl.modeling import position_taps

        vision = self.vision
        proj = self.patch_embed.proj
        x = F.linear(pixel_values.to(proj.weight.dtype), proj.weight, proj.bias)
        total = x.shape[0]
        if total != int(vision_layout.patch_counts(grid).sum()):
            raise ValueError(f"pixel_values {tuple(pixel_values.shape)} do not fit grid_thw {grid.tolist()}; pass "
                             "the image processor's pixel_values with its grid")
        indices, weights = position_taps(grid, vision.num_grid_per_side, vision.spatial_merge_size)
        taps = self.pos_embed.weight[torch.from_numpy(indices).to(x.device)].float()  # (patches, 4, D), fp32 sums
        x = x + (taps * torch.from_numpy(weights).to(x.device)[..., None]).sum(1).to(x.dtype)
        positions = vision_layout.rotary_position_ids(grid, vision.spatial_merge_size)
        angles = torch.from_numpy(positions.astype(np.float32)).reshape(-1, 2, 1) * self.inv_freq.reshape(1, 1, -1)
        half = angles.reshape(total, -1)
        rotary = torch.cat([half, half], dim=-1).reshape(total, 1, 1, -1).to(x.device)
        mask = vlm._block_mask(vision_layout.frame_cu_seqlens(grid), x.device)
        hidden, deepstack = x.unsqueeze(1), []
        for index, layer in enumerate(self.blocks.layers):
            hidden, _ = layer(hidden, attention_mask=mask, rotary_pos_emb=rotary)
            if index in vision.deepstack_visual_indexes:
                deepstack.append(layer.deepstack_layer(hidden.squeeze(1)))
        return hidden.squeeze(1), deepstack


class ImageEncoder(torch.nn.Module):
    """MindSpeed-MM's image_encoder for Qwen3-VL: forward(pixels, grid) -> (merged, [DeepStack features])."""

    def __init__(self, args: Any, layout: Any) -> None:
        super().__init__()
        vision, projector = layout.config.vision, vlm.projector_config(args, layout)
        self.encoder = VisionEncoder(vlm.vision_config(args, layout), vision, projector)
        self.projector = vlm.VisionProjector(projector, vision)

    def forward(self, pixel_values: torch.Tensor, grid: np.ndarray) -> tuple[torch.Tensor, list[torch.Tensor]]:
        hidden, deepstack = self.encoder(pixel_values, grid)
        return self.projector(hidden), deepstack


def carried_levels(layout: Any) -> list[int]:
    """The DeepStack levels (= decoder layer indexes) on a later stage than the first: sent along with the hidden
    states through every stage, in level order."""
    first = layout.stage_layers("llm", 0)
    return [k for k in range(len(layout.config.vision.deepstack_visual_indexes)) if k not in first]


class Qwen3VLStage(vlm.Qwen2VLStage):
    """One pipeline stage of Qwen3-VL on megatron-core (Qwen2VLStage's interface; module docstring)."""

    image_encoder_class = ImageEncoder
    # MindSpeed-MM's Qwen3-VL ViT keeps these trainable when the encoder is frozen (the portable model's rule)
    never_frozen = ("image_encoder.encoder.pos_embed.", ".deepstack_layer.")

    @staticmethod
    def text_config(args: Any, layout: Any) -> Any:
        return vlm.text_config(args, layout, add_qkv_bias=False, qk_layernorm=True,
                               **qwen3_vl_moe.config_fields(args, layout))

    def decoder_layer_specs(self, config: Any, layers: range) -> list[Any]:
        """The MoE variant's sparse layers with megatron-core's MoELayer (engines/torch/megatron_core/qwen3_vl_moe.py)."""
        return qwen3_vl_moe.layer_specs(self.layout, layers, lambda experts: vlm._layer_spec(
            causal=True, qk_norm=config.qk_layernorm, num_experts=experts))

    def __init__(self, args: Any, layout: Any, pre_process: bool, post_process: bool,
                 vp_stage: int | None = None) -> None:
        from megatron.core import parallel_state as ps

        super().__init__(args, layout, pre_process, post_process, vp_stage)
        text = layout.config.text
        self.text_decoder.rotary_pos_emb = InterleavedMRoPE(text.head_dim, text.rope_theta, list(text.mrope_section))
        self.hidden_size = text.hidden_size
        self.carried = carried_levels(layout)
        self.levels: dict[int, torch.Tensor] = {}  # this micro-batch's DeepStack rows per level, [s(/tp), b, h]
        self.expert_names = qwen3_vl_moe.ExpertNames(self)  # the MoE variant's experts in checkpoint names
        for layer, index in zip(self.text_decoder.decoder.layers,
                                layout.stage_layers("llm", ps.get_pipeline_model_parallel_rank())):
            layer.register_forward_hook(self._deepstack_hook(index))

    def _deepstack_hook(self, index: int) -> Any:
        def add(module: torch.nn.Module, inputs: Any, output: Any) -> Any:
            if index not in self.levels:
                return output
            hidden, context = output
            return hidden + self.levels[index], context
        return add

    def set_input_tensor(self, input_tensor: Any) -> None:
        """The received message: hidden states to the decoder, the carried DeepStack levels kept for the hooks (a
        slice of the received tensor, so their gradients go back in its gradient)."""
        tensors = input_tensor if isinstance(input_tensor, list) else [input_tensor]
        message = tensors[0]
        if message is None or not self.carried:
            super().set_input_tensor(input_tensor)
            return
        parts = torch.split(message, self.hidden_size, dim=-1)
        self.levels = dict(zip(self.carried, parts[1:]))
        super().set_input_tensor([parts[0]])

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, **batch: Any) -> Any:
        if self.pre_process:
            self.levels = {}  # _merge fills them
        out = super().forward(input_ids, position_ids, **batch)
        if not self.post_process and self.carried:
            out = torch.cat([out] + [self.levels[k] for k in self.carried], dim=-1)
        self.levels = {}
        return out

    def _merge(self, input_ids: torch.Tensor, embeds: torch.Tensor, pixel_values: Any, image_grid: Any,
               pixel_values_videos: Any, video_grid: Any) -> torch.Tensor:
        """The merged embeddings [B, S, H], and self.levels: each DeepStack feature on the vision rows (zero on text
        rows), [S, B, H] split as the hidden states are. Without images, zeros for the carried levels only."""
        from megatron.core import tensor_parallel

        from mmrun.models.vlm import vision_layout
        from mmrun.models.vlm.blocks import merge_vision
        from mmrun.models.qwen3_vl.modeling import deepstack_index, deepstack_rows

        model = self.layout.config
        deepstack: list = []

        def visual(pixels: torch.Tensor, grid: np.ndarray) -> torch.Tensor:  # keep DeepStack's beside the merged
            merged, stacked = self.image_encoder(pixels, grid)
            deepstack.append(stacked)
            return merged

        merged = merge_vision(model, visual, self.training, input_ids, embeds, pixel_values, image_grid,
                              pixel_values_videos, video_grid, blank_on_one_process=True)

        def sequence(rows: torch.Tensor) -> torch.Tensor:  # [B, S, H] -> [S(/tp), B, H]
            rows = rows.transpose(0, 1).contiguous()
            return tensor_parallel.scatter_to_sequence_parallel_region(rows) if self.config.sequence_parallel else rows

        if pixel_values is not None or pixel_values_videos is not None:
            unit = model.vision.spatial_merge_size ** 2
            images = 0 if pixel_values is None else int(vision_layout.patch_counts(image_grid).sum()) // unit
            index = deepstack_index(model, input_ids, images)
            self.levels = {k: sequence(deepstack_rows(index, features, merged))
                           for k, features in enumerate(deepstack[0])}
        else:  # a blank ViT run: its features count zero times, the carried messages hold zeros
            self.levels = {k: sequence(torch.zeros_like(merged)) for k in self.carried}
            if deepstack and len(deepstack[0]):  # its DeepStack mergers count zero times too: gradients (zeros)
                # on every rank, so megatron-core's DDP buckets (--overlap-grad-reduce waits for every parameter)
                # fill alike
                merged = merged + sum(f.float().sum() for f in deepstack[0]).to(merged.dtype) * 0.0
        return merged
