"""Read a Hugging Face / diffusers model directory (config.json + safetensors) into numpy, for any model family.

transformers writes `model.safetensors` (or shards listed by `model.safetensors.index.json`), diffusers writes
`diffusion_pytorch_model.safetensors` (or `diffusion_pytorch_model.safetensors.index.json`); both are read here
through qwen2_vl/hf_checkpoint.py's safetensors reader (no framework, no pickle). BF16 tensors are widened to
float32 exactly. Errors are one line naming the path and what to pass instead (`UsageError`, exit code 2).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from mmrun.backend.errors import UsageError
from mmrun.models.qwen2_vl.hf_checkpoint import CONFIG_FILE, SafetensorsFile, bf16_bits_to_float32

# (single file, index of shards): transformers' names first, then diffusers'.
WEIGHT_FILES = (("model.safetensors", "model.safetensors.index.json"),
                ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"))


def read_config(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """config.json of the directory `path` as a dict; `what` names the model for the error messages."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"{what}: {path} is not a directory; pass the model directory (config.json + safetensors)")
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise UsageError(f"{what}: {path} has no config.json; pass the directory save_pretrained wrote")
    try:
        raw = json.loads(config_file.read_text())
    except ValueError as error:
        raise UsageError(f"{what}: {config_file} is not valid JSON ({error}); restore the file") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{what}: {config_file} holds a {type(raw).__name__}, not a JSON object; restore the file")
    return raw


def weight_files(path: str | os.PathLike, what: str) -> list[Path]:
    """The safetensors files of a model directory (one, or the shards its index lists)."""
    path = Path(path)
    for single, index in WEIGHT_FILES:
        if (path / index).is_file():
            try:
                names = sorted(set(json.loads((path / index).read_text())["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                raise UsageError(f"{what}: {path / index} is not a safetensors index ({error!r}); restore it") from None
            return [path / name for name in names]
        if (path / single).is_file():
            return [path / single]
    expected = " or ".join(single for single, _ in WEIGHT_FILES)
    raise UsageError(f"{what}: {path} has no {expected} (nor a sharded index); mmrun reads safetensors weights only "
                     "(re-save with save_pretrained(safe_serialization=True))")


def read_weights(path: str | os.PathLike, what: str, dtype: np.dtype | None = np.float32) -> dict[str, np.ndarray]:
    """name -> array of every tensor in the directory's safetensors files; floating tensors cast to `dtype`
    (None: as stored, bf16 widened to float32)."""
    arrays = {}
    for file in weight_files(path, what):
        try:
            opened = SafetensorsFile(file)
        except (OSError, ValueError) as error:
            raise UsageError(f"{what}: cannot read {file} as safetensors ({error}); restore the file") from None
        for name in opened:
            array = opened[name]
            if array.dtype == np.uint16:  # bf16 bits (hf_checkpoint's convention)
                array = bf16_bits_to_float32(array)
            if dtype is not None and array.dtype.kind == "f":
                array = array.astype(dtype, copy=False)
            arrays[name] = array
    return arrays


def check_names(what: str, path: str | os.PathLike, expected: Iterable[str], found: Iterable[str]) -> None:
    """One line naming the missing and unexpected tensors unless `found` has exactly the names `expected`."""
    expected, found = set(expected), set(found)
    missing, unexpected = sorted(expected - found), sorted(found - expected)
    if missing or unexpected:
        shown = "; ".join(f"{label} {len(keys)}: {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}"
                          for label, keys in (("missing", missing), ("unexpected", unexpected)) if keys)
        raise UsageError(f"{what}: {path} does not hold the tensors of its config.json ({shown}); "
                         "pass the weights saved with this config")


def check_shapes(what: str, path: str | os.PathLike, expected: Mapping[str, tuple[int, ...]],
                 arrays: Mapping[str, np.ndarray]) -> None:
    """One line naming the first tensors whose shape differs from the model's."""
    wrong = [f"{name} {tuple(arrays[name].shape)} (model {tuple(shape)})" for name, shape in sorted(expected.items())
             if tuple(arrays[name].shape) != tuple(shape)]
    if wrong:
        raise UsageError(f"{what}: {path} has tensors of other shapes than its config.json gives "
                         f"({'; '.join(wrong[:3])}); pass the weights saved with this config")
