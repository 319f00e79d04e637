"""Qwen2.5-Omni samples (MindSpeed-MM's template "qwen2_omni", its Qwen2OmniPlugin): audio beside images and videos.

Placeholders are expanded as MindSpeed-MM's process_messages does, message by message: each `<image>` becomes
`<|vision_bos|>` + `<|IMAGE|>` per merged patch + `<|vision_eos|>`; each `<audio>` `<|audio_bos|>` + `<|AUDIO|>` per
audio token + `<|audio_eos|>`; each `<video>` `<|vision_bos|>` + `<|VIDEO|>`* + `<|vision_eos|>`. With
preprocess_parameters.use_audio_in_video every `<video>` must be followed by an `<audio>` (its sound track, listed in
`audios`): the pair becomes `<|vision_bos|><|audio_bos|>` + video and audio tokens interleaved by 2-second chunks
(TMRoPE's, data/multimodal/omni_rope_index.py) + `<|audio_eos|><|vision_eos|>`.
A sample that lists no audios and whose videos are video files (data/multimodal/video_files.py) takes each video's
own sound track as its audio (a video without one is refused in one line).

Audio files are read at preprocess_parameters.audio_sampling_rate (data/audio/reader.py) and turned into Whisper
log-mel features (data/audio/features.py, the model directory's preprocessor_config.json); a sample's
`input_features` (audios, mel, frames) are zero beyond each audio's `feature_attention_mask`.
"""
from __future__ import annotations

import numpy as np

from mmrun.data.audio.features import AudioInputError, WhisperFeatures
from mmrun.data.audio.reader import read_audio
from mmrun.data.multimodal.omni_rope_index import OmniRopeConfig, audio_token_count, chunk_bounds, video_times
from mmrun.data.multimodal.templates import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, ChatTemplate

AUDIO_PLACEHOLDER = "<audio>"
AUDIO_TOKENS = {"audio_start": "<|audio_bos|>", "audio_end": "<|audio_eos|>", "audio_pad": "<|AUDIO|>"}
TEMPLATE_NAME = "qwen2_omni"


class OmniSampleError(ValueError):
    """A sample whose audio or placeholders cannot be used (the dataset reports it as its SampleError)."""


def audio_features(paths, settings: WhisperFeatures, sampling_rate: int, where: str,
                   what: str = "audio") -> dict[str, np.ndarray]:
    """input_features (audios, mel, longest) and feature_attention_mask (audios, longest) of the audio files
    (`what`: "video" when they are the sound tracks of video files)."""
    try:
        waves = [read_audio(path, sampling_rate, what) for path in paths]
        return settings.batch(waves, sampling_rate)
    except AudioInputError as error:
        raise OmniSampleError(f"{where}: {error}") from None


def interleaved_block(grid, seconds: float, audio_tokens: int, template: ChatTemplate, rope: OmniRopeConfig) -> str:
    """A video and its audio track as one block, chunk by chunk (MindSpeed-MM's placeholder string)."""
    merge = rope.spatial_merge_size
    per_frame = (int(grid[1]) // merge) * (int(grid[2]) // merge)
    times = np.repeat(video_times(int(grid[0]), seconds, rope.position_id_per_seconds), per_frame)
    per_chunk = int(rope.position_id_per_seconds * rope.seconds_per_chunk)
    video = chunk_bounds(times, per_chunk)
    audio = chunk_bounds(np.arange(audio_tokens), per_chunk)
    body = ""
    for j in range(max(len(video), len(audio))):
        if j < len(video):
            body += template.video_pad * (video[j][1] - video[j][0])
        if j < len(audio):
            body += AUDIO_TOKENS["audio_pad"] * (audio[j][1] - audio[j][0])
    return (f"{template.vision_start}{AUDIO_TOKENS['audio_start']}{body}{AUDIO_TOKENS['audio_end']}"
            f"{template.vision_end}")


def expand_messages(messages, template: ChatTemplate, rope: OmniRopeConfig, image_tokens, video_grids,
                    video_seconds, audio_lengths, use_audio_in_video: bool, where: str) -> list[dict]:
    """Copies of `messages` with every placeholder expanded (module docstring). `audio_lengths`: mel frames of each
    audio in order; `video_grids` / `video_seconds`: each video's grid and seconds per temporal step."""
    merge = rope.spatial_merge_size ** 2
    tokens = [int(n) for n in audio_token_count(audio_lengths)] if len(audio_lengths) else []
    images, audios, videos = iter(image_tokens), iter(range(len(tokens))), iter(range(len(video_grids)))
    audio_block = f"{AUDIO_TOKENS['audio_start']}{{}}{AUDIO_TOKENS['audio_end']}"
    out = []
    for message in messages:
        content = message["content"]
        while IMAGE_PLACEHOLDER in content:
            block = f"{template.vision_start}{template.image_pad * next(images)}{template.vision_end}"
            content = content.replace(IMAGE_PLACEHOLDER, block, 1)
        if use_audio_in_video and tokens and len(video_grids):
            if len(video_grids) != len(tokens):
                raise OmniSampleError(f"{where}: {len(video_grids)} videos but {len(tokens)} audios with "
                                      "use_audio_in_video; give each video its sound track as an audio")
            while VIDEO_PLACEHOLDER in content:
                at = content.find(VIDEO_PLACEHOLDER)
                if content.find(AUDIO_PLACEHOLDER, at) == -1:
                    raise OmniSampleError(f"{where}: with use_audio_in_video each {VIDEO_PLACEHOLDER} must be followed "
                                          f"by an {AUDIO_PLACEHOLDER} (its sound track); add it to the message")
                v, a = next(videos), next(audios)
                block = interleaved_block(video_grids[v], float(video_seconds[v]), tokens[a], template, rope)
                content = content.replace(VIDEO_PLACEHOLDER, block, 1).replace(AUDIO_PLACEHOLDER, "", 1)
        else:
            while AUDIO_PLACEHOLDER in content:
                content = content.replace(AUDIO_PLACEHOLDER, audio_block.format(
                    AUDIO_TOKENS["audio_pad"] * tokens[next(audios)]), 1)
            while VIDEO_PLACEHOLDER in content:
                count = int(np.prod(video_grids[next(videos)])) // merge
                content = content.replace(VIDEO_PLACEHOLDER,
                                          f"{template.vision_start}{template.video_pad * count}{template.vision_end}", 1)
        out.append({**message, "content": content})
    return out


# special_token_ids' view of the audio tokens (it reads `name` and `special_tokens`)
class _AudioTokens:
    name = TEMPLATE_NAME
    special_tokens = AUDIO_TOKENS


AUDIO_TOKENS_TEMPLATE = _AudioTokens()
# config.json (the thinker's part) key -> OmniRopeConfig field, and the tokenizer's string for the ids among them
_CONFIG_IDS = {"image_token_index": ("image_token_id", "<|IMAGE|>"), "video_token_index": ("video_token_id", "<|VIDEO|>"),
               "audio_token_index": ("audio_token_id", "<|AUDIO|>"),
               "vision_start_token_id": ("vision_start_token_id", "<|vision_bos|>"),
               "audio_start_token_id": ("audio_start_token_id", "<|audio_bos|>")}


def rope_config(model_dir: str, merge_size: int, vocab: dict, use_audio_in_video: bool) -> OmniRopeConfig:
    """TMRoPE's settings: the token ids from the tokenizer, checked against config.json (thinker or whole model)
    when the directory has one, whose position_id_per_seconds / seconds_per_chunk then apply."""
    import json
    import os

    from mmrun.data.gpt_dataset import DatasetConfigError

    ids = {field: vocab[token] for field, token in _CONFIG_IDS.values() if token in vocab}
    timing = {"position_id_per_seconds": 25, "seconds_per_chunk": 2}
    path = os.path.join(model_dir, "config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        config = config.get("thinker_config", config)
        for key, (field, token) in _CONFIG_IDS.items():
            if key in config and ids.get(field) != config[key]:
                raise DatasetConfigError(f"{path}: {key} is {config[key]} but tokenizer.json gives {token} the id "
                                         f"{ids.get(field)}; use matching files")
        timing = {k: config.get(k, v) for k, v in timing.items()}
        merge_size = int((config.get("vision_config") or {}).get("spatial_merge_size", merge_size))
    return OmniRopeConfig(spatial_merge_size=merge_size, use_audio_in_video=use_audio_in_video, **ids, **timing)


def with_video_sound(messages) -> list[dict]:
    """Messages whose every <video> is followed by the <audio> of its own sound track (use_audio_in_video with the
    audio read from the video files themselves)."""
    pair = VIDEO_PLACEHOLDER + AUDIO_PLACEHOLDER
    return [{**m, "content": m["content"].replace(pair, VIDEO_PLACEHOLDER).replace(VIDEO_PLACEHOLDER, pair)}
            for m in messages]


def encode_media(dataset, sample, out: dict) -> tuple[list[dict], int]:
    """The sample's audio features into `out` (beside its pixels, already there) and its messages expanded; returns
    (messages, number of audio tokens the text must keep)."""
    lengths = np.zeros(0, np.int64)
    rope = dataset.rope_config
    audios, what, messages = sample.audios, "audio", sample.messages
    if rope.use_audio_in_video and not audios and sample.videos and all(isinstance(v, str) for v in sample.videos):
        audios, what, messages = sample.videos, "video", with_video_sound(messages)  # each video file's own sound
    if audios:
        features = audio_features(audios, dataset.audio_settings,
                                  dataset.config.preprocess["audio_sampling_rate"], sample.where, what)
        out.update(features)
        lengths = features["feature_attention_mask"].sum(axis=1)
    image_tokens = [int(np.prod(g)) // rope.spatial_merge_size ** 2 for g in out.get("image_grid_thw", [])]
    messages = expand_messages(messages, dataset.template, rope, image_tokens, out.get("video_grid_thw", []),
                               out.get("second_per_grid_ts", []), lengths, rope.use_audio_in_video, sample.where)
    return messages, int(audio_token_count(lengths).sum()) if lengths.size else 0


def encode_prompt(tokenizer, template: ChatTemplate, text: str, rope: OmniRopeConfig, *, images=(), videos=(),
                  audios=(), image_config=None, video_config=None, settings: WhisperFeatures | None = None,
                  sampling_rate: int = 16000) -> dict[str, np.ndarray]:
    """One user turn for generation (inference_vlm.py): the images, the videos (each (frames, frames a second),
    data/multimodal/video_files.py; with rope.use_audio_in_video each followed by its sound track, the first
    len(videos) of `audios`), the other audios (waveforms at `sampling_rate`), then the text; the processor's
    arrays as OmniPrompt takes them (input_ids, pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw,
    second_per_grid_ts, input_features, feature_attention_mask)."""
    from mmrun.data.multimodal.image_processing import preprocess_images, preprocess_video
    from mmrun.data.multimodal.templates import USER
    from mmrun.data.multimodal.vlm_prompt import user_turn_ids

    out: dict[str, np.ndarray] = {}
    merge = rope.spatial_merge_size ** 2
    image_tokens, grids, seconds, lengths = [], [], [], np.zeros(0, np.int64)
    if images:
        out["pixel_values"], out["image_grid_thw"] = preprocess_images(list(images), image_config)
        image_tokens = [int(np.prod(g)) // merge for g in out["image_grid_thw"]]
    if videos:
        pixels = []
        for frames, rate in videos:
            flat, grid = preprocess_video(list(frames), video_config)
            pixels.append(flat)
            grids.append(grid)
            seconds.append(video_config.temporal_patch_size / rate)
        out["pixel_values_videos"], out["video_grid_thw"] = np.concatenate(pixels), np.concatenate(grids)
        out["second_per_grid_ts"] = np.asarray(seconds, dtype=np.float32)
    if len(audios):
        out.update(settings.batch(list(audios), sampling_rate))
        lengths = out["feature_attention_mask"].sum(axis=1)
    paired = rope.use_audio_in_video and len(videos) > 0
    content = (IMAGE_PLACEHOLDER * len(images) + (VIDEO_PLACEHOLDER + AUDIO_PLACEHOLDER * paired) * len(videos)
               + AUDIO_PLACEHOLDER * (len(audios) - len(videos) * paired) + text)
    message = expand_messages([{"role": USER, "content": content}], template, rope, image_tokens,
                              out.get("video_grid_thw", []), seconds, lengths, paired, "prompt")[0]
    out["input_ids"] = user_turn_ids(tokenizer, template, message["content"])
    return out
