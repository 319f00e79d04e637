"""MindSpore on CPU: the backend makes the host block on a graph instead of spinning (backend/mindspore/device.py;
measured in benchmarks/ms_runtime_knobs.py), a value the user set wins, and every graph the train step compiles
prints its compile time once (the first iteration's time is accounted for), with the C heap trimmed while it
compiles (common/heap_trim.py)."""
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

# Two micro-batches: the summing graph and the update graph each compile once and each says so once.
from mmrun.backend.mindspore import nn, optim, train_step


def squared_error(model, x, y):
    return ((model(x) - y) ** 2).mean()


model = nn.Linear(3, 1)
step = train_step.TrainStep(model, optim.AdamW(model.named_parameters()), loss_fn=squared_error)
said = []
step.announce = said.append
# The C heap is trimmed while each graph compiles and first runs (heap_trim.py), not in the steps after.
from mmrun.common import heap_trim
trims, real_trim = [], heap_trim._TRIM
heap_trim._TRIM = lambda pad: trims.append(real_trim(pad))
batch = (mindspore.Tensor(np.ones((2, 3), np.float32)), mindspore.Tensor(np.zeros((2, 1), np.float32)))
step([batch, batch])
after_compiles = len(trims)
step([batch, batch])
assert [line.split("(")[1].split(" ")[0] for line in said] == ["sum_into", "update"], said
assert after_compiles >= 2 and len(trims) == after_compiles, (after_compiles, len(trims))
os.environ[device.HOST_BLOCKING_VAR] = "0"
device._host_blocking_run()
assert os.environ[device.HOST_BLOCKING_VAR] == "0"  # the user's choice stays
print("ok")
"""


def test_mindspore_on_cpu_blocks_the_host_and_announces_each_compile(tmp_path):
    script = tmp_path / "host_blocking.py"  # mindspore.jit reads the function's source from a file
    script.write_text(CODE)
    env = {k: v for k, v in os.environ.items() if k not in ("MS_DEV_HOST_BLOCKING_RUN", "MMRUN_MS_DEVICE")}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-2000:] + proc.stderr[-2000:]
