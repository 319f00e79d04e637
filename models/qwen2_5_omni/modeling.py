"""Qwen2.5-Omni's thinker on mmrun's portable API (PyTorch and MindSpore), equal to transformers'
Qwen2_5OmniThinkerForConditionalGeneration (fp32 logits, loss and every gradient within 1e-5 for text, image,
video, audio and video with its audio track: tests/models/test_qwen2_5_omni_vs_transformers.py).

Built from the Qwen2-VL family's blocks (models/qwen2_vl/modeling.py): the Qwen2.5-VL vision tower (window
attention; Omni's checkpoint has separate q/k/v projections, so its attention overrides `project_qkv`), the
Qwen2 decoder with M-RoPE, the feature merge by one gather and the loss. New here: the Whisper-style audio
encoder, and TMRoPE positions (data/multimodal/omni_rope_index.py).

Parameter names are the thinker checkpoint's keys (hf_checkpoint.py reads a thinker directory or a whole
Qwen2.5-Omni's `thinker.*`):

    audio_tower.conv1.weight (D, mel*3), conv2.weight (D, D*3): the Conv1d kernels (D, C, 3) flattened
    audio_tower.{conv1,conv2}.bias, audio_tower.layers.N.{self_attn.{q,k,v,out}_proj, self_attn_layer_norm,
        fc1, fc2, final_layer_norm}, audio_tower.{ln_post, proj, audio_bos_eos_token}
    visual.patch_embed.proj.weight (D, 1176), visual.blocks.N.{norm1, norm2, attn.{q,k,v,proj},
        mlp.{gate,up,down}_proj}, visual.merger.{ln_q, mlp.0, mlp.2}
    model.embed_tokens, model.layers.N.*, model.norm, lm_head.weight (absent when tied)

The audio encoder in form (not in result) differs from transformers: the mel frames of every audio are cut into
chunks of 2 * n_window frames (each chunk its own attention segment, its positions from 0); both convolutions
(kernel 3, padding 1; the second stride 2) are one gather of the three taps from [frames; a zero row] and one
matmul, the zero row standing for the padding at each chunk's edges, so no chunk is padded to the longest.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mmrun.backend import nn, ops, tensors
from mmrun.data.multimodal.omni_rope_index import OmniRopeConfig, get_rope_index
from mmrun.models.qwen2_vl.configuration import VisionConfig
from mmrun.models.qwen2_vl.modeling import Qwen2TextModel, Qwen2VisionTransformer
from mmrun.models.vlm import vision_layout
from mmrun.models.vlm.blocks import (VisionAttention, causal_lm_loss, host_array, merge_vision,
                                     place_features)
from mmrun.models.qwen2_5_omni.configuration import AudioConfig, OmniConfig
from mmrun.models.transformer_blocks import activation

AUDIO_PREFIX = "audio_tower."
# Which parts `freeze` switches, by parameter-name prefix (MindSpeed-MM's model.json parts).
PARTS = {"audio_encoder": (AUDIO_PREFIX,), "vision_projector": ("visual.merger.",), "vision_encoder": ("visual.",)}


# ------------------------------------------------------------------------------------------ audio

def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
    """(length, channels) float32 [sin | cos] table of the audio positions (transformers' SinusoidsPositionEmbedding,
    in its float32 steps)."""
    increment = np.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = np.exp(np.float32(-increment) * np.arange(channels // 2, dtype=np.float32))
    scaled = np.arange(length, dtype=np.float32)[:, None] * inv_timescales[None, :]
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1).astype(np.float32)


def audio_layout(lengths: np.ndarray, n_window: int) -> dict[str, np.ndarray]:
    """Host bookkeeping of the audio encoder for audios of `lengths` mel frames (in their concatenated order):
    `chunks` the chunk lengths (2 * n_window frames, the last of each audio shorter), `conv1` / `conv2` the tap
    indices (rows, 3) into [frames; zero row] and [conv1 output; zero row] (out of a chunk: the zero row,
    index = the number of rows), `positions` each conv2 output row's index in its chunk, `cu_seqlens` the
    chunks after conv2 as attention segments, `pool` the first row of each averaged pair."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    window = 2 * n_window
    chunks = np.concatenate([np.minimum(window, length - np.arange(0, length, window)) for length in lengths]) \
        if lengths.size else np.zeros(0, np.int64)
    chunk_starts = np.concatenate([[0], np.cumsum(chunks)[:-1]]).astype(np.int64)
    total = int(chunks.sum())
    taps = np.arange(3) - 1
    # conv1: stride 1, one output per frame
    local = np.concatenate([np.arange(n) for n in chunks]) if chunks.size else np.zeros(0, np.int64)
    start_of = np.repeat(chunk_starts, chunks)
    size_of = np.repeat(chunks, chunks)
    source = local[:, None] + taps[None, :]
    conv1 = np.where((source >= 0) & (source < size_of[:, None]), start_of[:, None] + source, total)
    # conv2: stride 2 over each chunk's conv1 rows
    after = (chunks - 1) // 2 + 1
    out_local = np.concatenate([np.arange(n) for n in after]) if after.size else np.zeros(0, np.int64)
    start2 = np.repeat(chunk_starts, after)
    size2 = np.repeat(chunks, after)
    source2 = 2 * out_local[:, None] + taps[None, :]
    conv2 = np.where((source2 >= 0) & (source2 < size2[:, None]), start2[:, None] + source2, total)
    # stride-2 average pooling per audio over its conv2 rows
    per_audio = (lengths - 1) // 2 + 1
    pooled = (per_audio - 2) // 2 + 1
    offsets = np.concatenate([[0], np.cumsum(per_audio)[:-1]]).astype(np.int64)
    pool = np.concatenate([offsets[i] + 2 * np.arange(pooled[i]) for i in range(lengths.size)]) \
        if lengths.size else np.zeros(0, np.int64)
    return {"chunks": chunks, "conv1": conv1.astype(np.int64), "conv2": conv2.astype(np.int64),
            "positions": out_local.astype(np.int64), "cu_seqlens": np.concatenate([[0], np.cumsum(after)]).astype(
                np.int64), "pool": pool.astype(np.int64), "tokens": pooled.astype(np.int64)}


def _taps(table, index: np.ndarray):
    """(rows, C * 3) of a kernel-3 convolution's inputs: rows of [table; 0] at `index` (rows, 3), laid out
    channel-major (c * 3 + k) as the flattened Conv1d kernel (D, C, 3) is."""
    rows, width = index.shape[0], table.shape[1]
    padded = ops.cat([table, ops.zeros((1, width), dtype=table.dtype, like=table)], dim=0)
    picked = ops.reshape(ops.embedding(tensors.from_numpy(index.reshape(-1)), padded), (rows, 3, width))
    return ops.reshape(ops.transpose(picked, 1, 2), (rows, width * 3))


class AudioAttention(nn.Module):
    """Bidirectional attention inside each chunk; k_proj has no bias (Whisper's)."""

    def __init__(self, config: AudioConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        width = config.hidden_size
        self.k_proj = nn.Linear(width, width, bias=False)
        self.v_proj = nn.Linear(width, width)
        self.q_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x, cu_seqlens: np.ndarray):
        n = x.shape[0]
        q, k, v = (ops.reshape(p(x), (n, self.num_heads, self.head_dim)) for p in (self.q_proj, self.k_proj,
                                                                                      self.v_proj))
        y = ops.varlen_attention(q, k, v, cu_seqlens, scale=self.head_dim ** -0.5)
        return self.out_proj(ops.reshape(y, (n, self.num_heads * self.head_dim)))


class AudioEncoderLayer(nn.Module):
    def __init__(self, config: AudioConfig) -> None:
        super().__init__()
        self.self_attn = AudioAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(config.hidden_size)
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.final_layer_norm = nn.LayerNorm(config.hidden_size)
        self.act = activation(config.activation_function)

    def forward(self, x, cu_seqlens: np.ndarray):
        x = x + self.self_attn(self.self_attn_layer_norm(x), cu_seqlens)
        return x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))


class AudioEncoder(nn.Module):
    """mel frames (frames, num_mel_bins) of audios of `lengths` frames -> (tokens, output_dim), the audios'
    tokens in order (audio_layout's `tokens` each)."""

    def __init__(self, config: AudioConfig) -> None:
        super().__init__()
        self.config = config
        self.conv1 = nn.Linear(config.num_mel_bins * 3, config.hidden_size)
        self.conv2 = nn.Linear(config.hidden_size * 3, config.hidden_size)
        self.layers = nn.ModuleList([AudioEncoderLayer(config) for _ in range(config.num_layers)])
        self.ln_post = nn.LayerNorm(config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.output_dim)
        # <|audio_bos|>/<|audio_eos|> embeddings the checkpoint carries; the thinker's forward does not use them
        self.audio_bos_eos_token = nn.Embedding(2, config.output_dim)
        self.positions = sinusoids(config.max_source_positions, config.hidden_size)  # numpy: no buffers in the API

    def forward(self, frames, lengths: np.ndarray):
        layout = audio_layout(lengths, self.config.n_window)
        if frames.dtype != self.conv1.weight.dtype:
            frames = tensors.cast(frames, self.conv1.weight.dtype)
        if layout["positions"].size and int(layout["positions"].max()) >= self.config.max_source_positions:
            raise ValueError(f"audio chunks of {int(layout['chunks'].max())} frames exceed max_source_positions "
                             f"{self.config.max_source_positions}; lower n_window")
        x = ops.gelu(self.conv1(_taps(frames, layout["conv1"])))
        x = ops.gelu(self.conv2(_taps(x, layout["conv2"])))
        x = x + tensors.cast(tensors.from_numpy(self.positions[layout["positions"]]), x.dtype)
        for layer in self.layers:
            x = layer(x, layout["cu_seqlens"])
        pool = layout["pool"]
        x = (ops.embedding(tensors.from_numpy(pool), x) + ops.embedding(tensors.from_numpy(pool + 1), x)) / 2
        return self.proj(self.ln_post(x))


def audio_frames(input_features, feature_attention_mask) -> tuple[Any, np.ndarray]:
    """(frames (total, mel), lengths) from the processor's input_features (audios, mel, T) and its
    feature_attention_mask (audios, T): each audio's real frames, concatenated in order."""
    mask = host_array(feature_attention_mask).astype(bool)
    count, mel, length = input_features.shape
    rows = np.flatnonzero(mask.reshape(-1))  # row b * T + t of the (audios * T, mel) frames
    flat = ops.reshape(ops.transpose(input_features, 1, 2), (count * length, mel))
    return ops.embedding(tensors.from_numpy(rows.astype(np.int64)), flat), mask.sum(axis=1).astype(np.int64)


# ------------------------------------------------------------------------------------------ vision

class SplitQKVVisionAttention(VisionAttention):
    """Qwen2.5-VL's vision attention with Omni's separate q, k, v projections (with bias)."""

    def __init__(self, config: VisionConfig) -> None:
        nn.Module.__init__(self)
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.q = nn.Linear(config.hidden_size, config.hidden_size)
        self.k = nn.Linear(config.hidden_size, config.hidden_size)
        self.v = nn.Linear(config.hidden_size, config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def project_qkv(self, x):
        return self.q(x), self.k(x), self.v(x)


class OmniVisionTransformer(Qwen2VisionTransformer):
    """Qwen2.5-VL's ViT and merger (window attention, full attention at fullatt_block_indexes) with split q/k/v."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__(config, True)
        for block in self.blocks:
            block.attn = SplitQKVVisionAttention(config)


# ------------------------------------------------------------------------------------------ whole thinker

class Qwen2_5OmniThinkerForConditionalGeneration(nn.Module):
    """The thinker for training: forward returns {"logits", "loss_dict"} as Qwen2VLForConditionalGeneration.

    forward(input_ids (B, S), attention_mask=None, labels=None, pixel_values=None, image_grid_thw=None,
            pixel_values_videos=None, video_grid_thw=None, video_second_per_grid=None (videos,),
            input_features=None (audios, mel, T), feature_attention_mask=None (audios, T),
            use_audio_in_video=False, position_ids=None (3, B, S), calculate_per_token_loss=False)

    The processor's names; `second_per_grid_ts` is taken for video_second_per_grid (mmrun's Qwen2-VL batches).
    Positions are TMRoPE's, computed on the host when not given. Attention is causal only (padding on the right).
    """

    # merge_vision's blank_on_one_process: an engine whose optimizer skips a parameter without a gradient sets it
    # (engines/torch/fsdp2: torch's AdamW), so that one process keeps the blank ViT pass of a text-only batch
    blank_vision_on_one_process = False

    def __init__(self, config: OmniConfig) -> None:
        super().__init__()
        self.config = config
        self.audio_tower = AudioEncoder(config.audio)
        self.visual = OmniVisionTransformer(config.vision)
        self.model = Qwen2TextModel(config.text)
        self.lm_head = (None if config.tie_word_embeddings
                        else nn.Linear(config.text.hidden_size, config.text.vocab_size, bias=False))
        self.vision_config = config.as_qwen2_5_vl()
        self.rope_config = OmniRopeConfig.from_model_config(config)

    def forward(self, input_ids, attention_mask=None, labels=None, pixel_values=None, image_grid_thw=None,
                pixel_values_videos=None, video_grid_thw=None, video_second_per_grid=None, input_features=None,
                feature_attention_mask=None, use_audio_in_video=False, position_ids=None,
                calculate_per_token_loss: bool = False, second_per_grid_ts=None, **ignored):
        if video_second_per_grid is None:
            video_second_per_grid = second_per_grid_ts
        image_grid, video_grid = vision_layout.grid_array(image_grid_thw), vision_layout.grid_array(video_grid_thw)
        embeds = self.model.embed_tokens(input_ids)
        embeds = merge_vision(self.vision_config, self.visual, self.training, input_ids, embeds, pixel_values,
                              image_grid, pixel_values_videos, video_grid, self.blank_vision_on_one_process)
        lengths = None if feature_attention_mask is None else host_array(feature_attention_mask).sum(axis=1)
        embeds = self.merge_audio(input_ids, embeds, input_features, feature_attention_mask)
        if position_ids is None:
            positions, _ = get_rope_index(self.rope_config, host_array(input_ids), image_grid, video_grid,
                                          host_array(attention_mask), bool(host_array(use_audio_in_video)), lengths,
                                          host_array(video_second_per_grid))
            position_ids = tensors.from_numpy(positions)
        hidden = self.model(embeds, position_ids)
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = ops.linear(hidden, weight)
        loss_dict = {} if labels is None else causal_lm_loss(logits, labels, calculate_per_token_loss)
        return {"logits": logits, "loss_dict": loss_dict}

    def merge_audio(self, input_ids, embeds, input_features, feature_attention_mask):
        """embeds with the <|AUDIO|> tokens' rows replaced by the audio encoder's features, in order."""
        batch, seq, _ = embeds.shape
        ids = ops.reshape(input_ids, (batch * seq,))
        is_token = tensors.cast(ids == self.config.audio_token_id, "int64")
        found = int(tensors.to_numpy(ops.sum(is_token)))
        if input_features is None:
            if found:
                raise ValueError(f"input_ids hold {found} audio tokens (id {self.config.audio_token_id}) but no "
                                 "input_features were given; pass the processor's input_features and "
                                 "feature_attention_mask")
            if not self.training:
                return embeds
            # As merge_vision's blank image: the encoder runs on 4 silent frames whose result counts zero times.
            blank = self.audio_tower(ops.zeros((4, self.config.audio.num_mel_bins), like=embeds), np.array([4]))
            return embeds + tensors.cast(ops.sum(blank), embeds.dtype) * 0.0
        if feature_attention_mask is None:
            raise ValueError("input_features were given without feature_attention_mask; pass the processor's mask")
        frames, lengths = audio_frames(input_features, feature_attention_mask)
        expected = int(np.sum(audio_layout(lengths, self.config.audio.n_window)["tokens"]))
        if found != expected:
            raise ValueError(f"audio tokens and features do not match: input_ids hold {found} audio tokens (id "
                             f"{self.config.audio_token_id}), the {len(lengths)} audio(s) give {expected} features; "
                             "the sequence cut-off (--seq-length) probably truncated an audio")
        audio = self.audio_tower(frames, lengths)
        if audio.dtype != embeds.dtype:
            audio = tensors.cast(audio, embeds.dtype)
        return place_features(ids, embeds, audio, [(is_token, expected)])

    def freeze(self, audio_encoder: bool = True, vision_encoder: bool = True, vision_projector: bool = False,
               text_decoder: bool = False) -> dict:
        """Which parts train, as MindSpeed-MM's model.json `freeze` flags say: a frozen part gets requires_grad
        False. Returns {part: number of parameters frozen}."""
        wanted = {"audio_encoder": audio_encoder, "vision_encoder": vision_encoder,
                  "vision_projector": vision_projector, "text_decoder": text_decoder}
        frozen = dict.fromkeys(wanted, 0)
        for name, param in self.named_parameters():
            part = next((p for p, prefixes in PARTS.items() if name.startswith(prefixes)), "text_decoder")
            (nn.freeze if wanted[part] else nn.unfreeze)([param])
            frozen[part] += int(wanted[part])
        return frozen


# ------------------------------------------------------------------------------------------ weights

def init_weights(model: Qwen2_5OmniThinkerForConditionalGeneration, seed: int, std: float | None = None) -> None:
    """Deterministic, framework-independent init (the Qwen2-VL family's mm_layout.initial_value by name)."""
    from mmrun.models.vlm.mm_layout import initial_value

    std = model.config.text.initializer_range if std is None else std
    state = {name: initial_value(name, tuple(param.shape), seed, std) for name, param in model.named_parameters()}
    model.load_state_dict(tensors.state_dict_from_numpy(state))


def load_hf_weights(model: Qwen2_5OmniThinkerForConditionalGeneration, arrays: Mapping[str, np.ndarray]) -> None:
    """Load hf_checkpoint.load_hf_directory's arrays (mmrun layout, bf16 as uint16 bits), strictly."""
    from mmrun.checkpoint.formats.safetensors import to_float_arrays
    model.load_state_dict(tensors.state_dict_from_numpy(to_float_arrays(arrays)))


def from_pretrained(path: str) -> Qwen2_5OmniThinkerForConditionalGeneration:
    """The thinker of a Hugging Face Qwen2.5-Omni directory (thinker or whole model), its weights loaded."""
    from mmrun.models.qwen2_5_omni.hf_checkpoint import load_hf_directory
    config, arrays = load_hf_directory(path)
    model = Qwen2_5OmniThinkerForConditionalGeneration(config)
    load_hf_weights(model, arrays)
    return model
