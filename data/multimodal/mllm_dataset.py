"""MindSpeed-MM's Qwen2-VL fine-tuning samples from mllm_format JSON files, decoded when read.

Construction reads the JSON files named by `data.json` (in the listed order; `max_samples` keeps the first
N of them all, as MindSpeed-MM's `select(range(max_samples))`) and checks every sample's structure, which
is cheap: the conversation (roles alternate user/assistant, starting with the user, an even number of
turns), the placeholders (one `<image>` per image, one `<video>` per video) and that every image file
exists. Pixels and tokens are made in `__getitem__`: an image that cannot be decoded, or a cut-off
(`--seq-length`) that truncates an image's tokens, is found then.

A bad sample is an error naming the file and the sample's index in it. With `skip_bad_samples`, structural
problems drop the sample (one warning with the count and the first problem); a sample that fails when read
is replaced by the next good one (the same one every time, so every rank and framework sees the same
batch), counted in `skipped`, and warned about once per process. Nothing is written anywhere.

Media paths are resolved as MindSpeed-MM does: `dataset_dir/<path>` when that file exists, else `<path>`.
Videos are lists of frame images (MindSpeed-MM's nested-image form); with the qwen2_omni template a video may
also be a video file, decoded and sampled as MindSpeed-MM's Qwen2OmniPlugin (data/multimodal/video_files.py), whose
own sound track serves use_audio_in_video when the sample lists no audios (data/multimodal/omni.py).
"""
from __future__ import annotations

import functools
import json
import os
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image

from mmrun.data.gpt_dataset import DatasetConfigError
from mmrun.data.multimodal import omni
from mmrun.data.multimodal.video_files import read_video_file
from mmrun.data.multimodal.collate import collate
from mmrun.data.multimodal.data_config import MultimodalDataConfig, parse_dataset_param
from mmrun.data.multimodal.image_processing import (ImageProcessorConfig, preprocess_images, preprocess_video,
                                                     regularize_image)
from mmrun.data.multimodal.rope_index import RopeConfig
from mmrun.data.multimodal.templates import (ASSISTANT, FUNCTION, IMAGE_PLACEHOLDER, OBSERVATION,
                                             TEMPLATES, USER, VIDEO_PLACEHOLDER, ChatTemplate,
                                             encode_conversation, expand_placeholders, frame_timestamps)
from mmrun.data.tokenizers import HuggingFaceTokenizer


class SampleError(ValueError):
    """One sample cannot be used (one line: file, sample index, problem, what to do)."""


@dataclass(frozen=True)
class Sample:
    """A checked sample, before decoding."""

    file: str
    index: int  # position in its file
    messages: tuple  # ({"role", "content"}, ...) with roles mapped to the template's
    system: str
    images: tuple[str, ...]
    videos: tuple[tuple[str, ...], ...]
    audios: tuple[str, ...] = ()  # Qwen2.5-Omni (data/multimodal/omni.py)

    @property
    def where(self) -> str:
        return f"{self.file}: sample {self.index}"


def special_token_ids(tokenizer: HuggingFaceTokenizer, template: ChatTemplate, source: str = "tokenizer.json"
                      ) -> dict[str, int]:
    """The template's special tokens -> ids, looked up in the tokenizer by their strings."""
    vocab = tokenizer.vocab
    missing = [token for token in template.special_tokens.values() if token not in vocab]
    if missing:
        raise DatasetConfigError(f"{source} lacks {', '.join(missing)}, which the {template.name} template needs; "
                                 "use the model's own tokenizer.json.")
    return {name: vocab[token] for name, token in template.special_tokens.items()}


def _load_json_list(path: str) -> list:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise DatasetConfigError(f"{path}: dataset file not found (basic_parameters.dataset); "
                                 "check the path, relative to the current directory.") from None
    except (OSError, ValueError) as exc:
        raise DatasetConfigError(f"{path}: cannot read it as JSON ({exc}); fix the file.") from None
    if not isinstance(data, list):
        raise DatasetConfigError(f"{path}: expected a JSON list of samples. Received: {type(data).__name__}.")
    return data


def _resolve_media(path: object, dataset_dir: str, where: str, kind: str) -> str:
    if not isinstance(path, str) or not path:
        raise SampleError(f"{where}: {kind} path must be a non-empty string. Received: {path!r}; fix the sample.")
    joined = os.path.join(dataset_dir, path)
    if os.path.isfile(joined):
        return joined
    if os.path.isfile(path):
        return path
    raise SampleError(f"{where}: {kind} {path!r} not found (looked in dataset_dir {dataset_dir!r} and as given); "
                      "fix the path or basic_parameters.dataset_dir.")


def _media_list(record: dict, key: str | None) -> list:
    if not key or record.get(key) is None:
        return []
    value = record[key]
    return value if isinstance(value, list) else [value]


def parse_sample(record: object, config: MultimodalDataConfig, file: str, index: int) -> Sample:
    """MindSpeed-MM's ShareGPT conversion of one record, with its checks as errors (SampleError)."""
    where = f"{file}: sample {index}"
    attr = config.attr
    if not isinstance(record, dict):
        raise SampleError(f"{where}: expected a JSON object. Received: {type(record).__name__}; fix the sample.")
    messages = record.get(attr["messages"])
    if not isinstance(messages, list) or not messages:
        raise SampleError(f"{where}: empty or missing conversation ({attr['messages']!r} must be a non-empty list); "
                          "fix or remove the sample.")
    role_tag, content_tag = attr["role_tag"], attr["content_tag"]
    for turn, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get(content_tag), str):
            raise SampleError(f"{where}: message {turn} needs a string {content_tag!r}. Received: {message!r}.")
    system = record.get(attr["system"]) if attr["system"] else ""
    first = 0  # index of the first conversation message in the record (1 after a system message)
    if attr["system_tag"] and messages[0].get(role_tag) == attr["system_tag"]:
        system, messages, first = messages[0][content_tag], messages[1:], 1
    roles = {attr["user_tag"]: USER, attr["assistant_tag"]: ASSISTANT, attr["observation_tag"]: OBSERVATION,
             attr["function_tag"]: FUNCTION}
    accepted = ((attr["user_tag"], attr["observation_tag"]), (attr["assistant_tag"], attr["function_tag"]))
    mapped = []
    for turn, message in enumerate(messages):
        role = message.get(role_tag)
        expected = [tag for tag in accepted[turn % 2] if tag]
        if role not in expected:
            raise SampleError(f"{where}: message {turn + first} has role {role!r} where "
                              f"{' or '.join(map(repr, expected))} was expected; roles must alternate user/assistant, "
                              "starting with the user.")
        if roles[role] == FUNCTION:
            raise SampleError(f"{where}: message {turn + first} is a function call ({role!r}), which the qwen2vl template "
                              "cannot format; remove it.")
        mapped.append({"role": roles[role], "content": message[content_tag]})
    if not mapped or len(mapped) % 2:
        raise SampleError(f"{where}: {len(mapped)} messages after the system prompt; a conversation needs "
                          "user/assistant pairs (an even, non-zero count).")
    if not isinstance(system, (str, type(None))):
        raise SampleError(f"{where}: the system prompt must be a string. Received: {type(system).__name__}.")
    dataset_dir = config.basic["dataset_dir"]
    images = [_resolve_media(p, dataset_dir, where, "image") for p in _media_list(record, attr["images"])]
    videos = []
    for video in _media_list(record, attr["videos"]):
        if isinstance(video, str) and video and config.basic.get("template") == omni.TEMPLATE_NAME:
            videos.append(_resolve_media(video, dataset_dir, where, "video"))  # a video file (Qwen2.5-Omni)
            continue
        if not isinstance(video, list) or not video:
            raise SampleError(f"{where}: a video must be a list of frame image paths. Received: {video!r}; "
                              "decode video files to frames first (mmrun reads video files with the qwen2_omni template only).")
        videos.append(tuple(_resolve_media(p, dataset_dir, where, "video frame") for p in video))
    audios = [_resolve_media(p, dataset_dir, where, "audio") for p in _media_list(record, attr["audios"])]
    checks = [(IMAGE_PLACEHOLDER, images, "images"), (VIDEO_PLACEHOLDER, videos, "videos")]
    if attr["audios"]:
        checks.append((omni.AUDIO_PLACEHOLDER, audios, "audios"))
    for placeholder, media, kind in checks:
        count = sum(m["content"].count(placeholder) for m in mapped)
        if count != len(media):
            raise SampleError(f"{where}: {count} {placeholder} placeholders but {len(media)} {kind}; each "
                              f"{kind[:-1]} needs exactly one {placeholder} in the messages.")
    return Sample(file, index, tuple(mapped), system or "", tuple(images), tuple(videos), tuple(audios))


def _open_image(path: str, where: str) -> Image.Image:
    try:
        with Image.open(path) as image:
            image.load()
            return image.copy()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise SampleError(f"{where}: cannot decode image {path!r} ({exc}); replace the file or remove the sample.") \
            from None


class MultimodalDataset:
    """Qwen2-VL samples from a data.json `dataset_param` (see the module docstring); `dataset[i]` is a dict of
    numpy arrays: input_ids, labels (int64 [L], L <= seq_length), and when present pixel_values
    (float32 [N, 1176]), image_grid_thw (int64 [n, 3]), pixel_values_videos, video_grid_thw,
    second_per_grid_ts (float32 [n_videos])."""

    # Decoding images is worth worker processes (--num-workers, data/workers.py); the dataset pickles whole.
    worker_safe = True

    def __init__(self, dataset_param: dict, seq_length: int, skip_bad_samples: bool = False) -> None:
        if not isinstance(seq_length, int) or seq_length < 2:
            raise DatasetConfigError(f"--seq-length must be an integer of at least 2. Received: {seq_length!r}.")
        self.config = parse_dataset_param(dataset_param)
        self.seq_length = seq_length
        self.skip_bad_samples = skip_bad_samples
        model_dir = self.config.preprocess["model_name_or_path"]
        name = self.config.basic["template"]
        if name not in TEMPLATES:
            raise DatasetConfigError(f"basic_parameters.template {name!r} is not supported; use one of "
                                     f"{', '.join(TEMPLATES)}.")
        self.template = TEMPLATES[name]
        if self.config.attr["audios"] and name != omni.TEMPLATE_NAME:
            raise DatasetConfigError(f"attr.audios is {self.config.attr['audios']!r} but the {name} template takes no "
                                     f"audio; use the {omni.TEMPLATE_NAME} template (Qwen2.5-Omni) or set attr.audios "
                                     "to null")
        self.tokenizer = HuggingFaceTokenizer(model_dir)
        if self.tokenizer.tokenize(""):
            raise DatasetConfigError(f"{model_dir}/tokenizer.json adds tokens to every text (its post-processor); "
                                     "the chat template must control every token: use a Qwen2-VL tokenizer.json.")
        self.token_ids = special_token_ids(self.tokenizer, self.template, os.path.join(model_dir, "tokenizer.json"))
        self.image_config = ImageProcessorConfig.from_pretrained(model_dir)
        self.video_config = ImageProcessorConfig.from_pretrained(model_dir, video=True)
        self.rope_config = self._rope_config(model_dir)
        if name == omni.TEMPLATE_NAME:  # Qwen2.5-Omni: audio tokens and Whisper's features
            self.token_ids.update(special_token_ids(self.tokenizer, omni.AUDIO_TOKENS_TEMPLATE,
                                                    os.path.join(model_dir, "tokenizer.json")))
            self.audio_settings = omni.WhisperFeatures.from_pretrained(model_dir)
        self.skipped: dict[int, str] = {}  # sample index -> why it was replaced (this process only)
        self._samples = self._read_samples()
        if not self._samples:
            raise DatasetConfigError(f"basic_parameters.dataset {self.config.basic['dataset']!r} holds no usable "
                                     "sample.")

    def _rope_config(self, model_dir: str) -> RopeConfig:
        """From the model's config.json when there is one (Qwen2.5-VL's tokens_per_second), else the tokenizer."""
        if self.template.name == omni.TEMPLATE_NAME:
            return omni.rope_config(model_dir, self.image_config.merge_size, self.tokenizer.vocab,
                                    self.config.preprocess["use_audio_in_video"])
        if os.path.isfile(os.path.join(model_dir, "config.json")):
            rope = RopeConfig.from_pretrained(model_dir)
            ours = (self.token_ids["image_pad"], self.token_ids["video_pad"], self.token_ids["vision_start"])
            if (rope.image_token_id, rope.video_token_id, rope.vision_start_token_id) != ours:
                raise DatasetConfigError(f"{model_dir}/config.json's image/video/vision_start token ids "
                                         f"{(rope.image_token_id, rope.video_token_id, rope.vision_start_token_id)} "
                                         f"differ from tokenizer.json's {ours}; use matching files.")
            return rope
        return RopeConfig(self.image_config.merge_size, self.token_ids["image_pad"], self.token_ids["video_pad"],
                          self.token_ids["vision_start"], frames_split=self.template.timestamped_video)

    def _read_samples(self) -> list[Sample]:
        samples, problems = [], []
        limit = self.config.basic["max_samples"]
        for file in self.config.dataset_files:
            for index, record in enumerate(_load_json_list(file)):
                if limit is not None and len(samples) + len(problems) >= limit:
                    break
                try:
                    samples.append(parse_sample(record, self.config, file, index))
                except SampleError as exc:
                    if not self.skip_bad_samples:
                        raise
                    problems.append(str(exc))
        if problems:
            warnings.warn(f"skipped {len(problems)} bad samples of {len(samples) + len(problems)}; the first: "
                          f"{problems[0]}", stacklevel=3)
        return samples

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def collate_fn(self) -> functools.partial:
        """`collate` bound to this dataset's pad id, rope settings and seq_length (picklable, for workers)."""
        return functools.partial(collate, pad_token_id=self.token_ids["pad"], rope_config=self.rope_config,
                                 max_length=self.seq_length)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"sample {index} is outside the dataset of {len(self)} samples")
        index %= len(self)
        if not self.skip_bad_samples:
            return self.encode(self._samples[index])
        for offset in range(len(self)):
            candidate = (index + offset) % len(self)
            try:
                return self.encode(self._samples[candidate])
            except SampleError as exc:
                if not self.skipped:
                    warnings.warn(f"{exc} Skipped (replaced by the next good sample); further bad samples are only "
                                  "counted in dataset.skipped.", stacklevel=2)
                self.skipped[candidate] = str(exc)
        raise SampleError(f"no sample of {len(self)} could be decoded; the first problem: "
                          f"{next(iter(self.skipped.values()))}")

    def encode(self, sample: Sample) -> dict[str, np.ndarray]:
        """Pixels and tokens of one sample (raises SampleError)."""
        pre = self.config.preprocess
        out: dict[str, np.ndarray] = {}
        merge = self.image_config.merge_size ** 2
        image_tokens, video_tokens, video_blocks = [], [], []
        if sample.images:
            images = [regularize_image(_open_image(p, sample.where), pre["image_max_pixels"], pre["image_min_pixels"])
                      for p in sample.images]
            out["pixel_values"], out["image_grid_thw"] = preprocess_images(images, self.image_config)
            image_tokens = [int(np.prod(g)) // merge for g in out["image_grid_thw"]]
        if sample.videos:
            pixels, grids, seconds, counts = [], [], [], []
            for frames_paths in sample.videos:
                if isinstance(frames_paths, str):  # a video file (the qwen2_omni template): its sampled frames
                    try:
                        frames, rate = read_video_file(frames_paths, pre["video_fps"], pre["video_maxlen"])
                    except DatasetConfigError as exc:
                        raise SampleError(f"{sample.where}: {exc}") from None
                else:
                    frames, rate = [_open_image(p, sample.where) for p in frames_paths], pre["video_fps"]
                sampled = len(frames)
                if len(frames) % 2:
                    frames.append(frames[-1])  # MindSpeed-MM pads odd frame counts before the processor
                frames = [regularize_image(f, pre["video_max_pixels"], pre["video_min_pixels"]) for f in frames]
                try:
                    flat, grid = preprocess_video(frames, self.video_config)
                except ValueError as exc:
                    raise SampleError(f"{sample.where}: {exc}; fix the video's frames.") from None
                pixels.append(flat)
                grids.append(grid)
                counts.append(sampled)
                seconds.append(self.video_config.temporal_patch_size / rate)
            out["pixel_values_videos"] = np.concatenate(pixels)
            out["video_grid_thw"] = np.concatenate(grids)
            out["second_per_grid_ts"] = np.asarray(seconds, dtype=np.float32)
            video_tokens = [int(np.prod(g)) // merge for g in out["video_grid_thw"]]
            if self.template.timestamped_video:  # Qwen3-VL: "<t seconds>" + a vision block per temporal patch
                video_blocks = [[(seconds, tokens // int(g[0])) for seconds in frame_timestamps(
                    frames, pre["video_fps"], self.video_config.temporal_patch_size)]
                    for g, tokens, frames in zip(out["video_grid_thw"], video_tokens, counts)]
        audio_tokens = 0
        if self.template.name == omni.TEMPLATE_NAME:
            try:
                messages, audio_tokens = omni.encode_media(self, sample, out)
            except omni.OmniSampleError as exc:
                raise SampleError(str(exc)) from None
        else:
            messages = expand_placeholders(sample.messages, self.template, image_tokens, video_blocks or video_tokens)
        input_ids, labels = encode_conversation(
            self.tokenizer, messages, self.template, self.seq_length, system=sample.system,
            train_on_prompt=self.config.basic["train_on_prompt"], mask_history=self.config.basic["mask_history"])
        ids = np.asarray(input_ids, dtype=np.int64)
        for kind, pad, needed in (("image", "image_pad", sum(image_tokens)), ("video", "video_pad", sum(video_tokens)),
                                  ("audio", "audio_pad", audio_tokens)):
            kept = int((ids == self.token_ids[pad]).sum()) if pad in self.token_ids else 0
            if kept != needed:
                raise SampleError(f"{sample.where}: the cut-off --seq-length {self.seq_length} truncated the "
                                  f"{kind} tokens ({kept} of {needed} kept); raise --seq-length, lower "
                                  f"{kind}_max_pixels, or shorten the conversation.")
        out["input_ids"] = ids
        out["labels"] = np.asarray(labels, dtype=np.int64)
        return out
