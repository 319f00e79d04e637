"""MindSpore on a CPU: `masked_fill` and softmax's backward hand MindSpore's kernels operands of one shape, so no
compiled CPU kernel keeps broadcast index arrays (16 bytes an output element) for the whole run
(docs/memory-and-speed.md, "Where the compiled step's memory went"). Values and gradients stay bit-identical to
MindSpore's own ops, compiled and PyNative."""
from __future__ import annotations

import numpy as np
import pytest

RNG = np.random.default_rng(7)


def test_masked_fill_gives_mindspore_a_mask_of_xs_shape_and_the_same_values(bm, monkeypatch):
    import mindspore as ms

    real = ms.ops.masked_fill
    x = ms.Tensor(RNG.standard_normal((2, 3, 5, 5)).astype(np.float32))
    mask = bm.ops.causal_mask(5)
    expected = real(x, mask, float("-inf")).asnumpy()  # MindSpore broadcasting the (5, 5) mask itself
    seen = []
    monkeypatch.setattr(ms.ops, "masked_fill", lambda t, m, v: (seen.append(tuple(m.shape)), real(t, m, v))[1])
    np.testing.assert_array_equal(bm.ops.masked_fill(x, mask, float("-inf")).asnumpy(), expected)
    assert seen == [(2, 3, 5, 5)]


@pytest.mark.parametrize("dim", [-1, 1])
def test_softmax_gradient_is_mindspores_bit_for_bit_compiled_and_pynative(bm, dim):
    import mindspore as ms
    from mindspore import mint

    assert bm.ops._CPU_SOFTMAX, "the CPU softmax with the same-shape backward is not in use"
    x = ms.Tensor(RNG.standard_normal((2, 3, 5, 7)).astype(np.float32))
    w = ms.Tensor(RNG.standard_normal((2, 3, 5, 7)).astype(np.float32))

    def ours(t):
        return mint.sum(bm.ops.softmax(t, dim=dim) * w)

    def theirs(t):
        return mint.sum(mint.nn.functional.softmax(t, dim=dim) * w)

    for wrap in (lambda f: f, ms.jit):
        got, want = wrap(ms.grad(ours))(x).asnumpy(), wrap(ms.grad(theirs))(x).asnumpy()
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(bm.ops.softmax(x, dim=dim).asnumpy(), mint.nn.functional.softmax(x, dim=dim).asnumpy())


def _rms_norm(bm, t, w, cos, sin, mask):
    return bm.ops.rms_norm(t, w, 1e-6)


def _rotary_mul(bm, t, w, cos, sin, mask):
    return bm.ops.rotary_mul(t, cos * w[0], sin)


def _masked_fill(bm, t, w, cos, sin, mask):
    return bm.ops.masked_fill(t * w, mask, 0.0)


@pytest.mark.parametrize("op", [_rms_norm, _rotary_mul, _masked_fill])
def test_same_shape_operands_change_no_bit_of_values_or_gradients(bm, monkeypatch, op):
    """Against the same op with MindSpore broadcasting (MMRUN_MS_CPU_BROADCAST=1's path), compiled."""
    import mindspore as ms
    from mindspore import mint

    x = ms.Tensor(RNG.standard_normal((2, 3, 6, 8)).astype(np.float32))
    weight, cos, sin = (ms.Tensor(RNG.standard_normal(s).astype(np.float32)) for s in [(8,), (6, 8), (6, 8)])
    mask = ms.Tensor(RNG.standard_normal((6, 8)) > 0)

    def loss(t, w):
        y = op(bm, t, w, cos, sin, mask)
        return mint.sum(y * y)

    def measure():
        value, grads = ms.jit(ms.value_and_grad(loss, (0, 1)))(x, weight)
        return [value.asnumpy()] + [g.asnumpy() for g in grads]

    assert bm.ops._SAME_SHAPE_OPERANDS
    ours = measure()
    monkeypatch.setattr(bm.ops, "_SAME_SHAPE_OPERANDS", False)
    for got, want in zip(ours, measure()):
        np.testing.assert_array_equal(got, want)


def _gelu(bm, t):
    return bm.ops.gelu(t)


TARGET = np.array([3, -100, 0, 7, 7, 1], np.int64)


def _cross_entropy(bm, t):
    return bm.ops.cross_entropy(bm.ops.reshape(t, (6, 8)), bm.tensors.from_numpy(TARGET), ignore_index=-100)


@pytest.mark.parametrize("op", [_gelu, _cross_entropy])
def test_div_and_log_softmax_free_ops_match_mindspores_own_within_an_ulp(bm, monkeypatch, op):
    """gelu multiplies by 1/sqrt 2 instead of dividing, cross_entropy takes the LogSoftmax primitive (its own
    backward, not logsumexp's through the max): values within 1e-6 and gradients within 1e-5 of ops.gelu and
    ops.cross_entropy (MMRUN_MS_CPU_BROADCAST=1's path), compiled."""
    import mindspore as ms
    from mindspore import mint

    x = ms.Tensor(RNG.standard_normal((2, 3, 8)).astype(np.float32) * 3)

    def loss(t):
        y = op(bm, t)
        return mint.sum(y * y)

    def measure():
        value, grad = ms.jit(ms.value_and_grad(loss))(x)
        return value.asnumpy(), grad.asnumpy()

    ours = measure()
    monkeypatch.setattr(bm.ops, "_SAME_SHAPE_OPERANDS", False)
    theirs = measure()
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-6)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5, atol=1e-7)
    assert np.abs(ours[1]).max() > 0.01


def test_attention_with_batchmatmul_flags_matches_matmul_and_transpose(bm, monkeypatch):
    """The CPU attention's BatchMatMul(transpose_b) and BatchMatMul, whose backward transposes nothing, against
    mint.matmul with explicit transposes (MMRUN_MS_CPU_BROADCAST=1's path), compiled: values and gradients."""
    import mindspore as ms
    from mindspore import mint

    q, k, v = (ms.Tensor(RNG.standard_normal((2, 3, 6, 4)).astype(np.float32)) for _ in range(3))

    def loss(a, b, c):
        y = bm.ops.scaled_dot_product_attention(a, b, c, causal=True)
        return mint.sum(y * y)

    def measure():
        value, grads = ms.jit(ms.value_and_grad(loss, (0, 1, 2)))(q, k, v)
        return [value.asnumpy()] + [g.asnumpy() for g in grads]

    ours = measure()
    monkeypatch.setattr(bm.ops, "_SAME_SHAPE_OPERANDS", False)
    for got, want in zip(ours, measure()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
