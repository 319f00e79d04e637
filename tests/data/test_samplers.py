"""Data-parallel slicing: every DP size reads the same global batches in the same order; resume."""
from __future__ import annotations

from itertools import islice

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mmrun.data.gpt_dataset import DatasetConfigError, build_train_valid_test_datasets
from mmrun.data.samplers import MegatronPretrainingSampler, build_pretraining_data_loader, collate
from mmrun.data.tokenizers import NullTokenizer

TOK = NullTokenizer(1000)


def _global_batches(total, gbs, mbs, dp, consumed=0):
    """Per global batch: the sample ids in (micro-step, rank) order, gathered from every rank."""
    per_rank = [list(MegatronPretrainingSampler(total, consumed, mbs, r, dp)) for r in range(dp)]
    steps = gbs // (mbs * dp)
    batches = []
    for k in range(len(per_rank[0]) // steps):
        batches.append([i for m in range(k * steps, (k + 1) * steps) for r in range(dp) for i in per_rank[r][m]])
    return batches


@settings(max_examples=60, deadline=None)
@given(mbs=st.integers(1, 4), dp=st.sampled_from([1, 2, 4]), accum=st.integers(1, 3), extra=st.integers(0, 30),
       resume_batches=st.integers(0, 3))
def test_union_of_rank_slices_is_the_dp1_global_batch_in_order(mbs, dp, accum, extra, resume_batches):
    gbs = mbs * dp * accum
    total = 5 * gbs + extra
    consumed = resume_batches * gbs
    expected = [list(range(k * gbs, (k + 1) * gbs)) for k in range(resume_batches, total // gbs)]
    assert _global_batches(total, gbs, mbs, dp, consumed) == expected
    assert _global_batches(total, gbs, gbs // accum, 1, consumed) == expected  # DP=1, same global batch


def test_dp_loaders_give_the_dp1_batch_tokens():
    train = build_train_valid_test_datasets(None, "1,1,1", 128, 3, (48, 0, 0), tokenizer=TOK, mock=True)[0]
    # (a mock split holds millions of samples: read only the first few micro-batches)
    dp1 = list(islice(build_pretraining_data_loader(train, 0, micro_batch_size=4), 3))
    ranks = [list(islice(build_pretraining_data_loader(train, 0, 2, data_parallel_rank=r, data_parallel_size=2), 3))
             for r in range(2)]
    assert dp1[0]["tokens"].shape == (4, 128) and dp1[0]["tokens"].dtype == np.int64
    assert dp1[0]["loss_mask"].dtype == np.float32
    for step in range(3):
        joined = np.concatenate([ranks[0][step]["tokens"], ranks[1][step]["tokens"]])
        np.testing.assert_array_equal(joined, dp1[step]["tokens"])


def test_resume_from_consumed_samples_continues_the_same_stream():
    train = build_train_valid_test_datasets(None, "1,1,1", 128, 3, (64, 0, 0), tokenizer=TOK, mock=True)[0]
    full = [b["tokens"] for b in islice(build_pretraining_data_loader(train, 0, 4, 1, 2), 8)]
    resumed = [b["tokens"] for b in islice(build_pretraining_data_loader(train, 24, 4, 1, 2), 5)]
    for a, b in zip(full[3:], resumed, strict=True):
        np.testing.assert_array_equal(a, b)


def test_last_partial_group_is_dropped_unless_asked():
    assert list(MegatronPretrainingSampler(10, 0, 2, 1, 2)) == [[2, 3], [6, 7]]
    assert list(MegatronPretrainingSampler(10, 0, 2, 1, 2, drop_last=False)) == [[2, 3], [6, 7]]
    assert list(MegatronPretrainingSampler(11, 0, 2, 0, 2, drop_last=False)) == [[0, 1], [4, 5], [8, 9]]
    assert list(MegatronPretrainingSampler(11, 0, 2, 1, 2, drop_last=False)) == [[2, 3], [6, 7], [10]]


@pytest.mark.parametrize(
    "args, message",
    [
        ((0, 0, 1, 0, 1), "no samples to consume"),
        ((10, 10, 1, 0, 1), "consumed_samples=10 leaves nothing of the 10 samples"),
        ((10, 0, 0, 0, 1), "--micro-batch-size must be positive"),
        ((10, 0, 1, 2, 2), "data-parallel rank 2 is outside a data-parallel size of 2"),
    ],
)
def test_sampler_errors(args, message):
    with pytest.raises(DatasetConfigError, match=message):
        MegatronPretrainingSampler(*args)


def test_collate_stacks_and_loader_of_none_is_none():
    batch = collate([{"a": np.arange(3)}, {"a": np.arange(3) + 1}])
    assert batch["a"].shape == (2, 3)
    assert build_pretraining_data_loader(None, 0, 2) is None
