"""Checks of the values user code passes to backend functions, shared by both framework folders so
that the errors (and the replacements made with a notice) read the same on torch and MindSpore.
"""
from __future__ import annotations

from mmrun.backend import vocabulary
from mmrun.backend.errors import UsageError, warn_once

# framework -> device kind -> the communication backends that work there; the first is the default.
WORKING_DIST_BACKENDS: dict[str, dict[str, tuple[str, ...]]] = {
    "pytorch": {"npu": ("hccl",), "cuda": ("nccl", "gloo"), "cpu": ("gloo",)},
    # MindSpore on CPU uses its own mccl; gloo is rejected there (measured, mindspore 2.10).
    "mindspore": {"npu": ("hccl",), "cuda": ("nccl",), "cpu": ("mccl",)},
}
KNOWN_DIST_BACKENDS: tuple[str, ...] = ("hccl", "nccl", "gloo", "mccl", "mpi", "ucc")
REDUCE_OPS: tuple[str, ...] = ("sum", "mean")
MAX_SEED = 2**32 - 1  # numpy's legacy seeding takes 32-bit seeds only


def dist_backend(framework: str, device_kind: str, requested: str | None = None) -> str:
    """The backend to use on this device; a request that cannot work here is replaced, with a notice.

    Megatron scripts pass `--distributed-backend nccl` everywhere; on an NPU or a CPU that must become
    hccl, gloo or mccl (transfer_to_npu makes the same nccl -> hccl swap).
    """
    device_kind = vocabulary.device_kind(device_kind)
    working = WORKING_DIST_BACKENDS[framework][device_kind]
    if requested is None:
        return working[0]
    name = requested.strip().lower()
    if name not in KNOWN_DIST_BACKENDS:
        raise UsageError(
            f"Unknown distributed backend. Received: {requested!r}; choose one of {', '.join(KNOWN_DIST_BACKENDS)}"
        )
    if name not in working:
        warn_once(
            f"--distributed-backend {name} does not work with {framework} on {device_kind}; using {working[0]} instead"
        )
        return working[0]
    return name


def reduce_op(op: str) -> str:
    if op not in REDUCE_OPS:
        raise UsageError(f"all_reduce op must be one of {', '.join(REDUCE_OPS)}. Received: {op!r}")
    return op


def seed(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise UsageError(f"seed must be a whole number from 0 to {MAX_SEED}. Received: {value!r}")
    return value
