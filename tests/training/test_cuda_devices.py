"""On a CUDA machine: the same job on CPU and on the GPU gives the same losses, a checkpoint moves between
the two, and a step waits for the GPU once. Skipped where torch sees no CUDA device (CI, this project's
developer machines); benchmarks/gpu_check.sh runs them on a GPU machine in one call.

CPU runs hide the GPU with CUDA_VISIBLE_DEVICES="" (torch then detects CPU). Dropout uses
--dropout-impl hash so that both devices draw the same masks (native dropout draws each device's RNG).
"""
from __future__ import annotations

import importlib.util

import pytest


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch
    return torch.cuda.is_available()


pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not _cuda_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False here); "
                                  "run benchmarks/gpu_check.sh on a GPU machine")]

ITERS = 20
HIDE_GPU = {"CUDA_VISIBLE_DEVICES": ""}
DROPOUT = ["--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--dropout-impl", "hash"]


def _losses(run):
    assert run.returncode == 0, run.output[-3000:]
    return run.losses()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tk):
    base = tmp_path_factory.mktemp("cuda_runs")
    args = list(tk.tiny_gpt) + ["--mock-data"] + DROPOUT
    ckpt = {"cpu": base / "ckpt_cpu", "cuda": base / "ckpt_cuda"}
    env = {"cpu": HIDE_GPU, "cuda": {}}
    out = {}
    for device in ("cpu", "cuda"):
        out[device] = tk.run_training(base / device, args + ["--save", str(ckpt[device]), "--save-interval", "10"],
                                      nproc=None, env_extra=env[device])
    for saved, resumed in (("cuda", "cpu"), ("cpu", "cuda")):
        out[f"{saved}->{resumed}"] = tk.run_training(
            base / f"{saved}_to_{resumed}", args + ["--load", str(ckpt[saved]), "--ckpt-step", "10"],
            nproc=None, env_extra=env[resumed])
    return out


def test_the_gpu_run_really_ran_on_the_gpu(runs):
    assert "on cuda" in runs["cuda"].output and "on cuda:0" in runs["cuda"].output
    assert "on cpu" in runs["cpu"].output


def test_cpu_and_gpu_losses_agree_over_20_iterations(runs):
    cpu, gpu = _losses(runs["cpu"]), _losses(runs["cuda"])
    diff = max(abs(cpu[i] - gpu[i]) for i in range(1, ITERS + 1))
    print(f"max |cpu - cuda| lm loss over {ITERS} iterations (fp32, hash dropout 0.1): {diff:.2e}")
    assert diff <= 1e-4


@pytest.mark.parametrize("saved, resumed", [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_resumes_on_the_other_device(runs, saved, resumed):
    uninterrupted, after = _losses(runs[resumed]), _losses(runs[f"{saved}->{resumed}"])
    assert sorted(after) == list(range(11, ITERS + 1))
    diff = max(abs(after[i] - uninterrupted[i]) for i in after)
    print(f"max |{saved} checkpoint resumed on {resumed} - uninterrupted {resumed}|: {diff:.2e}")
    assert diff <= 1e-4


def test_a_train_step_synchronises_with_the_gpu_once(monkeypatch):
    """torch's sync debug mode raises on any synchronising call; the one read-back is counted instead."""
    import torch

    from mmrun.backend.torch import optim, train_step
    from mmrun.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128, seq_length=32,
                          max_position_embeddings=32)).cuda()
    opt = optim.AdamW(model.named_parameters(), lr=1e-3)
    assert opt.fused  # CUDA: torch's fused AdamW
    step = train_step.TrainStep(model, opt, clip_grad=1.0)
    tokens = torch.randint(0, 128, (4, 32), device="cuda")
    batch = [(tokens, None, tokens, torch.ones(4, 32, device="cuda"))]
    loss_fn = lambda m, t, _p, labels, mask: m(t, labels=labels, loss_mask=mask)  # noqa: E731
    step.loss_fn = loss_fn
    step(batch)  # warm-up (first-call allocations may synchronise)
    reads = []
    monkeypatch.setattr(train_step, "_read_back", lambda loss, norm: reads.append(1) or (0.0, 0.0))
    step.world_size = 1
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(batch)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert reads == [1]


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16", "float16"])
def test_the_triton_hash_dropout_matches_the_cpu_masks(dtype_name):
    """The fused kernel on the GPU draws the CPU's (and MindSpore's) masks bit for bit, forward and backward,
    and keeps nothing for backward. Its speed against F.dropout is benchmarks/hash_dropout.py's (a ratio measured
    in one run), not an assert here."""
    import numpy as np
    import torch

    from mmrun.backend import dropout_hash
    from mmrun.backend.torch import kernels, ops, seeding

    if not kernels.has_fused_hash_dropout("cuda"):
        pytest.skip("Triton is not installed with this torch: the hash dropout runs eagerly on CUDA")
    dtype = getattr(torch, dtype_name)
    for shape in ((8, 1024, 768), (3, 1000, 7)):  # blocks that divide the size, and a bounds-masked last block
        x = torch.randn(*shape, device="cuda").to(dtype).requires_grad_()
        seeding.seed_everything(3)
        gpu = ops.dropout(x, 0.1, True, "hash")
        assert gpu.grad_fn.saved_tensors == ()
        gpu.backward(torch.ones_like(gpu))
        seeding.seed_everything(3)
        cpu_x = x.detach().cpu().requires_grad_()
        cpu = ops.dropout(cpu_x, 0.1, True, "hash")
        cpu.backward(torch.ones_like(cpu))
        assert torch.equal(gpu.detach().cpu(), cpu.detach())
        assert torch.equal(x.grad.cpu(), cpu_x.grad)
        zero = (x == 0).cpu().numpy()
        assert np.array_equal((gpu != 0).cpu().numpy() | zero, dropout_hash.keep_mask(3, 0, shape, 0.1) | zero)
