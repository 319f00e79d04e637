"""--dropout-impl: which dropout runs where (backend/dropout_hash.py), the choices on both backends, and
the hash dropout's fused Triton kernel (checked on CPU with Triton's interpreter when Triton is installed)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import importlib.util

import numpy as np
import pytest

from mmrun.backend import dropout_hash
from mmrun.backend.errors import UsageError


@pytest.mark.parametrize("impl, device, expected", [
    ("auto", "cpu", "hash"), ("auto", "cuda", "native"), ("auto", "GPU", "native"), ("auto", "npu:3", "native"),
    ("auto", "Ascend", "native"), ("hash", "cuda", "hash"), ("native", "cpu", "native"), ("hash", "npu", "hash"),
])
def test_auto_is_the_hash_on_cpu_and_native_on_accelerators(impl, device, expected):
    assert dropout_hash.resolve_impl(impl, device) == expected


def test_an_unknown_impl_is_one_clear_error():
    with pytest.raises(UsageError, match=r"dropout implementation must be one of auto, hash, native. Received: 'fast'"):
        dropout_hash.resolve_impl("fast", "cpu")
    assert dropout_hash.native_impls("cpu") == ("native",)
    assert dropout_hash.native_impls("cuda") == ("auto", "native")


def _backend(request, framework):
    """One framework's backend only (the GPU check machine has no MindSpore)."""
    return request.getfixturevalue("bt" if framework == "pytorch" else "bm")


def _on_cpu(be, array):
    """A CPU tensor on either framework (MindSpore runs on CPU in these tests)."""
    if be.__name__.endswith("torch"):
        import torch
        return torch.from_numpy(array)
    return be.tensors.from_numpy(array)


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_hash_and_auto_on_cpu_draw_the_reference_mask(request, framework):
    be = _backend(request, framework)
    x = _on_cpu(be, np.ones((4, 257), dtype=np.float32))
    for impl in ("hash", "auto"):
        be.seeding.seed_everything(21)
        out = be.tensors.to_numpy(be.ops.dropout(x, 0.3, True, impl))
        np.testing.assert_array_equal(out != 0, dropout_hash.keep_mask(21, 0, (4, 257), 0.3))


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_native_is_the_frameworks_own_dropout(request, framework):
    be = _backend(request, framework)
    x = be.tensors.from_numpy(np.ones((64, 256), dtype=np.float32))
    be.seeding.seed_everything(3)
    state = be.seeding.get_rng_state()["dropout"]
    out = be.tensors.to_numpy(be.ops.dropout(x, 0.25, True, "native"))
    assert set(np.unique(out)) <= {0.0, np.float32(1.0) / np.float32(0.75)}
    assert 0.2 < float((out == 0).mean()) < 0.3
    assert not np.array_equal(out != 0, dropout_hash.keep_mask(3, 0, (64, 256), 0.25))
    assert be.seeding.get_rng_state()["dropout"] == state  # the hash generator did not move


def test_torch_native_equals_f_dropout_for_the_same_torch_seed(bt):
    import torch
    import torch.nn.functional as F

    x = torch.randn(8, 33)
    torch.manual_seed(9)
    ours = bt.ops.dropout(x, 0.4, True, "native")
    torch.manual_seed(9)
    assert torch.equal(ours, F.dropout(x, 0.4, True))


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_a_bad_impl_fails_when_the_layer_is_built(request, framework):
    with pytest.raises(UsageError, match="Received: 'philox'"):
        _backend(request, framework).nn.Dropout(0.1, "philox")


def test_gpt_config_refuses_a_bad_impl():
    from mmrun.models.gpt import GPTConfig

    with pytest.raises(ValueError, match="dropout_impl must be auto, hash or native. Received: 'x'"):
        GPTConfig(dropout_impl="x")


TRITON_CHECK = textwrap.dedent("""\
    import os
    os.environ["TRITON_INTERPRET"] = "1"   # Triton's interpreter: the kernel on CPU tensors, through numpy
    import numpy as np, torch
    from mmrun.backend import dropout_hash
    from mmrun.backend.torch import kernels, ops, seeding
    # (3, 1000, 7): the bounds-masked last block; (2, 4096): blocks that divide the size (unmasked loads)
    for dtype, p, shape in [(d, p, s) for d in (torch.float32, torch.float16) for p in (0.1, 0.6, 0.999)
                            for s in ((3, 1000, 7), (2, 4096))]:
        x = torch.randn(*shape).to(dtype).requires_grad_()
        seeding.seed_everything(5)
        fused = ops.dropout(x, p, True, "hash")          # the Triton kernel (interpreted)
        assert fused.grad_fn.saved_tensors == ()          # backward redraws the mask from the key: nothing kept
        fused.backward(torch.ones_like(fused))
        fused_grad, x.grad = x.grad.clone(), None
        seeding.seed_everything(5)
        os.environ["TRITON_INTERPRET"] = "0"              # not CUDA, not interpreted: the eager hash
        eager = ops.dropout(x, p, True, "hash")
        eager.backward(torch.ones_like(eager))
        os.environ["TRITON_INTERPRET"] = "1"
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        assert torch.equal(fused.detach().view(bits), eager.detach().view(bits)), (dtype, p, shape)
        assert torch.equal(fused_grad, x.grad), (dtype, p, shape)
        assert np.array_equal((fused != 0).numpy(), dropout_hash.keep_mask(5, 0, x.shape, p)), (dtype, p, shape)
    assert not kernels._kernel_failed
    print("triton kernel ok")
    """)


def test_the_triton_hash_dropout_kernel_is_bit_identical_to_the_eager_hash():
    """fp32 and fp16 (Triton's interpreter mishandles bf16 loads even in a copy kernel: bf16 is checked on a GPU)."""
    # The dev extra pins Triton, so a missing one is a broken install, not a reason to skip.
    assert importlib.util.find_spec("triton") is not None, 'Triton is missing: pip install -e ".[dev]"'
    proc = subprocess.run([sys.executable, "-c", TRITON_CHECK], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0 and "triton kernel ok" in proc.stdout, proc.stderr[-3000:]
