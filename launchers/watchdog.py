"""mmrun's watch over this node's ranks while the launcher runs: a rank that failed, vanished or fell silent.

Polled by the Supervisor a few times a second; reads only the job's status folder (the ranks'
`rank_<R>.json` ends and `rank_<R>.progress` files), so a check costs a few small file reads.

- failed: a rank's bootstrap reported a non-zero end. msrun lets the other workers and its scheduler
  wait (about 30 s for a rank killed by a signal); torchrun stops the job itself within its monitor
  interval, or restarts it under --max-restarts, so mmrun steps in for msrun only.
- vanished: the bootstrap itself was killed and could not report (msrun only, as above).
- msrun's scheduler failed or vanished: its ranks would wait --cluster_time_out (600 s) for it.
- silent (`--watchdog-seconds N`, both launchers): no output line and no heartbeat() for N seconds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from mmrun.launchers import failure
from mmrun.launchers.heartbeat import Progress, read_progress

WATCHDOG_EXIT_CODE = 124  # as GNU timeout(1): stopped because it ran too long without progress


@dataclass(frozen=True)
class Stop:
    exit_code: int
    lines: list[str]  # what mmrun prints, first line first


class RankWatch:
    def __init__(self, status_dir: Path, launcher: str, log_dir: Path | None, *, stop_on_failure: bool,
                 watchdog_seconds: float = 0.0):
        self.status_dir = status_dir
        self.launcher = launcher
        self.log_dir = log_dir
        self.stop_on_failure = stop_on_failure
        self.watchdog_seconds = watchdog_seconds

    def check(self) -> Stop | None:
        """Why the job must stop now, or None."""
        if self.stop_on_failure:
            cause = failure.first_failure(failure.read_statuses(self.status_dir))
            if cause is not None:
                return Stop(failure.exit_code_of(cause), failure.describe(self.launcher, self.log_dir, cause))
            vanished = self._vanished()
            if vanished is not None:
                return vanished
            scheduler = failure.scheduler_failure(self.status_dir, self.log_dir)
            if scheduler is not None:
                return Stop(*scheduler)
        if self.watchdog_seconds > 0:
            now = time.monotonic()
            for rank in failure.running_ranks(self.status_dir):
                silent = rank.silent_for(now)
                if silent > self.watchdog_seconds and not rank.finished:
                    with_tail = read_progress(failure.progress_file(self.status_dir, rank.rank)) or rank
                    return Stop(WATCHDOG_EXIT_CODE, self._silent(with_tail, silent))
        return None

    def _silent(self, rank: Progress, silent: float) -> list[str]:
        since = "started" if rank.last_progress == rank.created else "last printed a line or called heartbeat()"
        return [f"mmrun: error: rank {rank.rank} (local rank {rank.local_rank}) made no progress for {silent:.1f} s "
                f"(--watchdog-seconds {self.watchdog_seconds:g}) since it {since}; stopped the job "
                f"(exit {WATCHDOG_EXIT_CODE})", *failure.last_lines(rank.tail)]

    def after_exit(self, launcher_code: int, launcher_waited: bool = True) -> Stop | None:
        """What to report once the launcher (and the workers) ended, or None for success.

        `launcher_waited`: False for msrun --join False, whose code says nothing about the workers.
        """
        if launcher_code == 0 and launcher_waited:
            return None  # torchrun may have restarted a failed rank (--max-restarts) and finished the job
        statuses = failure.read_statuses(self.status_dir)
        # a rank that failed on its own, then one that vanished, then one that was stopped
        cause = failure.first_failure(statuses, stopped_too=False)
        if cause is None:
            vanished = self._vanished()
            if vanished is not None:
                return vanished
            cause = failure.first_failure(statuses)
        if cause is not None:
            return Stop(failure.exit_code_of(cause), failure.describe(self.launcher, self.log_dir, cause))
        scheduler = failure.scheduler_failure(self.status_dir, self.log_dir)
        return Stop(*scheduler) if scheduler is not None else None

    def _vanished(self) -> Stop | None:
        # Several at once: the launcher may have killed the others meanwhile (msrun does, within 1 s).
        lines = [line for rank in failure.vanished_ranks(self.status_dir) for line in failure.describe_vanished(rank)]
        return Stop(failure.UNKNOWN_EXIT_CODE, lines) if lines else None
