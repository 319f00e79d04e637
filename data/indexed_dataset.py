"""Megatron's indexed dataset format (`<prefix>.bin` + `<prefix>.idx`): writer and memmap reader.

Byte layout of the `.idx` file (little endian), as written by megatron-core's `_IndexWriter`:

    b"MMIDIDX\\x00\\x00"            9 bytes magic
    version                         uint64, always 1
    dtype code                      uint8, see DTYPE_CODES
    sequence_count                  uint64
    document_count                  uint64 (= number of documents + 1)
    sequence_lengths                int32[sequence_count]   tokens per sequence
    sequence_pointers               int64[sequence_count]   byte offset of each sequence in .bin
    document_indices                int64[document_count]   0, then the end sequence of each document
    sequence_modes (multimodal)     int8[sequence_count]    only in multimodal files

The `.bin` file is every sequence's tokens, back to back, in the dtype of the header. A document is
one or more sequences (one per sentence with Megatron's --split-sentences, else one).
"""
from __future__ import annotations

import os
import shutil
import struct
from array import array
from typing import Iterable, Sequence

import numpy as np

from mmrun.common.atomic_write import AtomicFile

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
# Megatron's DType enum: code -> numpy dtype.
DTYPE_CODES: dict[int, type] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
_CODE_OF_DTYPE = {np.dtype(t): c for c, t in DTYPE_CODES.items()}
# magic + version + dtype code + sequence count + document count
_HEADER_BYTES = len(INDEX_HEADER) + 8 + 1 + 8 + 8


class IndexedDatasetError(ValueError):
    """A .bin/.idx pair is missing or does not follow the format (one line, names the file)."""


def idx_path(path_prefix: str) -> str:
    return path_prefix + ".idx"


def bin_path(path_prefix: str) -> str:
    return path_prefix + ".bin"


def optimal_dtype(vocab_size: int | None) -> type:
    """Megatron's choice of token dtype: uint16 while the vocabulary fits, else int32."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def dtype_code(dtype) -> int:
    try:
        return _CODE_OF_DTYPE[np.dtype(dtype)]
    except KeyError:
        raise IndexedDatasetError(
            f"dtype {np.dtype(dtype)} has no code in Megatron's indexed format; use one of "
            f"{', '.join(str(np.dtype(t)) for t in DTYPE_CODES.values())}."
        ) from None


def cast_tokens(tokens: Sequence[int] | np.ndarray, dtype) -> np.ndarray:
    """Token ids as an array of `dtype`, refusing ids the dtype cannot hold (numpy would wrap them
    silently, and a wrapped id is a wrong token, not an error later)."""
    dtype = np.dtype(dtype)
    data = np.asarray(tokens)
    if data.size and dtype.kind in "iu" and (data.dtype.kind in "iu" or data.dtype == object):
        info = np.iinfo(dtype)
        low, high = data.min(), data.max()
        if low < info.min or high > info.max:
            raise IndexedDatasetError(
                f"token ids [{low}, {high}] do not fit the dataset dtype {dtype}; "
                "write with a wider dtype (int32 for vocabularies of 65500 or more)."
            )
    return data.astype(dtype, copy=False)


class IndexedDatasetWriter:
    """Writes `<prefix>.bin`/`<prefix>.idx` under temporary names (mmrun.common.atomic_write); `finalize()`
    renames them.

    Until `finalize()` returns, no file with the final names exists (an interrupted or failed run
    leaves nothing a reader could mistake for a dataset); `abort()`, or leaving a `with` block by
    an exception, removes the temporary files. The `.idx` is renamed last, so a `.idx` on disk
    always has its complete `.bin` beside it.
    """

    def __init__(self, path_prefix: str, dtype=np.int32, multimodal: bool = False) -> None:
        self.path_prefix = path_prefix
        self.dtype = np.dtype(dtype)
        self._code = dtype_code(self.dtype)
        self.multimodal = multimodal
        self._bin_file = AtomicFile(bin_path(path_prefix), "wb")
        self._bin = self._bin_file.file
        self._lengths = array("q")
        self._modes = array("b") if multimodal else None
        self._doc_idx = array("q", [0])
        self._done = False

    def __enter__(self) -> "IndexedDatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._done:
            self.finalize()

    def _write_tokens(self, tokens) -> int:
        data = cast_tokens(tokens, self.dtype)
        self._bin.write(data.tobytes(order="C"))
        return int(data.size)

    def add_item(self, tokens: Sequence[int] | np.ndarray, mode: int = 0) -> None:
        """One sequence; call `end_document()` after the last sequence of a document."""
        self._lengths.append(self._write_tokens(tokens))
        if self._modes is not None:
            self._modes.append(mode)

    def end_document(self) -> None:
        self._doc_idx.append(len(self._lengths))

    def add_document(
        self,
        tokens: Sequence[int] | np.ndarray,
        lengths: Sequence[int] | None = None,
        modes: Sequence[int] | None = None,
    ) -> None:
        """A whole document: its tokens, split into sequences of `lengths` (default: one)."""
        n = self._write_tokens(tokens)
        lengths = [n] if lengths is None else list(lengths)
        if sum(lengths) != n:
            raise IndexedDatasetError(
                f"document lengths {lengths} do not add up to its {n} tokens; pass one length per sequence."
            )
        self._lengths.extend(lengths)
        if self._modes is not None:
            self._modes.extend(modes if modes is not None else [0] * len(lengths))
        self._doc_idx.append(len(self._lengths))

    def add_index(self, path_prefix: str) -> None:
        """Append a whole existing dataset (Megatron's merge of --partitions outputs)."""
        other = IndexedDataset(path_prefix)
        if other.dtype != self.dtype:
            raise IndexedDatasetError(
                f"cannot merge {path_prefix!r} ({other.dtype}) into a {self.dtype} dataset; "
                "tokenize both with the same tokenizer."
            )
        offset = len(self._lengths)
        self._lengths.extend(other.sequence_lengths.astype(np.int64).tolist())
        self._doc_idx.extend((other.document_indices[1:] + offset).tolist())
        if self._modes is not None:
            modes = other.sequence_modes
            self._modes.extend(modes.tolist() if modes is not None else [0] * len(other))
        other.close()
        with open(bin_path(path_prefix), "rb") as f:
            shutil.copyfileobj(f, self._bin)

    @property
    def num_documents(self) -> int:
        return len(self._doc_idx) - 1

    def finalize(self) -> None:
        lengths = np.frombuffer(self._lengths, dtype=np.int64) if self._lengths else np.zeros(0, np.int64)
        if lengths.size and lengths.max() > np.iinfo(np.int32).max:
            raise IndexedDatasetError("a sequence is longer than 2**31-1 tokens, which the format cannot hold.")
        pointers = np.zeros(lengths.size, dtype=np.int64)
        if lengths.size:
            np.cumsum(lengths[:-1] * self.dtype.itemsize, out=pointers[1:])
        index = AtomicFile(idx_path(self.path_prefix), "wb")
        try:
            f = index.file
            f.write(INDEX_HEADER)
            f.write(struct.pack("<Q", INDEX_VERSION))
            f.write(struct.pack("<B", self._code))
            f.write(struct.pack("<Q", lengths.size))
            f.write(struct.pack("<Q", len(self._doc_idx)))
            f.write(lengths.astype("<i4").tobytes())
            f.write(pointers.astype("<i8").tobytes())
            f.write(np.asarray(self._doc_idx, dtype="<i8").tobytes())
            if self._modes is not None:
                f.write(np.asarray(self._modes, dtype=np.int8).tobytes())
            # Both files are complete before either is renamed; the .idx goes last, so an .idx on disk
            # always has its .bin beside it.
            self._bin_file.commit()
            index.commit()
        except BaseException:
            index.abort()
            raise
        self._done = True

    def abort(self) -> None:
        """Remove the temporary files; a no-op after `finalize()`."""
        if self._done:
            return
        self._bin_file.abort()
        self._done = True


def write_indexed_dataset(
    path_prefix: str, documents: Iterable[Sequence[int]], dtype=np.int32
) -> None:
    """Write one sequence per document (the common case) in one call."""
    with IndexedDatasetWriter(path_prefix, dtype) as writer:
        for doc in documents:
            writer.add_document(doc)


class IndexedDataset:
    """Read-only view of `<prefix>.bin`/`<prefix>.idx` through numpy memmaps.

    `ds[i]` is sequence i (a numpy array in the file's dtype), `ds.get(i, offset, length)` a part
    of it; the index arrays are exposed as megatron-core names them.
    """

    def __init__(self, path_prefix: str, multimodal: bool | None = None) -> None:
        self.path_prefix = path_prefix
        for suffix in (".bin", ".idx"):
            if path_prefix.endswith(suffix):
                raise IndexedDatasetError(
                    f"pass the path prefix without {suffix}. Received: {path_prefix!r}; "
                    f"use {path_prefix[: -len(suffix)]!r}."
                )
        ipath, bpath = idx_path(path_prefix), bin_path(path_prefix)
        missing = [p for p in (ipath, bpath) if not os.path.isfile(p)]
        if missing:
            raise IndexedDatasetError(
                f"indexed dataset not found: {', '.join(missing)} missing for prefix {path_prefix!r}; "
                "run `mmrun preprocess-data` and pass its <output-prefix>_<key>_document as the prefix."
            )
        self._idx = np.memmap(ipath, mode="r", dtype=np.uint8)
        header = bytes(self._idx[:_HEADER_BYTES])
        if len(header) < _HEADER_BYTES or header[: len(INDEX_HEADER)] != INDEX_HEADER:
            raise IndexedDatasetError(f"{ipath!r} is not a Megatron index file (bad MMIDIDX header).")
        version, code, seq_count, doc_count = struct.unpack("<QBQQ", header[len(INDEX_HEADER) :])
        if version != INDEX_VERSION:
            raise IndexedDatasetError(f"{ipath!r} has index version {version}; only version 1 is readable.")
        if code not in DTYPE_CODES:
            raise IndexedDatasetError(f"{ipath!r} has unknown dtype code {code}.")
        self.dtype = np.dtype(DTYPE_CODES[code])
        arrays_end = _HEADER_BYTES + seq_count * (4 + 8) + doc_count * 8
        extra = self._idx.size - arrays_end
        if extra not in (0, seq_count) or (multimodal and extra != seq_count):
            raise IndexedDatasetError(
                f"{ipath!r} is truncated or corrupt: {self._idx.size} bytes for {seq_count} sequences "
                f"and {doc_count - 1} documents."
            )
        self.multimodal = bool(extra) if multimodal is None else multimodal
        off = _HEADER_BYTES
        buf = self._idx
        self.sequence_lengths = np.frombuffer(buf, dtype="<i4", count=seq_count, offset=off)
        off += seq_count * 4
        self.sequence_pointers = np.frombuffer(buf, dtype="<i8", count=seq_count, offset=off)
        off += seq_count * 8
        self.document_indices = np.frombuffer(buf, dtype="<i8", count=doc_count, offset=off)
        off += doc_count * 8
        self.sequence_modes = (
            np.frombuffer(buf, dtype=np.int8, count=seq_count, offset=off) if self.multimodal else None
        )
        if doc_count == 0 or self.document_indices[-1] != seq_count:
            raise IndexedDatasetError(
                f"{ipath!r} is corrupt: its document indices do not end at its {seq_count} sequences."
            )
        bin_bytes = os.path.getsize(bpath)
        needed = int(self.sequence_lengths.astype(np.int64).sum()) * self.dtype.itemsize
        if bin_bytes != needed:
            raise IndexedDatasetError(
                f"{bpath!r} has {bin_bytes} bytes but {ipath!r} describes {needed}; the pair does not "
                "belong together or one is truncated. Re-run the preprocessing."
            )
        # An empty .bin cannot be memory-mapped.
        self._bin = np.memmap(bpath, mode="r", dtype=np.uint8) if bin_bytes else np.zeros(0, np.uint8)

    def __len__(self) -> int:
        return int(self.sequence_lengths.shape[0])

    @property
    def num_documents(self) -> int:
        return int(self.document_indices.shape[0]) - 1

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens `[offset, offset + length)` of sequence `idx` (to its end when length is None)."""
        seq_len = int(self.sequence_lengths[idx])
        if length is None:
            length = seq_len - offset
        if offset < 0 or length < 0 or offset + length > seq_len:
            raise IndexError(f"tokens [{offset}, {offset + length}) are outside sequence {idx} of length {seq_len}")
        start = int(self.sequence_pointers[idx]) + offset * self.dtype.itemsize
        return np.frombuffer(self._bin, dtype=self.dtype, count=length, offset=start)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError("slices into an indexed dataset must be contiguous")
            return [self.get(i) for i in range(start, stop)]
        return self.get(int(idx))

    def document(self, doc: int) -> np.ndarray:
        """All tokens of document `doc` (its sequences concatenated)."""
        lo, hi = int(self.document_indices[doc]), int(self.document_indices[doc + 1])
        if hi == lo:
            return np.zeros(0, dtype=self.dtype)
        count = int(self.sequence_lengths[lo:hi].astype(np.int64).sum())
        return np.frombuffer(self._bin, dtype=self.dtype, count=count, offset=int(self.sequence_pointers[lo]))

    def close(self) -> None:
        # Drop the memmaps so the files can be removed or replaced (Windows, and tidy on Linux).
        for name in ("sequence_lengths", "sequence_pointers", "document_indices", "sequence_modes"):
            setattr(self, name, None)
        self._idx = self._bin = None

    @staticmethod
    def exists(path_prefix: str) -> bool:
        return os.path.isfile(idx_path(path_prefix)) and os.path.isfile(bin_path(path_prefix))
