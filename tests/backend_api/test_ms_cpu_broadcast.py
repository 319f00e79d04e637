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
