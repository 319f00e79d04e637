"""dtype names, numpy conversion and which matmul dtypes each device computes in."""
from __future__ import annotations

import numpy as np
import pytest

FRAMEWORKS = ["pytorch", "mindspore"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_numpy_roundtrip_and_dtype_names(backends, framework):
    t = backends[framework].tensors
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = t.from_numpy(a)
    a[0, 0] = 99  # from_numpy copies
    np.testing.assert_array_equal(t.to_numpy(x), np.arange(6).reshape(2, 3))
    for name in ("fp32", "float32", "fp16", "bf16", "bfloat16", "int64"):
        assert t.cast(x, name).dtype == t.dtype(name)
    # bf16 has no numpy dtype: to_numpy upcasts exactly to float32
    assert t.to_numpy(t.cast(x, "bf16")).dtype == np.float32
    np.testing.assert_array_equal(t.to_numpy(t.cast(x, "bf16")), np.arange(6).reshape(2, 3))
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        t.dtype("fp8")


def test_compute_dtype_table_knows_mindspore_cpu_has_no_bf16_matmul(bt, bm):
    assert bm.tensors.supports_compute_dtype("fp16", "cpu")
    assert not bm.tensors.supports_compute_dtype("bf16", "cpu")
    assert bm.tensors.supports_compute_dtype("bfloat16", "ascend")
    assert bt.tensors.supports_compute_dtype("bf16", "cpu")


@pytest.mark.parametrize("dtype", ["fp16"])
def test_half_precision_forward_runs_on_both(bt, bm, dtype):
    a = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    outs = [be.tensors.to_numpy(be.ops.matmul(be.tensors.from_numpy(a, dtype), be.tensors.from_numpy(a.T, dtype)))
            for be in (bt, bm)]
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-2, atol=1e-2)
