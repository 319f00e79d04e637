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


def _profile_step(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an iteration count >= 0. Received: {text}")
    return value


def add_monitoring_arguments(group: argparse._ArgumentGroup, add: Callable[..., None]) -> None:
    """Megatron's TensorBoard/W&B, throughput, timer, profiler and determinism flags (docs/precision-and-performance.md)."""
    from mmrun.precision.timers import LEVELS, OPTIONS

    add(group, "--tensorboard-dir", default=None,
        help="write TensorBoard scalars (Megatron's tags) here; needs tensorboardX (pip install 'mmrun[monitor]')")
    add(group, "--tensorboard-log-interval", type=_at_least_one, default=1,
        help="iterations between TensorBoard scalars (1)")
    add(group, "--tensorboard-queue-size", type=_at_least_one, default=1000,
        help="scalars queued before the writer flushes to disk (1000)")
    for flag, what in (("--log-timers-to-tensorboard", "the per-phase timers and iteration time"),
                       ("--log-batch-size-to-tensorboard", "the global batch size"),
                       ("--log-validation-ppl-to-tensorboard", "the validation perplexity"),
                       ("--log-memory-to-tensorboard", "peak device memory and peak host RSS"),
                       ("--log-world-size-to-tensorboard", "the world size")):
        add(group, flag, action="store_true", help=f"TensorBoard: also write {what}")
    add(group, "--log-loss-scale-to-tensorboard", action="store_true",
        help="TensorBoard: the loss scale (written by default; Megatron's older switch)")
    add(group, "--no-log-loss-scale-to-tensorboard", action="store_true",
        help="TensorBoard: leave the loss scale out")
    add(group, "--no-log-learnig-rate-to-tensorboard", action="store_true",
        help="TensorBoard: leave the learning rate out (Megatron's spelling)")
    add(group, "--wandb-project", default=None,
        help="also log the scalars to Weights & Biases (needs wandb installed; optional)")
    add(group, "--wandb-exp-name", default=None, help="W&B run name")
    add(group, "--wandb-save-dir", default=None, help="W&B local folder (default <tensorboard-dir>/wandb)")
    add(group, "--log-throughput", action="store_true",
        help="add the model TFLOP/s per device to each iteration line (and TensorBoard 'throughput')")
    add(group, "--timing-log-level", type=int, choices=LEVELS, default=0,
        help="per-phase timers after each iteration line: 1 = batch-generator, forward-backward, grads-all-reduce, "
             "optimizer; 2 = also forward-compute and backward-compute (synchronises the device per phase); 0 = off")
    add(group, "--timing-log-option", choices=OPTIONS, default="minmax",
        help="timers across ranks: max, minmax (default) or all")
    add(group, "--profile", action="store_true",
        help="profile iterations --profile-step-start+1 .. --profile-step-end on --profile-ranks (torch.profiler, "
             "torch_npu.profiler on NPUs, MindSpore's profiler); prints the top operators, writes a Perfetto trace")
    add(group, "--profile-step-start", type=_profile_step, default=10,
        help="iterations done when profiling starts (10)")
    add(group, "--profile-step-end", type=_profile_step, default=12,
        help="iterations done when profiling stops (12)")
    add(group, "--profile-ranks", type=int, nargs="+", default=[0], help="ranks that profile (0)")
    add(group, "--profile-dir", default=None,
        help="where traces go (default --tensorboard-dir, else ./profile)")
    add(group, "--use-pytorch-profiler", action="store_true",
        help="accepted for Megatron scripts: mmrun always uses the framework's own profiler")
    add(group, "--deterministic-mode", "--deterministic", action="store_true",
        help="reproducible runs: seeds, deterministic kernels (torch, MindSpore), HCCL_DETERMINISTIC, data in "
             "order; says at start what it cannot cover")
