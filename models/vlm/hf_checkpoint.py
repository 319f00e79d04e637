"""Hugging Face directories of the Qwen vision-language families: the lazy reader, the --load check and the writer
they share. Each family gives its names and config (models/<family>/hf_checkpoint.py: `PATCH_EMBED`,
`hf_parameter_names`, `is_hf_directory`, `load_hf_config`, an `HFWeights` subclass); this module finds them
through the family table (models/families.py). The safetensors format and the atomic directory writer are the
checkpoint room's (checkpoint/formats/).

Arrays are numpy in mmrun's layout: the checkpoint's, except the ViT's Conv3d patch kernel (D, 3, T, P, P), kept
flattened as the Linear's (D, 3*T*P*P) (same bytes, same order). BF16 tensors read as their raw bits (np.uint16).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from mmrun.backend.errors import UsageError
from mmrun.checkpoint.formats.hf_directory import (INDEX_FILE, SINGLE_FILE, NotAnHFDirectoryError, name_difference,
                                                   write_directory)
from mmrun.checkpoint.formats.safetensors import DEFAULT_MAX_SHARD_BYTES, SafetensorsFile, bf16_bits_to_float32
from mmrun.models.vlm.mm_layout import hf_shapes


def check_names(where: str, config: Any, names: set[str], expected: Iterable[str]) -> None:
    """One error listing the missing and unexpected names."""
    shown = name_difference(expected, names)
    if shown:
        raise ValueError(f"{where} does not hold the tensors of its {config.model_type} config ({shown}); "
                         "pass the weights saved with this config")


class HFWeights(Mapping[str, np.ndarray]):
    """A Hugging Face directory's weights, read lazily one tensor at a time (`weights[name]`), in mmrun's names
    and layout; `config` is its family's config. The names are checked against the config at once, from the
    files' headers alone. A family subclasses it, giving `patch_embed_name` (the Conv3d kernel read flattened),
    `load_config(path)`, `parameter_names(config)` and, where its files use other names, `stored_name_to_ours`."""

    patch_embed_name: str = ""
    other_flattened: tuple[str, ...] = ()  # further kernels read flattened (Qwen2.5-Omni's audio Conv1d)
    skipped_prefixes: tuple[str, ...] = ()  # stored tensors of no part the model reads (Qwen2.5-Omni's talker)

    @staticmethod
    def load_config(path: Path) -> Any:
        raise NotImplementedError

    @staticmethod
    def parameter_names(config: Any) -> list[str]:
        raise NotImplementedError

    @staticmethod
    def stored_name_to_ours(stored: str) -> str:
        return stored

    def __init__(self, path: str | os.PathLike) -> None:
        path = Path(path)
        self.path = path
        self.config = self.load_config(path)
        if (path / INDEX_FILE).is_file():
            files = sorted(set(json.loads((path / INDEX_FILE).read_text())["weight_map"].values()))
        elif (path / SINGLE_FILE).is_file():
            files = [SINGLE_FILE]
        else:
            raise NotAnHFDirectoryError(f"{path} has no {SINGLE_FILE} or {INDEX_FILE}; mmrun reads safetensors "
                                        "weights only (re-save a pytorch_model.bin with "
                                        "save_pretrained(safe_serialization=True))")
        self._where: dict[str, tuple[SafetensorsFile, str]] = {}
        for file in files:
            opened = SafetensorsFile(path / file)
            for stored in opened:
                if not stored.endswith(".inv_freq") and not stored.startswith(self.skipped_prefixes):  # rotary buffers some old checkpoints carry; computed, not learned
                    self._where[self.stored_name_to_ours(stored)] = (opened, stored)
        if self.config.tie_word_embeddings:
            self._where.pop("lm_head.weight", None)  # a copy of embed_tokens where a writer kept it
        check_names(str(path), self.config, set(self._where), self.parameter_names(self.config))

    def dtype(self, name: str) -> np.dtype:
        file, stored = self._where[name]
        return file.dtype(stored)

    def nbytes(self, name: str) -> int:
        file, stored = self._where[name]
        return file.nbytes(stored)

    def __getitem__(self, name: str) -> np.ndarray:
        file, stored = self._where[name]
        array = file[stored]
        flat = name == self.patch_embed_name or name in self.other_flattened
        return array.reshape(array.shape[0], -1) if flat else array

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def read_float(self, name: str) -> np.ndarray:
        """One tensor as a model loads it: bf16 bits widened to float32 (to_float_arrays), the rest as stored."""
        array = self[name]
        return bf16_bits_to_float32(array) if array.dtype == np.uint16 else array


def checked_for_model(weights: HFWeights, config: Any, described_by: str,
                      network: Callable[[Any], dict[str, Any]] | None = None) -> HFWeights:
    """A training run's --load of an HF directory (`weights`, read lazily: each rank reads only the tensors of its
    shard), after checking that its config.json describes `config`'s network (`described_by` names where that
    came from, e.g. model.json's path). The dtype it was saved in does not count; `network` (a config -> the
    dict compared) lets a family leave out more settings that do not shape the weights."""
    network = network or (lambda c: structure(c.to_hf_config()))
    difference = config_difference(network(weights.config), network(config))
    if difference:
        raise UsageError(f"--load {weights.path}: its config.json describes another model than {described_by} "
                         f"({difference}); make {described_by} match the checkpoint")
    return weights


# Keys of an HF config (at any level) that do not change the network: the dtype the weights were saved in, and the
# generation's special tokens (MindSpeed-MM's model.json has no bos/eos/pad: Qwen3-VL-8B-Instruct's text_config
# holds them, so comparing them refused the real download against the real model_8B.json)
NOT_THE_NETWORK = ("torch_dtype", "dtype", "architectures", "bos_token_id", "eos_token_id", "pad_token_id")


def structure(hf_config: dict[str, Any]) -> dict[str, Any]:
    """An HF config without the keys that do not change the network (NOT_THE_NETWORK, at every level)."""
    return {k: structure(v) if isinstance(v, dict) else v for k, v in hf_config.items() if k not in NOT_THE_NETWORK}


def config_difference(theirs: dict[str, Any], ours: dict[str, Any], prefix: str = "") -> str:
    """The first few keys where two HF config dicts differ, as `key: checkpoint X, model.json Y` ('' if none)."""
    found = []
    for key in sorted(set(theirs) | set(ours)):
        a, b = theirs.get(key), ours.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            inner = config_difference(a, b, f"{prefix}{key}.")
            found.extend([inner] if inner else [])
        elif a != b:
            found.append(f"{prefix}{key}: checkpoint {a!r}, model.json {b!r}")
    return "; ".join(found[:3])


def is_vlm_directory(path: Path) -> bool:
    """A Hugging Face directory of any Qwen vision-language family: one the writer may replace."""
    from mmrun.models import families

    return any(families.part(family, "hf_checkpoint").is_hf_directory(path) for family in families.vlm_families())


def save_hf_directory(path: str | os.PathLike, config: Any, arrays: Mapping[str, np.ndarray], *,
                      dtype: str | None = None, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                      copy_files_from: str | os.PathLike | None = None) -> Path:
    """Write config.json and safetensors (sharded with an index above `max_shard_bytes`) that transformers'
    from_pretrained loads; returns the directory. `arrays` are in mmrun's layout (e.g. a state dict through
    tensors.state_dict_to_numpy, or load_hf_directory's). `dtype` "bfloat16" | "float32" | "float16"
    converts floating tensors (bf16 rounded to nearest even), None writes them as given (uint16 = bf16 bits).
    `copy_files_from`: a directory whose other files (tokenizer, processor, generation config) are copied.

    The directory is built beside `path` and swapped in at once; an existing `path` is replaced only when
    it is empty or a Hugging Face directory of a Qwen vision-language family itself."""
    check_names("the arrays to save", config, set(arrays), expected=hf_shapes(config))
    return write_hf_directory(path, config, arrays.items(), {n: np.asarray(a).dtype for n, a in arrays.items()},
                              dtype=dtype, max_shard_bytes=max_shard_bytes, copy_files_from=copy_files_from)


def write_hf_directory(path: str | os.PathLike, config: Any, tensors: Iterable[tuple[str, np.ndarray]],
                       dtypes: Mapping[str, np.dtype], *, dtype: str | None = None,
                       max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                       copy_files_from: str | os.PathLike | None = None) -> Path:
    """save_hf_directory, streaming: `tensors` yields (name, array) of every parameter once, in any order, each
    array in mmrun's layout and of dtype `dtypes[name]`; each goes to its file as it comes, so memory holds
    one tensor at a time. Shapes come from the config (its family's mm_layout.hf_shapes)."""
    from mmrun.models import families

    v = config.vision
    shapes = dict(hf_shapes(config))
    check_names("the tensors to save", config, set(dtypes), expected=shapes)
    names = families.part(config, "hf_checkpoint")
    patch = names.PATCH_EMBED
    shapes[patch] = (shapes[patch][0], v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    shapes.update(getattr(names, "stored_shapes", lambda c: {})(config))  # a family's other flattened kernels
    return write_directory(path, config.to_hf_config(), shapes, tensors, dtypes, dtype=dtype,
                           max_shard_bytes=max_shard_bytes, copy_files_from=copy_files_from,
                           replaceable=is_vlm_directory, what="Qwen2-VL / Qwen3-VL")
