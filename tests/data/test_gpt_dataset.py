"""GPT samples: identical to megatron-core's GPTDataset / MockGPTDataset, --split, determinism."""
from __future__ import annotations

import os

import numpy as np
import pytest

from mmrun.data.gpt_dataset import (
    DatasetConfigError,
    GPTDataset,
    GPTDatasetConfig,
    build_train_valid_test_datasets,
    parse_split,
    split_ranges,
    train_valid_test_num_samples,
)
from mmrun.data.indexed_dataset import IndexedDataset, write_indexed_dataset
from mmrun.data.tokenizers import NullTokenizer

TOK = NullTokenizer(500)  # eod = 500


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> str:
    """1000 documents of 1-80 random tokens, each closed by EOD."""
    rng = np.random.default_rng(0)
    docs = [np.append(rng.integers(0, 500, size=int(rng.integers(1, 80))), TOK.eod) for _ in range(1000)]
    path = str(tmp_path_factory.mktemp("gpt") / "ds_text_document")
    write_indexed_dataset(path, docs, np.uint16)
    return path


def _megatron(megatron_datasets, cls, nums, seed, seq, tmp_path, blend=None, masks=False, split="949,50,1"):
    gpt = megatron_datasets.gpt
    config = gpt.GPTDatasetConfig(
        random_seed=seed, sequence_length=seq, blend=blend, split=split, tokenizer=TOK,
        reset_position_ids=masks, reset_attention_mask=False, eod_mask_loss=masks,
        path_to_cache=str(tmp_path / "cache") if blend else None, create_attention_mask=False,
    )
    return megatron_datasets.Builder(cls, list(nums), lambda: True, config).build()


def _assert_same_samples(ours, theirs, indices):
    for i in indices:
        a, b = ours[i], theirs[i]
        assert sorted(a) == ["labels", "loss_mask", "position_ids", "tokens"]
        for key in a:
            np.testing.assert_array_equal(a[key], b[key].numpy(), err_msg=f"sample {i} {key}")
            assert a[key].dtype == b[key].numpy().dtype


@pytest.mark.parametrize(
    "nums, masks",
    [
        ((100, 20, 5), False),        # one epoch per split
        ((3000, 500, 300), True),     # several epochs, the last one shuffled apart; EOD masks on
        ((None, None, None), False),  # one epoch each, sized by the data
    ],
)
def test_equals_megatron_core_gpt_dataset(prefix, megatron_datasets, tmp_path, nums, masks):
    seed, seq = 1234, 32
    theirs = _megatron(megatron_datasets, megatron_datasets.gpt.GPTDataset, nums, seed, seq, tmp_path,
                       blend=([prefix], None), masks=masks)
    ours = build_train_valid_test_datasets(prefix, "949,50,1", seq, seed, nums, tokenizer=TOK,
                                           eod_mask_loss=masks, reset_position_ids=masks)
    for o, t in zip(ours, theirs):
        assert len(o) == len(t)
        np.testing.assert_array_equal(o.document_index, t.document_index)
        np.testing.assert_array_equal(o.sample_index, t.sample_index)
        np.testing.assert_array_equal(o.shuffle_index, t.shuffle_index)
        _assert_same_samples(o, t, list(range(min(len(o), 150))) + [len(o) - 1])
    assert ours[1].num_epochs == (7 if nums[1] == 500 else 1)


def test_sample_index_equals_megatron_helper_with_empty_sequences(megatron_datasets):
    class LowLevel:  # sequences of length 0 as well (a zero-length document must be skipped)
        sequence_lengths = np.random.default_rng(1).integers(0, 9, size=400).astype(np.int32)

        def get(self, idx, offset=0, length=None):
            raise AssertionError("not read")

    for seq, n in ((2, None), (7, 900), (16, 50)):
        ds = GPTDataset(LowLevel(), np.arange(400), n, GPTDatasetConfig(seq_length=seq, seed=3))
        tokens_per_epoch = int(LowLevel.sequence_lengths.sum())
        expected = megatron_datasets.helpers.build_sample_idx(
            LowLevel.sequence_lengths, ds.document_index, seq, ds.num_epochs, tokens_per_epoch, True, 1
        )
        np.testing.assert_array_equal(ds.sample_index, expected)


def test_mock_data_equals_megatron_core_mock(megatron_datasets, tmp_path):
    theirs = _megatron(megatron_datasets, megatron_datasets.gpt.MockGPTDataset, (64, 16, 8), 7, 64, tmp_path)
    ours = build_train_valid_test_datasets(None, "949,50,1", 64, 7, (64, 16, 8), tokenizer=TOK, mock=True)
    for o, t in zip(ours, theirs):
        assert len(o) == len(t)
        _assert_same_samples(o, t, list(range(20)) + [len(o) - 1])
    other_seed = build_train_valid_test_datasets(None, "1", 64, 8, (64, 0, 0), tokenizer=TOK, mock=True)[0]
    assert not np.array_equal(ours[0][0]["tokens"], other_seed[0]["tokens"])


def test_same_seed_same_order_other_seed_other_order(prefix):
    def first_tokens(seed):
        train = build_train_valid_test_datasets(prefix, "949,50,1", 16, seed, (64, 8, 8), tokenizer=TOK)[0]
        return np.stack([train[i]["tokens"] for i in range(64)])

    np.testing.assert_array_equal(first_tokens(5), first_tokens(5))
    assert not np.array_equal(first_tokens(5), first_tokens(6))


def test_samples_are_consecutive_windows_of_the_shuffled_documents(prefix):
    seq = 24
    train = build_train_valid_test_datasets(prefix, "949,50,1", seq, 11, (200, 0, 0), tokenizer=TOK)[0]
    ds = IndexedDataset(prefix)
    stream = np.concatenate([ds[int(d)] for d in train.document_index]).astype(np.int64)
    for i in range(50):
        s = train[i]
        start = int(train.shuffle_index[i]) * seq
        np.testing.assert_array_equal(s["tokens"], stream[start : start + seq])
        np.testing.assert_array_equal(s["labels"], stream[start + 1 : start + seq + 1])
        np.testing.assert_array_equal(s["position_ids"], np.arange(seq))
        assert s["loss_mask"].dtype == np.float32 and (s["loss_mask"] == 1).all()  # --eod-mask-loss off


def test_eod_mask_loss_and_reset_position_ids():
    from mmrun.data.gpt_dataset import make_sample

    tokens = np.array([5, 6, TOK.eod, 7, 8, 9, TOK.eod, 4])
    s = make_sample(tokens, np.roll(tokens, -1), GPTDatasetConfig(seq_length=8, seed=0, eod=TOK.eod,
                                                                   eod_mask_loss=True, reset_position_ids=True))
    assert s["loss_mask"].tolist() == [1, 1, 0, 1, 1, 1, 0, 1]
    assert s["position_ids"].tolist() == [0, 1, 2, 0, 1, 2, 3, 0]


def test_split_proportions_and_disjoint_documents(prefix):
    assert parse_split("949,50,1") == pytest.approx([0.949, 0.05, 0.001])
    assert parse_split("8/1/1") == pytest.approx([0.8, 0.1, 0.1])
    assert parse_split("1") == [1.0, 0.0, 0.0]
    assert split_ranges("949,50,1", 1000) == [(0, 949), (949, 999), (999, 1000)]
    assert split_ranges("98,2,0", 1000) == [(0, 980), (980, 1000), None]
    datasets = build_train_valid_test_datasets(prefix, "80,15,5", 16, 1, (10, 10, 10), tokenizer=TOK)
    seen = [set(ds.document_index.tolist()) for ds in datasets]
    assert [len(s) for s in seen] == [800, 150, 50]
    assert seen[0] == set(range(800)) and seen[1] == set(range(800, 950)) and seen[2] == set(range(950, 1000))
    train, valid, test = build_train_valid_test_datasets(prefix, "1,0,0", 16, 1, (10, 0, 0), tokenizer=TOK)
    assert valid is None and test is None and len(train.documents) == 1000


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(split="1,1,1,1"), r"--split takes up to three non-negative weights.*Received: '1,1,1,1'"),
        (dict(split="0,0,0"), r"--split takes up to three"),
        (dict(split="9999,1,0", num_samples=(10, 5, 0)), r"the valid split of --split 9999,1,0 gets no documents out of 1000"),
        (dict(data_prefix=["1.0", "a", "2.0", "b"]), r"several prefixes or weights \(dataset blending\) is not supported"),
        (dict(data_prefix=None), r"--data-path is required unless --mock-data"),
        (dict(mock=True, tokenizer=None), r"--mock-data needs a tokenizer"),
        (dict(seq_length=1), r"--seq-length must be at least 2"),
        (dict(tokenizer=None, eod_mask_loss=True), r"need the tokenizer's end-of-document id"),
    ],
)
def test_configuration_errors_are_one_line(prefix, kwargs, message):
    args = dict(data_prefix=prefix, split="949,50,1", seq_length=16, seed=1, num_samples=(10, 5, 1), tokenizer=TOK)
    args.update(kwargs)
    with pytest.raises(DatasetConfigError, match=message) as info:
        build_train_valid_test_datasets(**args)
    assert "\n" not in str(info.value)


def test_num_samples_per_split_as_megatron():
    # 20 iterations of global batch 8, validation every 10 iterations for 2 iterations
    assert train_valid_test_num_samples(20, 8, 10, 2) == (160, 48, 16)


def test_demo_corpus_trains_from_its_preprocessed_form(tmp_path):
    from mmrun.data.corpus import DEMO_JSONL, DEMO_MERGES, DEMO_VOCAB
    from mmrun.data.preprocess import main
    from mmrun.data.tokenizers import GPT2BPETokenizer

    assert main(["--input", str(DEMO_JSONL), "--output-prefix", str(tmp_path / "demo"), "--tokenizer-type",
                 "GPT2BPETokenizer", "--vocab-file", str(DEMO_VOCAB), "--merge-file", str(DEMO_MERGES),
                 "--append-eod", "--log-interval", "0"]) == 0
    tok = GPT2BPETokenizer(str(DEMO_VOCAB), str(DEMO_MERGES))
    train, valid, test = build_train_valid_test_datasets(
        str(tmp_path / "demo_text_document"), "949,50,1", 128, 1234, train_valid_test_num_samples(20, 8, 10, 2),
        tokenizer=tok)
    assert len(train) >= 160 and len(valid) >= 48 and len(test) >= 16
    text = tok.detokenize(train[0]["tokens"].tolist())
    assert len(text) > 300 and text.isascii()
    assert os.path.getsize(str(tmp_path / "demo_text_document.bin")) < 200_000
