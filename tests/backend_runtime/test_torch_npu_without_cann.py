"""torch_npu installed on a machine without CANN must not break torch.

The real torch_npu wheel (43.6 MB, about 5 s to fetch and unpack here) is installed once, without
its dependencies, into a side folder that only the child processes see (PYTHONPATH): the test
environment itself stays free of it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TORCH_NPU_VERSION = "2.13.0"  # torch_npu pins torch exactly: this matches the torch 2.13.0 installed
CACHE = Path(os.environ.get("MMRUN_TORCH_NPU_CACHE", "/tmp/mmrun-torch-npu")) / TORCH_NPU_VERSION


def _torch_npu_folder() -> Path:
    if (CACHE / "torch_npu" / "__init__.py").exists():
        return CACHE
    partial = CACHE.with_name(f"{CACHE.name}.partial-{os.getpid()}")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--target", str(partial),
         f"torch_npu=={TORCH_NPU_VERSION}"],
        capture_output=True, text=True, timeout=300,
    )
    if proc.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        pytest.skip(f"could not install torch_npu=={TORCH_NPU_VERSION} from the package index: "
                    f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    try:
        partial.rename(CACHE)  # atomic: a concurrent run sees a whole folder or none
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)  # another run got there first
    return CACHE


BACKEND_THEN_TORCH = """
import json, os, sys
import mmrun.backend as backend
info = backend.current()
import torch
print(json.dumps({"device": info.device_kind, "sum": float(torch.ones(3).sum()),
                  "autoload": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD"),
                  "left_behind": sorted(m for m in sys.modules if m.startswith("torch_npu"))}))
"""


@pytest.mark.slow
def test_torch_still_works_on_cpu(run_python, clean_env, last_json):
    folder = _torch_npu_folder()
    env = clean_env(PYTHONPATH=str(folder))
    # The hazard is real: a plain `import torch` fails once torch_npu is importable without CANN.
    plain = run_python("import torch", env=env)
    assert plain.returncode != 0 and "Failed to load the backend extension: torch_npu" in plain.stderr
    # Through the backend: torch works on CPU, with one warning that says why and what to do.
    proc = run_python(BACKEND_THEN_TORCH, env=env)
    out = last_json(proc)
    assert out == {"device": "cpu", "sum": 3.0, "autoload": "0", "left_behind": []}
    warnings = [line for line in proc.stderr.splitlines() if "BackendWarning" in line]
    assert len(warnings) == 1, proc.stderr
    assert "torch_npu is installed but cannot be used (ImportError: libhccl.so" in warnings[0]
    assert "CANN was not found" in warnings[0] and "Running on CPU" in warnings[0]
