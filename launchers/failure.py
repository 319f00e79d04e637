"""Which worker failed, how (its exit code or the signal that killed it), and the last lines of its output.

Each rank's bootstrap writes `rank_<R>.json` when the rank's script ends (names in worker_bootstrap.py); the first rank to fail
(earliest end) is the cause, the others were usually stopped by the launcher. A rank whose bootstrap
itself was killed leaves only its progress file (`rank_<R>.progress`, see heartbeat.py): it vanished.
"""
from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path

from mmrun.launchers.heartbeat import TAIL_LINES, Progress, read_progress
from mmrun.launchers.options import MSRUN
from mmrun.launchers.worker_bootstrap import PROGRESS_FILE, SCHEDULER, STATUS_FILE

UNKNOWN_EXIT_CODE = 1  # a rank whose end nobody could observe


@dataclass(frozen=True)
class WorkerStatus:
    rank: int
    local_rank: int
    exit_code: int  # 128 + N after signal N, as a shell reports it
    signal: int | None  # the signal that killed the script, if one did
    forwarded: int | None  # a signal its bootstrap received and passed on: the rank was stopped, not failing
    time: float
    tail: list[str]  # the worker's last lines of Python-level output, from its progress file

    @property
    def how(self) -> str:
        if self.signal:
            how = f"was killed by signal {self.signal} ({signal_name(self.signal)}): exit code {self.exit_code}"
        else:
            how = f"failed with exit code {self.exit_code}"
        if self.forwarded:
            how += f", after its bootstrap passed {signal_name(self.forwarded)} on to it (the rank was being stopped)"
        return how


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def read_statuses(status_dir: Path) -> list[WorkerStatus]:
    statuses = []
    for path in sorted(status_dir.glob(STATUS_FILE.format(rank="*"))):
        try:
            record = json.loads(path.read_text())
            statuses.append(WorkerStatus(record["rank"], record["local_rank"], record["exit_code"], record.get("signal"),
                                         record.get("forwarded"), record["time"], record.get("tail", [])))
        except (OSError, ValueError, KeyError):
            continue  # written atomically, so only a foreign file lands here
    return statuses


def first_failure(statuses: list[WorkerStatus], stopped_too: bool = True) -> WorkerStatus | None:
    """The earliest rank that failed on its own; else (with `stopped_too`) the earliest one that was stopped.

    When one rank fails, torchrun stops the others (SIGTERM, passed on by their bootstraps), so they
    end with failures too, later; a rank that was stopped is the cause only when no rank failed alone.
    """
    failed = [s for s in statuses if s.exit_code != 0]
    own = [s for s in failed if not s.forwarded]
    chosen = own or (failed if stopped_too else [])
    return min(chosen, key=lambda s: s.time) if chosen else None


def progress_file(status_dir: Path, rank: int) -> Path:
    return status_dir / PROGRESS_FILE.format(rank=rank)


def running_ranks(status_dir: Path, lines: int = 0) -> list[Progress]:
    """Ranks that started and have not reported an end (yet), with their last `lines` lines."""
    ended = {path.stem for path in status_dir.glob(STATUS_FILE.format(rank="*"))}
    found = []
    for path in sorted(status_dir.glob(PROGRESS_FILE.format(rank="*"))):
        progress = read_progress(path, lines) if path.stem not in ended else None
        if progress is not None:
            found.append(progress)
    return found


def vanished_ranks(status_dir: Path) -> list[Progress]:
    """Ranks whose bootstrap ended without writing a status: killed from outside, or crashed itself."""
    gone = [p for p in running_ranks(status_dir) if not p.writer_alive()]
    # A bootstrap writes its status before it exits: one that ended after the listing above left it by now.
    gone = [p for p in gone if not (status_dir / STATUS_FILE.format(rank=p.rank)).exists()]
    return [read_progress(progress_file(status_dir, p.rank)) or p for p in gone]  # with their last lines


def exit_code_of(status: WorkerStatus) -> int:
    """What mmrun exits with for this failure: the worker's own code, 128 + N after signal N."""
    return exit_code_of_record(status.exit_code)


def exit_code_of_record(code: int) -> int:
    return code if 0 < code < 256 else UNKNOWN_EXIT_CODE


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


def last_lines(lines: list[str] | tuple[str, ...]) -> list[str]:
    if not lines:
        return ["mmrun: it printed nothing through Python's sys.stdout/sys.stderr"]
    count = "line" if len(lines) == 1 else f"{len(lines)} lines"
    return [f"mmrun: its last {count} of output:", *(f"  {line}" for line in lines)]


def describe(launcher: str, log_dir: Path | None, status: WorkerStatus) -> list[str]:
    """The lines mmrun prints about a failed worker."""
    out = [f"mmrun: rank {status.rank} (local rank {status.local_rank}) {status.how}"]
    path = worker_log(launcher, log_dir, status) if log_dir else None
    if path is not None:
        out.append(f"mmrun: last {TAIL_LINES} lines of {path}:")
        out.extend(f"  {line}" for line in tail(path))
    else:
        out.extend(last_lines(status.tail))
    return out


def describe_vanished(progress: Progress) -> list[str]:
    return [f"mmrun: rank {progress.rank} (local rank {progress.local_rank}) ended without reporting how: its bootstrap "
            f"(pid {progress.writer_pid}) was killed from outside; exit code unknown ({UNKNOWN_EXIT_CODE})",
            *last_lines(progress.tail)]


def scheduler_failure(status_dir: Path, log_dir: Path | None) -> tuple[int, list[str]] | None:
    """(exit code, lines) when msrun's scheduler on this node failed or vanished; None while it runs or after a clean end."""
    try:
        record = json.loads((status_dir / f"{SCHEDULER}.json").read_text())
    except (OSError, ValueError):
        record = None
    if record is None:
        progress = read_progress(status_dir / f"{SCHEDULER}.progress", lines=0)
        if progress is None or progress.writer_alive() or (status_dir / f"{SCHEDULER}.json").exists():
            return None
        code, how = UNKNOWN_EXIT_CODE, f"ended without reporting how: its bootstrap (pid {progress.writer_pid}) was killed from outside"
    elif record["exit_code"]:
        code = exit_code_of_record(record["exit_code"])
        how = (f"was killed by signal {record['signal']} ({signal_name(record['signal'])})" if record.get("signal")
               else f"failed with exit code {record['exit_code']}")
    else:
        return None
    out = [f"mmrun: msrun's scheduler {how}, and the ranks would wait --cluster_time_out for it; stopped the job (exit {code})"]
    log = log_dir / "scheduler.log" if log_dir else None
    if log is not None and log.is_file() and log.stat().st_size:
        out.append(f"mmrun: last {TAIL_LINES} lines of {log}:")
        out.extend(f"  {line}" for line in tail(log))
    elif record and record.get("tail"):
        out.extend(last_lines(record["tail"]))
    return code, out
