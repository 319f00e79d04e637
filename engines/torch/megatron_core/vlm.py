"""Qwen2-VL / Qwen2.5-VL on megatron-core: tensor, pipeline and sequence parallelism on PyTorch.

One pipeline stage of the vision-language model, built from megatron-core's own modules with the local
layer spec (no Transformer Engine, no Apex: it runs on CPU, CUDA and, through transfer_to_npu, Ascend):

    image_encoder.encoder.patch_embed.proj   the Conv3d(kernel = stride) weight flattened (D, 3*2*14*14),
                                             one matmul over the processor's flattened patches
    image_encoder.encoder.blocks             megatron-core TransformerBlock (LayerNorm or RMSNorm, fused
                                             per-head qkv with bias, MLP), attention NOT causal: an
                                             `arbitrary` mask keeps each frame (Qwen2.5-VL: each window)
                                             to itself, Qwen2-VL's 2-D vision rotary as rotary_pos_emb
    image_encoder.projector                  the merger: norm, then megatron-core MLP over 2x2 patch groups
                                             (fc1 column-parallel 4D -> 4D, GELU, fc2 row-parallel 4D -> H)
    text_decoder                             megatron-core GPTModel(position_embedding_type="mrope",
                                             mrope_section), RMSNorm, SwiGLU, GQA with QKV bias, tied or
                                             untied output layer as model.json says

so the parameter names per rank are MindSpeed-MM's (models/vlm/mm_layout.py: `layout.rank_shapes`),
and the weights start from `mm_layout.initial_state` (the portable model's init for the seed, sharded),
or from a Hugging Face directory (`rank_state_from_hf`): a TP/PP run trains the same network from the
same weights as the one-process run of models/pretrain_vlm.py.

Measured choice (issue 23): megatron-core's local spec CAN be made non-causal on CPU. Its
DotProductAttention applies any boolean mask given with attn_mask_type=arbitrary (masked_fill with
-10000, then softmax in fp32), so the ViT is megatron-core's TransformerBlock with a block-diagonal mask
(one N x N boolean per micro-batch's images), not our portable ViT wrapped.

Pipeline: the ViT and projector on stage 0 (mmrun's rule, MindSpeed-MM's [V, 0, ...]), the decoder layers
per stage as `llm_pp_layers` says, given to megatron-core as its pipeline_model_parallel_layout (which
allows any per-stage counts). Virtual pipeline stages (--virtual-pipeline-model-parallel-size, model.json's
lists of lists) are the same layout with one entry per virtual stage, chunk-major as megatron-core reads it:
each model chunk is a Qwen2VLStage built for its vp_stage, the ViT on chunk 0 of stage 0 only, and
megatron-core's interleaved 1F1B schedule runs them. Sequences change length from batch to batch, so the
1F1B schedule sends shapes first (TransformerConfig.variable_seq_lengths); the interleaved one cannot (its shape
messages of consecutive calls cross and deadlock when a rank's previous and next stage are one rank), so with
virtual stages the entry pads every batch to --seq-length. Sequence parallelism covers the text decoder; the ViT and
projector see the whole (replicated) patch sequence on every tensor-parallel rank (their norms' gradients
are then equal on every rank and need no sum).

A micro-batch without images still runs the ViT, on a blank 2x2 image whose features count zero times,
as the portable model does with several ranks: every data-parallel rank reduces the same ViT gradients. Here on one
process too (merge_vision's blank_on_one_process): megatron-core's DDP with --overlap-grad-reduce waits for every
parameter's gradient hook.
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from mmrun.backend.errors import UsageError
from mmrun.backend.torch.megatron_core import runtime
from mmrun.models import recompute

IGNORE_INDEX = -100

# transformers' hidden_act names -> torch functions (the ViT's MLP; the projector uses exact GELU, as
# transformers' PatchMerger's nn.GELU()).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu": F.gelu,
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
}


class TorchNorm:
    """torch's LayerNorm or RMSNorm (config.normalization) with megatron-core's norm constructor, its
    parameters marked `sequence_parallel` when the config is: finalize_model_grads then sums their
    gradients over the tensor-parallel group (megatron-core's WrappedTorchNorm refuses sequence
    parallelism; Apex's fused norms, which accept it, are absent on CPU)."""

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                zero_centered_gamma: bool = False, normalization: str | None = None) -> torch.nn.Module:
        kinds = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}
        kind = normalization or config.normalization
        if kind not in kinds or zero_centered_gamma:
            raise ValueError(f"TorchNorm builds {' or '.join(kinds)}; received normalization={kind!r}, "
                             f"zero_centered_gamma={zero_centered_gamma}")
        norm = kinds[kind](hidden_size, eps=eps)
        for param in norm.parameters():
            setattr(param, "sequence_parallel", bool(config.sequence_parallel))
        return norm


# ------------------------------------------------------------------------------------------ configs

def _common(args: Any) -> dict[str, Any]:
    """TransformerConfig fields every part shares: precision, fusions off where unfused is the same math."""
    dtype = torch.float16 if args.fp16 else torch.bfloat16 if args.bf16 else torch.float32
    return dict(
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        hidden_dropout=0.0, attention_dropout=0.0,  # Qwen2-VL trains without dropout
        fp16=args.fp16, bf16=args.bf16, params_dtype=dtype, pipeline_dtype=dtype,
        attention_softmax_in_fp32=True, use_cpu_initialization=runtime.device_kind() == "cpu",
        **{**runtime.fusions(), "bias_activation_fusion": False},
        apply_rope_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
        init_method_std=args.init_method_std if args.init_method_std is not None else 0.02,
        **recompute.megatron_fields(recompute.from_args(args)),  # --recompute-*: megatron-core's own recompute
    )


def _transformer_config(**fields: Any) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*cuda_graph_scope.*")  # 0.16's deprecation notice, graphs off
        return TransformerConfig(**fields)


def text_config(args: Any, layout: Any, **changes: Any) -> Any:
    """The text decoder's TransformerConfig: GPTModel's, with the per-stage layer counts as megatron-core's
    pipeline_model_parallel_layout (embedding on the first stage, loss on the last); `changes` replace fields
    (Qwen3-VL: no QKV bias, QK-norm)."""
    text = layout.config.text
    pp = layout.pp
    stages = [["decoder"] * n for n in layout.llm_pp_layers]
    stages[0].insert(0, "embedding")
    stages[-1].append("loss")
    fields = dict(
        **_common(args), num_layers=text.num_hidden_layers, hidden_size=text.hidden_size,
        num_attention_heads=text.num_attention_heads, num_query_groups=text.num_key_value_heads,
        kv_channels=text.head_dim, ffn_hidden_size=text.intermediate_size, layernorm_epsilon=text.rms_norm_eps,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        add_qkv_bias=True, mrope_section=list(text.mrope_section), pipeline_model_parallel_size=pp,
        pipeline_model_parallel_layout=stages if pp > 1 else None,
        # with VPP the batches come padded to --seq-length (models/pretrain_vlm.py): the interleaved schedule
        # deadlocks on shape messages
        sequence_parallel=args.sequence_parallel, variable_seq_lengths=pp > 1 and layout.vpp == 1,
        # 0.16 refuses variable sequence lengths with its default MoE dispatcher even without experts
        moe_token_dispatcher_type="alltoall",
        calculate_per_token_loss=bool(args.calculate_per_token_loss))
    return _transformer_config(**{**fields, **changes})


def vision_config(args: Any, layout: Any) -> Any:
    """The ViT's TransformerConfig: multi-head (no grouping), biases everywhere, one pipeline stage."""
    vision = layout.config.vision
    qwen2_5 = getattr(layout.config, "is_qwen2_5", False)  # Qwen3-VL's ViT: Qwen2-VL's LayerNorm block
    return _transformer_config(
        **_common(args), num_layers=vision.depth, hidden_size=vision.hidden_size,
        num_attention_heads=vision.num_heads, kv_channels=vision.head_dim, ffn_hidden_size=vision.intermediate_size,
        layernorm_epsilon=1e-6, normalization="RMSNorm" if qwen2_5 else "LayerNorm", gated_linear_unit=qwen2_5,
        activation_func=ACTIVATIONS[vision.hidden_act], add_bias_linear=True, add_qkv_bias=True,
        sequence_parallel=False)


def projector_config(args: Any, layout: Any) -> Any:
    """The merger's MLP: 4D -> 4D (GELU) -> text hidden size, with biases."""
    vision, text = layout.config.vision, layout.config.text
    merged = vision.hidden_size * vision.spatial_merge_size ** 2
    return _transformer_config(
        **_common(args), num_layers=1, hidden_size=text.hidden_size, num_attention_heads=text.num_attention_heads,
        ffn_hidden_size=merged,
        layernorm_epsilon=1e-6, normalization="RMSNorm" if getattr(layout.config, "is_qwen2_5", False) else "LayerNorm",
        gated_linear_unit=False, activation_func=F.gelu, add_bias_linear=True, sequence_parallel=False)


def _layer_spec(causal: bool, qk_norm: bool = False, num_experts: int | None = None) -> Any:
    """megatron-core's local GPT layer spec with TorchNorm; the ViT's attention takes an arbitrary mask; qk_norm:
    TorchNorm on each head of q and k (Qwen3's q_layernorm / k_layernorm, config.qk_layernorm set); num_experts:
    the MLP is megatron-core's MoELayer (TopKRouter, SequentialMLP of local experts, the config's dispatcher)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.enums import AttnMaskType

    spec = get_gpt_layer_local_spec(num_experts=num_experts, moe_grouped_gemm=False)
    sub = spec.submodules
    attention = sub.self_attention
    if not causal:
        attention = dataclasses.replace(attention, params={**attention.params, "attn_mask_type": AttnMaskType.arbitrary})
    if qk_norm:
        attention = dataclasses.replace(attention, submodules=dataclasses.replace(
            attention.submodules, q_layernorm=TorchNorm, k_layernorm=TorchNorm))
    return dataclasses.replace(spec, submodules=dataclasses.replace(
        sub, input_layernorm=TorchNorm, pre_mlp_layernorm=TorchNorm, self_attention=attention))


# ------------------------------------------------------------------------------------------ vision

class VisionEncoder(torch.nn.Module):
    """patch_embed + megatron-core TransformerBlock (non-causal): pixels (patches, 1176) -> (patches, D)."""

    def __init__(self, config: Any, vision: Any, qwen2_5: bool) -> None:
        from megatron.core.transformer.transformer_block import TransformerBlock, TransformerBlockSubmodules

        from mmrun.models.transformer_blocks import rotary_inv_freq

        super().__init__()
        self.vision, self.qwen2_5 = vision, qwen2_5
        self.patch_embed = torch.nn.Module()
        self.patch_embed.proj = torch.nn.Module()
        # HF's Conv3d kernel (D, 3, 2, 14, 14) flattened (mm_layout's shape): kernel = stride makes it one matmul
        self.patch_embed.proj.weight = torch.nn.Parameter(
            torch.empty(vision.hidden_size, vision.patch_dim, dtype=config.params_dtype))
        spec = TransformerBlockSubmodules(layer_specs=[_layer_spec(causal=False)] * vision.depth, layer_norm=None)
        self.blocks = TransformerBlock(config, spec, post_layer_norm=False, pre_process=True, post_process=False)
        self.inv_freq = torch.from_numpy(rotary_inv_freq(vision.head_dim // 2, vision.rope_theta))

    def forward(self, pixel_values: torch.Tensor, grid: np.ndarray) -> tuple[torch.Tensor, np.ndarray | None]:
        """(patches, D) hidden states after the last block, and Qwen2.5-VL's window order (None for Qwen2-VL)."""
        from mmrun.models.vlm import vision_layout

        vision = self.vision
        merge, unit = vision.spatial_merge_size, vision.spatial_merge_size ** 2
        weight = self.patch_embed.proj.weight
        x = F.linear(pixel_values.to(weight.dtype), weight)
        total = x.shape[0]
        positions = vision_layout.rotary_position_ids(grid, merge)
        frames = vision_layout.frame_cu_seqlens(grid)
        order = windows = None
        if self.qwen2_5:
            order, windows = vision_layout.window_index(grid, merge, vision.window_size, vision.patch_size)
            x = x.reshape(total // unit, -1)[torch.from_numpy(order).to(x.device)].reshape(total, -1)
            positions = positions.reshape(total // unit, unit, 2)[order].reshape(total, 2)
        # Qwen2-VL's 2-D rotary as megatron-core's rotary_pos_emb: angles [rows | columns], twice (rotate_half).
        angles = torch.from_numpy(positions.astype(np.float32)).reshape(-1, 2, 1) * self.inv_freq.reshape(1, 1, -1)
        half = angles.reshape(total, -1)
        rotary = torch.cat([half, half], dim=-1).reshape(total, 1, 1, -1).to(x.device)
        masks = {"frames": _block_mask(frames, x.device)}
        if windows is not None:
            masks["windows"] = _block_mask(windows, x.device)
        hidden = x.unsqueeze(1)  # [s, b=1, h]
        for index, layer in enumerate(self.blocks.layers):
            full = not self.qwen2_5 or index in vision.fullatt_block_indexes
            hidden, _ = layer(hidden, attention_mask=masks["frames" if full else "windows"], rotary_pos_emb=rotary)
        return hidden.squeeze(1), order


def _block_mask(cu_seqlens: np.ndarray, device: torch.device) -> torch.Tensor:
    """[1, 1, N, N] boolean, True where attention is masked: positions in different segments."""
    lengths = np.diff(cu_seqlens)
    segment = torch.from_numpy(np.repeat(np.arange(len(lengths)), lengths)).to(device)
    return (segment[:, None] != segment[None, :]).reshape(1, 1, len(segment), len(segment))


class VisionProjector(torch.nn.Module):
    """The merger: norm, each 2x2 group of patches as one 4D vector, megatron-core MLP (fc1 column-,
    fc2 row-parallel)."""

    def __init__(self, config: Any, vision: Any) -> None:
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
        from megatron.core.transformer.mlp import MLP, MLPSubmodules

        super().__init__()
        self.merged = vision.hidden_size * vision.spatial_merge_size ** 2
        self.layernorm = TorchNorm(config, vision.hidden_size, eps=1e-6)
        self.encoder = MLP(config, MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
                           input_size=self.merged)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.layernorm(hidden).reshape(-1, self.merged)
        out, bias = self.encoder(x)
        return out if bias is None else out + bias


class ImageEncoder(torch.nn.Module):
    """MindSpeed-MM's image_encoder: encoder (ViT) + projector (merger), on pipeline stage 0."""

    def __init__(self, args: Any, layout: Any) -> None:
        super().__init__()
        vision = layout.config.vision
        self.encoder = VisionEncoder(vision_config(args, layout), vision, layout.config.is_qwen2_5)
        self.projector = VisionProjector(projector_config(args, layout), vision)

    def forward(self, pixel_values: torch.Tensor, grid: np.ndarray) -> torch.Tensor:
        hidden, order = self.encoder(pixel_values, grid)
        merged = self.projector(hidden)
        if order is not None:  # Qwen2.5-VL: the merged tokens back in image order
            merged = merged[torch.from_numpy(np.argsort(order)).to(merged.device)]
        return merged


# ------------------------------------------------------------------------------------------ whole stage

class Qwen2VLStage(torch.nn.Module):
    """One pipeline stage (model chunk) of Qwen2-VL on megatron-core; what the engine's model_provider returns.

    forward(input_ids (B, S), position_ids (3, B, S), labels=None, pixel_values=None, image_grid_thw=None,
            pixel_values_videos=None, video_grid_thw=None, calculate_per_token_loss=False, **ignored)
    -> on the last stage {"loss_dict": {...}, "logits": None} as the portable model's loss_dict (mean over the
       micro-batch's label tokens, or their sum and count); on other stages the hidden states to send on.
    """

    checkpoint_names = "mindspeed-mm"  # engines/base.py MODEL_NAMES: the layout's names per (TP, PP) rank

    def __init__(self, args: Any, layout: Any, pre_process: bool, post_process: bool,
                 vp_stage: int | None = None) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.enums import ModelType
        from megatron.core.models.gpt import GPTModel
        from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

        super().__init__()
        self.layout, self.pre_process, self.post_process = layout, pre_process, post_process
        config = self.text_config(args, layout)
        self.config = config  # what megatron-core's DDP, schedules and finalize_model_grads read
        self.model_type = ModelType.encoder_or_decoder  # the schedules ask (one decoder; the ViT feeds stage 0)
        model = layout.config
        pp_rank, chunk = ps.get_pipeline_model_parallel_rank(), vp_stage or 0
        self.image_encoder = (self.image_encoder_class(args, layout) if len(layout.stage_layers("vit", pp_rank, chunk))
                              else None)
        spec = TransformerBlockSubmodules(layer_specs=self.decoder_layer_specs(
            config, layout.stage_layers("llm", pp_rank, chunk)), layer_norm=TorchNorm)
        self.text_decoder = GPTModel(
            config=config, transformer_layer_spec=spec, vocab_size=model.text.vocab_size,
            max_sequence_length=model.text.max_position_embeddings, pre_process=pre_process,
            post_process=post_process, parallel_output=True,
            share_embeddings_and_output_weights=model.tie_word_embeddings, position_embedding_type="mrope",
            rotary_base=int(model.text.rope_theta), vp_stage=vp_stage)
        self.share_embeddings_and_output_weights = self.text_decoder.share_embeddings_and_output_weights
        # the interleaved schedule sends [--seq-length, b, h] whatever the batch holds (module docstring)
        self.fixed_length = args.seq_length if layout.vpp > 1 else None

    image_encoder_class: Callable[..., torch.nn.Module] = ImageEncoder

    @staticmethod
    def text_config(args: Any, layout: Any) -> Any:
        return text_config(args, layout)

    def decoder_layer_specs(self, config: Any, layers: range) -> list[Any]:
        """One layer spec per decoder layer of this stage (global numbers `layers`); Qwen3-VL MoE's sparse ones differ."""
        return [_layer_spec(causal=True, qk_norm=config.qk_layernorm)] * len(layers)

    # megatron-core's hooks: the schedule's received activations, the tied embedding the finalizer reduces
    def set_input_tensor(self, input_tensor: Any) -> None:
        self.text_decoder.set_input_tensor(input_tensor)

    def shared_embedding_or_output_weight(self) -> torch.Tensor:
        return self.text_decoder.shared_embedding_or_output_weight()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, labels: torch.Tensor | None = None,
                pixel_values: torch.Tensor | None = None, image_grid_thw: Any = None,
                pixel_values_videos: torch.Tensor | None = None, video_grid_thw: Any = None,
                calculate_per_token_loss: bool = False, **ignored: Any) -> Any:
        if self.fixed_length is not None and input_ids.shape[1] != self.fixed_length:
            raise UsageError(f"virtual pipeline stages send fixed shapes between stages: every micro-batch must be "
                             f"--seq-length {self.fixed_length} tokens long. Received: {input_ids.shape[1]} tokens; pad "
                             f"batches to --seq-length (models/pretrain_vlm.py does)")
        decoder_input = None
        if self.pre_process:
            decoder_input = self._embeddings(input_ids, pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw)
        if not self.post_process:
            return self.text_decoder(input_ids=None, position_ids=position_ids, attention_mask=None,
                                     decoder_input=decoder_input)
        shifted = _shift_labels(labels)
        mask = shifted != IGNORE_INDEX
        # megatron-core's vocab-parallel cross-entropy per token [B, S]; ignored tokens are given label 0 and
        # masked out of the sum (vocab_parallel_cross_entropy has no ignore_index).
        token_loss = self.text_decoder(input_ids=None, position_ids=position_ids, attention_mask=None,
                                       decoder_input=decoder_input, labels=torch.where(mask, shifted, 0))
        total = (token_loss.float() * mask).sum()
        count = mask.sum()
        if calculate_per_token_loss:
            return {"loss_dict": {"loss": total, "num_tokens": count}, "logits": None}
        return {"loss_dict": {"loss": total / count.clamp(min=1)}, "logits": None}

    def _embeddings(self, input_ids: torch.Tensor, pixel_values: Any, image_grid_thw: Any,
                    pixel_values_videos: Any, video_grid_thw: Any) -> torch.Tensor:
        """[S, B, H] (sequence-parallel: this rank's S / tp rows): token embeddings with the vision features
        put where the image / video pad tokens are (index assignment, length unchanged)."""
        from megatron.core import tensor_parallel
        from mmrun.models.vlm import vision_layout

        config = self.config
        seq = input_ids.shape[1]
        if config.sequence_parallel and seq % config.tensor_model_parallel_size:
            raise UsageError(f"--sequence-parallel splits the sequence over {config.tensor_model_parallel_size} "
                             f"tensor-parallel ranks; this micro-batch has {seq} tokens (batches are padded to a "
                             "multiple of 8). Received: a tensor-parallel size that does not divide it; use 2, 4 or 8")
        embeds = self.text_decoder.embedding(input_ids=input_ids, position_ids=None)  # [S(/tp), B, H]
        if config.sequence_parallel:
            # the whole sequence for the index assignment; backward takes this rank's rows of the gradient
            embeds = tensor_parallel.gather_from_sequence_parallel_region(embeds, tensor_parallel_output_grad=False)
        embeds = self._merge(input_ids, embeds.transpose(0, 1), pixel_values, vision_layout.grid_array(image_grid_thw),
                             pixel_values_videos, vision_layout.grid_array(video_grid_thw)).transpose(0, 1).contiguous()
        if config.sequence_parallel:
            embeds = tensor_parallel.scatter_to_sequence_parallel_region(embeds)
        return embeds


    def _merge(self, input_ids: torch.Tensor, embeds: torch.Tensor, pixel_values: Any, image_grid: Any,
               pixel_values_videos: Any, video_grid: Any) -> torch.Tensor:
        """[B, S, H] embeddings with the ViT's features on the image / video pad tokens: the portable model's merge
        (its checks, one gather; a training micro-batch without images runs the ViT on a blank image that counts
        zero times)."""
        from mmrun.models.vlm.blocks import merge_vision

        return merge_vision(self.layout.config, self.image_encoder, self.training, input_ids, embeds, pixel_values,
                            image_grid, pixel_values_videos, video_grid, blank_on_one_process=True)


def _shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """labels shifted left by one (token s predicts labels[s + 1]), the last position ignored."""
    pad = torch.full_like(labels[:, :1], IGNORE_INDEX)
    return torch.cat([labels[:, 1:], pad], dim=1)


# ------------------------------------------------------------------------------------------ building

def build_layout(args: Any, config: Any, vit_pp_layers: list[Any] | None, llm_pp_layers: list[Any] | None) -> Any:
    """The run's VLMLayout (models/vlm/mm_layout.py: its checks are the one-line errors, exit 2); model.json's
    lists of lists (virtual chunks) must match --virtual-pipeline-model-parallel-size."""
    from mmrun.models.vlm.mm_layout import VLMLayout

    return VLMLayout.build(config, tp=args.tensor_model_parallel_size, pp=args.pipeline_model_parallel_size,
                           vit_pp_layers=vit_pp_layers, llm_pp_layers=llm_pp_layers,
                           vpp=args.virtual_pipeline_model_parallel_size or 1)


# MindSpeed-MM's three freezable parts by name prefix (model.json's `freeze` switches).
PARTS = {"vision_encoder": "image_encoder.encoder.", "vision_projector": "image_encoder.projector.",
         "text_decoder": "text_decoder.", "audio_encoder": "audio_encoder."}  # the last: Qwen2.5-Omni's


def freeze(model: torch.nn.Module, **frozen: bool) -> None:
    """requires_grad False for the parts switched on (no gradient, no optimizer state), True for the others;
    call before the engine wraps the model (megatron-core's DDP and optimizer take only trainable ones)."""
    never = getattr(model, "never_frozen", ())  # Qwen3-VL: the ViT's learned positions and DeepStack mergers
    for name, param in model.named_parameters():
        part = next(p for p, prefix in PARTS.items() if name.startswith(prefix))
        param.requires_grad_(not frozen.get(part, False) or any(key in name for key in never))
