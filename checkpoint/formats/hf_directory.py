"""Hugging Face / diffusers model directories (config.json + safetensors), read and written for every family.

transformers writes `model.safetensors` (or shards listed by `model.safetensors.index.json`), diffusers writes
`diffusion_pytorch_model.safetensors` (or `diffusion_pytorch_model.safetensors.index.json`); both are read here
through checkpoint/formats/safetensors.py (no framework, no pickle). BF16 tensors are widened to float32 exactly.
Errors are one line naming the path and what to pass instead (`UsageError`, exit code 2). `write_directory`
builds a directory beside its target and swaps it in at once (common/atomic_write.py): a reader never sees a
half-written checkpoint. The families add their names and configs (models/<family>/hf_checkpoint.py).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from mmrun.backend.errors import UsageError
from mmrun.common.atomic_write import remove_stale_temporaries, replace_directory, temporary_name
from mmrun.checkpoint.formats.safetensors import (DEFAULT_MAX_SHARD_BYTES, DTYPE_NAMES, TORCH_DTYPE, SafetensorsFile,
                                                  SafetensorsWriter, bf16_bits_to_float32, converted,
                                                  converted_dtype, shards_of)

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class NotAnHFDirectoryError(ValueError):
    """The path is not a Hugging Face model directory of the family asked for."""


def holds_model(path: str | os.PathLike, model_types: Iterable[str]) -> bool:
    """True when `path` is a directory with a config.json of one of `model_types` and safetensors weights."""
    path = Path(path)
    try:
        model_type = json.loads((path / CONFIG_FILE).read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return False
    return model_type in model_types and ((path / SINGLE_FILE).is_file() or (path / INDEX_FILE).is_file())


def read_model_config(path: str | os.PathLike, model_types: tuple[str, ...], what: str, folder: str) -> dict[str, Any]:
    """config.json of a Hugging Face directory whose model_type is one of `model_types`, as a dict; otherwise one
    NotAnHFDirectoryError line (`what` names the family in it, e.g. "Qwen3-VL"; `folder` is mmrun's reader)."""
    path = Path(path)
    if not path.is_dir():
        raise NotAnHFDirectoryError(f"{path} is not a directory; pass a Hugging Face {what} model directory "
                                    "(config.json + model.safetensors)")
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise NotAnHFDirectoryError(f"{path} has no config.json, so it is not a Hugging Face model directory; "
                                    "pass the directory that save_pretrained wrote")
    try:
        raw = json.loads(config_file.read_text())
    except ValueError as error:
        raise NotAnHFDirectoryError(f"{config_file} is not valid JSON ({error}); restore the file") from None
    if not isinstance(raw, dict) or raw.get("model_type") not in model_types:
        found = raw.get("model_type") if isinstance(raw, dict) else type(raw).__name__
        raise NotAnHFDirectoryError(f"{config_file} has model_type {found!r}, not {what}; mmrun's {folder} reads "
                                    f"model_type {' or '.join(model_types)}")
    return raw


# (single file, index of shards): transformers' names first, then diffusers'.
WEIGHT_FILES = ((SINGLE_FILE, INDEX_FILE),
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
            if array.dtype == np.uint16:  # bf16 bits (formats/safetensors.py's convention)
                array = bf16_bits_to_float32(array)
            if dtype is not None and array.dtype.kind == "f":
                array = array.astype(dtype, copy=False)
            arrays[name] = array
    return arrays


def name_difference(expected: Iterable[str], found: Iterable[str]) -> str:
    """'missing N: a, b ...; unexpected M: c ...' between two sets of tensor names ('' when they are equal)."""
    expected, found = set(expected), set(found)
    missing, unexpected = sorted(expected - found), sorted(found - expected)
    return "; ".join(f"{label} {len(keys)}: {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}"
                     for label, keys in (("missing", missing), ("unexpected", unexpected)) if keys)


def check_names(what: str, path: str | os.PathLike, expected: Iterable[str], found: Iterable[str]) -> None:
    """One line naming the missing and unexpected tensors unless `found` has exactly the names `expected`."""
    shown = name_difference(expected, found)
    if shown:
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


def load_into(model: Any, arrays: Mapping[str, np.ndarray], what: str, path: str | os.PathLike,
              dtype: str | None = None) -> Any:
    """Load `arrays` into a portable-API model after checking names and shapes (one-line errors), then cast it to
    `dtype` ("fp16", "bf16", ...) when given; returns the model."""
    from mmrun.backend import tensors

    expected = {name: tuple(param.shape) for name, param in model.named_parameters()}
    check_names(what, path, expected, arrays)
    check_shapes(what, path, expected, arrays)
    model.load_state_dict(tensors.state_dict_from_numpy(arrays))
    if dtype is not None:
        model.to(tensors.dtype(dtype))
    return model


def write_directory(path: str | os.PathLike, hf_config: dict[str, Any], shapes: Mapping[str, tuple[int, ...]],
                    tensors: Iterable[tuple[str, np.ndarray]], dtypes: Mapping[str, np.dtype], *,
                    dtype: str | None = None, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                    copy_files_from: str | os.PathLike | None = None,
                    replaceable: Callable[[Path], bool] = lambda path: False, what: str = "model") -> Path:
    """A transformers directory at `path`: config.json (`hf_config`, with torch_dtype when the floating tensors
    share one) and safetensors, sharded with an index above `max_shard_bytes`. `tensors` yields (name, array) of
    every name in `shapes` once, in any order, each array of dtype `dtypes[name]`; each goes to its file as it
    comes, so memory holds one tensor at a time. `dtype` "bfloat16" | "float32" | "float16" converts floating
    tensors (bf16 rounded to nearest even), None writes them as given (uint16 = bf16 bits). `copy_files_from`: a
    directory whose other files (tokenizer, processor, generation config) are copied. The directory is built
    beside `path` and swapped in at once; an existing `path` is replaced only when it is empty or
    `replaceable(path)` says it is a directory of this kind."""
    path = Path(path)
    if path.exists() and not (path.is_dir() and (not any(path.iterdir()) or replaceable(path))):
        raise ValueError(f"refusing to replace {path}: it exists and is not a Hugging Face {what} directory; "
                         "name a new directory")
    stored = {name: converted_dtype(np.dtype(dtypes[name]), dtype) for name in shapes}
    float_kinds = {DTYPE_NAMES[d] for d in stored.values() if DTYPE_NAMES[d] in TORCH_DTYPE}
    hf_config = dict(hf_config)
    if len(float_kinds) == 1:
        hf_config["torch_dtype"] = TORCH_DTYPE[float_kinds.pop()]
    sizes = {name: int(np.prod(shape, dtype=np.int64)) * stored[name].itemsize for name, shape in shapes.items()}
    shards = shards_of(sizes, max_shard_bytes)
    files = [SINGLE_FILE] if len(shards) == 1 else [f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                                                    for i in range(1, len(shards) + 1)]
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    staging = Path(tempfile.mkdtemp(prefix=temporary_name(path), dir=path.parent))
    writers: list[SafetensorsWriter] = []
    try:
        if copy_files_from is not None:
            skip = {CONFIG_FILE, SINGLE_FILE, INDEX_FILE}
            for item in Path(copy_files_from).iterdir():
                if item.is_file() and item.name not in skip and not item.name.endswith(".safetensors"):
                    shutil.copy2(item, staging / item.name)
        (staging / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
        file_of = {name: i for i, shard in enumerate(shards) for name in shard}
        writers = [SafetensorsWriter(staging / file, {n: (stored[n], shapes[n]) for n in shard})
                   for file, shard in zip(files, shards)]
        for name, array in tensors:
            if name not in file_of:
                raise ValueError(f"tensor {name} is not a parameter of this {what} model")
            writers[file_of[name]].write(name, converted(name, np.asarray(array), dtype).reshape(shapes[name]))
        for writer in writers:
            writer.close()
        if len(shards) > 1:
            index = {"metadata": {"total_size": int(sum(sizes.values()))},
                     "weight_map": {name: files[file_of[name]] for name in sorted(file_of)}}
            (staging / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        return replace_directory(staging, path)
    except BaseException:
        for writer in writers:
            writer.abort()
        shutil.rmtree(staging, ignore_errors=True)
        raise
