"""The profiler and device synchronisation for mmrun.precision on the MindSpore backend.

Same public names and contract as `mmrun.backend.torch.profiler`:

    handle = start(out_dir, rank)    # mindspore.profiler.profile: host ops (CPU), and device ops on Ascend/GPU
    report = stop(handle)            # precision.profiling.Report: a Chrome trace + per-operator time
    synchronize()                    # waits for the device (the timers' phase boundaries)

MindSpore writes `<out_dir>/<host>_<pid>_<time>_ascend_ms/` (its own layout, read by MindStudio Insight); the
Chrome trace is its `ASCEND_PROFILER_OUTPUT/trace_view.json`, which Perfetto opens. In graph mode (mindspore.jit)
the ops of the compiled step are recorded as the kernels the graph runs.
"""
from __future__ import annotations

import contextlib
import glob
import io
import os
from typing import Any

import mindspore

from mmrun.precision.profiling import OpRow, Report, rows_from_chrome_trace


def synchronize() -> None:
    mindspore.runtime.synchronize()


def start(out_dir: str, rank: int) -> Any:
    from mindspore.profiler import ProfilerActivity, profile, tensorboard_trace_handler

    os.makedirs(out_dir, exist_ok=True)
    activities = [ProfilerActivity.CPU]
    if mindspore.get_context("device_target") in ("Ascend", "GPU"):
        activities.append(ProfilerActivity.NPU if hasattr(ProfilerActivity, "NPU") else ProfilerActivity.GPU)
    before = set(glob.glob(os.path.join(out_dir, "*_ascend_ms")))
    prof = profile(activities=activities, on_trace_ready=tensorboard_trace_handler(out_dir))
    prof.start()
    return {"prof": prof, "out_dir": out_dir, "rank": rank, "before": before}


def stop(handle: Any) -> Report:
    prof, out_dir = handle["prof"], handle["out_dir"]
    synchronize()
    # The parser prints progress bars on stdout (`Parsing: [####...]`); a person reads the table instead.
    with contextlib.redirect_stdout(io.StringIO()):
        prof.stop()
    new = sorted(set(glob.glob(os.path.join(out_dir, "*_ascend_ms"))) - handle["before"], key=os.path.getmtime)
    folder = new[-1] if new else out_dir
    trace = os.path.join(folder, "ASCEND_PROFILER_OUTPUT", "trace_view.json")
    rows = rows_from_chrome_trace(trace, skip_processes=("Scope Layer",)) if os.path.exists(trace) else []
    return Report(trace=trace, folder=folder, rows=rows)
