"""What torchrun and msrun start in each worker when the job comes through `mmrun`: a thin parent.

`python worker_bootstrap.py [-m] SCRIPT [args]`:
1. exports the torch-style rank variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
   MASTER_PORT) that msrun does not set, derived from its RANK_ID/RANK_SIZE/DEVICE_ID/MS_SCHED_*;
2. forks a child that runs, in msrun's scheduler process (MS_ROLE=MS_SCHED), only the scheduler (never
   the user's training body), and otherwise the script (`worker_script.py`: same interpreter, flags,
   stdout/stderr and environment; its own process group), forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT,
   SIGUSR1 and SIGUSR2 to that group, and waits;
4. writes the child's exact end to $MMRUN_STATUS_DIR/rank_<RANK>.json (exit code, or the signal that
   killed it; the stopping signal it forwarded, if any; its last lines), because torchrun turns every
   failure into 1, msrun hides the code in its logs, and a rank killed by SIGKILL cannot write anything;
5. ends the same way: the child's exit code, or the same signal raised on itself, so torchrun and
   msrun see what they would have seen without it.

It imports only the standard library, mmrun.backend.rank_env, mmrun.launchers.heartbeat and, at the
end, mmrun.common.atomic_write; the fork costs about a millisecond (see benchmarks/worker_bootstrap_cost.py).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

from mmrun.common.processes import set_parent_death_signal
from mmrun.launchers import heartbeat

STATUS_DIR_VAR = "MMRUN_STATUS_DIR"
# in $MMRUN_STATUS_DIR, per rank: its end (written once it ended) and its progress file (while it runs)
STATUS_FILE, PROGRESS_FILE = "rank_{rank}.json", "rank_{rank}.progress"
SCHEDULER = "scheduler"  # msrun's scheduler's: scheduler.json, scheduler.progress
NODE_RANK_VAR = "MMRUN_NODE_RANK"
# torchrun stops its workers with SIGTERM (and forwards SIGINT, SIGHUP, SIGQUIT); SLURM warns of a preemption
# with SIGUSR1/2, which a script may catch to save a checkpoint.
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
FORWARDED_SIGNALS = (*STOPPING_SIGNALS, signal.SIGUSR1, signal.SIGUSR2)
CORE_DUMPING = (signal.SIGQUIT, signal.SIGILL, signal.SIGABRT, signal.SIGFPE, signal.SIGSEGV, signal.SIGBUS,
                signal.SIGSYS, signal.SIGTRAP)


def _run_scheduler() -> int:
    # msrun starts a scheduler on every node whose address is --master_addr; when several "nodes" share
    # one host (tests, or a node list that names the master twice) only node rank 0 may serve.
    if os.environ.get(NODE_RANK_VAR, "0") not in ("0", "-1"):
        return 0
    os.environ.setdefault("MMRUN_AI_FRAMEWORK", "mindspore")
    import mmrun.backend as backend

    backend.init_distributed()  # in the scheduler this serves the cluster and returns when the job ends
    return 0


class _Child:
    """The script's process; signals that reach the bootstrap while it runs go to its process group."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.forwarded: int | None = None  # the first stopping signal passed on: the launcher (or someone) stopped this rank

    def forward(self, signum: int, _frame) -> None:
        if signum in STOPPING_SIGNALS:
            self.forwarded = self.forwarded or signum
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass

    def fork(self) -> int:
        """os.fork(): 0 in the child, which then runs the script; its pid in the bootstrap.

        A fork, not a new interpreter: the script starts as fast as it did in the bootstrap itself,
        with the same interpreter flags (torchrun passes -u), file descriptors and environment. The
        forwarded signals are blocked across the fork, so none reaches a half-made child.
        """
        parent = os.getpid()
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
        previous = {sig: signal.signal(sig, self.forward) for sig in FORWARDED_SIGNALS}
        self.pid = os.fork()
        if self.pid == 0:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            # Its own process group: a signal to the bootstrap's group (torchrun's way) reaches the script once, forwarded.
            os.setpgid(0, 0)
            # A bootstrap killed outright (SIGKILL) takes its script with it.
            if set_parent_death_signal(signal.SIGKILL) and os.getppid() != parent:
                os._exit(128 + signal.SIGKILL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
        return self.pid

    def wait(self) -> int:
        """The child's wait status."""
        _, status = os.waitpid(self.pid, 0)  # retried by Python after each forwarded signal
        return status

    def wait_scheduler(self, status_dir: str | None, world_size: int) -> int:
        """The scheduler child's wait status; a clean end (0) as soon as every rank has written its own.

        MindSpore's scheduler notices that the workers left on a 5-second tick, and msrun waits for it, so
        every msrun job ended 0.5 to 5 s after its last rank (measured: 4.5 to 5 s from the last worker's
        unregistering to msrun's exit). A rank's record is written after its script's process has exited,
        so once all of them are there the scheduler serves no one. Records older than this scheduler
        (a restarted job) do not count; without $MMRUN_STATUS_DIR, or with ranks on other machines
        writing elsewhere, the scheduler ends on its own as before.
        """
        if not status_dir:
            return self.wait()
        started = time.time()
        names = [os.path.join(status_dir, STATUS_FILE.format(rank=r)) for r in range(world_size)]
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return status
            if all(_written_since(name, started) for name in names):
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(self.pid, 0)
                return 0  # the wait status of exit code 0: the scheduler's work was done
            time.sleep(0.25)


def _written_since(path: str, since: float) -> bool:
    try:
        return os.stat(path).st_mtime >= since
    except OSError:
        return False


def _write_status(status_dir: str, name: str, progress_file: str, child: _Child, wait_status: int) -> None:
    code = os.waitstatus_to_exitcode(wait_status)
    killed_by = -code if code < 0 else None
    progress = heartbeat.read_progress(progress_file)
    record = {
        "rank": int(os.environ.get("RANK", "0")),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "exit_code": 128 + killed_by if killed_by else code,
        "signal": killed_by,
        "forwarded": child.forwarded,
        "time": time.time(),
        "pid": child.pid,
        "tail": list(progress.tail) if progress else [],
    }
    _save(status_dir, name, record)


def _save(status_dir: str, name: str, record: dict) -> None:
    from mmrun.common.atomic_write import atomic_write

    try:
        atomic_write(os.path.join(status_dir, name), json.dumps(record))
    except OSError:
        pass  # the status is a diagnosis aid; never turn a worker's result into a bootstrap failure


def _end_like(wait_status: int) -> int:
    """Exit as the child did: with its code, or by the signal that killed it."""
    code = os.waitstatus_to_exitcode(wait_status)
    if code >= 0:
        return code
    killed_by = -code
    sys.stdout.flush()
    sys.stderr.flush()
    if killed_by in CORE_DUMPING:  # the child's core (if any) is the one worth keeping
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if killed_by not in (signal.SIGKILL, signal.SIGSTOP):  # these two cannot be caught or blocked anyway
        signal.signal(killed_by, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [killed_by])
    os.kill(os.getpid(), killed_by)
    return 128 + killed_by  # only for a signal whose default action does not end the process


def _leave(code: int) -> None:
    """The bootstrap's own exit: nothing of its own to flush or finalize beyond stdio, so no interpreter teardown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str]) -> int:
    from mmrun.backend.rank_env import read_rank_info, torch_style_variables

    os.environ.update(torch_style_variables())
    scheduler = read_rank_info().is_scheduler
    if not scheduler and (not argv or argv == ["-m"]):
        print("worker_bootstrap: no script given", file=sys.stderr)
        return 2

    # msrun's scheduler gets the same record as a rank: its ranks would wait --cluster_time_out (600 s)
    # for a scheduler that died, so mmrun stops the job when it ends badly before they do.
    status_dir = os.environ.get(STATUS_DIR_VAR)
    rank = os.environ.get("RANK", "0")
    status_name, progress_name = ((f"{SCHEDULER}.json", f"{SCHEDULER}.progress") if scheduler
                                  else (STATUS_FILE.format(rank=rank), PROGRESS_FILE.format(rank=rank)))
    progress_file = os.path.join(status_dir, progress_name) if status_dir else None
    if status_dir:
        try:
            os.unlink(os.path.join(status_dir, status_name))  # a restarted rank's earlier end
        except FileNotFoundError:
            pass
        heartbeat.create(progress_file, os.getpid(), -1 if scheduler else int(rank), int(os.environ.get("LOCAL_RANK", "0")))
        os.environ[heartbeat.PROGRESS_FILE_VAR] = progress_file

    child = _Child()
    if child.fork() == 0:
        if scheduler:
            return _run_scheduler()
        from mmrun.launchers import worker_script

        return worker_script.run(argv)
    wait_status = child.wait_scheduler(status_dir, read_rank_info().world_size) if scheduler else child.wait()
    if status_dir:
        _write_status(status_dir, status_name, progress_file, child, wait_status)
    _leave(_end_like(wait_status))
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
