"""What torchrun and msrun start in each worker when the job comes through `mmrun`.

`python worker_bootstrap.py [-m] SCRIPT [args]`:
1. exports the torch-style rank variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
   MASTER_PORT) that msrun does not set, derived from its RANK_ID/RANK_SIZE/DEVICE_ID/MS_SCHED_*;
2. in msrun's scheduler process (MS_ROLE=MS_SCHED) runs only the scheduler, never the user's training body;
3. runs SCRIPT as `__main__` (or a module with -m), exactly as `python SCRIPT args` would;
4. records the worker's own exit code in $MMRUN_STATUS_DIR/rank_<RANK>.json, because torchrun turns
   every failure into 1 and msrun hides the code in its logs.

This file is run by path, so its folder lands on sys.path[0]; it is replaced by the script's folder
before any user code runs. Only the standard library, mmrun.backend.rank_env and mmrun.common are
imported here.
"""
from __future__ import annotations

import collections
import json
import os
import runpy
import sys
import time
import traceback

STATUS_DIR_VAR = "MMRUN_STATUS_DIR"
NODE_RANK_VAR = "MMRUN_NODE_RANK"


TAIL_LINES = 20


class _Tail:
    """The last lines a worker wrote through sys.stdout/sys.stderr, interleaved in write order.

    Kept in memory and put in the status file, so mmrun can show a failed rank's last lines without
    asking torchrun for per-rank log files (its --tee costs about 0.35 s per job).
    """

    def __init__(self, lines: int = TAIL_LINES):
        self.lines: collections.deque[str] = collections.deque(maxlen=lines)
        self.partial = ""

    def record(self, text: str) -> None:
        pieces = (self.partial + text).split("\n")
        self.partial = pieces.pop()
        self.lines.extend(pieces)

    def snapshot(self) -> list[str]:
        return [*self.lines, *([self.partial] if self.partial else [])][-self.lines.maxlen:]


class _TeeToTail:
    """A text stream that passes writes through and records them in a _Tail."""

    def __init__(self, stream, tail: _Tail):
        self._stream, self._tail = stream, tail

    def write(self, text: str) -> int:
        self._tail.record(text)
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


_tail = _Tail()


def _write_status(exit_code: int, error: str | None) -> None:
    status_dir = os.environ.get(STATUS_DIR_VAR)
    if not status_dir:
        return
    rank = os.environ.get("RANK", "0")
    record = {
        "rank": int(rank),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "exit_code": exit_code,
        "time": time.time(),
        "pid": os.getpid(),
        "error": error,
        "tail": _tail.snapshot(),
    }
    from mmrun.common.atomic_write import atomic_write

    try:
        atomic_write(os.path.join(status_dir, f"rank_{rank}.json"), json.dumps(record))
    except OSError:
        pass  # the status is a diagnosis aid; never turn a worker's result into a bootstrap failure


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # what python itself does with sys.exit("message")
    return 1


def _run_scheduler() -> int:
    # msrun starts a scheduler on every node whose address is --master_addr; when several "nodes" share
    # one host (tests, or a node list that names the master twice) only node rank 0 may serve.
    if os.environ.get(NODE_RANK_VAR, "0") not in ("0", "-1"):
        return 0
    os.environ.setdefault("MMRUN_AI_FRAMEWORK", "mindspore")
    import mmrun.backend as backend

    backend.init_distributed()  # in the scheduler this serves the cluster and returns when the job ends
    return 0


def main(argv: list[str]) -> int:
    from mmrun.backend.rank_env import read_rank_info, torch_style_variables

    os.environ.update(torch_style_variables())
    if read_rank_info().is_scheduler:
        return _run_scheduler()

    as_module = bool(argv) and argv[0] == "-m"
    if as_module:
        argv = argv[1:]
    if not argv:
        print("worker_bootstrap: no script given", file=sys.stderr)
        return 2
    target, args = argv[0], argv[1:]
    sys.path[0] = os.getcwd() if as_module else os.path.dirname(os.path.abspath(target))
    sys.argv = [target, *args]

    sys.stdout, sys.stderr = _TeeToTail(sys.stdout, _tail), _TeeToTail(sys.stderr, _tail)
    code, error = 0, None
    try:
        if as_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        code, error = 130, "KeyboardInterrupt"
    except BaseException:  # noqa: BLE001 - report any failure the way python would, then exit 1
        error = traceback.format_exc()
        sys.stderr.write(error)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    _write_status(code, error)
    if _destroy_torch_process_group():
        _exit_before_finalization(code)
    if code == 0 and os.environ.get("MS_ROLE") == "MS_WORKER":
        _join_msrun_cluster()
    return code


def _destroy_torch_process_group() -> bool:
    """Tear down a torch process group the script left alive (most Megatron scripts do); True if there was one.

    Left to interpreter exit, its C++ threads can outlive what they use and abort the process
    ("terminate called without an active exception", SIGABRT): measured in 2 of 13 two-node runs on
    this machine, where the finished rank then counts as failed and the other node waits for it.
    torch is never imported here for a script that did not use it.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return False
    dist.destroy_process_group()
    return True


def _exit_before_finalization(code: int) -> None:
    """End the process the way interpreter exit would, minus the C++ teardown of torch.distributed.

    The teardown can still abort a rank that finished cleanly (seen once in a full CI run, with the
    process group destroyed: a 2-process training job whose rank 0 printed its last line, then died
    of SIGABRT; torch's own fix, an atexit destroy, was abandoned upstream). So: wait for the script's
    non-daemon threads, run its atexit handlers, flush every open file, and leave with os._exit.
    """
    import atexit
    import gc
    import io
    import threading

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads __class__, which some objects turn into a warning.
        if issubclass(type(obj), io.IOBase) and not obj.closed:
            try:
                obj.flush()
            except (OSError, ValueError):  # a pipe whose reader is gone, a detached buffer
                pass
    os._exit(code)


def _join_msrun_cluster() -> None:
    """msrun's scheduler waits (up to --cluster_time_out, 600 s) for every worker to register.

    A script that never initialised communication (a single-rank job, a data tool) would leave it
    waiting; registering at the end lets the job finish. A failed worker skips this: msrun stops the
    job on its own when a worker fails.
    """
    os.environ.setdefault("MMRUN_AI_FRAMEWORK", "mindspore")
    import mmrun.backend as backend

    backend.init_distributed()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
