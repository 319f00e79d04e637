"""Megatron's --profile window on both frameworks, and the top-operators table printed when it closes.

Megatron's count: profiling starts when --profile-step-start iterations are done and stops when
--profile-step-end are, so the defaults 10 and 12 record iterations 11 and 12; only the ranks of
--profile-ranks (default 0) profile. The recorder is mmrun.backend.<framework>.profiler:

    handle = start(out_dir, rank)      # torch.profiler (torch_npu.profiler on an NPU), MindSpore's profiler
    report = stop(handle)              # Report(trace: path of a Chrome/Perfetto JSON trace, rows: [OpRow])

The trace opens in https://ui.perfetto.dev, chrome://tracing, and TensorBoard's profile plugin
(torch's `*.pt.trace.json`); MindSpore's output folder is MindStudio Insight's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class OpRow:
    """One operator's time in the profiled steps (self time: children are not counted twice)."""

    name: str
    calls: int
    total_ms: float


@dataclass
class Report:
    trace: str  # the Chrome-format JSON trace (Perfetto, chrome://tracing, TensorBoard)
    folder: str  # everything the profiler wrote
    rows: list[OpRow]


def top_table(rows: list[OpRow], steps: int, limit: int = 10) -> str:
    """The operators that took the most time, largest first, with their share of the profiled op time."""
    total = sum(r.total_ms for r in rows) or 1.0
    top = sorted(rows, key=lambda r: r.total_ms, reverse=True)[:limit]
    width = max([len("operator")] + [len(r.name[:60]) for r in top])
    lines = [f"  {'operator':<{width}}  {'calls':>7}  {'total ms':>10}  {'ms/step':>9}  {'share':>6}"]
    for r in top:
        lines.append(f"  {r.name[:60]:<{width}}  {r.calls:>7}  {r.total_ms:>10.2f}  {r.total_ms / max(1, steps):>9.2f}  "
                     f"{100.0 * r.total_ms / total:>5.1f}%")
    return "\n".join(lines)


def rows_from_chrome_trace(path: str, skip_processes: tuple[str, ...] = ()) -> list[OpRow]:
    """Complete events ("ph": "X") of a Chrome trace summed per name (durations in microseconds), leaving out
    the processes (trace rows) named in skip_processes (MindSpore's "Scope Layer": module scopes, not ops)."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    skipped = {e.get("pid") for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and (e.get("args") or {}).get("name") in skip_processes}
    sums: dict[str, list[float]] = {}
    for event in events:
        if event.get("ph") != "X" or event.get("pid") in skipped:
            continue
        acc = sums.setdefault(str(event.get("name")), [0, 0.0])
        acc[0] += 1
        acc[1] += float(event.get("dur", 0.0)) / 1000.0
    return [OpRow(name, int(calls), ms) for name, (calls, ms) in sums.items()]


class ProfileWindow:
    def __init__(self, start: int, end: int, ranks: list[int], rank: int, out_dir: str,
                 log: Callable[[str], None]) -> None:
        self.start, self.end, self.rank, self.out_dir, self.log = start, end, rank, out_dir, log
        self.active = rank in ranks
        self._handle: Any = None
        self.steps = 0  # iterations recorded so far
        self.report: Report | None = None

    @classmethod
    def create(cls, args: Any, rank: int, log: Callable[[str], None]) -> "ProfileWindow":
        out_dir = args.profile_dir or args.tensorboard_dir or "profile"
        if args.profile_step_end <= args.profile_step_start:
            from mmrun.precision.monitor import MonitorError

            raise MonitorError(f"--profile-step-end must be after --profile-step-start. Received: "
                               f"--profile-step-start {args.profile_step_start} --profile-step-end "
                               f"{args.profile_step_end}; e.g. --profile-step-start 2 --profile-step-end 4")
        if args.profile_step_end > args.train_iters:
            log(f"WARNING: --profile-step-end {args.profile_step_end} is after --train-iters {args.train_iters}: the "
                "profile stops with the last iteration")
        ranks = list(args.profile_ranks)
        log(f"> profiling iterations {args.profile_step_start + 1}..{args.profile_step_end} on rank(s) "
            f"{', '.join(map(str, ranks))} into {out_dir}")
        return cls(args.profile_step_start, args.profile_step_end, ranks, rank, out_dir, log)

    def before_step(self, iteration: int) -> None:
        """`iteration` is the one about to run (1-based): it is profiled when start < iteration <= end."""
        if self.active and self._handle is None and self.report is None and iteration == self.start + 1:
            from mmrun import backend

            self._handle = backend.profiler.start(self.out_dir, self.rank)

    def after_step(self, iteration: int) -> None:
        if self._handle is None:
            return
        self.steps += 1
        if iteration >= self.end:
            self._finish(self.steps)

    def _finish(self, steps: int) -> None:
        from mmrun import backend

        handle, self._handle = self._handle, None
        self.report = backend.profiler.stop(handle)
        # Every profiling rank prints: a rank whose operators differ is what the table is for.
        print(f"> profile of rank {self.rank}, {steps} iteration(s): trace {self.report.trace} (open in "
              f"https://ui.perfetto.dev or TensorBoard); top operators by self time:\n"
              f"{top_table(self.report.rows, steps)}", flush=True)

    def close(self) -> None:
        """A run that ends inside the window (fewer iterations, an early exit) still gets its trace."""
        if self._handle is not None:
            self._finish(self.steps)
