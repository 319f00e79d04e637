"""Qwen2.5-Omni's thinker on megatron-core: Qwen2.5-VL's stage (vlm.py) plus the audio encoder on the first stage.

MindSpeed-MM places the audio encoder beside the ViT on pipeline stage 0 (model_7b.json's audio_pp_layers [32, 0]);
so does mmrun. The audio encoder is built from megatron-core's modules with MindSpeed-MM's names
(models/qwen2_5_omni/mm_layout.py):

    audio_encoder.encoder.conv1 / conv2      the Conv1d (k3) kernels flattened (D, C*3): one matmul over the gathered
                                             taps, as the portable model (models/qwen2_5_omni/modeling.py)
    audio_encoder.encoder.blocks             megatron-core TransformerBlock (LayerNorm, fused per-head qkv with bias,
                                             GELU MLP), not causal: an `arbitrary` mask keeps each 2-second chunk
                                             to itself; sinusoidal positions added before the first layer, no rotary
    audio_encoder.encoder.ln_post / proj     after the stride-2 average pooling of each audio

MindSpeed-MM's converter stores the missing k bias as zeros inside linear_qkv's bias; a constant added to every key
leaves the softmax unchanged, so it stays zero in training (its gradient is zero). The audio features replace the
<|AUDIO|> tokens after the vision features (the portable model's merge, its checks). TMRoPE positions are the
batch's position_ids, computed per sample by the collate on every stage's batch.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mmrun.engines.torch.megatron_core import vlm


def audio_config(args: Any, layout: Any) -> Any:
    """The audio encoder's TransformerConfig: Whisper's layers (LayerNorm, biases, GELU MLP), one pipeline stage."""
    audio = layout.config.audio
    return vlm._transformer_config(
        **vlm._common(args), num_layers=audio.num_layers, hidden_size=audio.hidden_size,
        num_attention_heads=audio.num_heads, kv_channels=audio.head_dim, ffn_hidden_size=audio.intermediate_size,
        layernorm_epsilon=1e-5, normalization="LayerNorm", gated_linear_unit=False,
        activation_func=vlm.ACTIVATIONS[audio.activation_function], add_bias_linear=True, add_qkv_bias=True,
        sequence_parallel=False)


class AudioEncoder(torch.nn.Module):
    """mel frames (frames, num_mel_bins) of audios of `lengths` frames -> (tokens, output_dim), as the portable
    AudioEncoder (same host bookkeeping: modeling.audio_layout)."""

    def __init__(self, config: Any, audio: Any) -> None:
        from megatron.core.transformer.transformer_block import TransformerBlock, TransformerBlockSubmodules

        from mmrun.models.qwen2_5_omni.modeling import sinusoids

        super().__init__()
        self.audio = audio
        dtype = config.params_dtype
        self.conv1 = torch.nn.Linear(audio.num_mel_bins * 3, audio.hidden_size, dtype=dtype)
        self.conv2 = torch.nn.Linear(audio.hidden_size * 3, audio.hidden_size, dtype=dtype)
        spec = TransformerBlockSubmodules(layer_specs=[vlm._layer_spec(causal=False)] * audio.num_layers,
                                          layer_norm=None)
        self.blocks = TransformerBlock(config, spec, post_layer_norm=False, pre_process=True, post_process=False)
        self.ln_post = vlm.TorchNorm(config, audio.hidden_size, eps=1e-5)
        self.proj = torch.nn.Linear(audio.hidden_size, audio.output_dim, dtype=dtype)
        self.audio_bos_eos_token = torch.nn.Embedding(2, audio.output_dim, dtype=dtype)  # stored, not used in forward
        self.positions = torch.from_numpy(sinusoids(audio.max_source_positions, audio.hidden_size))

    def forward(self, frames: torch.Tensor, lengths: np.ndarray) -> torch.Tensor:
        from mmrun.models.qwen2_5_omni.modeling import _taps, audio_layout

        layout = audio_layout(lengths, self.audio.n_window)
        if layout["positions"].size and int(layout["positions"].max()) >= self.audio.max_source_positions:
            raise ValueError(f"audio chunks of {int(layout['chunks'].max())} frames exceed max_source_positions "
                             f"{self.audio.max_source_positions}; lower n_window")
        frames = frames.to(self.conv1.weight.dtype)
        x = F.gelu(self.conv1(_taps(frames, layout["conv1"])))
        x = F.gelu(self.conv2(_taps(x, layout["conv2"])))
        x = x + self.positions[torch.from_numpy(layout["positions"])].to(x.device, x.dtype)
        mask = vlm._block_mask(layout["cu_seqlens"], x.device)
        hidden = x.unsqueeze(1)  # [s, b=1, h]
        for layer in self.blocks.layers:
            hidden, _ = layer(hidden, attention_mask=mask, rotary_pos_emb=None)
        x = hidden.squeeze(1)
        pool = torch.from_numpy(layout["pool"]).to(x.device)
        x = (x[pool] + x[pool + 1]) / 2
        return self.proj(self.ln_post(x))


class AudioPart(torch.nn.Module):
    """MindSpeed-MM's audio_encoder (its `encoder`), on pipeline stage 0."""

    def __init__(self, args: Any, layout: Any) -> None:
        super().__init__()
        self.encoder = AudioEncoder(audio_config(args, layout), layout.config.audio)


class OmniStage(vlm.Qwen2VLStage):
    """One pipeline stage of Qwen2.5-Omni's thinker on megatron-core: Qwen2VLStage's, with the audio encoder where
    the ViT is (stage 0, chunk 0). forward takes the batch's input_features / feature_attention_mask besides
    Qwen2VLStage's inputs."""

    def __init__(self, args: Any, layout: Any, pre_process: bool, post_process: bool,
                 vp_stage: int | None = None) -> None:
        super().__init__(args, layout, pre_process, post_process, vp_stage)
        self.audio_encoder = AudioPart(args, layout) if self.image_encoder is not None else None
        self._audio_inputs: tuple[Any, Any] = (None, None)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, labels: torch.Tensor | None = None,
                input_features: torch.Tensor | None = None, feature_attention_mask: torch.Tensor | None = None,
                **rest: Any) -> Any:
        self._audio_inputs = (input_features, feature_attention_mask)
        try:
            return super().forward(input_ids, position_ids, labels, **rest)
        finally:
            self._audio_inputs = (None, None)

    def _merge(self, input_ids: torch.Tensor, embeds: torch.Tensor, *vision: Any) -> torch.Tensor:
        """Qwen2VLStage's vision merge, then the audio features on the <|AUDIO|> tokens (the portable thinker's
        merge_audio: its checks, the blank audio of a micro-batch without audio)."""
        from mmrun.models.qwen2_5_omni.modeling import Qwen2_5OmniThinkerForConditionalGeneration
        from mmrun.models.vlm.blocks import merge_vision

        config = self.layout.config
        embeds = merge_vision(config.as_qwen2_5_vl(), self.image_encoder, self.training, input_ids, embeds, *vision,
                              blank_on_one_process=True)
        merger = SimpleNamespace(config=config, audio_tower=self.audio_encoder.encoder,
                                 training=self.training)
        return Qwen2_5OmniThinkerForConditionalGeneration.merge_audio(merger, input_ids, embeds, *self._audio_inputs)
