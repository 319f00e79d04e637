"""safetensors files and bf16 in numpy, for every model family: no framework, no pickle.

The format is an 8-byte header length, a JSON header (name -> dtype, shape, byte offsets), then each tensor's
little-endian bytes; it is read and written here, so no framework and no safetensors release's numpy quirks
are involved. **bf16**: numpy has no bfloat16, so a BF16 tensor is read as its raw bits in an np.uint16 array of
the same shape (no checkpoint mmrun reads holds integer uint16 tensors), and a uint16 array is written back as
BF16: a file read and written again is byte-identical per tensor. `bf16_bits_to_float32` widens bits exactly;
`float32_to_bf16_bits` rounds to nearest even, as torch does; `to_float_arrays` gives the arrays a model loads.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

DEFAULT_MAX_SHARD_BYTES = 5 * 1024 ** 3  # transformers' default max_shard_size ("5GB")
# safetensors dtype name <-> numpy dtype; BF16 travels as uint16 bits (see the module docstring).
DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
           "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
DTYPE_NAMES = {np.dtype(v): k for k, v in DTYPES.items()}
TORCH_DTYPE = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


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
            if spec["dtype"] not in DTYPES:
                raise ValueError(f"{self.path}: tensor {name} has dtype {spec['dtype']}, which mmrun does not read; "
                                 f"supported: {sorted(DTYPES)}")
        self._specs: dict[str, dict[str, Any]] = header

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._specs[name]["shape"])

    def dtype(self, name: str) -> np.dtype:
        return np.dtype(DTYPES[self._specs[name]["dtype"]])

    def nbytes(self, name: str) -> int:
        begin, end = self._specs[name]["data_offsets"]
        return end - begin

    def __getitem__(self, name: str) -> np.ndarray:
        spec = self._specs[name]
        begin, end = spec["data_offsets"]
        dtype = np.dtype(DTYPES[spec["dtype"]]).newbyteorder("<")
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
            if dtype not in DTYPE_NAMES:
                raise ValueError(f"tensor {name} has numpy dtype {dtype}, which safetensors cannot hold here; "
                                 f"use one of {sorted(str(np.dtype(d)) for d in DTYPES.values())}")
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
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
        if a.dtype not in DTYPE_NAMES:
            raise ValueError(f"tensor {name} has numpy dtype {a.dtype}, which safetensors cannot hold here; "
                             f"use one of {sorted(str(np.dtype(d)) for d in DTYPES.values())}")
    writer = SafetensorsWriter(path, {name: (a.dtype, a.shape) for name, a in arrays.items()}, metadata)
    try:
        for name in sorted(arrays):
            writer.write(name, arrays[name])
    except BaseException:
        writer.abort()
        raise
    writer.close()


def converted_dtype(given: np.dtype, dtype: str | None) -> np.dtype:
    """The dtype `converted` gives an array of dtype `given`."""
    return converted("", np.empty(0, given), dtype).dtype


def converted(name: str, a: np.ndarray, dtype: str | None) -> np.ndarray:
    if dtype is None or a.dtype.kind not in "fu" or (a.dtype.kind == "u" and a.dtype != np.uint16):
        return a
    if dtype == "bfloat16":
        return a if a.dtype == np.uint16 else float32_to_bf16_bits(a.astype(np.float32))
    if dtype in ("float32", "float16"):
        wide = bf16_bits_to_float32(a) if a.dtype == np.uint16 else a
        return wide.astype(dtype)
    raise ValueError(f"dtype {dtype!r} cannot be written; use bfloat16, float32, float16 or None (as given)")


def shards_of(sizes: Mapping[str, int], max_bytes: int) -> list[list[str]]:
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
