"""Loss scaling: Megatron's ConstantGradScaler / DynamicGradScaler rules and which runs get one."""
from __future__ import annotations

import json

import pytest

from mmrun.backend.grad_scaler import ConstantGradScaler, DynamicGradScaler, grad_scaler_for


def replay(scaler: DynamicGradScaler, overflows: str) -> list[float]:
    """The scale after each step of a pattern like "xx..x" (x: the gradients overflowed)."""
    scales = []
    for mark in overflows:
        scaler.update(mark == "x")
        scales.append(scaler.scale)
    return scales


def test_hysteresis_delays_the_first_backoff_then_every_overflow_halves():
    scaler = DynamicGradScaler(initial_scale=2.0 ** 10, hysteresis=2, growth_interval=1000)
    # Megatron: the hysteresis count is only restored by a growth, so once spent, each overflow halves.
    assert replay(scaler, "xx.x") == [2.0 ** 10, 2.0 ** 9, 2.0 ** 9, 2.0 ** 8]
    assert (scaler.growth_tracker, scaler.hysteresis_tracker) == (0, -1)


def test_growth_after_a_clean_interval_restores_the_hysteresis():
    scaler = DynamicGradScaler(initial_scale=8.0, growth_interval=3, hysteresis=2)
    assert replay(scaler, "x...") == [8.0, 8.0, 8.0, 16.0]
    assert scaler.hysteresis_tracker == 2
    assert replay(scaler, "..x..x") == [16.0, 16.0, 16.0, 16.0, 16.0, 8.0]


def test_scale_never_drops_below_min_scale():
    scaler = DynamicGradScaler(initial_scale=4.0, min_scale=2.0, hysteresis=1)
    assert replay(scaler, "xxxx") == [2.0, 2.0, 2.0, 2.0]


def test_state_round_trips_through_json_and_a_constant_scaler_keeps_its_own_scale():
    scaler = DynamicGradScaler(initial_scale=2.0 ** 16, growth_interval=5)
    replay(scaler, "x..x.")
    state = json.loads(json.dumps(scaler.state_dict()))
    resumed = DynamicGradScaler(initial_scale=2.0 ** 16, growth_interval=5)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == scaler.state_dict()
    assert replay(resumed, "...x") == replay(scaler, "...x")

    constant = ConstantGradScaler(128.0)
    constant.update(True)
    constant.load_state_dict(state)  # a constant scale is an argument: a saved state does not override it
    assert constant.scale == 128.0 and constant.inv_scale == 1 / 128.0


def test_a_dynamic_scaler_ignores_a_state_saved_without_dynamic_scaling():
    scaler = DynamicGradScaler(initial_scale=2.0 ** 12)
    scaler.load_state_dict(ConstantGradScaler(4.0).state_dict())
    assert scaler.scale == 2.0 ** 12


@pytest.mark.parametrize("precision, loss_scale, expected", [
    ("fp32", None, None),
    ("fp32", 8.0, None),  # Megatron scales only fp16/bf16 runs
    ("fp16", None, "dynamic"),
    ("fp16", 1024.0, "constant"),
    ("bf16", None, None),
    ("bf16", 1024.0, "constant"),
])
def test_megatrons_rule_for_which_scaler_a_run_gets(precision, loss_scale, expected):
    scaler = grad_scaler_for(precision, loss_scale, initial_loss_scale=2.0 ** 20, loss_scale_window=7, hysteresis=3)
    assert (None if scaler is None else scaler.state_dict()["kind"]) == expected
    if expected == "dynamic":
        assert (scaler.scale, scaler.growth_interval, scaler.hysteresis) == (2.0 ** 20, 7, 3)
    if expected == "constant":
        assert scaler.scale == loss_scale


@pytest.mark.parametrize("kwargs, message", [
    ({"initial_scale": 0.0}, "the loss scale must be a positive finite number. Received: 0.0"),
    ({"initial_scale": 4.0, "min_scale": 8.0}, "min_scale must be positive and at most initial_scale"),
    ({"backoff_factor": 1.5}, "backoff_factor must be between 0 and 1"),
    ({"hysteresis": 0}, "hysteresis must be at least 1"),
])
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        DynamicGradScaler(**kwargs)
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        grad_scaler_for("fp8")
