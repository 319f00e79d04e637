"""A guardian that outlives mmrun by a few seconds: however mmrun ends, no process of its job survives it.

mmrun forks the guardian before it starts the launcher. The guardian moves to its own session (a
signal to mmrun's process group or terminal does not reach it), closes every inherited file but
stderr, and blocks reading one end of a pipe whose other end only mmrun holds (close-on-exec, so no
launcher or worker inherits it). The kernel closes mmrun's end when mmrun ends by any means,
SIGKILL included:
- mmrun finished its own cleanup and wrote "done" first: the guardian exits at once;
- anything else (kill -9, the OOM killer, a crash): the guardian stops every process tagged with
  the run's MMRUN_RUN_ID (SIGTERM, then SIGKILL after a grace period), keeps sweeping until none
  has appeared for a second, removes the run's temporary folder, and exits.

Why not PR_SET_PDEATHSIG alone: it reaches only mmrun's own child (the launcher); msrun starts its
workers in sessions of their own and leaves them running when it is killed. Why a pipe and not a
pidfd: it needs no Linux 5.3 and no seccomp profile that allows pidfd_open, PIDs are never
reused under it, and it tells a clean end ("done") from a death.
"""
from __future__ import annotations

import os
import shutil
import sys
import time

from mmrun.launchers.supervisor import reap

DONE = b"done"


class Guardian:
    def __init__(self, run_id: str, temp_dir: str | None = None, grace: float = 3.0):
        self.run_id = run_id
        self.temp_dir = temp_dir
        self.grace = grace
        self.pid: int | None = None
        self._lifeline: int | None = None

    def start(self) -> None:
        read_end, write_end = os.pipe()  # both close-on-exec (PEP 446)
        pid = os.fork()
        if pid == 0:
            os.close(write_end)
            try:
                self._watch(read_end)
            finally:
                os._exit(0)
        os.close(read_end)
        self.pid, self._lifeline = pid, write_end

    def release(self) -> None:
        """mmrun's clean end: the guardian exits without sweeping (mmrun has reaped the job itself)."""
        if self._lifeline is None:
            return
        try:
            os.write(self._lifeline, DONE)
        finally:
            os.close(self._lifeline)
            self._lifeline = None
        os.waitpid(self.pid, 0)

    def _watch(self, lifeline: int) -> None:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.closerange(3, lifeline)
        os.closerange(lifeline + 1, max(lifeline + 1, os.sysconf("SC_OPEN_MAX")))
        mmrun_pid = os.getppid()
        message = b""
        while chunk := os.read(lifeline, len(DONE)):
            message += chunk
        if message == DONE:
            return
        found = self.sweep()
        if found:
            print(f"mmrun guardian: mmrun (pid {mmrun_pid}) ended without stopping its job; stopped {len(found)} "
                  f"process{'' if len(found) == 1 else 'es'} of run {self.run_id}", file=sys.stderr, flush=True)

    def sweep(self, settle: float = 1.0, limit: float = 60.0) -> set[int]:
        """Reap tagged processes until none is seen for `settle` seconds (a launcher may still be spawning)."""
        found: set[int] = set()
        quiet_since = time.monotonic()
        deadline = quiet_since + limit
        while time.monotonic() < deadline:
            reaped = reap(self.run_id, grace=self.grace)
            if reaped:
                found.update(reaped)
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= settle:
                break
            time.sleep(0.1)
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        return found
