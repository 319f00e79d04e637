"""MindSpeed-MM's t2v annotations (`data_storage_mode: combine`).

`data_path` is a text file whose lines are `<video folder>,<annotation json>`; each annotation json is a list of
{"path": video relative to its folder, "cap": caption or list of captions, ...}. The path is joined to the
folder, as MindSpeed-MM's DataFileReader does; other keys ride along into the feature index.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mmrun.data.video.readers import VideoDataError


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise VideoDataError(f"{path}: annotation file cannot be read ({error.strerror})") from None
    except json.JSONDecodeError as error:
        raise VideoDataError(f"{path}: annotation is not JSON ({error.msg} at line {error.lineno})") from None


def read_annotation(annotation: str | os.PathLike, folder: str | os.PathLike) -> list[dict[str, Any]]:
    """The samples of one annotation json, each `path` joined to `folder`."""
    annotation = Path(annotation)
    samples = _read_json(annotation)
    if not isinstance(samples, list):
        raise VideoDataError(f"{annotation}: an annotation is a JSON list of {{\"path\", \"cap\"}}, "
                             f"got {type(samples).__name__}")
    out = []
    for number, sample in enumerate(samples):
        if not isinstance(sample, dict) or not isinstance(sample.get("path"), str) or "cap" not in sample:
            raise VideoDataError(f"{annotation}: entry {number} needs \"path\" (a string) and \"cap\", "
                                 f"got {json.dumps(sample)[:80]}")
        out.append({**sample, "path": os.path.join(folder, sample["path"])})
    return out


def read_data_txt(data_path: str | os.PathLike) -> list[dict[str, Any]]:
    """All samples that a `combine` data.txt names, in its order."""
    data_path = Path(data_path)
    try:
        lines = data_path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise VideoDataError(f"{data_path}: data_path cannot be read ({error.strerror})") from None
    samples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.strip().split(",")
        if len(parts) != 2:
            raise VideoDataError(f"{data_path}:{number}: a line is `<video folder>,<annotation json>`, got {line!r}")
        samples.extend(read_annotation(parts[1], parts[0]))
    return samples


def caption_of(sample: dict[str, Any], rng: Any) -> str:
    """One caption: a list picks one at random, as MindSpeed-MM's dataset does."""
    caption = sample["cap"]
    if isinstance(caption, (list, tuple)):
        return str(caption[int(rng.integers(len(caption)))]) if caption else ""
    return str(caption)
