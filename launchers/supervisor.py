"""Start a launcher, forward signals to it, and leave no process behind.

Every process of a job carries `MMRUN_RUN_ID=<id>` in its environment (children inherit it), so the
job's processes are found by that tag in /proc even when they left the launcher's process group: msrun
was seen leaving workers and its scheduler behind after it exited.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from mmrun.common.processes import set_parent_death_signal
from mmrun.launchers.console import Relay

RUN_ID_VARIABLE = "MMRUN_RUN_ID"
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def processes_with(*variables: str) -> list[int]:
    """PIDs (other than this one) whose environment holds every one of these `NAME=value` entries."""
    wanted = [v.encode() for v in variables]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile, or not ours to read
        if all(v in environment for v in wanted):
            found.append(int(entry.name))
    return found


def tagged_processes(run_id: str, role: str | None = None) -> list[int]:
    """PIDs whose environment carries this run's tag (and MS_ROLE=role, when given)."""
    return processes_with(f"{RUN_ID_VARIABLE}={run_id}", *([f"MS_ROLE={role}"] if role else []))


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def reap(run_id: str, grace: float = 5.0) -> list[int]:
    """SIGTERM every tagged process, SIGKILL what is left after `grace` seconds; returns who was found."""
    pids = tagged_processes(run_id)
    if not pids:
        return []
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and tagged_processes(run_id):
        time.sleep(0.05)
    _signal_all(tagged_processes(run_id), signal.SIGKILL)
    # A killed process stays in /proc until its parent reaps it; zombies of our own child are reaped by wait().
    return pids


def wait_for_workers(run_id: str, stop_when: Callable[[], bool] | None = None, poll: float = 0.25) -> None:
    """Wait until no msrun worker of this run is alive (used when msrun itself did not join).

    `stop_when` is polled meanwhile; when it answers True every process of the run is reaped.
    """
    while tagged_processes(run_id, role="MS_WORKER"):
        if stop_when is not None and stop_when():
            reap(run_id, grace=2.0)
            return
        time.sleep(poll)


def _die_with_parent() -> None:
    """In the launcher's child: get SIGTERM if mmrun dies, even by SIGKILL, which no handler can forward."""
    set_parent_death_signal(signal.SIGTERM)  # where it is missing, the guardian still reaps the job


class Supervisor:
    """Runs one launcher command in its own session; SIGINT, SIGTERM and SIGHUP to mmrun reach all its processes.

    `stop_when` is polled a few times a second while the launcher runs; an exit code from it stops the
    whole job (msrun does not stop on a failed worker; nothing stops a silent one) and becomes the
    result in `stopped_with`.
    """

    def __init__(self, command: list[str], env: dict[str, str], run_id: str, shutdown_grace: float = 10.0,
                 stop_when: Callable[[], int | None] | None = None, poll: float = 0.25,
                 quiet_mindspore: bool = False):
        self.command = command
        self.quiet_mindspore = quiet_mindspore  # leave MindSpore's own INFO/WARNING lines off the console (console.py)
        self.env = {**env, RUN_ID_VARIABLE: run_id}
        self.run_id = run_id
        self.shutdown_grace = shutdown_grace
        self.stop_when = stop_when
        self.poll = poll
        self.received: int | None = None
        self.stopped_with: int | None = None
        self.process: subprocess.Popen | None = None

    def _forward(self, signum: int, _frame) -> None:
        self.received = signum
        self._signal_launcher(signum)

    def _signal_launcher(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signum)
            except ProcessLookupError:
                pass

    def run(self) -> int:
        """The launcher's exit code; after a forwarded signal, 128 + signal number."""
        previous = {sig: signal.signal(sig, self._forward) for sig in FORWARDED_SIGNALS}
        try:
            # A new session: the launcher's own signal handling cannot reach mmrun, and the group is ours to kill.
            pipe = subprocess.PIPE if self.quiet_mindspore else None
            self.process = subprocess.Popen(self.command, env=self.env, start_new_session=True, preexec_fn=_die_with_parent,
                                            stdout=pipe, stderr=pipe)
            relays = [Relay(self.process.stdout, 1), Relay(self.process.stderr, 2)] if self.quiet_mindspore else []
            deadline: float | None = None
            while True:
                try:
                    code = self.process.wait(timeout=self.poll)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if self.received is None and self.stopped_with is None and self.stop_when is not None:
                    self.stopped_with = self.stop_when()
                    if self.stopped_with is not None:
                        self._signal_launcher(signal.SIGTERM)
                        reap(self.run_id, grace=2.0)
                        continue
                if self.received is None:
                    continue
                deadline = deadline or time.monotonic() + self.shutdown_grace
                if time.monotonic() > deadline:  # the launcher did not stop its workers in time
                    os.killpg(self.process.pid, signal.SIGKILL)
            for relay in relays:  # the launcher's last lines; a process it left holding the pipe cannot hold mmrun
                relay.join(timeout=2.0)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.received is not None:
            reap(self.run_id, grace=2.0)
            return 128 + self.received
        return code
