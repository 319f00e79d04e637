"""Dropout under tensor and pipeline parallelism (MindSpore only: megatron-core draws other masks). With
--dropout-impl hash every split draws the masks one process draws for the whole model (ShardedDropout for
tensors split over TP, the dropout generator placed per micro-batch for pipeline stages), so TP=2 and PP=2 train
exactly as one process does; for PP this also proves the recomputed forward of the backward drew the same
masks as the forward (else its gradients would differ)."""
from __future__ import annotations

import numpy as np
import pytest

# PyNative (--jit off): the masks are the same math either way, the compiled split engine with dropout trains and
# resumes bit-exact in tests/training/test_mindspore_parallel_e2e.py (tp2-dropout), and here it saved ~25 s of compile.
ARGS = ["--dropout", "0.1", "--iters", "4", "--micro-batches", "3", "--jit", "off"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, jobs_module):
    return jobs_module.msrun("ms_engine.py", 1, ARGS, tmp_path_factory.mktemp("dropout") / "one")[0].result


@pytest.mark.slow
@pytest.mark.parametrize("split", [["--pp", "2"], ["--tp", "2", "--sequence-parallel"]], ids=["pp2", "tp2-sp"])
def test_split_model_draws_one_processs_masks(tmp_path, jobs, one_process, split):
    ranks = jobs.msrun("ms_engine.py", 2, [*split, *ARGS], tmp_path / "split")
    for ranked in ranks.values():
        np.testing.assert_allclose(ranked.result["losses"], one_process["losses"], rtol=0, atol=2e-6)
        np.testing.assert_allclose(ranked.result["grad_norms"], one_process["grad_norms"], rtol=2e-6)
        # dropout really changed the loss: the same first step in eval mode (no masks) gives another one
        assert abs(ranked.result["losses"][0] - ranked.result["eval_loss"]) > 1e-4
        assert abs(ranked.result["eval_loss"] - one_process["eval_loss"]) < 2e-6
