"""Per-sample feature files of video generation (Wan2.1) and their `data.jsonl` index, in numpy.

MindSpeed-MM's feature extraction (get_sora_feature.py `_save_sample_features`) writes one file per video with
torch.save: `{"video": latents [C, F, H, W], "prompt_ids": text embeddings [L, D], "prompt_mask": [L]}`, plus for
image-to-video the Wan i2v processor's `i2v_clip_feature` (CLIP hidden states [257, img_dim]) and
`i2v_vae_feature` (the first frame's latents with its 4-channel frame mask, [4 + C, F, H, W]). The index,
`data.jsonl`, is one JSON object per line whose `file` names the feature file relative to `data_folder`.

mmrun reads those `.pt` files safely (torch.load(weights_only=True): tensors only, through mmrun.backend, as
numpy) and writes its own as `.safetensors` (no pickle anywhere); the training dataset reads both. Every key is
checked against LAYOUTS before a sample reaches a model: a bad file is one line naming the file, the key, what was
expected and what was received (FeatureFileError, exit code 2).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from mmrun.backend.errors import UsageError
from mmrun.common.atomic_write import atomic_write

VIDEO, PROMPT_IDS, PROMPT_MASK = "video", "prompt_ids", "prompt_mask"
I2V_CLIP, I2V_VAE = "i2v_clip_feature", "i2v_vae_feature"
FILE_KEY = "file"  # the index's key (MindSpeed-MM's FILE_INFO)
PT_SUFFIX, SAFETENSORS_SUFFIX = ".pt", ".safetensors"
FORMAT = "mmrun-features"  # safetensors metadata of mmrun's own files


@dataclass(frozen=True)
class Layout:
    rank: int  # after leading size-1 axes are dropped (MindSpeed-MM keeps a batch axis of 1 on some keys)
    shape: str  # words for messages


LAYOUTS: dict[str, Layout] = {
    VIDEO: Layout(4, "[C, F, H, W] latents"),
    PROMPT_IDS: Layout(2, "[L, text_dim] text embeddings"),
    PROMPT_MASK: Layout(1, "[L] text mask"),
    I2V_CLIP: Layout(2, "[tokens, img_dim] CLIP image features"),
    I2V_VAE: Layout(4, "[4 + C, F, H, W] first-frame latents with the frame mask"),
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "t2v": (VIDEO, PROMPT_IDS, PROMPT_MASK),
    "i2v": (VIDEO, PROMPT_IDS, PROMPT_MASK, I2V_CLIP, I2V_VAE),
}


class FeatureFileError(UsageError):
    """A feature file or index that cannot feed training; the message is one line naming the file (exit 2)."""


def feature_file_name(video_path: str | os.PathLike, suffix: str = SAFETENSORS_SUFFIX) -> str:
    """MindSpeed-MM's name for a video's features: the base name with dots turned into underscores, then the
    suffix ("clips/a.mp4" -> "a_mp4.safetensors"; "a_mp4.pt" with suffix ".pt", as MindSpeed-MM writes)."""
    return os.path.basename(os.fspath(video_path)).replace(".", "_") + suffix


# ------------------------------------------------------------------------------------------------ files

def read_feature_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """name -> array of one feature file, `.pt` (MindSpeed-MM's, tensors only) or `.safetensors` (mmrun's).
    Entries that are not arrays (MindSpeed-MM keeps non-tensor i2v extras as they are) are left out."""
    path = Path(path)
    if not path.is_file():
        raise FeatureFileError(f"{path}: feature file not found; check the index's '{FILE_KEY}' and data_folder")
    if path.suffix == PT_SUFFIX:
        from mmrun.backend import pt_files

        try:
            loaded: Any = pt_files.load_tensors(path)
        except UsageError as err:
            raise FeatureFileError(str(err)) from None
    elif path.suffix == SAFETENSORS_SUFFIX:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            loaded = load_file(str(path))
        except (SafetensorError, ValueError, OSError) as err:
            raise FeatureFileError(f"{path}: not a readable safetensors file ({err}); extract the features "
                                   "again") from None
    else:
        raise FeatureFileError(f"{path}: feature files are {PT_SUFFIX} (MindSpeed-MM) or {SAFETENSORS_SUFFIX} "
                               f"(mmrun); received suffix {path.suffix or '(none)'!r}")
    if not isinstance(loaded, dict):
        raise FeatureFileError(f"{path}: expected a dict of tensors (keys {', '.join(REQUIRED['t2v'])}), "
                               f"received a {type(loaded).__name__}")
    return {str(key): value for key, value in loaded.items() if isinstance(value, np.ndarray)}


def write_feature_file(path: str | os.PathLike, features: Mapping[str, np.ndarray]) -> Path:
    """Write mmrun's safetensors feature file atomically (all of it or nothing); returns the path."""
    path = Path(path)
    if path.suffix != SAFETENSORS_SUFFIX:
        raise FeatureFileError(f"{path}: mmrun writes features as {SAFETENSORS_SUFFIX}, received suffix "
                               f"{path.suffix or '(none)'!r}")
    from safetensors.numpy import save

    arrays = {}
    for key, value in features.items():
        if not isinstance(value, np.ndarray):
            raise TypeError(f"feature {key!r} is a {type(value).__name__}, not a numpy array")
        arrays[key] = np.ascontiguousarray(value)
    return atomic_write(path, save(arrays, metadata={"format": FORMAT}))


# ------------------------------------------------------------------------------------------- validation

def _squeeze_to(array: np.ndarray, rank: int) -> np.ndarray:
    while array.ndim > rank and array.shape[0] == 1:
        array = array[0]
    return array


def validate_features(features: Mapping[str, np.ndarray], path: str | os.PathLike, task: str = "t2v", *,
                      text_dim: int | None = None, img_dim: int | None = None,
                      in_channels: int | None = None) -> dict[str, np.ndarray]:
    """The sample's arrays in LAYOUTS' ranks (leading size-1 axes dropped), or FeatureFileError naming the file,
    the key, what was expected and what was received. `text_dim`, `img_dim` and `in_channels` are the model
    json's predictor values (`in_dim`: the latents' channels, plus i2v_vae_feature's for i2v) when known."""
    if task not in REQUIRED:
        raise FeatureFileError(f"task {task!r} is not one of {', '.join(REQUIRED)} (the model json's 'task')")
    out: dict[str, np.ndarray] = {}
    for key in REQUIRED[task]:
        if key not in features:
            raise FeatureFileError(f"{path}: key {key!r} missing ({task} needs {', '.join(REQUIRED[task])}); "
                                   f"received keys {', '.join(sorted(features)) or '(none)'}")
        layout = LAYOUTS[key]
        array = _squeeze_to(np.asarray(features[key]), layout.rank)
        if array.ndim != layout.rank:
            raise FeatureFileError(f"{path}: key {key!r} expected {layout.shape} (rank {layout.rank}), received "
                                   f"shape {tuple(features[key].shape)}")
        out[key] = array
    for key, value in features.items():  # extras travel along unchanged
        out.setdefault(key, value)
    _check_sizes(out, path, task, text_dim, img_dim, in_channels)
    return out


def _mismatch(path: Any, key: str, what: str, expected: Any, received: Any, hint: str) -> FeatureFileError:
    return FeatureFileError(f"{path}: key {key!r} {what} expected {expected}, received {received}; {hint}")


def _check_sizes(out: dict[str, np.ndarray], path: Any, task: str, text_dim: int | None, img_dim: int | None,
                 in_channels: int | None) -> None:
    prompt, mask, video = out[PROMPT_IDS], out[PROMPT_MASK], out[VIDEO]
    if text_dim is not None and prompt.shape[-1] != text_dim:
        raise _mismatch(path, PROMPT_IDS, "last dimension (text_dim)", text_dim, prompt.shape[-1],
                        "the model json's predictor.text_dim must match the text encoder that made the features")
    if mask.shape[0] != prompt.shape[0]:
        raise _mismatch(path, PROMPT_MASK, "length (that of prompt_ids)", prompt.shape[0], mask.shape[0],
                        "extract the features again")
    channels = video.shape[0]
    if task == "i2v":
        clip, first = out[I2V_CLIP], out[I2V_VAE]
        if img_dim is not None and clip.shape[-1] != img_dim:
            raise _mismatch(path, I2V_CLIP, "last dimension (img_dim)", img_dim, clip.shape[-1],
                            "the model json's predictor.img_dim must match the image encoder")
        if first.shape[1:] != video.shape[1:]:
            raise _mismatch(path, I2V_VAE, "[F, H, W] (those of video)", tuple(video.shape[1:]),
                            tuple(first.shape[1:]), "extract the features again")
        channels += first.shape[0]
    if in_channels is not None and channels != in_channels:
        what = "channels (+ i2v_vae_feature's) (in_dim)" if task == "i2v" else "channels (in_dim)"
        raise _mismatch(path, VIDEO, what, in_channels, channels,
                        "the model json's predictor.in_dim must match the VAE's latent channels")


# ------------------------------------------------------------------------------------------------ index

def read_index(data_path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a `data.jsonl` index (blank lines skipped); each must carry a string `file`."""
    data_path = Path(data_path)
    if not data_path.is_file():
        raise FeatureFileError(f"{data_path}: index not found; point basic_parameters.data_path at the data.jsonl "
                               "that feature extraction wrote")
    records = []
    with data_path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise FeatureFileError(f"{data_path}:{number}: not a JSON object ({err.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get(FILE_KEY), str):
                raise FeatureFileError(f"{data_path}:{number}: expected an object with a string {FILE_KEY!r}, "
                                       f"received {line.strip()[:80]}")
            records.append(record)
    if not records:
        raise FeatureFileError(f"{data_path}: the index lists no feature files")
    return records


def write_index(data_path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> Path:
    """Write a `data.jsonl` index atomically, one JSON object per line (MindSpeed-MM's json.dumps form)."""
    text = "".join(json.dumps(dict(record)) + "\n" for record in records)
    return atomic_write(data_path, text)


# ---------------------------------------------------------------------------------------------- dataset

class FeatureDataset:
    """MindSpeed-MM's `dataset_type: feature`: the index's records, each sample read and validated on access."""

    def __init__(self, data_path: str | os.PathLike, data_folder: str | os.PathLike = "", task: str = "t2v", *,
                 text_dim: int | None = None, img_dim: int | None = None, in_channels: int | None = None) -> None:
        self.records = read_index(data_path)
        self.data_folder = Path(data_folder) if data_folder else None
        self.task = task
        self.checks = {"text_dim": text_dim, "img_dim": img_dim, "in_channels": in_channels}

    @classmethod
    def from_dataset_param(cls, dataset_param: Mapping[str, Any], task: str = "t2v", **checks: Any) -> FeatureDataset:
        """Built from a feature_data.json's `dataset_param` (`dataset_type: feature`, `basic_parameters`)."""
        kind = dataset_param.get("dataset_type")
        if kind != "feature":
            raise FeatureFileError(f"dataset_param.dataset_type expected 'feature' (features extracted beforehand), "
                                   f"received {kind!r}")
        basic = dataset_param.get("basic_parameters") or {}
        if not basic.get("data_path"):
            raise FeatureFileError("dataset_param.basic_parameters.data_path missing: name the data.jsonl index")
        return cls(basic["data_path"], basic.get("data_folder", ""), task, **checks)

    def __len__(self) -> int:
        return len(self.records)

    def path(self, index: int) -> Path:
        name = self.records[index][FILE_KEY]
        return self.data_folder / name if self.data_folder else Path(name)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        path = self.path(index)
        return validate_features(read_feature_file(path), path, self.task, **self.checks)


def collate(samples: Sequence[Mapping[str, np.ndarray]], keys: Sequence[str]) -> dict[str, np.ndarray]:
    """Stack the samples' `keys` along a new batch axis; samples of different shapes are one line."""
    batch = {}
    for key in keys:
        shapes = {tuple(sample[key].shape) for sample in samples}
        if len(shapes) > 1:
            raise FeatureFileError(f"a micro-batch mixes {key!r} shapes {sorted(shapes)}; use --micro-batch-size 1 "
                                   "or features of one resolution and length")
        batch[key] = np.stack([sample[key] for sample in samples])
    return batch
