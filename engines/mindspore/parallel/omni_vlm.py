"""Qwen2.5-Omni's thinker on MindSpore's parallel engine: Qwen2.5-VL's stage (vlm.py) plus the audio encoder on the
first stage, beside the ViT, as MindSpeed-MM places it (model_7b.json's audio_pp_layers [32, 0]).

The audio encoder in MindSpeed-MM's names (models/qwen2_5_omni/mm_layout.py): conv1 / conv2 (the Conv1d kernels
flattened, one matmul over the gathered taps), blocks.layers.N (LayerNorm, linear_qkv column-parallel per head
[q k v] with the k bias stored as zeros, attention inside each 2-second chunk, linear_proj row-parallel, GELU MLP
fc1 column- / fc2 row-parallel), ln_post, proj. Its forward is the portable AudioEncoder's (the same host
bookkeeping and steps) over these layers, and its features replace the <|AUDIO|> tokens by the portable thinker's
merge. TMRoPE positions are the batch's position_ids (per sample, from the collate).
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np

from mmrun.backend.mindspore import nn, ops
from mmrun.backend.mindspore.parallel.groups import ParallelState
from mmrun.backend.mindspore.parallel.layers import ColumnParallelLinear, RowParallelLinear, divide
from mmrun.engines.mindspore.parallel import vlm
from mmrun.models.vlm import vision_layout
from mmrun.models.vlm.blocks import merge_vision

# A micro-batch of the Omni stage: Qwen2-VL's inputs, the audio's, then the (shifted) labels and their mask.
OMNI_FIELDS = (*vlm.VLM_FIELDS[:-2], "input_features", "feature_attention_mask", *vlm.VLM_FIELDS[-2:])


class AudioAttention(nn.Module):
    def __init__(self, audio: Any, state: ParallelState) -> None:
        super().__init__()
        self.head_dim = audio.head_dim
        self.heads = divide(audio.num_heads, state.tensor_model_parallel_size, "number of audio attention heads")
        self.linear_qkv = ColumnParallelLinear(audio.hidden_size, 3 * audio.hidden_size, state)
        self.linear_proj = RowParallelLinear(audio.hidden_size, audio.hidden_size, state)

    def forward(self, x, cu_seqlens: np.ndarray):
        qkv, _ = self.linear_qkv(x)  # [n, heads/tp * 3 * head_dim], per head [q k v]
        n = qkv.shape[0]
        q, k, v = ops.split(ops.reshape(qkv, (n, self.heads, 3 * self.head_dim)), self.head_dim, dim=-1)
        y = ops.varlen_attention(q, k, v, cu_seqlens, scale=self.head_dim ** -0.5)
        out, _ = self.linear_proj(ops.reshape(y, (n, self.heads * self.head_dim)))
        return out


class AudioLayer(nn.Module):
    def __init__(self, audio: Any, state: ParallelState) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(audio.hidden_size)
        self.self_attention = AudioAttention(audio, state)
        self.pre_mlp_layernorm = nn.LayerNorm(audio.hidden_size)
        self.mlp = vlm.VisionMLP(SimpleNamespace(hidden_size=audio.hidden_size, intermediate_size=audio.intermediate_size,
                                                 hidden_act=audio.activation_function), state, gated=False)

    def forward(self, x, cu_seqlens: np.ndarray):
        x = x + self.self_attention(self.input_layernorm(x), cu_seqlens)
        return x + self.mlp(self.pre_mlp_layernorm(x))


class AudioBlocks(nn.Module):
    def __init__(self, audio: Any, state: ParallelState) -> None:
        super().__init__()
        self.layers = nn.ModuleList([AudioLayer(audio, state) for _ in range(audio.num_layers)])


class AudioEncoder(nn.Module):
    """MindSpeed-MM's audio_encoder.encoder: mel frames of audios of `lengths` frames -> (tokens, output_dim)."""

    def __init__(self, audio: Any, state: ParallelState) -> None:
        from mmrun.models.qwen2_5_omni.modeling import sinusoids

        super().__init__()
        self.audio = audio
        self.conv1 = nn.Linear(audio.num_mel_bins * 3, audio.hidden_size)
        self.conv2 = nn.Linear(audio.hidden_size * 3, audio.hidden_size)
        self.blocks = AudioBlocks(audio, state)
        self.ln_post = nn.LayerNorm(audio.hidden_size)
        self.proj = nn.Linear(audio.hidden_size, audio.output_dim)
        self.audio_bos_eos_token = nn.Embedding(2, audio.output_dim)  # stored, not used in forward
        self.positions = sinusoids(audio.max_source_positions, audio.hidden_size)

    def forward(self, frames, lengths: np.ndarray):
        from mmrun.models.qwen2_5_omni.modeling import AudioEncoder as PortableAudioEncoder

        portable = SimpleNamespace(config=self.audio, conv1=self.conv1, conv2=self.conv2, layers=self.blocks.layers,
                                   ln_post=self.ln_post, proj=self.proj, positions=self.positions)
        return PortableAudioEncoder.forward(portable, frames, lengths)


class AudioPart(nn.Module):
    def __init__(self, audio: Any, state: ParallelState) -> None:
        super().__init__()
        self.encoder = AudioEncoder(audio, state)


class OmniStage(vlm.Qwen2VLStage):
    """This rank's stage of Qwen2.5-Omni's thinker: Qwen2VLStage's, with the audio encoder on the first stage."""

    fields = OMNI_FIELDS

    def __init__(self, config: Any, layout: Any, state: ParallelState) -> None:
        super().__init__(config, layout, state)
        if self.pre_process:  # the audio's tokens are not the text sequence: no sequence parallelism
            self.audio_encoder = AudioPart(config.audio, dataclasses.replace(state, sequence_parallel=False))
        self.vision_config = config.as_qwen2_5_vl()

    def forward(self, input_ids, position_ids, pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw,
                input_features=None, feature_attention_mask=None, hidden_in=None, labels=None):
        from mmrun.models.qwen2_5_omni.modeling import Qwen2_5OmniThinkerForConditionalGeneration

        x = hidden_in
        if self.pre_process:
            x = self.text_decoder.embedding.word_embeddings(input_ids)  # [b, s, h], summed over TP
            x = merge_vision(self.vision_config, self.image_encoder, self.training, input_ids, x, pixel_values,
                             vision_layout.grid_array(image_grid_thw), pixel_values_videos,
                             vision_layout.grid_array(video_grid_thw))
            merger = SimpleNamespace(config=self.config, audio_tower=self.audio_encoder.encoder, training=self.training)
            x = Qwen2_5OmniThinkerForConditionalGeneration.merge_audio(merger, input_ids, x, input_features,
                                                                      feature_attention_mask)
        return self._decode(x, input_ids, position_ids, labels)
