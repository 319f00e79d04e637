"""MindSpore on CPU: the backend makes the host block on a graph instead of spinning (backend/mindspore/device.py;
measured in benchmarks/ms_runtime_knobs.py), and a value the user set wins."""
from __future__ import annotations

import os
import subprocess
import sys

# In a fresh process: the variable is a process-wide setting read by MindSpore's runtime.
CODE = """
import os
import numpy as np
import mindspore
from mmrun.backend.mindspore import device
assert device.detect().kind == "cpu", device.detect()
assert os.environ[device.HOST_BLOCKING_VAR] == "1", os.environ.get(device.HOST_BLOCKING_VAR)

@mindspore.jit
def double_sum(x):
    return (x * 2).sum()

# a compiled graph runs, and its result reaches the host, with the setting on
assert float(double_sum(mindspore.Tensor(np.arange(4, dtype=np.float32)))) == 12.0
os.environ[device.HOST_BLOCKING_VAR] = "0"
device._host_blocking_run()
assert os.environ[device.HOST_BLOCKING_VAR] == "0"  # the user's choice stays
print("ok")
"""


def test_mindspore_on_cpu_blocks_the_host_unless_the_user_chose(tmp_path):
    script = tmp_path / "host_blocking.py"  # mindspore.jit reads the function's source from a file
    script.write_text(CODE)
    env = {k: v for k, v in os.environ.items() if k not in ("MS_DEV_HOST_BLOCKING_RUN", "MMRUN_MS_DEVICE")}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-2000:] + proc.stderr[-2000:]
