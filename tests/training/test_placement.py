"""Every tensor of a training step lives on the process's device: parameters, gradients, optimizer state,
batches, the RNG-free constants the model makes. On CPU in CI; the same test runs on CUDA (and NPU)
where present, where `default_device()` is the accelerator: a job that says "on cuda" and computes on the
CPU is the worst bug this product can have.

Runs the trainer's own phases in this process (initialize, setup_model_and_optimizer, the data iterators,
ForwardPlan and TrainStep) with the pytorch backend.
"""
from __future__ import annotations

import pytest

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3", "--train-iters", "2",
        "--mock-data", "--eval-iters", "0", "--ai-framework", "pytorch"]


def _tensors(obj):
    """Every tensor inside nested dicts/lists/tuples."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


@pytest.fixture(scope="module")
def stepped():
    """The trainer's objects after model_provider() and one step (2 micro-batches)."""
    import importlib

    from mmrun import backend
    from mmrun.models import pretrain_gpt
    from mmrun.training.arguments import parse_args
    from mmrun.engines.forward_plan import ForwardPlan

    pretrain = importlib.import_module("mmrun.training.pretrain")  # the package exports the function under this name
    args = parse_args(TINY + ["--hidden-dropout", "0.1", "--attention-dropout", "0.1"])
    job = pretrain.initialize(args)
    pretrain.setup_model_and_optimizer(job, pretrain_gpt.model_provider)
    train_iters, _, _ = pretrain.build_train_valid_test_data_iterators(job, pretrain_gpt.train_valid_test_datasets_provider)
    train_iter = train_iters[0]  # one per model chunk; mmrun's engine has one
    plan = ForwardPlan(pretrain_gpt.forward_step, job.model, jit=False)
    step = backend.train_step.TrainStep(job.model, job.optimizer, loss_fn=plan.loss, lr_scheduler=job.scheduler,
                                        clip_grad=1.0, increment=args.global_batch_size)
    batches = [plan.capture(train_iter) for _ in range(args.num_micro_batches)]
    _, grads = step._backward(batches, 1.0)  # the gradients the update will use, before they are consumed
    replay = [plan.capture(train_iter) for _ in range(args.num_micro_batches)]
    result = step(replay)
    return {"device": backend.device.default_device(), "job": job, "batches": batches, "grads": grads,
            "result": result}


def test_parameters_are_on_the_device(stepped):
    where = stepped["device"]
    params = list(stepped["job"].model.parameters())
    assert params and all(p.device == where for p in params), {str(p.device) for p in params}


def test_gradients_are_on_the_device(stepped):
    where = stepped["device"]
    assert stepped["grads"] and all(g.device == where for g in stepped["grads"])


def test_optimizer_state_is_on_the_device(stepped):
    where = stepped["device"]
    optimizer = stepped["job"].optimizer
    state = optimizer.state_dict()["tensors"]
    assert state and all(t.device == where for t in state.values())
    moments = [t for s in optimizer._opt.state.values() for k, t in s.items() if k != "step"]
    assert moments and all(t.device == where for t in moments)
    assert all(p.device == where for p in optimizer.main_params)


def test_batch_tensors_are_on_the_device(stepped):
    where = stepped["device"]
    flat = [t for batch in stepped["batches"] for t in _tensors(batch)]
    assert len(flat) >= 3 and all(t.device == where for t in flat), {str(t.device) for t in flat}


def test_the_step_ran_and_read_back_plain_floats(stepped):
    result = stepped["result"]
    assert isinstance(result.loss, float) and isinstance(result.grad_norm, float)
    assert 0.0 < result.loss < 20.0 and result.grad_norm > 0.0


def test_new_tensors_from_the_portable_api_go_to_the_device(stepped):
    from mmrun.backend.torch import ops, tensors

    where = stepped["device"]
    import numpy as np

    made = [ops.zeros((2, 2)), ops.ones((3,)), ops.arange(4), ops.causal_mask(4), tensors.from_numpy(np.arange(3))]
    assert all(t.device == where for t in made)
