"""What torchrun and msrun start in each worker when the job comes through `mmrun`: a thin parent.

`python worker_bootstrap.py [-m] SCRIPT [args]`:
1. exports the torch-style rank variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
   MASTER_PORT) that msrun does not set, derived from its RANK_ID/RANK_SIZE/DEVICE_ID/MS_SCHED_*;
2. in msrun's scheduler process (MS_ROLE=MS_SCHED) runs only the scheduler, never the user's training body;
3. otherwise runs the script in a child process (`worker_script.py`, same interpreter and flags, same
   stdout/stderr, its own process group), forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2
   to that group, and waits;
4. writes the child's exact end to $MMRUN_STATUS_DIR/rank_<RANK>.json (exit code, or the signal that
   killed it, and its last lines), because torchrun turns every failure into 1, msrun hides the code
   in its logs, and a rank killed by SIGKILL cannot write anything itself;
5. ends the same way: the child's exit code, or the same signal raised on itself, so torchrun and
   msrun see what they would have seen without it.

It stays small and imports only the standard library, mmrun.backend.rank_env, mmrun.launchers.heartbeat
and, at the end, mmrun.common.atomic_write: it costs one extra interpreter start per rank.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

from mmrun.launchers import heartbeat

STATUS_DIR_VAR = "MMRUN_STATUS_DIR"
NODE_RANK_VAR = "MMRUN_NODE_RANK"
PARENT_PID_VAR = "MMRUN_BOOTSTRAP_PID"  # tells the child which process to die with
SCRIPT_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_script.py")
# torchrun forwards SIGTERM, SIGINT, SIGHUP and SIGQUIT by default; SLURM sends SIGUSR1/2 before a preemption.
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
CORE_DUMPING = (signal.SIGQUIT, signal.SIGILL, signal.SIGABRT, signal.SIGFPE, signal.SIGSEGV, signal.SIGBUS,
                signal.SIGSYS, signal.SIGTRAP)


def set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel to send `signum` to this process when its parent ends (Linux); False where it cannot."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum) == 0
    except (OSError, AttributeError):
        return False


def _run_scheduler() -> int:
    # msrun starts a scheduler on every node whose address is --master_addr; when several "nodes" share
    # one host (tests, or a node list that names the master twice) only node rank 0 may serve.
    if os.environ.get(NODE_RANK_VAR, "0") not in ("0", "-1"):
        return 0
    os.environ.setdefault("MMRUN_AI_FRAMEWORK", "mindspore")
    import mmrun.backend as backend

    backend.init_distributed()  # in the scheduler this serves the cluster and returns when the job ends
    return 0


def _interpreter_command() -> list[str]:
    """This interpreter with the flags it was started with (torchrun passes -u; a user may add -X, -W, -O)."""
    flags = sys.orig_argv[1:len(sys.orig_argv) - len(sys.argv)]
    return [sys.executable, *flags]


class _Child:
    """The script's process; signals that reach the bootstrap before or while it runs go to its group."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.pending: list[int] = []

    def forward(self, signum: int, _frame) -> None:
        if self.pid is None:
            self.pending.append(signum)
            return
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass

    def run(self, argv: list[str]) -> int:
        """The child's wait status."""
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, self.forward)
        env = {**os.environ, PARENT_PID_VAR: str(os.getpid())}
        # Its own process group: a signal sent to the bootstrap's group reaches the script once, forwarded.
        self.pid = os.posix_spawn(sys.executable, [*_interpreter_command(), SCRIPT_RUNNER, *argv], env, setpgroup=0)
        for signum in self.pending:
            self.forward(signum, None)
        _, status = os.waitpid(self.pid, 0)  # retried by Python after each forwarded signal
        return status


def _write_status(status_dir: str, progress_file: str, child_pid: int, wait_status: int) -> None:
    code = os.waitstatus_to_exitcode(wait_status)
    killed_by = -code if code < 0 else None
    progress = heartbeat.read_progress(progress_file)
    record = {
        "rank": int(os.environ.get("RANK", "0")),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "exit_code": 128 + killed_by if killed_by else code,
        "signal": killed_by,
        "time": time.time(),
        "pid": child_pid,
        "tail": list(progress.tail) if progress else [],
    }
    from mmrun.common.atomic_write import atomic_write

    try:
        atomic_write(os.path.join(status_dir, f"rank_{record['rank']}.json"), json.dumps(record))
    except OSError:
        pass  # the status is a diagnosis aid; never turn a worker's result into a bootstrap failure


def _end_like(wait_status: int) -> int:
    """Exit as the child did: with its code, or by the signal that killed it."""
    code = os.waitstatus_to_exitcode(wait_status)
    if code >= 0:
        return code
    killed_by = -code
    if killed_by in CORE_DUMPING:  # the child's core (if any) is the one worth keeping
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if killed_by not in (signal.SIGKILL, signal.SIGSTOP):  # these two cannot be caught or blocked anyway
        signal.signal(killed_by, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [killed_by])
    os.kill(os.getpid(), killed_by)
    return 128 + killed_by  # only for a signal whose default action does not end the process


def main(argv: list[str]) -> int:
    from mmrun.backend.rank_env import read_rank_info, torch_style_variables

    os.environ.update(torch_style_variables())
    if read_rank_info().is_scheduler:
        return _run_scheduler()
    if not argv or argv == ["-m"]:
        print("worker_bootstrap: no script given", file=sys.stderr)
        return 2

    status_dir = os.environ.get(STATUS_DIR_VAR)
    progress_file = None
    if status_dir:
        rank = os.environ.get("RANK", "0")
        progress_file = os.path.join(status_dir, f"rank_{rank}.progress")
        try:
            os.unlink(os.path.join(status_dir, f"rank_{rank}.json"))  # a restarted rank's earlier end
        except FileNotFoundError:
            pass
        heartbeat.create(progress_file, os.getpid(), int(rank), int(os.environ.get("LOCAL_RANK", "0")))
        os.environ[heartbeat.PROGRESS_FILE_VAR] = progress_file

    child = _Child()
    wait_status = child.run(argv)
    if status_dir and progress_file:
        _write_status(status_dir, progress_file, child.pid, wait_status)
    return _end_like(wait_status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
