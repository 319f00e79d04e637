"""The profiler and device synchronisation for mmrun.precision on the torch backend.

Same public names and contract as `mmrun.backend.mindspore.profiler`:

    handle = start(out_dir, rank)    # records host ops, and CUDA kernels on a GPU / NPU ops on an Ascend NPU
    report = stop(handle)            # precision.profiling.Report: a Chrome trace + per-operator self time
    synchronize()                    # waits for the device (the timers' phase boundaries)

The trace is `<out_dir>/rank<R>.<ms>.pt.trace.json`, the name TensorBoard's profile plugin (torch-tb-profiler)
lists, and a Chrome trace that Perfetto opens. On an NPU torch_npu.profiler writes its own folder under out_dir
(Ascend's layout, for MindStudio Insight); it is used only when torch_npu is importable and the device is an NPU.
"""
from __future__ import annotations

import os
import time
from typing import Any

import torch

from mmrun.backend.torch import device
from mmrun.precision.profiling import OpRow, Report


def synchronize() -> None:
    kind = device.detect().kind
    if kind == "cuda":
        torch.cuda.synchronize()
    elif kind == "npu":
        torch.npu.synchronize()


def start(out_dir: str, rank: int) -> Any:
    os.makedirs(out_dir, exist_ok=True)
    kind = device.detect().kind
    if kind == "npu":
        import torch_npu  # guarded: only on an Ascend NPU, where the torch backend already imported it

        prof = torch_npu.profiler.profile(
            activities=[torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU],
            on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(out_dir))
    else:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if kind == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(activities=activities)
    prof.start()
    return {"prof": prof, "out_dir": out_dir, "rank": rank, "kind": kind}


def stop(handle: Any) -> Report:
    prof, out_dir, rank = handle["prof"], handle["out_dir"], handle["rank"]
    synchronize()
    prof.stop()
    rows = []
    for avg in prof.key_averages():
        # Device time where there is a device (what a GPU/NPU run waits on), host self time otherwise.
        self_us = getattr(avg, "self_device_time_total", 0.0) or 0.0
        if handle["kind"] == "cpu" or self_us <= 0:
            self_us = avg.self_cpu_time_total
        if self_us > 0:
            rows.append(OpRow(avg.key, int(avg.count), self_us / 1000.0))
    if handle["kind"] == "npu":
        trace = out_dir  # torch_npu's handler wrote its folder (trace_view.json inside)
    else:
        trace = os.path.join(out_dir, f"rank{rank}.{int(time.time() * 1000)}.pt.trace.json")
        prof.export_chrome_trace(trace)
    return Report(trace=trace, folder=out_dir, rows=rows)
