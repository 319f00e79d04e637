"""Megatron's .bin/.idx format: byte-for-byte interoperability with megatron-core, both directions."""
from __future__ import annotations

import os

import numpy as np
import pytest

from mmrun.data.indexed_dataset import (
    IndexedDataset,
    IndexedDatasetError,
    IndexedDatasetWriter,
    optimal_dtype,
    write_indexed_dataset,
)


def _documents(seed: int, n: int, high: int) -> list[list[np.ndarray]]:
    """n documents of 1-3 sequences each (one empty document among them), random lengths."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        parts = 0 if i == n // 2 else int(rng.integers(1, 4))
        docs.append([rng.integers(0, high, size=int(rng.integers(1, 50))) for _ in range(parts)])
    return docs


def _write_ours(prefix, docs, dtype, multimodal=False):
    with IndexedDatasetWriter(prefix, dtype, multimodal=multimodal) as w:
        for doc in docs:
            tokens = np.concatenate(doc) if doc else np.zeros(0, np.int64)
            modes = [k % 3 for k in range(len(doc))] if multimodal else None
            w.add_document(tokens, [len(s) for s in doc], modes)


def _write_megatron(indexed, prefix, docs, dtype, multimodal=False):
    b = indexed.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype, multimodal=multimodal)
    for doc in docs:
        tokens = np.concatenate(doc) if doc else np.zeros(0, np.int64)
        modes = [k % 3 for k in range(len(doc))] if multimodal else None
        b.add_document(tokens, [len(s) for s in doc], modes)
    b.finalize(prefix + ".idx")


def _files(prefix):
    return open(prefix + ".bin", "rb").read(), open(prefix + ".idx", "rb").read()


@pytest.mark.parametrize("dtype, high", [(np.uint16, 65000), (np.int32, 200_000)])
@pytest.mark.parametrize("multimodal", [False, True])
def test_files_are_byte_identical_to_megatron_cores(tmp_path, megatron_datasets, dtype, high, multimodal):
    docs = _documents(0, 40, high)
    _write_ours(str(tmp_path / "ours"), docs, dtype, multimodal)
    _write_megatron(megatron_datasets.indexed, str(tmp_path / "theirs"), docs, dtype, multimodal)
    assert _files(str(tmp_path / "ours")) == _files(str(tmp_path / "theirs"))


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_megatron_core_reads_our_files(tmp_path, megatron_datasets, dtype):
    docs = _documents(1, 30, 60000)
    prefix = str(tmp_path / "ours")
    _write_ours(prefix, docs, dtype)
    theirs = megatron_datasets.indexed.IndexedDataset(prefix)
    sequences = [s for doc in docs for s in doc]
    assert len(theirs) == len(sequences)
    assert theirs.index.dtype == dtype
    assert theirs.document_indices.tolist() == np.cumsum([0] + [len(d) for d in docs]).tolist()
    for i, seq in enumerate(sequences):
        np.testing.assert_array_equal(theirs[i], seq)
        np.testing.assert_array_equal(theirs.get(i, offset=1, length=len(seq) - 1), seq[1:])


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_we_read_megatron_cores_files(tmp_path, megatron_datasets, dtype):
    docs = _documents(2, 30, 60000)
    prefix = str(tmp_path / "theirs")
    _write_megatron(megatron_datasets.indexed, prefix, docs, dtype)
    ours, theirs = IndexedDataset(prefix), megatron_datasets.indexed.IndexedDataset(prefix)
    assert ours.dtype == dtype and len(ours) == len(theirs)
    assert ours.num_documents == len(docs)
    np.testing.assert_array_equal(ours.sequence_lengths, theirs.sequence_lengths)
    np.testing.assert_array_equal(ours.sequence_pointers, theirs.index.sequence_pointers)
    np.testing.assert_array_equal(ours.document_indices, theirs.document_indices)
    for i in range(len(ours)):
        np.testing.assert_array_equal(ours[i], theirs[i])
        np.testing.assert_array_equal(ours.get(i, 2, 3) if ours.sequence_lengths[i] >= 5 else ours[i],
                                      theirs.get(i, 2, 3) if ours.sequence_lengths[i] >= 5 else theirs[i])
    for d, doc in enumerate(docs):
        expected = np.concatenate(doc) if doc else np.zeros(0)
        np.testing.assert_array_equal(ours.document(d), expected)
    assert [a.tolist() for a in ours[3:7]] == [a.tolist() for a in theirs[3:7]]


def test_merge_equals_megatron_cores_add_index(tmp_path, megatron_datasets):
    a, b = _documents(3, 10, 1000), _documents(4, 12, 1000)
    for name, docs in (("a", a), ("b", b)):
        _write_ours(str(tmp_path / name), docs, np.uint16)
    with IndexedDatasetWriter(str(tmp_path / "ours"), np.uint16) as w:
        w.add_index(str(tmp_path / "a"))
        w.add_index(str(tmp_path / "b"))
    builder = megatron_datasets.indexed.IndexedDatasetBuilder(str(tmp_path / "theirs.bin"), dtype=np.uint16)
    builder.add_index(str(tmp_path / "a"))
    builder.add_index(str(tmp_path / "b"))
    builder.finalize(str(tmp_path / "theirs.idx"))
    assert _files(str(tmp_path / "ours")) == _files(str(tmp_path / "theirs"))
    _write_ours(str(tmp_path / "whole"), a + b, np.uint16)
    assert _files(str(tmp_path / "ours")) == _files(str(tmp_path / "whole"))


def test_nothing_under_the_final_names_until_finalize(tmp_path):
    prefix = str(tmp_path / "ds")
    w = IndexedDatasetWriter(prefix, np.uint16)
    w.add_document([1, 2, 3])
    assert not os.path.exists(prefix + ".bin") and not os.path.exists(prefix + ".idx")
    w.abort()
    assert os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError, match="boom"):
        with IndexedDatasetWriter(prefix, np.uint16) as w:
            w.add_document([1, 2, 3])
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []
    write_indexed_dataset(prefix, [[1, 2, 3], [4]], np.uint16)
    assert sorted(os.listdir(tmp_path)) == ["ds.bin", "ds.idx"]
    assert [x.tolist() for x in IndexedDataset(prefix)[:]] == [[1, 2, 3], [4]]


def test_token_ids_that_do_not_fit_the_dtype_are_refused(tmp_path):
    with IndexedDatasetWriter(str(tmp_path / "ds"), np.uint16) as w:
        with pytest.raises(IndexedDatasetError, match=r"token ids \[0, 70000\] do not fit the dataset dtype uint16"):
            w.add_document([0, 70000])
        w.abort()
    assert optimal_dtype(65499) == np.uint16 and optimal_dtype(65500) == np.int32 and optimal_dtype(None) == np.int32


def test_damaged_or_missing_files_give_one_line_errors(tmp_path):
    prefix = str(tmp_path / "ds")
    write_indexed_dataset(prefix, [[1, 2, 3], [4, 5]], np.uint16)
    with pytest.raises(IndexedDatasetError, match=r"pass the path prefix without \.bin.*use '.*ds'"):
        IndexedDataset(prefix + ".bin")
    with pytest.raises(IndexedDatasetError, match=r"indexed dataset not found: .*nope\.idx, .*nope\.bin missing"):
        IndexedDataset(str(tmp_path / "nope"))
    good_bin, good_idx = _files(prefix)
    cases = [
        (good_bin[:-2], good_idx, r"has 8 bytes but .* describes 10"),
        (good_bin, good_idx[:-3], r"truncated or corrupt"),
        (good_bin, b"NOTANIDX" + good_idx[8:], r"not a Megatron index file"),
        (good_bin, good_idx[:9] + (2).to_bytes(8, "little") + good_idx[17:], r"index version 2"),
        (good_bin, good_idx[:17] + bytes([42]) + good_idx[18:], r"unknown dtype code 42"),
    ]
    for bin_bytes, idx_bytes, message in cases:
        open(prefix + ".bin", "wb").write(bin_bytes)
        open(prefix + ".idx", "wb").write(idx_bytes)
        with pytest.raises(IndexedDatasetError, match=message) as info:
            IndexedDataset(prefix)
        assert "\n" not in str(info.value)


def test_empty_dataset_round_trip(tmp_path):
    # (megatron-core itself cannot open this one: numpy refuses to memory-map the empty .bin)
    prefix = str(tmp_path / "empty")
    write_indexed_dataset(prefix, [], np.uint16)
    ours = IndexedDataset(prefix)
    assert len(ours) == 0 and ours.num_documents == 0 and ours[:] == []
