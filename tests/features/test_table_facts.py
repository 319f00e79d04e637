"""The MindSpore CPU kernel facts the stack layer cites as "measured here", re-measured on the installed framework.

If a framework upgrade changes one of them (say MindSpore gains a bf16 MatMul kernel on CPU), this
fails and names the table cell to revisit. Each probe runs in its own process: after one missing
MindSpore kernel, later ops in the same process can report misleading errors.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

from mmrun import features as ft

MINDSPORE_PROBE = textwrap.dedent("""
    import numpy as np, mindspore as ms
    from mindspore import nn, ops, mint, Tensor
    ms.set_device("CPU")
    x = Tensor(np.random.randn(4, 16).astype(np.float16))
    labels = Tensor(np.array([1, 2, 3, 4], np.int32))
    net = nn.Dense(16, 16).to_float(ms.float16)
    norm = nn.LayerNorm((16,), epsilon=1e-5).to_float(ms.float16)
    loss = lambda a: ops.cross_entropy(mint.softmax(ops.gelu(norm(net(a))), dim=-1).astype(ms.float32), labels)
    grads = ms.value_and_grad(loss, None, net.trainable_params())(x)[1]
    print("fp16 ok", all(bool(np.isfinite(g.asnumpy()).all()) for g in grads))
    try:
        y = x.astype(ms.bfloat16)
        mint.matmul(y, y.T).asnumpy()
        print("bf16 matmul ok")
    except Exception as err:
        print("bf16 matmul fails:", str(err).splitlines()[0])
""")

def probe(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_mindspore_cpu_runs_fp16_and_lacks_bf16_matmul():
    out = probe(MINDSPORE_PROBE)
    stack = ft.load_tables().layer("stack")
    fp16, bf16 = stack.cell("fp16", "mindspore", "cpu"), stack.cell("bf16", "mindspore", "cpu")
    assert [s.check for s in fp16.sources + bf16.sources] == ["tests/features/test_table_facts.py"] * 2
    assert fp16.status == "supported"
    assert "fp16 ok True" in out, f"{out}\nMindSpore CPU fp16 changed: revisit fp16 mindspore/cpu in features/stack.yaml ({fp16.reason})"
    assert "bf16 matmul fails: Select CPU operator[MatMul] fail! Unsupported data type" in out, (
        f"{out}\nMindSpore's CPU bf16 MatMul changed: revisit bf16 mindspore/cpu in features/stack.yaml")
    assert "no bf16 MatMul kernel on the CPU" in bf16.reason and bf16.status == "unsupported"
