#!/usr/bin/env python3
"""What plain MindSpore does with recomputation on a CPU: peak resident memory of one training step of a stack of
blocks (no mmrun code in the worker), without and with `Cell.recompute()` on every block, compiled (mindspore.jit)
and PyNative, with MindSpore's own memory-pool peak beside the process's.

Each case is one fresh process: build `--layers` blocks on `--tokens` x `--hidden` fp32 activations (tiny
parameters), run `--steps` steps of value_and_grad (the loss and every gradient computed), and report the resident
high-water mark (ru_maxrss) minus the resident set before the first step (`step peak`, compilation included), the
resident set after the steps, and the pool's peak as MindSpore prints it (`MS_DEV_RUNTIME_CONF=memory_statistics:True`,
"peak used mem"). glibc's mmap threshold is fixed at 128 KiB as in benchmarks/recompute_memory.py.

Blocks (`--blocks`): `gelu` = Linear(H, 4H) -> ops.gelu -> Linear(4H, H) + residual (nn.Dense: MatMul + BiasAdd);
`erf` = the same with the exact GELU written as 0.5 x (1 + erf(x / sqrt 2)) and matmuls without bias; `tanh` = matmul
-> tanh -> matmul + residual; `attn` = 4-head self-attention (Dense qkv, BatchMatMul, softmax) + residual on
(tokens / 256, 256, H).

    python benchmarks/ms_recompute_probe.py                                 # the table in docs/memory-and-speed.md
    python benchmarks/ms_recompute_probe.py --blocks gelu --modes pynative --layers 2
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r'''
import json, resource, statistics, sys, time
import numpy as np
import mindspore as ms
from mindspore import mint, nn, ops
a = json.loads(sys.argv[1])
ms.set_seed(0)
H = a["hidden"]
rng = np.random.default_rng(1)
def w(*shape):
    return ms.Parameter(ms.Tensor(rng.standard_normal(shape).astype(np.float32) * 0.05))

class Gelu(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Dense(H, 4 * H), nn.Dense(4 * H, H)
    def construct(self, x):
        return x + self.fc2(ops.gelu(self.fc1(x)))

class Erf(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = w(H, 4 * H), w(4 * H, H)
    def construct(self, x):
        h = mint.matmul(x, self.w1)
        return x + mint.matmul(0.5 * h * (1.0 + mint.erf(h * 0.7071067811865476)), self.w2)

class Tanh(Erf):
    def construct(self, x):
        return x + mint.matmul(mint.tanh(mint.matmul(x, self.w1)), self.w2)

class Attn(nn.Cell):
    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Dense(H, 3 * H), nn.Dense(H, H)
    def construct(self, x):
        b, s, _ = x.shape
        q, k, v = [t.reshape(b, s, 4, H // 4).transpose(0, 2, 1, 3) for t in mint.split(self.qkv(x), H, -1)]
        p = mint.softmax(mint.matmul(q, k.transpose(0, 1, 3, 2)) * 0.1, -1)
        return x + self.o(mint.matmul(p, v).transpose(0, 2, 1, 3).reshape(b, s, H))

Block = {"gelu": Gelu, "erf": Erf, "tanh": Tanh, "attn": Attn}[a["block"]]
class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.blocks = nn.CellList([Block() for _ in range(a["layers"])])
    def construct(self, x):
        for blk in self.blocks:
            x = blk(x)
        return mint.mean(x * x)

net = Net()
if a["recompute"]:
    for blk in net.blocks:
        blk.recompute()
grad_fn = ms.value_and_grad(net, None, net.trainable_params())
def step(x):
    loss, grads = grad_fn(x)
    return loss, ops.addn([mint.sum(g * g) for g in grads])
if a["mode"] == "jit":
    step = ms.jit(step)
shape = (a["tokens"] // 256, 256, H) if a["block"] == "attn" else (a["tokens"], H)
x = ms.Tensor(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
before, times = rss(), []
for _ in range(a["steps"]):
    start = time.perf_counter()
    loss, norm = step(x)
    loss, norm = float(loss.asnumpy()), float(norm.asnumpy())
    times.append(time.perf_counter() - start)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps({"step_peak": peak - before, "after": rss() - before, "loss": loss, "norm": norm,
                              "step_s": statistics.median(times[1:]), "first_s": times[0]}), flush=True)
'''


def run_worker(source: str, name: str, case: dict, threads: int = 1) -> tuple[dict, int | None]:
    """Run a plain-MindSpore worker (`source`, printing `RESULT {json}`) on `case` in a fresh process, with MindSpore's
    pool statistics on -> (its result, the pool's peak in MB as MindSpore prints it, None if it printed none)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": str(threads),
           "MS_DEV_RUNTIME_CONF": "memory_statistics:True"}
    with tempfile.TemporaryDirectory() as tmp:  # mindspore.jit parses the source: the worker must be a file
        worker = Path(tmp) / f"{name}.py"
        worker.write_text(source, encoding="utf-8")
        done = subprocess.run([sys.executable, str(worker), json.dumps(case)], capture_output=True, text=True, env=env,
                              timeout=1800)
    lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{case} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    pools = re.findall(r"Common mem pool info:.*?peak used mem:(\d+)M", done.stdout + done.stderr)
    return json.loads(lines[-1][len("RESULT "):]), int(pools[-1]) if pools else None


def run(case: dict) -> dict:
    result, pool = run_worker(WORKER, "ms_recompute_worker", case, case["threads"])
    return {**result, "pool_peak": pool}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", nargs="+", default=["gelu", "erf", "tanh", "attn"])
    parser.add_argument("--modes", nargs="+", default=["jit", "pynative"])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"plain MindSpore, {args.layers} blocks, {args.tokens} tokens x hidden {args.hidden}, fp32, {args.steps} "
          f"steps, {args.threads} threads; MiB; ratios recompute / none\n")
    print("| block | step | step peak none -> recompute | ratio | pool peak none -> recompute | ratio "
          "| step peak - pool peak, none -> recompute | step time none -> recompute (s) | losses equal |")
    print("|---|---|---|---|---|---|---|---|---|")
    for block in args.blocks:
        for mode in args.modes:
            base = {"block": block, "mode": mode, "layers": args.layers, "tokens": args.tokens, "hidden": args.hidden,
                    "steps": args.steps, "threads": args.threads}
            none, full = run({**base, "recompute": False}), run({**base, "recompute": True})
            print(f"| {block} | {mode} | {none['step_peak']:.0f} -> {full['step_peak']:.0f} | "
                  f"{full['step_peak'] / none['step_peak']:.2f} | {none['pool_peak']} -> {full['pool_peak']} | "
                  f"{full['pool_peak'] / none['pool_peak']:.2f} | {none['step_peak'] - none['pool_peak']:.0f} -> "
                  f"{full['step_peak'] - full['pool_peak']:.0f} | {none['step_s']:.2f} -> {full['step_s']:.2f} | "
                  f"{'yes' if none['loss'] == full['loss'] else 'no'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
