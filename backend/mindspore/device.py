"""Which device this MindSpore process runs on: Ascend, else GPU, else CPU, or MMRUN_MS_DEVICE.

MindSpore calls its devices "Ascend", "GPU" and "CPU"; mmrun reports them by the names it uses
everywhere ("npu", "cuda", "cpu", backend/vocabulary.py), so the same checks work on both frameworks.
MindSpore's names are used only to talk to MindSpore, here.
"""
from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import mindspore

from mmrun.backend import cann, checks, rank_env
from mmrun.backend.errors import UsageError
from mmrun.backend.info import DeviceInfo
from mmrun.backend.vocabulary import MINDSPORE_TARGETS

DEVICE_VAR = "MMRUN_MS_DEVICE"
# accepted spelling (lower case) -> MindSpore's device target, in detection order
TARGETS: dict[str, str] = {"ascend": "Ascend", "gpu": "GPU", "cpu": "CPU"}
# MindSpore's device target -> mmrun's device kind
KIND_OF_TARGET: dict[str, str] = {target: kind for kind, target in MINDSPORE_TARGETS.items()}

_lock = threading.Lock()
_detected: DeviceInfo | None = None


@contextmanager
def _quiet_logging() -> Iterator[None]:
    # MindSpore logs two warnings for every device it probes and does not find.
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def _runtime_present(target: str) -> bool:
    """A cheap look for the device's runtime before asking MindSpore (whose probe is noisy)."""
    if target == "Ascend":
        return cann.cann_location() is not None
    if target == "GPU":
        return os.path.exists("/dev/nvidiactl")
    return True


def _available(target: str) -> bool:
    if target == "CPU":
        return True
    probe = {"Ascend": mindspore.device_context.ascend, "GPU": mindspore.device_context.gpu}[target]
    return bool(probe.is_available())


def _target() -> str:
    forced = os.environ.get(DEVICE_VAR, "").strip()
    if forced:
        target = TARGETS.get(forced.lower())
        if target is None:
            raise UsageError(
                f"{DEVICE_VAR} must be one of {', '.join(TARGETS.values())}. Received: {DEVICE_VAR}={forced!r}"
            )
        # Not silenced: when a forced device is missing, MindSpore's own warnings say why.
        if not _available(target):
            raise UsageError(
                f"{DEVICE_VAR}={forced} but this MindSpore cannot use {target} here (see MindSpore's warning above); "
                f"unset {DEVICE_VAR} to detect the device, or install the {target} runtime"
            )
        return target
    for target in TARGETS.values():
        if _runtime_present(target):
            with _quiet_logging():
                if _available(target):
                    return target
    return "CPU"


# On CPU, MindSpore's compiled graphs run on its actor threads while the Python thread that waits for the result
# (the step's loss read) spins in AsyncRQueue::Wait with sched_yield: a third of the process's CPU samples on the
# GPT benchmark (perf), taken from the threads that compute on a 2-core machine. MS_DEV_HOST_BLOCKING_RUN=1 makes
# the host block instead (read at each graph run): the same kernels, the same numbers, 25 % less CPU per step
# (benchmarks/ms_runtime_knobs.py). A value the user set wins.
HOST_BLOCKING_VAR = "MS_DEV_HOST_BLOCKING_RUN"


def _host_blocking_run() -> None:
    os.environ.setdefault(HOST_BLOCKING_VAR, "1")


# Two or more MindSpore ranks on one CPU host: each rank's actor and kernel threads hand every kernel to each other
# and spin on sched_yield meanwhile (perf: 28 % of the samples of 2 ranks of the demo VLM); with every rank free to
# run on every core, one rank's spinning takes the core the other rank computes on. Each rank on its own share of
# the cores, the spin yields to its own partner thread: the demo on 2 ranks, 2 cores, 110 and 113 ms per iteration
# against 151 and 228 unpinned, alternating, load 3 to 5 (docs/multimodal.md). Left alone: a process whose cores
# the user narrowed (taskset, numactl), more ranks than cores, and MMRUN_MS_BIND_CORES=0.
BIND_VAR = "MMRUN_MS_BIND_CORES"
BIND_VALUES: dict[str, bool] = {"1": True, "0": False}


def _cores_of_rank(allowed: list[int], local_rank: int, local_world_size: int) -> list[int] | None:
    """This rank's equal share of `allowed` (the node's cores split in rank order), None when there is nothing to
    split: one rank, or more ranks than cores."""
    if local_world_size < 2 or len(allowed) < local_world_size or not 0 <= local_rank < local_world_size:
        return None
    per = len(allowed) // local_world_size
    return sorted(allowed)[local_rank * per:(local_rank + 1) * per]


def _bind_cores() -> list[int] | None:
    value = os.environ.get(BIND_VAR, "1").strip()
    if value not in BIND_VALUES:
        raise UsageError(f"{BIND_VAR} must be 1 (each MindSpore rank on its own CPU cores, the default) or 0. "
                         f"Received: {BIND_VAR}={value!r}")
    info = rank_env.read_rank_info()
    if not BIND_VALUES[value] or info.is_scheduler or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < (os.cpu_count() or 0):
        return None  # the user chose this process's cores
    share = _cores_of_rank(allowed, info.local_rank, info.local_world_size)
    if share is None:
        return None
    # Every thread the process has now (MindSpore's, once imported); those started later inherit it.
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), share)
        except OSError:
            pass  # a thread that ended meanwhile
    return share


# ... but not before the msrun cluster forms: a rank bound to one core while it registers with msrun's scheduler
# stalled 20 to 75 s in one run in three (its registration refused until a timeout: 2 ranks of a script that only
# calls init_distributed, 5 of 12 runs bound against 0 of 8 unbound, 13 to 16 s each; mindspore 2.10). An msrun
# worker that has not joined the cluster yet is bound by _bind_cores_after_init, once init() returned.
def _before_cluster() -> bool:
    from mindspore.communication import GlobalComm

    info = rank_env.read_rank_info()
    return info.scheme == "msrun" and not info.is_scheduler and not GlobalComm.INITED


def _bind_cores_after_init() -> None:
    """distributed.init_distributed, once the cluster formed: the binding detect() left for later (CPU only)."""
    if _detected is not None and _detected.kind == "cpu":
        _bind_cores()


# MindSpore's compile cache (graphs saved after their first compile, loaded by the next run) reuses the saved graphs
# by the order they compiled in, without comparing what was baked into them (measured, mindspore 2.10, the demo VLM):
# a run with another --clip-grad loaded the old clip's graph and printed the old run's losses, and one with another
# --seq-length failed in a Reshape. So mmrun turns it on only in a directory of the job's own (compile_cache's
# `directory`, named by a digest of everything the graphs depend on: engines/compile_cache.py). A value the user set
# for either variable wins.
COMPILE_CACHE_VARS = ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH")


def compile_cache(directory: str) -> str | None:
    """Save compiled graphs in `directory` and load them from there in a later run (read by MindSpore at each
    compile, so call it before the first one). Returns the directory in use, None when the user's own
    MS_COMPILER_CACHE_* settings are kept."""
    if any(var in os.environ for var in COMPILE_CACHE_VARS):
        return None
    os.makedirs(directory, exist_ok=True)
    os.environ.update(MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=directory)
    return directory


def detect() -> DeviceInfo:
    """The device kind ("npu" | "cuda" | "cpu" for MindSpore's Ascend, GPU, CPU), its local index and its
    communication backend.

    Detected once per process and set with mindspore.set_device at that time. No device_id is
    passed: under msrun MindSpore negotiates it itself, and a single process gets device 0.
    """
    global _detected
    with _lock:
        if _detected is None:
            target = _target()
            try:
                mindspore.set_device(target)
            except RuntimeError:
                # The script already chose the device (or communication init set its device id) and
                # MindSpore refuses any change once kernels ran: adopt the device that is in use.
                target = mindspore.get_current_device().device_target
            if target == "CPU":
                _host_blocking_run()
                if not _before_cluster():
                    _bind_cores()
            index = 0 if target == "CPU" else rank_env.read_rank_info().local_rank
            kind = KIND_OF_TARGET[target]
            _detected = DeviceInfo(kind, index, checks.dist_backend("mindspore", kind))
        return _detected


def default_device() -> str:
    """Where new tensors go, as MindSpore names it ("Ascend" | "GPU" | "CPU"; the device is process-wide there)."""
    return MINDSPORE_TARGETS[detect().kind]


def to_device(obj: Any) -> Any:
    """The object itself: MindSpore places every tensor and Cell on its one process-wide device."""
    return obj


def peak_memory_mb() -> float | None:
    """Peak device memory of this process on Ascend/GPU (MB, mindspore.runtime.max_memory_allocated);
    None on CPU, where the process's peak resident set size says it instead. Not run here (no device)."""
    if detect().kind == "cpu":
        return None
    return float(mindspore.runtime.max_memory_allocated()) / 2**20
