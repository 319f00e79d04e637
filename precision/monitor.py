"""What the training loop reports beyond its log lines: TensorBoard and W&B scalars, throughput, Megatron's
per-phase timers, the profiler window, and the one-line summary at the end. Framework-free: the writer is
tensorboardX (no torch), the profiler and device synchronisation come from mmrun.backend.<framework>.profiler.

    monitor = RunMonitor.create(args, framework, rank, engine, log)     # always an object; cheap when all is off
    monitor.before_step(iteration)                     # starts the profiler at --profile-step-start
    monitor.after_step(iteration, out, elapsed, consumed_samples)      # scalars; stops the profiler
    monitor.log_interval(iteration, stats) -> text     # the throughput field; prints the timer block
    monitor.after_eval(kind, iteration, losses, consumed_samples)
    monitor.summary(result, ...) -> line;  monitor.close()

Scalars are Megatron's tags (training_log in megatron/training/training.py): `lm loss`, `learning-rate`,
`grad-norm`, `loss-scale`, `batch-size`, `world-size`, `iteration-time`, `<timer>-time`, `throughput`,
`mem-*`, `lm loss validation` (and `... vs samples`), written by the last rank as Megatron does (every rank
holds the same all-reduced values), so `mmrun compare` reads them like Megatron's own.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable

from mmrun.precision import profiling, timers as timers_mod
from mmrun.precision.timers import NO_TIMERS, Timers

TB_EXTRA = "monitor"  # pyproject.toml's extra that brings tensorboardX


class MonitorError(ValueError):
    """A monitoring option that cannot work here (a usage error: exit 2, one line)."""

    exit_code = 2


def train_flops_per_iteration(args: Any) -> float | None:
    """Model FLOPs of one training iteration (forward + backward = 3 x forward, no recomputation), Megatron's
    GPT count: per layer 2s(4h^2 + 2h*ffn) + 4s^2h, plus the logits 2shV, per sequence. None for a model
    whose sizes the arguments do not give."""
    sizes = [getattr(args, name, None) for name in ("num_layers", "hidden_size", "seq_length", "global_batch_size")]
    vocab = getattr(args, "padded_vocab_size", None)
    if any(v is None for v in sizes) or vocab is None:
        return None
    layers, h, s, batch = sizes
    ffn = getattr(args, "ffn_hidden_size", None) or 4 * h
    forward = layers * (2 * s * (4 * h * h + 2 * h * ffn) + 4 * s * s * h) + 2 * s * h * vocab
    return 3.0 * forward * batch


class _Writers:
    """TensorBoard (tensorboardX) and, if asked, W&B: the same scalars to both."""

    def __init__(self, args: Any, write: bool) -> None:
        self.tb = self.wandb = None
        if args.tensorboard_dir:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                raise MonitorError(f"--tensorboard-dir {args.tensorboard_dir} needs tensorboardX, which is not "
                                   f"installed; pip install 'mmrun[{TB_EXTRA}]' (or tensorboardX)") from None
            if write:
                self.tb = SummaryWriter(log_dir=args.tensorboard_dir, max_queue=args.tensorboard_queue_size)
        if args.wandb_project:
            try:
                import wandb
            except ImportError:
                raise MonitorError(f"--wandb-project {args.wandb_project} needs wandb, which is not installed; "
                                   "pip install wandb, or drop --wandb-project (TensorBoard needs no account)") from None
            if write:
                save_dir = args.wandb_save_dir or (os.path.join(args.tensorboard_dir, "wandb")
                                                   if args.tensorboard_dir else None)
                self.wandb = wandb.init(project=args.wandb_project, name=args.wandb_exp_name or None, dir=save_dir,
                                        config={k: v for k, v in vars(args).items()
                                                if isinstance(v, (int, float, str, bool, type(None)))})

    @property
    def active(self) -> bool:
        return self.tb is not None or self.wandb is not None

    def scalar(self, tag: str, value: float | None, step: int) -> None:
        if value is None:
            return
        if self.tb is not None:
            self.tb.add_scalar(tag, float(value), step)
        if self.wandb is not None:
            self.wandb.log({tag: float(value)}, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


@dataclass
class RunMonitor:
    args: Any
    framework: str
    rank: int
    world_size: int
    log: Callable[[str], None]
    writers: _Writers | None = None
    timers: Timers = NO_TIMERS
    profile: profiling.ProfileWindow | None = None
    flops: float | None = None
    step_seconds: float = 0.0  # steps trained in this run, for the summary
    steps: int = 0
    tokens: int = 0
    last_loss: float | None = None
    start_iteration: int = 0
    _block: str = ""

    @classmethod
    def create(cls, args: Any, framework: str, rank: int, engine: Any, log: Callable[[str], None],
               start_iteration: int = 0) -> "RunMonitor":
        from mmrun import backend

        world = int(getattr(args, "world_size", 1) or 1)
        mon = cls(args, framework, rank, world, log, start_iteration=start_iteration)
        writer_rank = world - 1  # Megatron writes TensorBoard on the last rank
        if args.tensorboard_dir or args.wandb_project:
            mon.writers = _Writers(args, write=rank == writer_rank)
            if args.tensorboard_dir:
                log(f"> TensorBoard: scalars every {args.tensorboard_log_interval} iteration(s) into "
                    f"{args.tensorboard_dir} (rank {writer_rank}); `tensorboard --logdir {args.tensorboard_dir}`")
        if args.timing_log_level > 0 or args.log_timers_to_tensorboard:
            # --log-timers-to-tensorboard alone records level 1 (Megatron's timers exist at every level).
            mon.timers = Timers(max(1, args.timing_log_level), sync=backend.profiler.synchronize)
            engine.timers = mon.timers
        if args.log_throughput:
            mon.flops = train_flops_per_iteration(args)
        if args.profile:
            mon.profile = profiling.ProfileWindow.create(args, rank, log)
        return mon

    # ------------------------------------------------------------------------------- per step
    def before_step(self, iteration: int) -> None:
        if self.profile is not None:
            self.profile.before_step(iteration)

    def after_step(self, iteration: int, out: Any, elapsed: float, consumed: int) -> None:
        self.steps += 1
        self.step_seconds += elapsed
        self.tokens += self.args.global_batch_size * self.args.seq_length
        if not out.skipped:
            self.last_loss = out.loss
        self.timers.iterations += 1
        if self.profile is not None:
            self.profile.after_step(iteration)
        writers = self.writers
        if writers is None or writers.tb is None and writers.wandb is None:
            return
        if iteration % self.args.tensorboard_log_interval:
            return
        args = self.args
        pairs: list[tuple[str, float | None]] = [("lm loss", out.loss), ("grad-norm", out.grad_norm)]
        if not args.no_log_learnig_rate_to_tensorboard:
            pairs.append(("learning-rate", out.lr))
        if args.log_batch_size_to_tensorboard:
            pairs.append(("batch-size", args.global_batch_size))
        if not args.no_log_loss_scale_to_tensorboard:
            pairs.append(("loss-scale", 1.0 if out.loss_scale is None else out.loss_scale))
        if args.log_world_size_to_tensorboard:
            pairs.append(("world-size", self.world_size))
        for tag, value in pairs:
            writers.scalar(tag, value, iteration)
            if tag not in ("batch-size", "world-size"):
                writers.scalar(f"{tag} vs samples", value, consumed)
        if args.log_memory_to_tensorboard:
            from mmrun import backend

            peak = backend.device.peak_memory_mb()
            writers.scalar("mem-max-allocated-bytes", None if peak is None else peak * 2 ** 20, iteration)
            import resource

            writers.scalar("mem-peak-rss-bytes", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, iteration)

    def log_interval(self, iteration: int, stats: Any) -> str:
        """At each --log-interval: the throughput field of the iteration line (empty without --log-throughput),
        the timer block for flush_timers (every rank joins its gather), the interval's TensorBoard timers."""
        per_iter = stats.elapsed / max(1, stats.iterations)
        text = ""
        throughput = None
        if self.args.log_throughput:
            if self.flops is not None and per_iter > 0:
                throughput = self.flops / (per_iter * 1e12 * self.world_size)
                # Megatron prints .1f; CPU-sized runs sit far below 1 TFLOP/s, so small values keep 3 digits.
                text = f" throughput per GPU (TFLOP/s/GPU): {throughput:.1f} |" if throughput >= 10 else \
                    f" throughput per GPU (TFLOP/s/GPU): {throughput:.3g} |"
            else:
                text = " throughput per GPU (TFLOP/s/GPU): n/a |"
        writers = self.writers
        if writers is not None and writers.active:
            if throughput is not None:
                writers.scalar("throughput", throughput, iteration)
            if self.args.log_timers_to_tensorboard:
                writers.scalar("iteration-time", per_iter, iteration)
        if self.timers is not NO_TIMERS:
            per_rank = self._gather(self.timers.per_iteration_ms())
            if self.args.timing_log_level > 0 and per_rank:
                self._block = timers_mod.block(per_rank, self.args.timing_log_option)
            if writers is not None and writers.active and self.args.log_timers_to_tensorboard:
                for name, values in per_rank.items():
                    writers.scalar(f"{name}-time", max(values), iteration)
            self.timers.reset()
        return text

    def flush_timers(self) -> None:
        """The timer block, printed after the iteration line as Megatron prints it."""
        if self._block:
            self.log(self._block)
            self._block = ""

    def _gather(self, mine: dict[str, float]) -> dict[str, list[float]]:
        """Every rank's ms per phase: one all-reduce (sum) of a world x phases array with this rank's row set."""
        names = list(timers_mod.PHASES)
        if self.world_size == 1:
            return {n: [mine[n]] for n in names if n in mine}
        import numpy as np

        from mmrun import backend
        from mmrun.backend import tensors

        table = np.zeros((self.world_size, len(names)), dtype=np.float32)
        table[self.rank] = [mine.get(n, 0.0) for n in names]
        summed = tensors.to_numpy(backend.distributed.all_reduce(tensors.from_numpy(table), op="sum"))
        return {n: [float(v) for v in summed[:, i]] for i, n in enumerate(names) if n in mine}

    def after_eval(self, kind: str, iteration: int, losses: dict[str, float], consumed: int) -> None:
        writers = self.writers
        if writers is None or not writers.active:
            return
        suffix = "validation" if kind == "valid" else "test"
        for key, value in losses.items():
            writers.scalar(f"{key} {suffix}", value, iteration)
            writers.scalar(f"{key} {suffix} vs samples", value, consumed)
            if self.args.log_validation_ppl_to_tensorboard:
                ppl = math.exp(min(20.0, value))
                writers.scalar(f"{key} {suffix} ppl", ppl, iteration)
                writers.scalar(f"{key} {suffix} ppl vs samples", ppl, consumed)

    # ------------------------------------------------------------------------------- the end
    def summary(self, iteration: int, train_iters: int, checkpoint: str | None) -> str:
        """One line a person reads at the end: what was trained, how fast, where it went."""
        where = f"checkpoint {checkpoint}" if checkpoint else "no checkpoint (--save not given)"
        if self.steps == 0:
            return (f"> summary: nothing trained: the run started at iteration {self.start_iteration} of "
                    f"--train-iters {train_iters}; {where}")
        rate = self.tokens / self.step_seconds if self.step_seconds > 0 else 0.0
        loss = "n/a" if self.last_loss is None else f"{self.last_loss:.6E}"
        return (f"> summary: {self.framework}, iterations {self.start_iteration + 1}..{iteration} ({self.steps} "
                f"trained) in {self.step_seconds:.1f} s, {rate:.1f} tokens/s, final lm loss {loss}, {where}")

    def close(self) -> None:
        if self.profile is not None:
            self.profile.close()
        if self.writers is not None:
            self.writers.close()
