"""Megatron's f/g regions (backend/mindspore/parallel/mappings.py) on 2 ranks under msrun: every forward and
backward exactly equals what numpy computes from both ranks' inputs, in PyNative and under mindspore.jit,
including the all-gather and reduce-scatter that CPU builds from all-reduce. And the reason they exist: a raw
AllReduce in the forward doubles the gradient on 2 ranks."""
from __future__ import annotations

import pytest

REGIONS = ("copy_to_tensor_parallel", "reduce_from_tensor_parallel", "scatter_to_tensor_parallel",
           "gather_from_tensor_parallel", "scatter_to_sequence_parallel", "gather_from_sequence_parallel",
           "reduce_scatter_to_sequence_parallel")


@pytest.mark.slow
def test_regions_forward_and_backward_are_exact(tmp_path, jobs):
    results = jobs.msrun("regions.py", 2, [], tmp_path / "regions")
    assert sorted(results) == [0, 1]
    for rank, ranked in results.items():
        errors = ranked.result
        for region in REGIONS:
            for mode in ("pynative", "jit"):
                assert errors[f"{region}/{mode}"] == [0.0, 0.0], (rank, region, mode)
        assert errors["raw_all_reduce_grad_over_upstream"] == 2.0
