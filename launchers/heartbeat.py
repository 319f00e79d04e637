"""A rank's progress file: its last output and its last sign of life, readable even after it died.

    from mmrun.launchers.heartbeat import heartbeat
    for iteration in range(train_iters):
        train_step(...)
        heartbeat()        # once per iteration: tells `mmrun --watchdog-seconds N` this rank is alive

Under `mmrun`, every worker has one file, `$MMRUN_PROGRESS_FILE` (`rank_<RANK>.progress` in the job's
status folder). The worker bootstrap creates it; the process running the user's script maps it into
memory and writes every line it prints through sys.stdout/sys.stderr into a ring of the last 16 KiB,
with the time. A memory write needs no system call and survives the writer's death (SIGKILL, the OOM
killer): the bootstrap reads a killed rank's last lines from it, and mmrun's watchdog reads the time
of each rank's last output or heartbeat. Outside mmrun, `heartbeat()` does nothing.

Times are CLOCK_MONOTONIC (`time.monotonic()`), one clock for every process of the machine.
Standard library only: the bootstrap imports this before any user code.
"""
from __future__ import annotations

import mmap
import os
import struct
import time

__all__ = ["PROGRESS_FILE_VAR", "heartbeat", "Progress", "read_progress"]

PROGRESS_FILE_VAR = "MMRUN_PROGRESS_FILE"
MAGIC = b"MMRUNPG1"
# magic, bytes of output ever written, last progress, heartbeats, file created, writer pid, its start time,
# rank, local rank, script finished (its process is tearing down or registering with msrun's scheduler)
HEADER = struct.Struct("<8sQdQdqQqqQ")
FINISHED_OFFSET = HEADER.size - 8
RING_BYTES = 16 * 1024
FILE_BYTES = HEADER.size + RING_BYTES
TAIL_LINES = 20


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot, /proc/<pid>/stat field 22): a PID's identity, as PIDs are reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):  # a zombie has ended: only its parent has not collected it yet
        return None
    return int(fields[19])


def create(path: str, writer_pid: int, rank: int, local_rank: int) -> None:
    """A fresh progress file for the process `writer_pid` (the bootstrap of one rank)."""
    header = HEADER.pack(MAGIC, 0, 0.0, 0, time.monotonic(), writer_pid, start_ticks(writer_pid) or 0, rank, local_rank, 0)
    with open(path, "wb") as handle:
        handle.write(header + bytes(RING_BYTES))


class _Writer:
    """The memory-mapped progress file of this process."""

    def __init__(self, path: str):
        with open(path, "r+b") as handle:
            self._map = mmap.mmap(handle.fileno(), FILE_BYTES)
        import threading  # only the script's process writes: the bootstrap does without it

        self._lock = threading.Lock()  # several threads may print at once
        _, self._written, _, self._beats, *_ = HEADER.unpack_from(self._map)

    def _stamp(self) -> None:
        struct.pack_into("<QdQ", self._map, 8, self._written, time.monotonic(), self._beats)

    def record(self, text: str) -> None:
        data = text.encode("utf-8", errors="replace")[-RING_BYTES:]
        with self._lock:
            start = self._written % RING_BYTES
            first = min(len(data), RING_BYTES - start)
            ring = HEADER.size
            self._map[ring + start:ring + start + first] = data[:first]
            self._map[ring:ring + len(data) - first] = data[first:]
            self._written += len(data)
            self._stamp()

    def beat(self) -> None:
        with self._lock:
            self._beats += 1
            self._stamp()

    def finish(self) -> None:
        with self._lock:
            struct.pack_into("<Q", self._map, FINISHED_OFFSET, 1)


_writer: _Writer | None = None


def attach(path: str) -> None:
    """Make this process the writer of `path` (done by the bootstrap, before the user's script runs)."""
    global _writer
    _writer = _Writer(path)


def record(text: str) -> None:
    """Output the process wrote: kept for the tail, and counted as progress."""
    if _writer is not None:
        _writer.record(text)


def script_finished() -> None:
    """The user's script returned: what is left (teardown, msrun registration) is mmrun's, not a hang to watch."""
    if _writer is not None:
        _writer.finish()


def heartbeat() -> None:
    """Tell mmrun's watchdog that this rank is making progress; a no-op outside an mmrun job.

    Call it once per training iteration (or more often): cheap, no system call. Lines printed through
    sys.stdout/sys.stderr count as progress too, so a loop that logs every iteration needs no call.
    """
    if _writer is not None:
        _writer.beat()


class Progress:
    """A progress file's state. A plain class: dataclasses would add 10 ms to every rank's start."""

    __slots__ = ("rank", "local_rank", "created", "last_progress", "beats", "writer_pid", "writer_start", "finished", "tail")

    def __init__(self, rank: int, local_rank: int, created: float, last_progress: float, beats: int, writer_pid: int,
                 writer_start: int, finished: bool, tail: tuple[str, ...]):
        self.rank, self.local_rank = rank, local_rank
        self.created = created  # CLOCK_MONOTONIC seconds
        self.last_progress = last_progress  # last output or heartbeat; `created` when there was none
        self.beats = beats
        self.writer_pid, self.writer_start = writer_pid, writer_start
        self.finished = finished  # the script returned; its process is ending
        self.tail = tail  # last lines of output, oldest first

    def silent_for(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.last_progress

    def writer_alive(self) -> bool:
        """False once the bootstrap that created the file has ended (or its PID now names another process)."""
        return start_ticks(self.writer_pid) == self.writer_start


def read_progress(path: str | os.PathLike, lines: int = TAIL_LINES) -> Progress | None:
    """The file's state with its last `lines` lines of output (0: the header only, for frequent polls);
    None when it is missing or not a progress file."""
    size = FILE_BYTES if lines > 0 else HEADER.size
    try:
        with open(path, "rb") as handle:
            raw = handle.read(size)
    except OSError:
        return None
    if len(raw) < size or raw[:8] != MAGIC:
        return None
    _, written, last, beats, created, pid, ticks, rank, local_rank, finished = HEADER.unpack_from(raw)
    found: list[str] = []
    if lines > 0:
        ring = raw[HEADER.size:]
        cut = written % RING_BYTES
        data = ring[:written] if written <= RING_BYTES else ring[cut:] + ring[:cut]
        found = data.decode("utf-8", errors="replace").splitlines()
        if written > RING_BYTES and found:
            found = found[1:]  # the ring's oldest line lost its beginning
    return Progress(rank, local_rank, created, max(last, created), beats, pid, ticks, bool(finished), tuple(found[-lines:]) if lines else ())
