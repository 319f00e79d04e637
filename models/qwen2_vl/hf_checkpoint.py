"""Hugging Face Qwen2-VL / Qwen2.5-VL directories: read them into mmrun's names, write them back.

A directory holds config.json and model.safetensors, or shards model-0000i-of-0000n.safetensors listed by
model.safetensors.index.json. Keys may be in the hub layout (`visual.*`, `model.layers.*`, `lm_head.weight`;
what every published checkpoint and transformers' save_pretrained write) or in transformers 5.x's
in-memory layout (`model.visual.*`, `model.language_model.*`); both read into the hub names, which are
mmrun's parameter names. Tied models (tie_word_embeddings) have no lm_head.weight.

Arrays are numpy in mmrun's layout: the same as the checkpoint except `visual.patch_embed.proj.weight`,
whose Conv3d kernel (D, 3, 2, 14, 14) is flattened to the Linear's (D, 1176) (same bytes, same order).
**bf16**: numpy has no bfloat16, so a BF16 tensor is read as its raw bits in an np.uint16 array of the
same shape (no Qwen2-VL checkpoint holds integer uint16 tensors), and a uint16 array is written back as
BF16: a checkpoint read and written again is byte-identical per tensor. `bf16_bits_to_float32` widens
bits exactly; `float32_to_bf16_bits` rounds to nearest even, as torch does; `to_float_arrays` gives the
arrays a model loads. safetensors files are read and written here (the format is a JSON header and raw
little-endian data), so no framework and no safetensors release's numpy quirks are involved.
Writes go to a temporary directory that replaces the target in one step (common/atomic_write.py):
a reader never sees a half-written checkpoint.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from mmrun.backend.errors import UsageError
from mmrun.common.atomic_write import remove_stale_temporaries, replace_directory, temporary_name
from mmrun.models.qwen2_vl.configuration import MODEL_TYPES, Qwen2VLConfig
from mmrun.models.qwen2_vl.mm_layout import hf_shapes

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PATCH_EMBED = "visual.patch_embed.proj.weight"
# The Conv3d kernel that mmrun keeps flattened, for the families whose checkpoint names it otherwise (the writer
# below serves Qwen3-VL too).
PATCH_EMBED_NAMES = {"qwen3_vl": "model.visual.patch_embed.proj.weight"}
DEFAULT_MAX_SHARD_BYTES = 5 * 1024 ** 3  # transformers' default max_shard_size ("5GB")
# safetensors dtype name <-> numpy dtype; BF16 travels as uint16 bits (see the module docstring).
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
           "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}
_TORCH_DTYPE = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
# transformers 5.x in-memory prefixes -> hub prefixes (its _checkpoint_conversion_mapping, reversed).
_IN_MEMORY_PREFIXES = (("model.visual.", "visual."), ("model.language_model.", "model."))


class NotAnHFDirectoryError(ValueError):
    """The path is not a Hugging Face Qwen2-VL / Qwen2.5-VL directory mmrun can read."""


# ------------------------------------------------------------------------------------------ bf16

def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32, exactly (bf16 is the top half of a float32)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even; NaN stays a quiet NaN (torch's rule)."""
    u = np.asarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
    return np.where(np.isnan(np.asarray(values, np.float32)), np.uint16(0x7FC0), rounded)


def to_float_arrays(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays with bf16 bits (uint16) widened to float32, the rest as they are: ready for load_state_dict."""
    return {name: bf16_bits_to_float32(a) if a.dtype == np.uint16 else a for name, a in arrays.items()}


# ------------------------------------------------------------------------------------------ safetensors

class SafetensorsFile(Mapping[str, np.ndarray]):
    """One .safetensors file read lazily: the header at once, each tensor from its byte offsets when asked
    (`file[name]`), so a reader holds one tensor at a time, never the file. BF16 reads as uint16 bits."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self._data_start = 8 + length
        for name, spec in header.items():
            if spec["dtype"] not in _DTYPES:
                raise ValueError(f"{self.path}: tensor {name} has dtype {spec['dtype']}, which mmrun does not read; "
                                 f"supported: {sorted(_DTYPES)}")
        self._specs: dict[str, dict[str, Any]] = header

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._specs[name]["shape"])

    def dtype(self, name: str) -> np.dtype:
        return np.dtype(_DTYPES[self._specs[name]["dtype"]])

    def nbytes(self, name: str) -> int:
        begin, end = self._specs[name]["data_offsets"]
        return end - begin

    def __getitem__(self, name: str) -> np.ndarray:
        spec = self._specs[name]
        begin, end = spec["data_offsets"]
        dtype = np.dtype(_DTYPES[spec["dtype"]]).newbyteorder("<")
        data = np.fromfile(self.path, dtype=dtype, count=(end - begin) // dtype.itemsize,
                           offset=self._data_start + begin)
        return data.astype(dtype.newbyteorder("="), copy=False).reshape(spec["shape"])

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """name -> numpy array of one .safetensors file (BF16 as uint16 bits)."""
    return dict(SafetensorsFile(path))


class SafetensorsWriter:
    """One .safetensors file written tensor by tensor, in any order: the header (names, dtypes, shapes) is
    written first, each tensor then goes to its own offset, so a writer holds one tensor at a time.
    `close()` checks that every tensor was written and fsyncs. Tensors are laid out in name order."""

    def __init__(self, path: str | os.PathLike, specs: Mapping[str, tuple[np.dtype, Sequence[int]]],
                 metadata: Mapping[str, str] | None = None) -> None:
        header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
        self._offsets: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = {}
        offset = 0
        for name in sorted(specs):
            dtype, shape = np.dtype(specs[name][0]), tuple(int(n) for n in specs[name][1])
            if dtype not in _NAMES:
                raise ValueError(f"tensor {name} has numpy dtype {dtype}, which safetensors cannot hold here; "
                                 f"use one of {sorted(str(np.dtype(d)) for d in _DTYPES.values())}")
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            header[name] = {"dtype": _NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            self._offsets[name] = (offset, dtype, shape)
            offset += nbytes
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)
        self.path = Path(path)
        self._data_start = 8 + len(encoded)
        self._pending = set(self._offsets)
        self._file = open(self.path, "wb")
        self._file.write(struct.pack("<Q", len(encoded)) + encoded)
        self._file.truncate(self._data_start + offset)

    def write(self, name: str, array: np.ndarray) -> None:
        offset, dtype, shape = self._offsets[name]
        if array.dtype != dtype or tuple(array.shape) != shape:
            raise ValueError(f"{self.path}: tensor {name} is {array.dtype} {tuple(array.shape)}, the header says "
                             f"{dtype} {shape}")
        self._file.seek(self._data_start + offset)
        self._file.write(np.ascontiguousarray(array).astype(dtype.newbyteorder("<"), copy=False).tobytes())
        self._pending.discard(name)

    def close(self) -> None:
        if self._pending:
            self._file.close()
            raise ValueError(f"{self.path}: {len(self._pending)} tensors were never written "
                             f"({', '.join(sorted(self._pending)[:3])} ...)")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def abort(self) -> None:
        self._file.close()


def write_safetensors(path: str | os.PathLike, arrays: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> None:
    """One .safetensors file: JSON header (padded to 8 bytes) then each tensor's little-endian bytes."""
    for name, a in arrays.items():
        if a.dtype not in _NAMES:
            raise ValueError(f"tensor {name} has numpy dtype {a.dtype}, which safetensors cannot hold here; "
                             f"use one of {sorted(str(np.dtype(d)) for d in _DTYPES.values())}")
    writer = SafetensorsWriter(path, {name: (a.dtype, a.shape) for name, a in arrays.items()}, metadata)
    try:
        for name in sorted(arrays):
            writer.write(name, arrays[name])
    except BaseException:
        writer.abort()
        raise
    writer.close()


# ------------------------------------------------------------------------------------------ names

def hf_parameter_names(config: Qwen2VLConfig) -> list[str]:
    """Every parameter name of the model (= hub checkpoint keys), without building it."""
    v, t = config.vision, config.text
    norm = ("weight",) if config.is_qwen2_5 else ("weight", "bias")
    mlp = (("gate_proj", "up_proj", "down_proj") if config.is_qwen2_5 else ("fc1", "fc2"))
    names = [PATCH_EMBED]
    for i in range(v.depth):
        block = f"visual.blocks.{i}."
        names += [block + f"{n}.{p}" for n in ("norm1", "norm2") for p in norm]
        names += [block + f"attn.{n}.{p}" for n in ("qkv", "proj") for p in ("weight", "bias")]
        names += [block + f"mlp.{n}.{p}" for n in mlp for p in ("weight", "bias")]
    names += [f"visual.merger.ln_q.{p}" for p in norm]
    names += [f"visual.merger.mlp.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")]
    names.append("model.embed_tokens.weight")
    for i in range(t.num_hidden_layers):
        layer = f"model.layers.{i}."
        names += [layer + f"self_attn.{n}.{p}" for n in ("q_proj", "k_proj", "v_proj") for p in ("weight", "bias")]
        names += [layer + "self_attn.o_proj.weight", layer + "input_layernorm.weight",
                  layer + "post_attention_layernorm.weight"]
        names += [layer + f"mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
    names.append("model.norm.weight")
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def _hub_name(name: str) -> str:
    for memory, hub in _IN_MEMORY_PREFIXES:
        if name.startswith(memory):
            return hub + name[len(memory):]
    return name


def _check_names(where: str, config: Any, names: set[str], expected: Iterable[str] | None = None) -> None:
    """One error listing the missing and unexpected names; `expected` defaults to this config's (Qwen2-VL's)."""
    expected = set(hf_parameter_names(config) if expected is None else expected)
    missing, unexpected = sorted(expected - names), sorted(names - expected)
    if missing or unexpected:
        shown = "; ".join(f"{label} {len(keys)}: {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}"
                          for label, keys in (("missing", missing), ("unexpected", unexpected)) if keys)
        raise ValueError(f"{where} does not hold the tensors of its {config.model_type} config ({shown}); "
                         "pass the weights saved with this config")


# ------------------------------------------------------------------------------------------ read

def is_hf_directory(path: str | os.PathLike) -> bool:
    """True when `path` is a directory with a Qwen2-VL / Qwen2.5-VL config.json and safetensors weights."""
    path = Path(path)
    try:
        model_type = json.loads((path / CONFIG_FILE).read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return False
    return model_type in MODEL_TYPES and ((path / SINGLE_FILE).is_file() or (path / INDEX_FILE).is_file())


def _is_vlm_directory(path: Path) -> bool:
    """A Hugging Face directory of a family this writer writes (Qwen2-VL's, or Qwen3-VL's): one it may replace."""
    if is_hf_directory(path):
        return True
    from mmrun.models.qwen3_vl import hf_checkpoint as qwen3_checkpoint
    return qwen3_checkpoint.is_hf_directory(path)


def load_hf_config(path: str | os.PathLike) -> Qwen2VLConfig:
    """The Qwen2VLConfig of a Hugging Face directory's config.json (one-line errors otherwise)."""
    path = Path(path)
    if not path.is_dir():
        raise NotAnHFDirectoryError(f"{path} is not a directory; pass a Hugging Face Qwen2-VL model directory "
                                    "(config.json + model.safetensors)")
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise NotAnHFDirectoryError(f"{path} has no config.json, so it is not a Hugging Face model directory; "
                                    "pass the directory that save_pretrained wrote")
    try:
        raw = json.loads(config_file.read_text())
    except ValueError as error:
        raise NotAnHFDirectoryError(f"{config_file} is not valid JSON ({error}); restore the file") from None
    if not isinstance(raw, dict) or raw.get("model_type") not in MODEL_TYPES:
        found = raw.get("model_type") if isinstance(raw, dict) else type(raw).__name__
        raise NotAnHFDirectoryError(f"{config_file} has model_type {found!r}, not a Qwen2-VL family model; "
                                    f"mmrun's qwen2_vl reads model_type {' or '.join(MODEL_TYPES)}")
    return Qwen2VLConfig.from_hf_config(raw)


class HFWeights(Mapping[str, np.ndarray]):
    """A Hugging Face directory's weights, read lazily one tensor at a time (`weights[name]`), in mmrun's names
    and layout (module docstring); `config` is its Qwen2VLConfig. The names are checked against the config at
    once, from the files' headers alone. (Qwen3-VL's reader subclasses it with its own `__init__`.)"""

    patch_embed_name = PATCH_EMBED  # the Conv3d kernel read flattened

    def __init__(self, path: str | os.PathLike) -> None:
        path = Path(path)
        self.path = path
        self.config = load_hf_config(path)
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
                if not stored.endswith(".inv_freq"):  # rotary buffers some old checkpoints carry; computed, not learned
                    self._where[_hub_name(stored)] = (opened, stored)
        if self.config.tie_word_embeddings:
            self._where.pop("lm_head.weight", None)  # a copy of embed_tokens where a writer kept it
        _check_names(str(path), self.config, set(self._where))

    def dtype(self, name: str) -> np.dtype:
        file, stored = self._where[name]
        return file.dtype(stored)

    def nbytes(self, name: str) -> int:
        file, stored = self._where[name]
        return file.nbytes(stored)

    def __getitem__(self, name: str) -> np.ndarray:
        file, stored = self._where[name]
        array = file[stored]
        return array.reshape(array.shape[0], -1) if name == self.patch_embed_name else array

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def read_float(self, name: str) -> np.ndarray:
        """One tensor as a model loads it: bf16 bits widened to float32 (to_float_arrays), the rest as stored."""
        array = self[name]
        return bf16_bits_to_float32(array) if array.dtype == np.uint16 else array


def open_for_model(path: str | os.PathLike, config: Qwen2VLConfig, described_by: str) -> HFWeights:
    """A training run's --load of an HF directory: its weights, read lazily (each rank reads only the tensors of
    its shard), after checking that its config.json describes `config`'s network (`described_by` names where
    that came from, e.g. model.json's path). The dtype it was saved in does not count."""
    weights = HFWeights(path)
    difference = _config_difference(_structure(weights.config.to_hf_config()), _structure(config.to_hf_config()))
    if difference:
        raise UsageError(f"--load {path}: its config.json describes another model than {described_by} ({difference}); "
                         f"make {described_by} match the checkpoint")
    return weights


def _structure(hf_config: dict[str, Any]) -> dict[str, Any]:
    """An HF config without the keys that do not change the network (the dtype the weights were saved in)."""
    return {k: v for k, v in hf_config.items() if k not in ("torch_dtype", "dtype", "architectures")}


def _config_difference(theirs: dict[str, Any], ours: dict[str, Any], prefix: str = "") -> str:
    """The first few keys where two HF config dicts differ, as `key: checkpoint X, model.json Y` ('' if none)."""
    found = []
    for key in sorted(set(theirs) | set(ours)):
        a, b = theirs.get(key), ours.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            inner = _config_difference(a, b, f"{prefix}{key}.")
            found.extend([inner] if inner else [])
        elif a != b:
            found.append(f"{prefix}{key}: checkpoint {a!r}, model.json {b!r}")
    return "; ".join(found[:3])


def load_hf_directory(path: str | os.PathLike) -> tuple[Qwen2VLConfig, dict[str, np.ndarray]]:
    """(config, {parameter name: array}) of a Hugging Face directory, in mmrun's layout (module docstring)."""
    weights = HFWeights(path)
    return weights.config, dict(weights)


# ------------------------------------------------------------------------------------------ write

def save_hf_directory(path: str | os.PathLike, config: Qwen2VLConfig, arrays: Mapping[str, np.ndarray], *,
                      dtype: str | None = None, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                      copy_files_from: str | os.PathLike | None = None) -> Path:
    """Write config.json and safetensors (sharded with an index above `max_shard_bytes`) that transformers'
    from_pretrained loads; returns the directory. `arrays` are in mmrun's layout (e.g. a state dict through
    tensors.state_dict_to_numpy, or load_hf_directory's). `dtype` "bfloat16" | "float32" | "float16"
    converts floating tensors (bf16 rounded to nearest even), None writes them as given (uint16 = bf16 bits).
    `copy_files_from`: a directory whose other files (tokenizer, processor, generation config) are copied.

    The directory is built beside `path` and swapped in at once; an existing `path` is replaced only when
    it is empty or a Hugging Face Qwen2-VL directory itself."""
    _check_names("the arrays to save", config, set(arrays), expected=hf_shapes(config))
    return write_hf_directory(path, config, arrays.items(), {n: np.asarray(a).dtype for n, a in arrays.items()},
                              dtype=dtype, max_shard_bytes=max_shard_bytes, copy_files_from=copy_files_from)


def write_hf_directory(path: str | os.PathLike, config: Qwen2VLConfig, tensors: Iterable[tuple[str, np.ndarray]],
                       dtypes: Mapping[str, np.dtype], *, dtype: str | None = None,
                       max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                       copy_files_from: str | os.PathLike | None = None) -> Path:
    """save_hf_directory, streaming: `tensors` yields (name, array) of every parameter once, in any order, each
    array in mmrun's layout and of dtype `dtypes[name]`; each goes to its file as it comes, so memory holds
    one tensor at a time. Shapes come from the config (mm_layout.hf_shapes)."""
    path = Path(path)
    if path.exists() and not (path.is_dir() and (not any(path.iterdir()) or _is_vlm_directory(path))):
        raise ValueError(f"refusing to replace {path}: it exists and is not a Hugging Face Qwen2-VL directory; "
                         "name a new directory")
    v = config.vision
    shapes = dict(hf_shapes(config))  # Qwen2-VL's or Qwen3-VL's (mm_layout picks by model_type)
    _check_names("the tensors to save", config, set(dtypes), expected=shapes)
    patch = PATCH_EMBED_NAMES.get(config.model_type, PATCH_EMBED)
    shapes[patch] = (shapes[patch][0], v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    stored = {name: _converted_dtype(np.dtype(dtypes[name]), dtype) for name in shapes}
    float_kinds = {_NAMES[d] for d in stored.values() if _NAMES[d] in _TORCH_DTYPE}
    hf_config = config.to_hf_config()
    if len(float_kinds) == 1:
        hf_config["torch_dtype"] = _TORCH_DTYPE[float_kinds.pop()]
    sizes = {name: int(np.prod(shape, dtype=np.int64)) * stored[name].itemsize for name, shape in shapes.items()}
    shards = _shards(sizes, max_shard_bytes)
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
                raise ValueError(f"tensor {name} is not a parameter of this {config.model_type} model")
            converted = _converted(name, np.asarray(array), dtype)
            writers[file_of[name]].write(name, converted.reshape(shapes[name]))
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


def _converted_dtype(given: np.dtype, dtype: str | None) -> np.dtype:
    """The dtype _converted gives an array of dtype `given`."""
    return _converted("", np.empty(0, given), dtype).dtype


def _converted(name: str, a: np.ndarray, dtype: str | None) -> np.ndarray:
    if dtype is None or a.dtype.kind not in "fu" or (a.dtype.kind == "u" and a.dtype != np.uint16):
        return a
    if dtype == "bfloat16":
        return a if a.dtype == np.uint16 else float32_to_bf16_bits(a.astype(np.float32))
    if dtype in ("float32", "float16"):
        wide = bf16_bits_to_float32(a) if a.dtype == np.uint16 else a
        return wide.astype(dtype)
    raise ValueError(f"dtype {dtype!r} cannot be written; use bfloat16, float32, float16 or None (as given)")


def _shards(sizes: Mapping[str, int], max_bytes: int) -> list[list[str]]:
    """Tensor names in name order, cut into shards of at most max_bytes (a larger tensor gets a shard of its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name in sorted(sizes):
        if shards[-1] and size + sizes[name] > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += sizes[name]
    return shards
