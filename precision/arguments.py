"""The training flags of the precision and performance tools, declared into the trainer's parser
(training/arguments.py calls add_arguments once, so the shared parser holds one line for all of them)."""
from __future__ import annotations

import argparse
import math
from typing import Callable

from mmrun.precision.anomaly import LEVELS


def _non_negative(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0. Received: {text}")
    return value


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more. Received: {text}")
    return value


def add_arguments(group: argparse._ArgumentGroup, add: Callable[..., None]) -> None:
    add(group, "--dump-config", default=None, metavar="CONFIG_JSON",
        help="dump every module's forward outputs and backward gradients (statistics, or tensors) for the steps "
             "and ranks of msprobe's config.json; compare two dumps with `mmrun compare --dump A B`")
    add(group, "--anomaly-detection", choices=LEVELS, default="off",
        help="check each step's loss, grad norm and every module's activations and gradients for NaN/Inf and "
             "spikes: log (warn and go on) or stop (exit 1 naming the step and module); default off")
    add(group, "--anomaly-spike-factor", type=_non_negative, default=10.0,
        help="a spike is a value above this many times the median of its recent history (10; 0: only NaN/Inf)")
    add(group, "--anomaly-window", type=_at_least_one, default=50,
        help="iterations of history the spike median is taken over (50)")
