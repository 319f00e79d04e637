"""--deterministic-mode (Megatron's flag; `--deterministic` too): the alignment checklist of the migration
guides as one switch, on either framework, and what it cannot make deterministic said at the start of the run.

What it sets: the seeds (--seed: python, numpy, the framework; mmrun's initial weights are numpy's anyway),
the framework's deterministic kernels (backend/<framework>/seeding.py, set_deterministic), HCCL_DETERMINISTIC
for Ascend's collectives (read when HCCL starts, which is after this), and data in order (mmrun's data
loader never shuffles: rank r reads the r-th micro-batch of each global batch; the sample order comes from
--seed).
"""
from __future__ import annotations

import os
from typing import Any, Callable

# Environment variables read by the communication libraries when they start (after this runs).
ENV: dict[str, str] = {"HCCL_DETERMINISTIC": "true"}

# What stays outside the switch, and why (printed with the notice, so nobody expects more than it gives).
NOT_COVERED: tuple[str, ...] = (
    "a different process count or parallel layout sums gradients in another order (equal to ~1e-7, not bitwise)",
    "PyTorch and MindSpore use different kernels: they agree to ~1e-6 (mmrun compare --rtol 1e-5), not bitwise",
    "dropout masks differ between frameworks unless --dropout-impl hash",
    "a CPU run's thread count (OMP_NUM_THREADS) changes how oneDNN/MKL split reductions: keep it the same",
    "torch raises an error at an op that has no deterministic kernel (the message names it)",
)


def apply(args: Any, framework: str, log: Callable[[str], None]) -> None:
    """Switch determinism on before communication and the model exist (the seeds follow in the loop)."""
    if not getattr(args, "deterministic_mode", False):
        return
    from mmrun import backend

    for name, value in ENV.items():
        os.environ.setdefault(name, value)  # a value the user exported wins
    switched = backend.seeding.set_deterministic()
    env = ", ".join(f"{n}={os.environ[n]}" for n in ENV)
    log(f"> --deterministic-mode: seed {args.seed}, {', '.join(switched)}, {env}, data in order (never shuffled)")
    log("> --deterministic-mode does not cover: " + "; ".join(NOT_COVERED))
