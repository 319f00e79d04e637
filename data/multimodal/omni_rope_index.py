"""TMRoPE (time-aligned multimodal rotary) position ids of Qwen2.5-Omni's thinker, in numpy.

Rows (time, height, width). Walking each row's real tokens (attention_mask 1) in order:
- text: the running index in all three rows;
- an audio block `<audio_start> <AUDIO>*n <audio_end>`: start, then n consecutive positions, then end, each
  one after the previous piece's maximum (n from the mel length: the encoder's stride-2 conv and pooling);
- an image / video block `<vision_start> <IMAGE|VIDEO>* <vision_end>`: start, the grid (time = frame index *
  seconds per grid * position_id_per_seconds, truncated; height/width = merged patch row/column; all offset by
  the block's start), end at the grid's maximum + 1;
- with `use_audio_in_video`, a video block `<vision_start> <audio_start> [video | audio]* <audio_end>
  <vision_end>`: both starts share one position, the video grid and the audio positions (0, 1, 2, ... from the
  same start) are cut into chunks of `position_id_per_seconds * seconds_per_chunk` time positions and
  interleaved chunk by chunk (video chunk j, then audio chunk j), both ends share one position.
Each piece starts at the previous *piece's* maximum + 1 (so after an interleaved block it is the last chunk's).
Without any image or video grid the positions are plain text positions (audio tokens included), padding 1.

This is transformers 5.x's `Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_rope_index` (tests
check equality for text, image, video, audio and audio-in-video, padded batches included); padding keeps
position 1, as there.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class OmniRopeConfig:
    spatial_merge_size: int
    image_token_id: int
    video_token_id: int
    audio_token_id: int
    vision_start_token_id: int
    audio_start_token_id: int
    position_id_per_seconds: float = 25
    seconds_per_chunk: float = 2
    use_audio_in_video: bool = False  # the data's setting (the collator passes it to get_rope_index)

    @classmethod
    def from_model_config(cls, config) -> "OmniRopeConfig":
        """From mmrun's OmniConfig (models/qwen2_5_omni/configuration.py)."""
        return cls(spatial_merge_size=config.vision.spatial_merge_size, image_token_id=config.image_token_id,
                   video_token_id=config.video_token_id, audio_token_id=config.audio_token_id,
                   vision_start_token_id=config.vision_start_token_id,
                   audio_start_token_id=config.audio_start_token_id,
                   position_id_per_seconds=config.position_id_per_seconds,
                   seconds_per_chunk=config.seconds_per_chunk)


def audio_token_count(mel_frames) -> np.ndarray:
    """Audio tokens the encoder gives for `mel_frames` frames: stride-2 conv, then stride-2 pooling."""
    after_conv = (np.asarray(mel_frames, dtype=np.int64) - 1) // 2 + 1
    return (after_conv - 2) // 2 + 1


def chunk_bounds(values: np.ndarray, per_chunk: int, offset: int = 0) -> list[tuple[int, int]]:
    """(start, end) slices of a non-decreasing `values` cut where `values - offset` reaches each multiple of
    `per_chunk` (transformers' get_chunked_index); always at least one, possibly empty, slice."""
    bounds, start, chunk = [], 0, 1
    for i, value in enumerate(np.asarray(values).tolist()):
        if value - offset >= chunk * per_chunk:
            bounds.append((start, i))
            start, chunk = i, chunk + 1
    bounds.append((start, len(values)))
    return bounds


def _line(length: int, start: int) -> np.ndarray:
    return np.broadcast_to(np.arange(length, dtype=np.int64) + start, (3, length))


def _grid_positions(start: int, grid, merge: int, times: np.ndarray) -> np.ndarray:
    h, w = int(grid[1]) // merge, int(grid[2]) // merge
    tt, hh, ww = np.meshgrid(times, np.arange(h, dtype=np.int64), np.arange(w, dtype=np.int64), indexing="ij")
    return np.stack([tt, hh, ww]).reshape(3, -1) + start


def video_times(grid_t: int, seconds: float, per_second: float) -> np.ndarray:
    # float32 (arange * seconds) * per_second, truncated: what torch computes there
    return ((np.arange(grid_t, dtype=np.float32) * np.float32(seconds)) * np.float32(per_second)).astype(np.int64)


def get_rope_index(config: OmniRopeConfig, input_ids, image_grid_thw=None, video_grid_thw=None,
                   attention_mask=None, use_audio_in_video: bool = False, audio_seqlens=None,
                   second_per_grids=None) -> tuple[np.ndarray, np.ndarray]:
    """(position_ids int64 (3, B, S), rope_deltas int64 (B, 1)); see the module docstring. `audio_seqlens`: mel
    frames of each audio in batch order (the feature_attention_mask's row sums); `second_per_grids`: seconds per
    temporal grid step of each video."""
    input_ids = np.asarray(input_ids)
    batch, length = input_ids.shape
    mask = (np.ones_like(input_ids, dtype=bool) if attention_mask is None
            else np.asarray(attention_mask) == 1)
    if image_grid_thw is None and video_grid_thw is None:
        positions = np.where(mask, np.cumsum(mask, axis=1) - 1, 1).astype(np.int64)
        deltas = positions.max(axis=1, keepdims=True) + 1 - mask.sum(axis=1, keepdims=True)
        return np.broadcast_to(positions, (3, batch, length)).copy(), deltas.astype(np.int64)
    c = config
    merge = c.spatial_merge_size
    images = np.asarray(image_grid_thw).reshape(-1, 3) if image_grid_thw is not None else np.zeros((0, 3), np.int64)
    videos = np.asarray(video_grid_thw).reshape(-1, 3) if video_grid_thw is not None else np.zeros((0, 3), np.int64)
    audio_tokens = audio_token_count(audio_seqlens) if audio_seqlens is not None else np.zeros(0, np.int64)
    seconds = np.asarray(second_per_grids, dtype=np.float32).reshape(-1) if second_per_grids is not None else None
    per_chunk = int(c.position_id_per_seconds * c.seconds_per_chunk)
    position_ids = np.ones((3, batch, length), dtype=np.int64)
    deltas = np.zeros((batch, 1), dtype=np.int64)
    image_i = video_i = audio_i = 0
    for row in range(batch):
        ids = input_ids[row][mask[row]]
        tokens = ids.tolist()
        starts = np.flatnonzero(ids[:-1] == c.vision_start_token_id)
        after = ids[starts + 1]  # the token after each <vision_start>: what kind of block it opens
        n_images = int((after == c.image_token_id).sum())
        n_videos = int((after == (c.audio_start_token_id if use_audio_in_video else c.video_token_id)).sum())
        n_audios = int((ids == c.audio_start_token_id).sum())
        remaining = {"image": n_images, "video": n_videos, "audio": n_audios}
        pieces: list[np.ndarray] = []

        def next_start() -> int:
            return int(pieces[-1].max()) + 1 if pieces else 0

        st = 0
        for _ in range(n_images + n_audios if use_audio_in_video else n_images + n_videos + n_audios):
            found = {}
            for name, token in (("image", c.image_token_id), ("video", c.video_token_id),
                                ("audio", c.audio_token_id)):
                found[name] = (tokens.index(token, st) if token in tokens and remaining[name] > 0
                               else len(tokens) + 1)
            first = min(found.values())
            if first == found["audio"]:
                kind = "audio"
            elif first == found["image"]:
                kind = "image"
            else:
                kind = "video_audio" if use_audio_in_video else "video"
            text_len = first - st - (2 if kind == "video_audio" else 1)
            if text_len:
                pieces.append(_line(text_len, next_start()))
            bos = next_start()
            pieces.append(_line(1, bos))
            if kind == "video_audio":
                pieces.append(_line(1, bos))
            start = next_start()
            if kind == "audio":
                n = int(audio_tokens[audio_i])
                pieces.append(_line(n, start))
                block = n
                audio_i += 1
            elif kind == "image":
                grid = images[image_i]
                times = np.arange(int(grid[0]), dtype=np.int64) * int(c.position_id_per_seconds)
                pieces.append(_grid_positions(start, grid, merge, times))
                block = int(np.prod(grid)) // merge ** 2
                image_i += 1
            else:
                grid = videos[video_i]
                video = _grid_positions(start, grid, merge, video_times(int(grid[0]), seconds[video_i],
                                                                         c.position_id_per_seconds))
                block = int(np.prod(grid)) // merge ** 2
                if kind == "video":
                    pieces.append(video)
                else:
                    n = int(audio_tokens[audio_i])
                    audio = _line(n, start)
                    video_chunks = chunk_bounds(video[0], per_chunk, start)
                    audio_chunks = chunk_bounds(audio[0], per_chunk, start)
                    for j in range(max(len(video_chunks), len(audio_chunks))):
                        if j < len(video_chunks):
                            pieces.append(video[:, video_chunks[j][0]:video_chunks[j][1]])
                        if j < len(audio_chunks):
                            pieces.append(audio[:, audio_chunks[j][0]:audio_chunks[j][1]])
                    block += n
                    audio_i += 1
                video_i += 1
            eos = next_start()
            pieces.append(_line(1, eos))
            if kind == "video_audio":
                pieces.append(_line(1, eos))
            ends = 2 if kind == "video_audio" else 1
            st += text_len + ends + block + ends
            remaining["audio" if kind == "audio" else kind.split("_")[0]] -= 1
            if kind == "video_audio":
                remaining["audio"] -= 1
        if st < len(tokens):
            pieces.append(_line(len(tokens) - st, next_start()))
        if not pieces:
            continue
        positions = np.concatenate(pieces, axis=1)
        position_ids[:, row, mask[row]] = positions
        deltas[row, 0] = positions.max() + 1 - ids.size
    return position_ids, deltas
