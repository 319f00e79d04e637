"""Run the analysis over many files in worker processes that a crash inside LibCST cannot take down.

LibCST parses in native code: on some input it overflows the stack (a segfault) or works for
minutes and GiBs before answering (limits.py has the measurements). So every file, with
`--jobs 1` too, is analysed in a worker process. Each worker parses on a thread with a stack of
`Limits.stack_bytes`, and before each file arms a CPU-time alarm (ITIMER_PROF, whose default action
ends the process) and an address-space limit. The parent hands out one file at a time and
watches each worker: a worker that dies takes only its file with it, which comes back skipped
with the reason (signal, time or memory); a new worker takes over and the run goes on. Results
come back in input order whatever `jobs` is.
"""
from __future__ import annotations

import faulthandler
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing import connection, get_all_start_methods, get_context
from pathlib import Path
from typing import Callable, Iterator

from .findings import FileResult, Finding
from .runner import RunConfig, analyse_file, make_index

try:
    import resource
except ImportError:   # not on Windows: no memory limit there, the other guards still hold
    resource = None  # type: ignore[assignment]

_READY = "ready"
_MEMORY_FAILED = re.compile(r"memory allocation of \d+ bytes failed|MemoryError|Cannot allocate memory")


class WorkerStartError(RuntimeError):
    """A worker process could not start (the message is one line: why)."""


@dataclass
class RunResult:
    files: list[FileResult] = field(default_factory=list)   # in the order of the items given
    seconds: float = 0.0

    @property
    def findings(self) -> list[Finding]:
        return [f for r in self.files for f in r.findings]

    @property
    def skipped(self) -> list[FileResult]:
        return [r for r in self.files if r.skipped]


# ---------------------------------------------------------------------- inside a worker
def _address_space() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _limit_memory(extra: int) -> None:
    """Let this process grow by at most `extra` bytes from now on (beyond that, allocations fail)."""
    used = _address_space()
    if resource is None or used is None:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = used + extra if hard == resource.RLIM_INFINITY else min(used + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _cpu_alarm(seconds: float) -> None:
    """End this process (SIGPROF) once it has used `seconds` more of CPU time; 0 disarms."""
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_PROF, seconds)


def _serve(conn, config: RunConfig) -> None:
    try:
        index = make_index(config)
    except BaseException as exc:  # noqa: BLE001 - said on stderr, where the parent reads why
        os.write(2, f"\n{type(exc).__name__}: {exc}\n".encode("utf-8", "replace"))
        return
    limits = config.limits
    # This thread's stack (limits.stack_bytes) has room for LibCST's visitors on deep trees.
    sys.setrecursionlimit(max(sys.getrecursionlimit(), limits.recursion_limit))
    conn.send(_READY)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return   # the parent is gone
        if job is None:
            return
        number, path, display, size = job
        _limit_memory(limits.memory_bytes)
        _cpu_alarm(limits.cpu_budget(size))
        result = analyse_file(path, display, index, fix=config.fix, limits=limits)
        _cpu_alarm(0)
        try:
            conn.send((number, result))
        except (EOFError, OSError):
            return


def _worker_main(conn, config: RunConfig, stderr_path: str) -> None:
    # Ctrl-C is the parent's to handle: it stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A crash is reported by the parent in one line; a Python stack dump (PYTHONFAULTHANDLER,
    # pytest) would only add noise on the user's terminal.
    faulthandler.disable()
    if hasattr(signal, "SIGPROF"):
        signal.signal(signal.SIGPROF, signal.SIG_DFL)   # the CPU alarm ends the process
    # What native code prints when it dies ("memory allocation of N bytes failed") goes to a file
    # the parent reads for the reason, not onto the user's terminal.
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    threading.stack_size(config.limits.stack_bytes)
    worker = threading.Thread(target=_serve, args=(conn, config), name="mmrun-analyse")
    worker.start()
    worker.join()


# ---------------------------------------------------------------------- in the parent
def _context():
    # fork is the fastest start and shares the loaded rules; it is only safe without other threads.
    methods = get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return get_context("fork")
    return get_context("forkserver" if "forkserver" in methods else "spawn")


def _stderr_tail(path: str) -> list[str]:
    """The last non-empty lines a worker wrote to its stderr file (what native code says as it dies)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [" ".join(line.split())[:200] for line in text.splitlines() if line.strip()]


_START_SECONDS = 120.0   # a worker that has not said "ready" by then is given up


class _Worker:
    def __init__(self, ctx, config: RunConfig, stderr_path: str) -> None:
        self.stderr_path = stderr_path
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, config, stderr_path), daemon=True,
                                   name="mmrun-analyse-worker")
        self.process.start()
        child.close()
        self.ready = False
        self.job: tuple[int, str, int] | None = None   # (item number, display, size) in flight
        self.deadline = time.monotonic() + _START_SECONDS
        self.timed_out = False

    def assign(self, number: int, item: tuple[str, str], size: int, wall: float) -> bool:
        """Send one file; False when the worker is already gone (its death is handled elsewhere)."""
        path, display = item
        try:
            self.conn.send((number, path, display, size))
        except OSError:
            return False
        self.job = (number, display, size)
        self.deadline = time.monotonic() + wall
        return True

    def receive(self):
        """The worker's next message; _NOTHING if none is there yet; None when it has died."""
        try:
            if self.conn.poll():
                return self.conn.recv()
        except (EOFError, OSError):
            pass
        if self.process.is_alive():
            return _NOTHING
        self.process.join()
        return None

    def stop(self, now: bool = False) -> None:
        if now and self.process.is_alive():
            self.process.kill()
        elif self.process.is_alive() and self.job is None:
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.conn.close()
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)   # a process stuck in the kernel cannot be waited for


_NOTHING = object()


def _death_reason(worker: _Worker, config: RunConfig) -> str:
    """Why the worker died on its file, in words (the file is then skipped with this reason)."""
    limits, size = config.limits, worker.job[2] if worker.job else 0
    code = worker.process.exitcode
    tail = _stderr_tail(worker.stderr_path)
    said = tail[-1] if tail else ""
    if worker.timed_out:
        return f"no answer after {limits.wall_budget(size):.3g} s; stopped"
    if code is not None and code < 0 and -code == getattr(signal, "SIGPROF", -1):
        return (f"took more than {limits.cpu_budget(size):.3g} s of CPU time (LibCST's parser is slow on "
                "deeply nested or very long expressions)")
    if any(_MEMORY_FAILED.search(line) for line in tail):
        return f"needed more than {limits.memory_bytes >> 20} MiB of memory (LibCST's parser)"
    if code is not None and code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
        if -code == getattr(signal, "SIGKILL", 9):
            how += ", perhaps by the system for lack of memory"
    else:
        how = f"exit status {code}"
    return f"the analysis process crashed ({how}{': ' + said if said else ''})"


class _Pool:
    """`jobs` supervised workers; `results(items, sizes)` yields (item number, FileResult)."""

    def __init__(self, config: RunConfig, jobs: int) -> None:
        self.config = config
        self.jobs = jobs
        self.ctx = _context()
        self.folder = tempfile.TemporaryDirectory(prefix="mmrun-analyse-")
        self.workers: list[_Worker] = []
        self.started = 0

    def __enter__(self) -> "_Pool":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        for worker in self.workers:
            worker.stop(now=kind is not None)   # interrupted: do not wait for a file to finish
        self.workers = []
        self.folder.cleanup()

    def _start(self) -> None:
        self.started += 1
        stderr_path = str(Path(self.folder.name, f"worker-{self.started}.stderr"))
        try:
            self.workers.append(_Worker(self.ctx, self.config, stderr_path))
        except OSError as exc:
            raise WorkerStartError(f"cannot start an analysis worker process ({exc.strerror or exc})") from None

    def _retire(self, worker: _Worker) -> FileResult | None:
        """Remove a dead (or stopped) worker; the skipped result for its file, if it had one."""
        self.workers.remove(worker)
        worker.stop(now=True)
        if not worker.ready:
            tail = _stderr_tail(worker.stderr_path)
            said = tail[-1] if tail else ""
            raise WorkerStartError("an analysis worker process " + (
                f"did not start within {_START_SECONDS:.0f} s" if worker.timed_out else "failed to start")
                + (f": {said}" if said else ""))
        if worker.job is None:
            return None
        return FileResult(path=worker.job[1], skipped=_death_reason(worker, self.config))

    def results(self, items: list[tuple[str, str]], sizes: list[int]) -> Iterator[tuple[int, FileResult]]:
        todo = deque(range(len(items)))
        limits = self.config.limits
        while todo or any(w.job is not None for w in self.workers):
            busy = sum(w.job is not None for w in self.workers)
            while len(self.workers) < min(self.jobs, busy + len(todo)):
                self._start()
            for worker in self.workers:
                if worker.ready and worker.job is None and todo:
                    number = todo[0]
                    size = sizes[number]
                    if worker.assign(number, items[number], size, limits.wall_budget(size)):
                        todo.popleft()
            waiting = {}
            for worker in self.workers:
                waiting[worker.conn] = worker
                waiting[worker.process.sentinel] = worker
            deadline = min(w.deadline for w in self.workers)
            connection.wait(list(waiting), None if deadline == float("inf") else max(0.0, deadline - time.monotonic()))
            for worker in list(self.workers):
                message = worker.receive()
                if message is _NOTHING:
                    if time.monotonic() <= worker.deadline:
                        continue
                    worker.timed_out = True   # no answer in time: stop it, skip its file
                    message = None
                if message is None:
                    skipped = self._retire(worker)
                    if skipped is not None:
                        yield worker.job[0], skipped
                elif message == _READY:
                    worker.ready = True
                    worker.deadline = float("inf")
                else:
                    number, result = message
                    worker.job, worker.deadline = None, float("inf")
                    yield number, result


def run(items: list[tuple[str, str]], config: RunConfig, *, jobs: int = 1,
        progress: Callable[[int, int], None] | None = None) -> RunResult:
    """Analyse (file, display) pairs in `jobs` worker processes; results in input order."""
    started = time.perf_counter()
    results: list[FileResult | None] = [None] * len(items)
    sizes = []
    for path, _ in items:
        try:
            sizes.append(os.stat(path).st_size)
        except OSError:
            sizes.append(0)   # the worker says why it cannot read it
    if items:
        with _Pool(config, max(1, min(jobs, len(items)))) as pool:
            for done, (number, result) in enumerate(pool.results(items, sizes), 1):
                results[number] = result
                if progress is not None:
                    progress(done, len(items))
    return RunResult(files=results, seconds=time.perf_counter() - started)   # type: ignore[arg-type]


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def stderr_progress(every: int = 100) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        if total >= 2 * every and (done % every == 0 or done == total):
            print(f"mmrun analyse: {done}/{total} files", file=sys.stderr, flush=True)
    return report
