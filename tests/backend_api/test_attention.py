"""ops.scaled_dot_product_attention: the fused kernel against the explicit path, and both frameworks.

On CPU torch's fused path is F.scaled_dot_product_attention and MindSpore's is the explicit one
(flash_attention_score has no CPU kernel); on Ascend/CUDA the same tests compare the device kernels.
"""
from __future__ import annotations

import numpy as np
import pytest

RNG = np.random.default_rng(7)
SHAPE = (2, 3, 16, 8)  # batch, heads, seq, head_dim


def _qkv():
    return [RNG.standard_normal(SHAPE).astype(np.float32) for _ in range(3)]


def _torch_run(bt, fn, arrays):
    ts = [bt.tensors.from_numpy(a).requires_grad_(True) for a in arrays]
    out = fn(*ts)
    weights = bt.tensors.from_numpy(np.random.default_rng(3).standard_normal(tuple(out.shape)).astype(np.float32))
    (out * weights).sum().backward()
    return bt.tensors.to_numpy(out), [bt.tensors.to_numpy(t.grad) for t in ts]


def _ms_run(bm, fn, arrays):
    import mindspore as ms

    ts = [bm.tensors.from_numpy(a) for a in arrays]
    out = fn(*ts)
    weights = bm.tensors.from_numpy(np.random.default_rng(3).standard_normal(tuple(out.shape)).astype(np.float32))
    grads = ms.grad(lambda *x: bm.ops.sum(fn(*x) * weights), (0, 1, 2))(*ts)
    return bm.tensors.to_numpy(out), [bm.tensors.to_numpy(g) for g in grads]


def _max_diff(a, b):
    out = float(np.abs(a[0] - b[0]).max())
    return max([out] + [float(np.abs(x - y).max()) for x, y in zip(a[1], b[1])])


@pytest.mark.parametrize("causal", [True, False])
def test_torch_fused_attention_equals_the_explicit_path(bt, causal):
    arrays = _qkv()
    fused = _torch_run(bt, lambda q, k, v: bt.ops.scaled_dot_product_attention(q, k, v, causal=causal), arrays)
    explicit = _torch_run(bt, lambda q, k, v: bt.ops._explicit_attention(q, k, v, causal, 0.0, 8 ** -0.5, "auto"),
                          arrays)
    diff = _max_diff(fused, explicit)
    print(f"torch fused vs explicit attention (causal={causal}), forward and grads: {diff:.2e}")
    # On the CPU torch's SDPA sums in the explicit path's order; a GPU's fused float32 kernels tile the
    # reductions (an H200, torch 2.11: 1.58e-06 causal, 7.9e-07 not).
    from mmrun import backend
    assert diff <= (1e-6 if backend.current().device_kind == "cpu" else 5e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_torch_and_mindspore_attention_agree(bt, bm, causal):
    arrays = _qkv()
    pt = _torch_run(bt, lambda q, k, v: bt.ops.scaled_dot_product_attention(q, k, v, causal=causal), arrays)
    ms = _ms_run(bm, lambda q, k, v: bm.ops.scaled_dot_product_attention(q, k, v, causal=causal), arrays)
    diff = _max_diff(pt, ms)
    print(f"torch vs mindspore attention (causal={causal}): {diff:.2e}")
    assert diff <= 5e-6  # two frameworks' float32 reductions (values and gradients of order 1)


def _ms_run_seeded(bm, fn, arrays, seed):
    """_ms_run with the dropout generator re-seeded before the forward and before the gradient pass, so
    both use the first mask (ms.grad runs the function again)."""
    import mindspore as ms

    ts = [bm.tensors.from_numpy(a) for a in arrays]
    bm.seeding.seed_everything(seed)
    out = fn(*ts)
    weights = bm.tensors.from_numpy(np.random.default_rng(3).standard_normal(tuple(out.shape)).astype(np.float32))
    bm.seeding.seed_everything(seed)
    grads = ms.grad(lambda *x: bm.ops.sum(fn(*x) * weights), (0, 1, 2))(*ts)
    return bm.tensors.to_numpy(out), [bm.tensors.to_numpy(g) for g in grads]


def test_hash_attention_dropout_draws_the_same_masks_on_both_frameworks(bt, bm):
    arrays = _qkv()
    bt.seeding.seed_everything(11)
    pt = _torch_run(bt, lambda q, k, v: bt.ops.scaled_dot_product_attention(
        q, k, v, causal=True, dropout_p=0.25, dropout_impl="hash"), arrays)
    ms = _ms_run_seeded(bm, lambda q, k, v: bm.ops.scaled_dot_product_attention(
        q, k, v, causal=True, dropout_p=0.25, dropout_impl="hash"), arrays, 11)
    no_dropout = _torch_run(bt, lambda q, k, v: bt.ops.scaled_dot_product_attention(q, k, v, causal=True), arrays)
    diff = _max_diff(pt, ms)
    print(f"torch vs mindspore attention with hash dropout 0.25: {diff:.2e}")
    assert diff <= 5e-6
    assert float(np.abs(pt[0] - no_dropout[0]).max()) > 1e-2  # dropout was on


def test_native_attention_dropout_is_torchs_own(bt):
    """native: F.scaled_dot_product_attention's dropout, drawn from torch's generator (reproducible by seed)."""
    import torch
    import torch.nn.functional as F

    q, k, v = (bt.tensors.from_numpy(a) for a in _qkv())
    torch.manual_seed(5)
    ours = bt.ops.scaled_dot_product_attention(q, k, v, causal=True, dropout_p=0.3, dropout_impl="native")
    torch.manual_seed(5)
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.3)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert not torch.allclose(ours, bt.ops.scaled_dot_product_attention(q, k, v, causal=True))


def test_bad_dropout_probability_is_refused_on_both(bt, bm):
    for be in (bt, bm):
        q = be.tensors.from_numpy(_qkv()[0])
        with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1, but got 1.5"):
            be.ops.scaled_dot_product_attention(q, q, q, dropout_p=1.5)
