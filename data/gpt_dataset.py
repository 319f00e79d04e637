"""GPT pretraining samples from an indexed dataset, in megatron-core's order.

A sample is `seq_length + 1` consecutive tokens of the split's documents, concatenated in a shuffled
order; sample i starts at token `i * seq_length` of that concatenation (neighbouring samples share
one token, so `labels` of one sample end where `tokens` of the next begin). The three index arrays
are built exactly as megatron-core's `GPTDataset` builds them (document index shuffled with
`numpy.random.RandomState(seed)`, epochs repeated as needed, the final epoch shuffled apart when it
is less than 80 % full, then the sample order shuffled with the same random state), so that for a
single `--data-path` the samples equal megatron-core's one for one (a test checks this). Only numpy
is used: the order is the same under PyTorch and MindSpore, and for any data-parallel size (the
sampler in `samplers.py` slices the global order).

Not carried over: blending several `--data-path` prefixes, the on-disk index cache (the indices are
rebuilt in well under a second for corpora of this size), `--reset-attention-mask`, and padding of a
last partial sample (megatron-core drops it by default, as here).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from mmrun.data.indexed_dataset import IndexedDataset

SPLIT_NAMES = ("train", "valid", "test")
# megatron-core: a final epoch with fewer than this share of an epoch's samples is shuffled on its
# own, so that its few samples do not concentrate at the end of the run.
SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80
# megatron-core splits mock documents evenly, whatever --split says.
MOCK_SPLIT = "1,1,1"


class DatasetConfigError(ValueError):
    """Dataset arguments that cannot work together (one line, says what to change)."""


class LowLevelDataset(Protocol):
    """What a GPT dataset reads: sequence lengths and token slices (IndexedDataset, mock)."""

    sequence_lengths: np.ndarray

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray: ...


class TokenizerLike(Protocol):
    vocab_size: int
    eod: int


@dataclass(frozen=True)
class GPTDatasetConfig:
    """The GPT dataset settings; the names are Megatron's argument names without dashes."""

    seq_length: int
    seed: int
    eod: int | None = None
    eod_mask_loss: bool = False
    reset_position_ids: bool = False

    def __post_init__(self) -> None:
        if self.seq_length < 2:
            raise DatasetConfigError(f"--seq-length must be at least 2. Received: {self.seq_length}.")
        if (self.eod_mask_loss or self.reset_position_ids) and self.eod is None:
            raise DatasetConfigError(
                "--eod-mask-loss and --reset-position-ids need the tokenizer's end-of-document id. "
                "Received: no eod; pass a tokenizer."
            )


# ---------------------------------------------------------------------------------------------
# --split


def parse_split(split: str) -> list[float]:
    """`"949,50,1"` (or `949/50/1`) -> normalized train/valid/test weights, as megatron-core."""
    parts = [float(x) for x in re.findall(r"[.0-9]+", str(split))]
    if not parts or len(parts) > len(SPLIT_NAMES) or sum(parts) <= 0:
        raise DatasetConfigError(
            f"--split takes up to three non-negative weights for train,valid,test with a positive sum. "
            f"Received: {split!r}; for example 949,50,1."
        )
    parts += [0.0] * (len(SPLIT_NAMES) - len(parts))
    total = sum(parts)
    return [p / total for p in parts]


def split_ranges(split: str, num_elements: int) -> list[tuple[int, int] | None]:
    """[begin, end) element range of each split (None for a zero weight), rounded as megatron-core."""
    weights = parse_split(split)
    bounds = np.concatenate([[0.0], np.cumsum(weights)]).tolist()
    ranges: list[tuple[int, int] | None] = []
    for lo, hi, w in zip(bounds[:-1], bounds[1:], weights):
        if w <= 0:
            ranges.append(None)
        else:
            ranges.append((int(round(lo * float(num_elements))), int(round(hi * float(num_elements)))))
    return ranges


# ---------------------------------------------------------------------------------------------
# index arrays (megatron-core's _build_document_index / build_sample_idx / _build_shuffle_index)


def _num_epochs(tokens_per_epoch: int, num_samples: int | None, seq_length: int) -> int:
    if num_samples is None:
        return 1
    requested = num_samples * seq_length + 1
    return max(1, -(-requested // tokens_per_epoch))


def _document_index(documents: np.ndarray, num_epochs: int, rng: np.random.RandomState, separate_final: bool):
    if not separate_final or num_epochs == 1:
        index = np.tile(documents.astype(np.int32), num_epochs)
        rng.shuffle(index)
        return index
    first = _document_index(documents, num_epochs - 1, rng, False)
    last = _document_index(documents, 1, rng, False)
    return np.concatenate([first, last])


def _shuffle_index(num_samples: int, total: int, rng: np.random.RandomState) -> np.ndarray:
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total:
        return first
    last = np.arange(num_samples, total, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate([first, last])


class GPTDataset:
    """Samples of one split: `ds[i]` -> dict of numpy arrays `tokens`, `labels`, `loss_mask`,
    `position_ids` (each of length seq_length). `len(ds)` covers every sample of the epochs built,
    at least `num_samples` (one epoch when num_samples is None)."""

    def __init__(
        self,
        low_level: LowLevelDataset,
        documents: np.ndarray,
        num_samples: int | None,
        config: GPTDatasetConfig,
        split_name: str = "train",
    ) -> None:
        self.low_level = low_level
        self.config = config
        self.split_name = split_name
        self.documents = np.asarray(documents, dtype=np.int32)
        self.num_samples = num_samples
        seq = config.seq_length
        sizes = np.asarray(low_level.sequence_lengths)
        tokens_per_epoch = int(sizes[self.documents].astype(np.int64).sum())
        if tokens_per_epoch < 2:
            raise DatasetConfigError(
                f"the {split_name} split has {tokens_per_epoch} tokens in {len(self.documents)} documents; "
                "it needs at least 2. Use more data or change --split."
            )
        epochs = _num_epochs(tokens_per_epoch, num_samples, seq)
        separate_final = False
        if epochs > 1:
            sans_final = ((epochs - 1) * tokens_per_epoch - 1) // seq
            per_epoch = (tokens_per_epoch - 1) // seq
            separate_final = num_samples - sans_final < int(SEPARATE_FINAL_EPOCH_THRESHOLD * per_epoch)
        rng = np.random.RandomState(config.seed)
        self.document_index = _document_index(self.documents, epochs, rng, separate_final)
        self.num_epochs = epochs
        total_samples = (epochs * tokens_per_epoch - 1) // seq
        # Start token of each entry of the document index in the concatenation; a sample's
        # (document, offset) is found by bisection instead of a stored [samples, 2] sample index.
        lengths = sizes[self.document_index].astype(np.int64)
        self._doc_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self._doc_lengths = lengths
        self.shuffle_index = _shuffle_index(
            sans_final if separate_final else total_samples, total_samples, rng
        )

    def __len__(self) -> int:
        return int(self.shuffle_index.shape[0])

    @property
    def sample_index(self) -> np.ndarray:
        """megatron-core's [samples + 1, 2] (document-index entry, offset) array, for inspection."""
        positions = np.arange(len(self) + 1, dtype=np.int64) * self.config.seq_length
        return np.stack(self._locate(positions), axis=1)

    def _locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # side="right" skips zero-length documents, as megatron-core's build_sample_idx does.
        entry = np.searchsorted(self._doc_starts, positions, side="right") - 1
        return entry, positions - self._doc_starts[entry]

    def sample_tokens(self, idx: int) -> np.ndarray:
        """The seq_length + 1 tokens of sample `idx` (after shuffling), as int64."""
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} is outside the {self.split_name} dataset of {len(self)} samples")
        seq = self.config.seq_length
        start = int(self.shuffle_index[idx]) * seq
        entry, offset = (int(x) for x in np.asarray(self._locate(np.array([start]))).ravel())
        out = np.empty(seq + 1, dtype=np.int64)
        filled = 0
        while filled < seq + 1:
            take = min(int(self._doc_lengths[entry]) - offset, seq + 1 - filled)
            if take > 0:
                doc = int(self.document_index[entry])
                out[filled : filled + take] = self.low_level.get(doc, offset=offset, length=take)
                filled += take
            entry += 1
            offset = 0
        return out

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        text = self.sample_tokens(int(idx))
        return make_sample(text[:-1], text[1:], self.config)


def make_sample(tokens: np.ndarray, labels: np.ndarray, config: GPTDatasetConfig) -> dict[str, np.ndarray]:
    """Megatron's `_get_ltor_masks_and_position_ids`, less the attention mask (the model's, causal)."""
    seq = tokens.shape[0]
    loss_mask = np.ones(seq, dtype=np.float32)
    position_ids = np.arange(seq, dtype=np.int64)
    if config.eod_mask_loss:
        # Megatron masks the prediction made FROM an end-of-document token (of the next document's
        # first token), not the prediction of the EOD itself.
        loss_mask[tokens == config.eod] = 0.0
    if config.reset_position_ids:
        prev = 0
        for i in np.flatnonzero(tokens == config.eod):
            position_ids[i + 1 :] -= i + 1 - prev
            prev = i + 1
    return {
        "tokens": np.ascontiguousarray(tokens, dtype=np.int64),
        "labels": np.ascontiguousarray(labels, dtype=np.int64),
        "loss_mask": loss_mask,
        "position_ids": position_ids,
    }


# ---------------------------------------------------------------------------------------------
# --mock-data


class MockLowLevelDataset:
    """megatron-core's `MockGPTLowLevelDataset`: 100,000 documents whose lengths come from a fixed
    generator (seed 0) and whose tokens are 1, 2, 3, ... (mod vocab size) closed by EOD. The run's
    --seed picks their order, as for real data."""

    seed = 0
    size = 100_000
    max_sequence_length = 4096

    def __init__(self, vocab_size: int, eod: int) -> None:
        self.vocab_size = int(vocab_size)
        self.eod = int(eod)
        rng = np.random.default_rng(seed=self.seed)
        self.sequence_lengths = rng.integers(low=1, high=self.max_sequence_length, size=self.size, dtype=np.int32)

    def __len__(self) -> int:
        return self.size

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        n = int(self.sequence_lengths[idx])
        if length is None:
            length = n - offset
        pos = np.arange(offset, offset + length, dtype=np.int64)
        return np.where(pos == n - 1, self.eod, (pos + 1) % self.vocab_size)


class MockGPTDataset(GPTDataset):
    """A GPT dataset over `MockLowLevelDataset` (no files; for --mock-data)."""

    def __init__(
        self,
        documents: np.ndarray,
        num_samples: int | None,
        config: GPTDatasetConfig,
        vocab_size: int,
        split_name: str = "train",
    ) -> None:
        super().__init__(MockLowLevelDataset(vocab_size, config.eod), documents, num_samples, config, split_name)


# ---------------------------------------------------------------------------------------------
# the train_valid_test_datasets_provider's building block


def train_valid_test_num_samples(
    train_iters: int, global_batch_size: int, eval_interval: int, eval_iters: int
) -> tuple[int, int, int]:
    """Samples each split must provide, as Megatron's `get_train_valid_test_num_samples`."""
    evaluations = (train_iters // eval_interval + 1) * eval_iters if eval_interval > 0 else 0
    return train_iters * global_batch_size, evaluations * global_batch_size, eval_iters * global_batch_size


def _single_prefix(data_prefix: str | Sequence[str]) -> str:
    prefixes = [data_prefix] if isinstance(data_prefix, str) else list(data_prefix)
    if len(prefixes) != 1:
        raise DatasetConfigError(
            "--data-path with several prefixes or weights (dataset blending) is not supported by mmrun. "
            f"Received: {' '.join(map(str, prefixes)) or 'nothing'}; pass one <prefix>_text_document."
        )
    return prefixes[0]


def build_train_valid_test_datasets(
    data_prefix: str | Sequence[str] | None,
    split: str,
    seq_length: int,
    seed: int,
    num_samples: Sequence[int | None],
    tokenizer: TokenizerLike | None = None,
    mock: bool = False,
    eod_mask_loss: bool = False,
    reset_position_ids: bool = False,
) -> tuple[GPTDataset | None, GPTDataset | None, GPTDataset | None]:
    """(train, valid, test) GPT datasets; a split with weight 0 in `split` is None.

    `num_samples` is (train, valid, test) as from `train_valid_test_num_samples`. With `mock`,
    `data_prefix` and `split` are ignored (megatron-core splits mock documents 1,1,1) and
    `tokenizer` (vocab_size, eod) shapes the synthetic tokens.
    """
    if len(num_samples) != len(SPLIT_NAMES):
        raise DatasetConfigError(f"num_samples needs one entry per split (train, valid, test). Received: {num_samples!r}.")
    if mock and tokenizer is None:
        raise DatasetConfigError(
            "--mock-data needs a tokenizer for its vocabulary size and EOD id. Received: none; "
            "for example --tokenizer-type NullTokenizer --vocab-size 1024."
        )
    config = GPTDatasetConfig(
        seq_length=seq_length,
        seed=seed,
        eod=None if tokenizer is None else tokenizer.eod,
        eod_mask_loss=eod_mask_loss,
        reset_position_ids=reset_position_ids,
    )
    if mock:
        low_level = None
        num_elements = MockLowLevelDataset.size
        split = MOCK_SPLIT
    else:
        if data_prefix is None:
            raise DatasetConfigError("--data-path is required unless --mock-data is given. Received: no --data-path.")
        low_level = IndexedDataset(_single_prefix(data_prefix))
        num_elements = len(low_level)  # sequences: megatron-core splits GPT data by sequence
    datasets: list[GPTDataset | None] = []
    for name, bounds, n in zip(SPLIT_NAMES, split_ranges(split, num_elements), num_samples):
        if bounds is None or bounds[0] == bounds[1]:
            if bounds is not None and n:
                raise DatasetConfigError(
                    f"the {name} split of --split {split} gets no documents out of {num_elements}; "
                    f"{n} {name} samples are needed. Use more data or give {name} a larger weight."
                )
            datasets.append(None)
            continue
        documents = np.arange(bounds[0], bounds[1], dtype=np.int32)
        if mock:
            datasets.append(MockGPTDataset(documents, n, config, tokenizer.vocab_size, name))
        else:
            datasets.append(GPTDataset(low_level, documents, n, config, name))
    return tuple(datasets)  # type: ignore[return-value]
