"""PyTorch vs MindSpore in one process: the measurements of scripts/parity_report.py, with their limits."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def setup(parity):
    return parity.initial_state(), parity.make_batches(40)


def test_forward_loss_and_gradients_match(parity, setup):
    state, batches = setup
    result = parity.forward_backward(state, batches[0])
    assert result["loss_diff"] <= parity.THRESHOLDS["forward_loss"]
    assert result["max_grad_diff"] <= parity.THRESHOLDS["max_grad"]
    assert result["max_grad"] > 1e-3  # gradients are not trivially zero
    assert len(result["grad_diffs"]) == 28  # every parameter compared


@pytest.mark.slow
def test_twenty_adamw_steps_with_clipping_and_warmup_match(parity, setup):
    state, batches = setup
    torch_run = parity.train("pytorch", state, batches, 20)
    ms_run = parity.train("mindspore", state, batches, 20, jit=True)
    ms_run["initial"] = state
    row = parity.compare_training(torch_run, ms_run)
    assert row["max_step_loss_diff"] <= parity.THRESHOLDS["step_loss"]
    assert row["lr_equal"] and torch_run["lrs"][0] == 0.0 and max(torch_run["lrs"]) == pytest.approx(1e-3)
    assert min(torch_run["grad_norms"]) > parity.CLIP_GRAD  # clipping was active on every step
    assert row["final_param_diff"] <= 1e-4 < row["max_param_change"]
    assert torch_run["losses"][-1] < torch_run["losses"][0] - 0.1  # it learned something


@pytest.mark.slow
def test_pynative_and_jit_steps_are_identical(parity, setup):
    state, batches = setup
    pynative = parity.train("mindspore", state, batches, 3, jit=False)
    compiled = parity.train("mindspore", state, batches, 3, jit=True)
    np.testing.assert_allclose(compiled["losses"], pynative["losses"], rtol=0, atol=1e-6)
    for name, value in pynative["state"].items():
        np.testing.assert_allclose(compiled["state"][name], value, rtol=0, atol=1e-7)


@pytest.mark.slow
def test_gradient_accumulation_over_micro_batches(parity, setup):
    state, _ = setup
    full = [(tokens, labels, np.ones_like(mask)) for tokens, labels, mask in parity.make_batches(3, seed=5)]
    halves = [tuple(a[i:i + 2] for a in batch) for batch in full for i in (0, 2)]
    whole = parity.train("pytorch", state, full, 3)
    torch_acc = parity.train("pytorch", state, halves, 3, micro_batches=2)
    # same tokens, unmasked: the mean over two half-batches is the full-batch mean
    np.testing.assert_allclose(torch_acc["losses"], whole["losses"], atol=1e-6)
    np.testing.assert_allclose(torch_acc["grad_norms"], whole["grad_norms"], rtol=1e-5)
    ms_acc = parity.train("mindspore", state, halves, 3, micro_batches=2, jit=True)
    np.testing.assert_allclose(ms_acc["losses"], torch_acc["losses"], atol=parity.THRESHOLDS["step_loss"])
    np.testing.assert_allclose(ms_acc["grad_norms"], torch_acc["grad_norms"], rtol=1e-5)


@pytest.mark.slow
def test_checkpoint_saved_on_one_framework_loads_on_the_other(parity, setup):
    state, batches = setup
    result = parity.checkpoint_roundtrip(state, batches[0])
    assert sorted(result) == ["mindspore->pytorch", "pytorch->mindspore"]
    for row in result.values():
        assert row["iteration"] == 3
        assert row["loss_diff"] <= parity.THRESHOLDS["forward_loss"]
        assert row["next_step_loss_diff"] <= parity.THRESHOLDS["forward_loss"]


# ------------------------------------------------------------------ dropout 0.1: the same masks on both

@pytest.fixture(scope="module")
def dropout_setup(parity):
    config = parity.GPT_DROPOUT_CONFIG
    return parity.initial_state(config=config), parity.make_batches(1, config=config)


def test_forward_loss_and_gradients_match_with_dropout(parity, dropout_setup):
    state, batches = dropout_setup
    result = parity.forward_backward(state, batches[0], config=parity.GPT_DROPOUT_CONFIG)
    assert result["loss_diff"] <= parity.THRESHOLDS["forward_loss"]
    assert result["max_grad_diff"] <= parity.THRESHOLDS["max_grad"]
    assert len(result["grad_diffs"]) == 28
    without = parity.forward_backward(state, batches[0])
    # the masks changed the numbers by far more than the limits: dropout was on, on both
    assert abs(result["loss_torch"] - without["loss_torch"]) > 10 * parity.THRESHOLDS["forward_loss"]
    assert abs(result["max_grad"] - without["max_grad"]) > 10 * parity.THRESHOLDS["max_grad"]


@pytest.mark.slow
def test_twenty_adamw_steps_match_with_dropout(parity):
    result = parity.dropout_parity(20, progress=lambda _: None)
    assert [row["label"] for row in result["training"]] == [label for label, _ in parity.DROPOUT_RUNS]
    for row in result["training"]:
        assert row["max_step_loss_diff"] <= parity.THRESHOLDS["step_loss"]
        assert row["lr_equal"]
        assert row["final_param_diff"] <= 1e-4 < row["max_param_change"]
        assert row["loss_last"] < row["loss_first"] - 0.1  # it learned something


def test_vit_patch_embedding_conv2d_matches(parity):
    result = parity.vit_patch_embedding()
    assert result["forward_diff"] <= 1e-5
    assert result["max_grad_diff"] <= 1e-6 * result["max_grad"]  # relative: conv grads sum many terms
