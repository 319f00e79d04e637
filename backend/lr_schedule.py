"""Megatron's learning-rate schedule (OptimizerParamScheduler), framework-neutral and pure Python.

Linear warmup from `init_lr` to `max_lr` over `lr_warmup_steps`, then decay to `min_lr` at
`lr_decay_steps` ("linear", "cosine", "constant", "inverse-square-root", or "WSD"), then `min_lr`.
Steps count whatever the caller increments by: Megatron counts samples (increment = global batch
size per iteration, warmup and decay lengths multiplied by it); `from_iterations` builds the schedule
from Megatron's iteration arguments in exactly that way. As in Megatron, `get_lr()` is the rate for
the current step count: with warmup, the first update uses `init_lr` (0 by default).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
WSD_DECAY_STYLES = ("linear", "cosine", "exponential", "minus_sqrt")


@dataclass
class LRSchedule:
    max_lr: float
    lr_decay_steps: float
    lr_warmup_steps: float = 0
    min_lr: float = 0.0
    lr_decay_style: str = "linear"
    init_lr: float = 0.0
    wsd_decay_steps: float | None = None
    lr_wsd_decay_style: str = "exponential"
    num_steps: float = 0

    def __post_init__(self) -> None:
        problems = []
        if self.lr_decay_style not in DECAY_STYLES:
            problems.append(f"lr_decay_style {self.lr_decay_style!r} is not one of {', '.join(DECAY_STYLES)}")
        if not 0.0 <= self.min_lr <= self.max_lr:
            problems.append(f"need 0 <= min_lr <= max_lr, got min_lr={self.min_lr}, max_lr={self.max_lr}")
        if self.init_lr > self.max_lr:
            problems.append(f"init_lr {self.init_lr} exceeds max_lr {self.max_lr}")
        if self.lr_decay_steps <= 0:
            problems.append(f"lr_decay_steps must be positive, got {self.lr_decay_steps}")
        elif not 0 <= self.lr_warmup_steps < self.lr_decay_steps:
            problems.append(f"need 0 <= lr_warmup_steps < lr_decay_steps, got {self.lr_warmup_steps} "
                            f"and {self.lr_decay_steps}")
        if self.lr_decay_style == "WSD" and (self.wsd_decay_steps is None
                                             or self.lr_wsd_decay_style not in WSD_DECAY_STYLES):
            problems.append("WSD decay needs wsd_decay_steps and lr_wsd_decay_style in "
                            f"{', '.join(WSD_DECAY_STYLES)}")
        if problems:
            raise ValueError("invalid learning-rate schedule: " + "; ".join(problems))

    @classmethod
    def from_iterations(cls, lr: float, train_iters: int, min_lr: float = 0.0, lr_decay_style: str = "linear",
                        lr_decay_iters: int | None = None, lr_warmup_iters: int = 0,
                        lr_warmup_fraction: float | None = None, lr_warmup_init: float = 0.0,
                        lr_wsd_decay_iters: int | None = None, lr_wsd_decay_style: str = "exponential",
                        global_batch_size: int = 1) -> "LRSchedule":
        """Megatron's arguments (--lr, --train-iters, --lr-decay-iters, --lr-warmup-iters or
        --lr-warmup-fraction, ...), converted as megatron.training does: lengths in samples, so step the
        schedule by `global_batch_size` per iteration (or keep the default 1 to count iterations)."""
        decay_steps = (lr_decay_iters if lr_decay_iters is not None else train_iters) * global_batch_size
        warmup_steps = (lr_warmup_fraction * decay_steps if lr_warmup_fraction is not None
                        else lr_warmup_iters * global_batch_size)
        wsd_steps = lr_wsd_decay_iters * global_batch_size if lr_wsd_decay_iters is not None else None
        return cls(max_lr=lr, lr_decay_steps=decay_steps, lr_warmup_steps=warmup_steps, min_lr=min_lr,
                   lr_decay_style=lr_decay_style, init_lr=lr_warmup_init, wsd_decay_steps=wsd_steps,
                   lr_wsd_decay_style=lr_wsd_decay_style)

    def lr_at(self, num_steps: float) -> float:
        """The learning rate after `num_steps` steps (Megatron's get_lr)."""
        if self.lr_warmup_steps > 0 and num_steps <= self.lr_warmup_steps:
            return self.init_lr + (self.max_lr - self.init_lr) * float(num_steps) / float(self.lr_warmup_steps)
        if self.lr_decay_style == "constant":
            return self.max_lr
        if num_steps > self.lr_decay_steps:
            return self.min_lr
        if self.lr_decay_style == "inverse-square-root":
            warmup, steps = max(self.lr_warmup_steps, 1), max(num_steps, 1)
            return max(self.min_lr, self.max_lr * warmup ** 0.5 / steps ** 0.5)
        ratio = float(num_steps - self.lr_warmup_steps) / float(self.lr_decay_steps - self.lr_warmup_steps)
        if self.lr_decay_style == "linear":
            coeff = 1.0 - ratio
        elif self.lr_decay_style == "cosine":
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        else:  # WSD: constant, then anneal over the last wsd_decay_steps
            anneal_start = self.lr_decay_steps - self.wsd_decay_steps
            if num_steps <= anneal_start:
                coeff = 1.0
            else:
                r = float(num_steps - anneal_start) / float(self.wsd_decay_steps)
                coeff = {"linear": lambda: 1.0 - r, "cosine": lambda: 0.5 * (math.cos(math.pi * r) + 1.0),
                         "exponential": lambda: 2.0 * math.pow(0.5, r) - 1.0,
                         "minus_sqrt": lambda: 1.0 - math.sqrt(r)}[self.lr_wsd_decay_style]()
        return self.min_lr + coeff * (self.max_lr - self.min_lr)

    def get_lr(self) -> float:
        """The learning rate for the next update."""
        return self.lr_at(self.num_steps)

    def step(self, increment: float = 1) -> None:
        self.num_steps += increment

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, including the step count."""
        return asdict(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the step count; the schedule's shape must match the saved one (as Megatron checks)."""
        for key, value in state.items():
            if key != "num_steps" and getattr(self, key, value) != value:
                raise ValueError(f"learning-rate schedule differs from the checkpoint: {key} is "
                                 f"{getattr(self, key)!r} here but {value!r} in the checkpoint; "
                                 "pass the same schedule arguments to resume")
        self.num_steps = state["num_steps"]
