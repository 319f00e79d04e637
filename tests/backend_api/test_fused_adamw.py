"""AdamW(fused=...) on both backends: the fused kernels against torch's reference order, the per-device
default, and a state that survives save/load whichever kernel wrote it."""
from __future__ import annotations

import numpy as np
import pytest


def _run(be, fused, steps=5, state=None):
    rng = np.random.default_rng(0)
    params = [be.nn.Parameter(be.tensors.from_numpy(rng.standard_normal((8, 4)).astype(np.float32))),
              be.nn.Parameter(be.tensors.from_numpy(rng.standard_normal((4,)).astype(np.float32)))]
    opt = be.optim.AdamW([("w", params[0]), ("b", params[1])], lr=1e-2, weight_decay=0.1, fused=fused,
                         no_decay=be.optim.megatron_no_decay)
    if state is not None:
        opt.load_state_dict(state)
    for i in range(steps):
        grads = [be.tensors.from_numpy(np.random.default_rng(10 + i).standard_normal(tuple(p.shape)).astype(np.float32))
                 for p in params]
        opt.step(grads)
    return [be.tensors.to_numpy(p) for p in params], opt


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_fused_and_reference_order_agree(backends, framework):
    be = backends[framework]
    fused, opt = _run(be, True)
    reference, _ = _run(be, False)
    assert opt.fused
    diff = max(float(np.abs(a - b).max()) for a, b in zip(fused, reference))
    print(f"{framework}: fused vs torch-order AdamW after 5 steps: {diff:.2e}")
    assert diff <= 1e-6


def test_torch_default_is_the_reference_on_cpu_and_fused_on_accelerators(bt):
    _, opt = _run(bt, None, steps=1)
    assert opt.fused == (bt.device.default_device().type in ("cuda", "npu"))


def test_torch_cpu_default_is_bitwise_torch_single_tensor_adamw(bt):
    """The multi-tensor AdamW mmrun picks on CPU changes no bit against torch.optim.AdamW's own CPU default (the
    single-tensor loop diffusers' training scripts get), decay and no-decay groups alike."""
    import torch

    if bt.device.default_device().type != "cpu":
        pytest.skip("the CPU kernels")
    ours, opt = _run(bt, None)
    rng = np.random.default_rng(0)
    params = [torch.nn.Parameter(torch.from_numpy(rng.standard_normal(s).astype(np.float32))) for s in ((8, 4), (4,))]
    reference = torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}], lr=1e-2,
                                  weight_decay=0.1, foreach=False)
    for i in range(5):
        for p in params:
            p.grad = torch.from_numpy(np.random.default_rng(10 + i).standard_normal(tuple(p.shape)).astype(np.float32))
        reference.step()
    assert not opt.fused and all(np.array_equal(a, p.detach().numpy()) for a, p in zip(ours, params))


def test_mindspore_default_is_the_fused_kernel(bm):
    _, opt = _run(bm, None, steps=1)
    assert opt.fused


@pytest.mark.parametrize("saved_fused, loaded_fused", [(True, False), (False, True)])
def test_a_state_moves_between_kernels(bt, saved_fused, loaded_fused):
    _, opt = _run(bt, saved_fused, steps=3)
    state = {**opt.state_dict(), "tensors": bt.tensors.state_dict_to_numpy(opt.state_dict()["tensors"])}
    # The state holds the step count and the moments (the weights start fresh in both runs below): the other
    # kernel continues from it as the saving kernel does.
    other_kernel, resumed = _run(bt, loaded_fused, steps=2, state=state)
    same_kernel, _ = _run(bt, saved_fused, steps=2, state=state)
    assert resumed.step_count == 5
    assert max(float(np.abs(a - b).max()) for a, b in zip(other_kernel, same_kernel)) <= 1e-6
