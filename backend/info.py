"""What the backend reports about this process: plain data, no framework imported."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "npu" | "cuda" | "cpu" on both frameworks (backend/vocabulary.py)
    index: int  # the local accelerator index (the local rank on NPU/GPU), 0 on CPU
    dist_backend: str  # torch: "hccl" | "nccl" | "gloo"; MindSpore: "hccl" | "nccl" | "mccl"


@dataclass(frozen=True)
class BackendInfo:
    framework: str  # "pytorch" | "mindspore"
    version: str
    device_kind: str
    device_index: int
    dist_backend: str
    rank: int
    local_rank: int
    world_size: int
