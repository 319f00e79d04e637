"""megatron-core as the PyTorch engine: every layout trains the same network to the same losses.

Real jobs through `mmrun` (torchrun, gloo, CPU): mmrun's own GPT on one process, megatron-core's GPTModel
on one process, and megatron-core with tensor (2), pipeline (2), tensor x pipeline (2 x 2, 4 processes),
data parallelism with the distributed optimizer (2), virtual pipeline stages (2 x 2), sequence parallelism
(TP 2) and context parallelism (2). fp32, dropout 0, the same --seed: megatron-core's GPTModel starts from
mmrun's GPT weights, converted (models/gpt_names.py), so per-iteration losses, gradient norms and
validation losses agree within 1e-5 (floating-point summation order is all that differs).
"""
from __future__ import annotations

import pytest

TOLERANCE = 1e-5
PARALLEL = ["tp2", "pp2", "tp2pp2", "dp2-distopt", "dp2-distopt-overlap", "mcore-recompute", "pp2-vpp2", "tp2-sp", "cp2"]


def _assert_same_training(run, reference, tolerance=TOLERANCE):
    losses, expected = run.losses(), reference.losses()
    assert sorted(losses) == sorted(expected) == list(range(1, 9))
    worst = max(abs(losses[i] - expected[i]) for i in expected)
    valid = max(abs(a - b) for a, b in zip(run.evals("valid"), reference.evals("valid")))
    print(f"\n  largest difference: train loss {worst:.1e}, validation loss {valid:.1e}", end="")  # docs/parallelism.md
    assert worst < tolerance, {i: (losses[i], expected[i]) for i in expected}
    norms = {m["iteration"]: m["grad_norm"] for m in run.metrics if m["kind"] == "train"}
    expected_norms = {m["iteration"]: m["grad_norm"] for m in reference.metrics if m["kind"] == "train"}
    assert max(abs(norms[i] - expected_norms[i]) for i in expected_norms) < 10 * tolerance
    for kind in ("valid", "test"):
        assert len(run.evals(kind)) == len(reference.evals(kind)) > 0
        assert max(abs(a - b) for a, b in zip(run.evals(kind), reference.evals(kind))) < tolerance


@pytest.mark.slow
def test_megatron_cores_gptmodel_trains_like_mmruns_gpt(mcore_runs):
    _assert_same_training(mcore_runs("mcore"), mcore_runs("mmrun-gpt"))


@pytest.mark.slow
@pytest.mark.parametrize("name", PARALLEL)
def test_each_parallel_layout_matches_one_process(mcore_runs, name):
    run = mcore_runs(name)
    _assert_same_training(run, mcore_runs("mcore"))  # megatron-core, TP = PP = 1
    _assert_same_training(run, mcore_runs("mmrun-gpt"))  # mmrun's own GPT with the same (converted) weights


@pytest.mark.slow
def test_the_log_names_the_engine_and_the_layout(mcore_runs):
    out = mcore_runs("tp2pp2").output
    assert "engine megatron-core" in out and "data-parallel 1, tensor-parallel 2, pipeline-parallel 2" in out
    assert "megatron-core 0.16" in out and "CPU shims installed" in out
    summary = [m for m in mcore_runs("tp2pp2").metrics if m["kind"] == "summary"][0]
    assert summary["engine"] == "megatron-core" and summary["parallel"]["tp"] == summary["parallel"]["pp"] == 2
    plain = mcore_runs("mmrun-gpt").output
    assert "engine mmrun" in plain and "CPU shims" not in plain  # megatron-core is not even imported there


@pytest.mark.slow
def test_the_distributed_optimizer_says_it_shards(mcore_runs):
    assert "distributed optimizer: AdamW state and fp32 gradients sharded over 2 data-parallel rank(s)" in \
        mcore_runs("dp2-distopt").output
