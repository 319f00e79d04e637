"""Which worker failed, with what code, and the last lines of its log.

Workers started through mmrun's bootstrap write `rank_<R>.json` with their own exit code; the first
rank to fail (earliest exit time) is the cause, the others were usually stopped by the launcher.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mmrun.launchers.options import MSRUN

TAIL_LINES = 20


@dataclass(frozen=True)
class WorkerStatus:
    rank: int
    local_rank: int
    exit_code: int
    time: float
    error: str | None
    tail: list[str]  # the worker's last lines of Python-level output, recorded by the bootstrap


def read_statuses(status_dir: Path) -> list[WorkerStatus]:
    statuses = []
    for path in sorted(status_dir.glob("rank_*.json")):
        try:
            record = json.loads(path.read_text())
            statuses.append(WorkerStatus(record["rank"], record["local_rank"], record["exit_code"], record["time"], record.get("error"), record.get("tail", [])))
        except (OSError, ValueError, KeyError):
            continue  # a worker killed mid-write leaves no usable record; the launcher's code stands
    return statuses


def first_failure(statuses: list[WorkerStatus]) -> WorkerStatus | None:
    failed = [s for s in statuses if s.exit_code != 0]
    return min(failed, key=lambda s: s.time) if failed else None


def worker_log(launcher: str, log_dir: Path, status: WorkerStatus) -> Path | None:
    """msrun: <log_dir>/worker_<rank>.log; torchrun (when the user chose --log-dir with --redirects/--tee): <log_dir>/<run>/attempt_<n>/<local_rank>/std{err,out}.log."""
    if not log_dir.is_dir():
        return None
    if launcher == MSRUN:
        candidates = [log_dir / f"worker_{status.rank}.log", *log_dir.glob(f"*_{status.rank}.log")]
    else:
        runs = sorted(log_dir.glob(f"*/attempt_*/{status.local_rank}"), key=lambda p: p.stat().st_mtime)
        candidates = [runs[-1] / name for name in ("stderr.log", "stdout.log")] if runs else []
    for path in candidates:
        if path.is_file() and path.stat().st_size > 0:
            return path
    return None


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    with path.open("rb") as handle:
        handle.seek(0, 2)
        size = handle.tell()
        handle.seek(max(0, size - 64 * 1024))
        text = handle.read().decode("utf-8", errors="replace")
    return text.splitlines()[-lines:]


def describe(launcher: str, log_dir: Path | None, status: WorkerStatus) -> list[str]:
    """The lines mmrun prints about a failed worker."""
    out = [f"mmrun: rank {status.rank} (local rank {status.local_rank}) failed with exit code {status.exit_code}"]
    path = worker_log(launcher, log_dir, status) if log_dir else None
    if path is not None:
        out.append(f"mmrun: last {TAIL_LINES} lines of {path}:")
        out.extend(f"  {line}" for line in tail(path))
    elif status.tail:
        out.append(f"mmrun: its last {len(status.tail)} lines of output:")
        out.extend(f"  {line}" for line in status.tail)
    elif status.error:
        out.append("mmrun: its error:")
        out.extend(f"  {line}" for line in status.error.splitlines()[-TAIL_LINES:])
    return out
