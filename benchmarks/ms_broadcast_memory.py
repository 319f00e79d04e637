#!/usr/bin/env python3
"""Where the compiled MindSpore CPU step's memory outside the pool goes: one elementwise op at a time, in plain
MindSpore (no mmrun code in the worker), written with a broadcasting operand and with operands of one shape.

MindSpore 2.10's CPU kernel for binary arithmetic (Add, Sub, Mul, Div, RealDiv, ...; MaskedFill too) computes, at its
first launch, two std::vector<size_t> of one index per OUTPUT element (the position read from each input) whenever
the operands need broadcasting (fp32 Add/Sub/Mul of one shape or with a one-element operand take a direct path; Div
always indexes; other dtypes index even for one shape), and keeps them in the kernel object. A compiled graph has
one kernel object per node for the whole run, so every such node holds 16 bytes per output element, outside
MindSpore's memory pool, until the process ends (heaptrack: std::vector<unsigned long>::_M_default_append called from
libmindspore_ops_cpu.so; docs/memory-and-speed.md). PyNative caches a kernel per op and shape, so repeats share one.
Transpose (4-D) keeps one size_t per element the same way (`--ops transpose`); BiasAdd and the LogSoftmax primitive
keep nothing (`bias_add`, `log_softmax_primitive`).

Each case is one fresh process: `--reps` times x = x + 0.5 * op(x) on a (rows, cols) fp32 tensor, value_and_grad of
mean(x^2), compiled (mindspore.jit) or PyNative, 2 steps; `step peak` = resident high-water mark minus the resident
set before the first step (compilation included), `pool` = MindSpore's pool peak
(MS_DEV_RUNTIME_CONF=memory_statistics:True), `outside` = the difference.

    python benchmarks/ms_broadcast_memory.py                          # the table in docs/memory-and-speed.md
    python benchmarks/ms_broadcast_memory.py --ops masked_fill masked_fill_same --modes jit pynative
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ms_recompute_probe import run_worker  # noqa: E402 - the plain-MindSpore worker runner, shared

WORKER = r'''
import json, resource, sys
import numpy as np
import mindspore as ms
from mindspore import mint, nn, ops
a = json.loads(sys.argv[1])
N, C = a["rows"], a["cols"]
b = ms.Parameter(ms.Tensor(np.full((C,), 0.01, np.float32)), name="b")
MASK = ms.Tensor(np.arange(C) % 3 == 0)
MULT = ms.Tensor(2654435761, ms.uint32)
SQRT2 = ms.Tensor(1.41421356, ms.float32)
INV_SQRT2 = ms.Tensor(0.70710678, ms.float32)

class SoftmaxSameShapeGrad(nn.Cell):
    """mint.softmax with MindSpore's own backward, the row sum broadcast before the subtraction."""
    def construct(self, x):
        return mint.softmax(x, -1)
    def bprop(self, x, out, dout):
        return (out * (dout - ops.broadcast_to(ops.ReduceSum(keep_dims=True)(out * dout, -1), dout.shape)),)
SOFTMAX = SoftmaxSameShapeGrad()

def op_tanh(y):
    return mint.tanh(y)
def op_add_bias(y):
    return y + b
def op_bias_add(y):
    return ops.bias_add(y, b)
def op_transpose(y):
    return ops.transpose(y.reshape(-1, 4, C // 4, C), (0, 1, 3, 2)).reshape(y.shape)
def op_add_bias_same(y):
    return y + ops.broadcast_to(b, y.shape)
def op_masked_fill(y):
    return ops.masked_fill(y, MASK, 0.0)
def op_masked_fill_same(y):
    return ops.masked_fill(y, ops.broadcast_to(MASK, y.shape), 0.0)
def op_softmax(y):
    return mint.softmax(y, -1)
def op_softmax_same(y):
    return SOFTMAX(y)
def op_div_scalar(y):
    return y / SQRT2
def op_div_same(y):
    return y / ops.broadcast_to(SQRT2, y.shape)
def op_mul_reciprocal(y):
    return y * INV_SQRT2
def op_log_softmax(y):
    return y - ops.logsumexp(y, -1, True)
def op_log_softmax_primitive(y):
    return ops.LogSoftmax(-1)(y)
def op_mul_scalar_uint32(y):
    h = ops.cast(ops.abs(y) * 1000.0, ms.uint32) * MULT
    return ops.cast(ops.cast(h, ms.int64) % 7, ms.float32) * y
f = globals()["op_" + a["op"]]

class Net(nn.Cell):
    def construct(self, x):
        for _ in range(a["reps"]):
            x = f(x) * 0.5 + x
        return mint.mean(x * x)
grad_fn = ms.value_and_grad(Net(), 0, None)
def step(x):
    loss, gx = grad_fn(x)
    return loss, mint.sum(gx * gx)
if a["mode"] == "jit":
    step = ms.jit(step)
x = ms.Tensor(np.random.default_rng(0).standard_normal((N, C)).astype(np.float32) * 0.5)
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20
before = rss()
for _ in range(2):
    loss, norm = step(x)
    loss, norm = float(loss.asnumpy()), float(norm.asnumpy())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps({"step_peak": peak - before, "loss": loss, "norm": norm}), flush=True)
'''

OPS = ["tanh", "add_bias", "bias_add", "transpose", "add_bias_same", "masked_fill", "masked_fill_same", "softmax",
       "softmax_same", "div_scalar", "div_same", "mul_reciprocal", "log_softmax", "log_softmax_primitive",
       "mul_scalar_uint32"]


def run(case: dict) -> dict:
    result, pool = run_worker(WORKER, "ms_broadcast_worker", case)
    return {**result, "pool": float("nan") if pool is None else pool}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", nargs="+", choices=OPS, default=OPS)
    parser.add_argument("--modes", nargs="+", choices=["jit", "pynative"], default=["jit"])
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--cols", type=int, default=512)
    args = parser.parse_args(argv)
    print(f"plain MindSpore, {args.reps} x (x + 0.5 * op(x)), ({args.rows}, {args.cols}) fp32, forward and backward, "
          f"2 steps, 1 thread; MiB; 16 bytes x {args.rows * args.cols} elements = "
          f"{16 * args.rows * args.cols / 2**20:.0f} MiB per indexed kernel\n")
    print("| op | step | step peak | pool peak | outside the pool | loss |")
    print("|---|---|---|---|---|---|")
    for op in args.ops:
        for mode in args.modes:
            r = run({"op": op, "mode": mode, "reps": args.reps, "rows": args.rows, "cols": args.cols})
            print(f"| {op} | {mode} | {r['step_peak']:.0f} | {r['pool']} | {r['step_peak'] - r['pool']:.0f} "
                  f"| {r['loss']:.6f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
