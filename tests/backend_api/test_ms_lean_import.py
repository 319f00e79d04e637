"""MindSpore on a CPU-only host is imported without triton (backend/mindspore/lean_import.py: 71 MB of resident
memory per process, measured there), triton stays importable afterwards (a PyTorch in the same process finds it),
and MMRUN_MS_IMPORT_TRITON=1 gives mindspore's own import back. Memory itself is measured by benchmarks/memory.py,
not here."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# In a fresh process: which modules `import mindspore` pulls in is decided once per process.
CODE = """
import importlib.util, json, sys
from mmrun.backend.mindspore import lean_import   # imports the backend package, so mindspore too
from mmrun.backend.mindspore import device
out = {"kind": device.detect().kind, "accelerator": lean_import._accelerator_runtime(),
       "triton_loaded": "triton" in sys.modules, "triton_installed": importlib.util.find_spec("triton") is not None,
       "hidden_left": sys.modules.get("triton", 0) is None}
if out["triton_installed"]:
    import triton
    out["triton_importable"] = hasattr(triton, "__version__")
print(json.dumps(out))
"""


def _run(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MMRUN_MS_DEVICE", "MMRUN_MS_IMPORT_TRITON")}
    proc = subprocess.run([sys.executable, "-c", CODE], env={**env, **extra}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_mindspore_is_imported_without_triton_on_a_cpu_only_host():
    lean = _run()
    if lean["accelerator"]:
        pytest.skip("a CUDA driver or CANN on this host: mindspore keeps its triton import there")
    assert lean["kind"] == "cpu"
    assert not lean["triton_loaded"] and not lean["hidden_left"], lean
    if lean["triton_installed"]:
        assert lean["triton_importable"], lean  # hidden only while mindspore imported
        assert _run(MMRUN_MS_IMPORT_TRITON="1")["triton_loaded"]  # the switch gives mindspore's import back


def test_a_bad_switch_value_names_itself(monkeypatch):
    from mmrun.backend.errors import UsageError
    from mmrun.backend.mindspore import lean_import
    monkeypatch.setenv(lean_import.TRITON_VAR, "yes")
    with pytest.raises(UsageError, match="MMRUN_MS_IMPORT_TRITON must be 1 .* Received: MMRUN_MS_IMPORT_TRITON='yes'"):
        lean_import.skip_triton()
