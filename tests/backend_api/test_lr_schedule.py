"""The learning-rate schedule gives megatron-core's OptimizerParamScheduler values, step for step."""
from __future__ import annotations

import pytest

from mmrun.backend.lr_schedule import LRSchedule


class _ParamGroups:
    """What megatron-core's scheduler writes to: an object with `param_groups` (its only use of the optimizer)."""

    def __init__(self) -> None:
        self.param_groups = [{}]


def megatron_lrs(steps, increment, **kwargs):
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    holder = _ParamGroups()
    scheduler = OptimizerParamScheduler(holder, start_wd=0.1, end_wd=0.1, wd_incr_steps=steps * increment,
                                        wd_incr_style="constant", **kwargs)
    lrs = []
    for _ in range(steps):
        lrs.append(holder.param_groups[0]["lr"])  # the rate the optimizer step of this iteration uses
        scheduler.step(increment)
    return lrs


CASES = {
    "cosine, warmup iters": dict(lr=3e-4, min_lr=3e-5, train_iters=50, lr_warmup_iters=10, lr_decay_style="cosine"),
    "linear, warmup fraction, decay iters": dict(lr=1e-3, min_lr=0.0, train_iters=60, lr_decay_iters=40,
                                                 lr_warmup_fraction=0.1, lr_decay_style="linear"),
    "constant, warmup init": dict(lr=1e-3, train_iters=20, lr_warmup_iters=5, lr_warmup_init=1e-4,
                                  lr_decay_style="constant"),
    "inverse-square-root": dict(lr=1e-3, min_lr=1e-5, train_iters=40, lr_warmup_iters=4,
                                lr_decay_style="inverse-square-root"),
    "WSD minus_sqrt": dict(lr=1e-3, min_lr=1e-5, train_iters=30, lr_warmup_iters=3, lr_decay_style="WSD",
                           lr_wsd_decay_iters=10, lr_wsd_decay_style="minus_sqrt"),
    "cosine, no warmup, global batch 8": dict(lr=2e-4, min_lr=2e-5, train_iters=25, lr_decay_style="cosine",
                                              global_batch_size=8),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_schedule_matches_megatron_core(name):
    args = CASES[name]
    schedule = LRSchedule.from_iterations(**args)
    gbs = args.get("global_batch_size", 1)
    ours = []
    for _ in range(args["train_iters"] + 5):  # run past the end: min_lr
        ours.append(schedule.get_lr())
        schedule.step(gbs)
    expected = megatron_lrs(args["train_iters"] + 5, gbs, init_lr=args.get("lr_warmup_init", 0.0),
                            max_lr=args["lr"], min_lr=args.get("min_lr", 0.0),
                            lr_warmup_steps=schedule.lr_warmup_steps, lr_decay_steps=schedule.lr_decay_steps,
                            lr_decay_style=args["lr_decay_style"], wsd_decay_steps=schedule.wsd_decay_steps,
                            lr_wsd_decay_style=args.get("lr_wsd_decay_style"))
    assert ours == pytest.approx(expected, rel=1e-12, abs=0)


def test_warmup_fraction_and_defaults_follow_megatron_arguments():
    schedule = LRSchedule.from_iterations(lr=1.0, train_iters=100, lr_warmup_fraction=0.05, global_batch_size=4)
    assert (schedule.lr_decay_steps, schedule.lr_warmup_steps) == (400, 20)
    assert schedule.lr_at(0) == 0.0  # Megatron's first update, during warmup, uses init_lr
    assert schedule.lr_at(10) == pytest.approx(0.5)
    assert schedule.lr_at(20) == pytest.approx(1.0)
    assert schedule.lr_at(401) == 0.0


def test_state_roundtrip_and_mismatch_error():
    schedule = LRSchedule.from_iterations(lr=1e-3, train_iters=10, lr_warmup_iters=2)
    for _ in range(4):
        schedule.step()
    resumed = LRSchedule.from_iterations(lr=1e-3, train_iters=10, lr_warmup_iters=2)
    resumed.load_state_dict(schedule.state_dict())
    assert resumed.get_lr() == schedule.get_lr() and resumed.num_steps == 4
    other = LRSchedule.from_iterations(lr=2e-3, train_iters=10, lr_warmup_iters=2)
    with pytest.raises(ValueError, match="max_lr is 0.002 here but 0.001 in the checkpoint"):
        other.load_state_dict(schedule.state_dict())


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_lr=1e-3, lr_decay_steps=10, lr_warmup_steps=10), "lr_warmup_steps < lr_decay_steps"),
    (dict(max_lr=1e-3, lr_decay_steps=10, min_lr=1e-2), "min_lr <= max_lr"),
    (dict(max_lr=1e-3, lr_decay_steps=10, lr_decay_style="step"), "'step' is not one of"),
    (dict(max_lr=1e-3, lr_decay_steps=0), "lr_decay_steps must be positive"),
    (dict(max_lr=1e-3, lr_decay_steps=10, lr_decay_style="WSD"), "WSD decay needs wsd_decay_steps"),
])
def test_invalid_schedules_are_rejected_with_the_reason(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LRSchedule(**kwargs)
