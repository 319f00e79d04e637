"""What the child forked by `worker_bootstrap.py` does for one rank: run the user's script.

`run([-m] SCRIPT [args])`:
1. copies every line written through sys.stdout/sys.stderr into the rank's progress file
   (`launchers/heartbeat.py`): the bootstrap reports the last lines even after a SIGKILL, and the
   watchdog counts them as progress;
2. runs SCRIPT as `__main__` (or a module with -m), exactly as `python SCRIPT args` would, with the
   same stdout/stderr file descriptors the launcher gave the bootstrap;
3. ends like the script: its exit code, its atexit handlers, its threads (see `_exit_before_finalization`).

The bootstrap is run by path, so its folder is on sys.path[0]; it is replaced by the script's folder
before any user code runs.
"""
from __future__ import annotations

import os
import runpy
import sys
import traceback

from mmrun.launchers import heartbeat


class _TeeToProgress:
    """A text stream that passes writes through and copies them into the progress file."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        heartbeat.record(text)
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # what python itself does with sys.exit("message")
    return 1


def run(argv: list[str]) -> int:
    """The script's exit code (the process may end inside, with os._exit, after a torch job)."""
    progress_file = os.environ.get(heartbeat.PROGRESS_FILE_VAR)
    if progress_file:
        heartbeat.attach(progress_file)

    as_module = bool(argv) and argv[0] == "-m"
    if as_module:
        argv = argv[1:]
    target, args = argv[0], argv[1:]
    sys.path[0] = os.getcwd() if as_module else os.path.dirname(os.path.abspath(target))
    sys.argv = [target, *args]

    sys.stdout, sys.stderr = _TeeToProgress(sys.stdout), _TeeToProgress(sys.stderr)
    code = 0
    try:
        if as_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - report any failure the way python would, then exit 1
        sys.stderr.write(traceback.format_exc())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    heartbeat.script_finished()
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
