#!/usr/bin/env python3
"""MindSpore alone: its first compiled train step against a steady one, with its own compile cache (a benchmark,
not a test).

The step is benchmarks/plain_models.py's GPT written in plain MindSpore (value_and_grad, clipping by the global
norm, AdamWeightDecay, all in one `mindspore.jit` graph), no mmrun imported in the process that runs it. Per size
(--layers) two fresh processes share one cache folder (MS_COMPILER_CACHE_ENABLE=1, MS_COMPILER_CACHE_PATH): the
first compiles and saves the graph (`cold`), the second loads it (`cached`). Each reports its first call (compile
or load, then the run) and the median of its steady steps; `first / steady` is what issue 30 bounds at 10x for
mmrun's steps, here for MindSpore's own. MindSpore's compile statistics give the part of the cached first call
spent in its backend (kernel graph, kernel build, actors), which the cache does not keep.

    python benchmarks/ms_first_step.py                      # 1, 2 and 4 layers of hidden 128
    python benchmarks/ms_first_step.py --layers 2 --hidden 256 --steps 40
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent


def worker(args: argparse.Namespace) -> dict:
    import mindspore
    import numpy as np

    sys.path.insert(0, str(HERE))
    import plain_models  # imports no framework at module level, and no mmrun

    mindspore.set_seed(0)

    cfg = SimpleNamespace(num_layers=args.layers[0], hidden_size=args.hidden, num_attention_heads=4,
                          ffn_hidden_size=4 * args.hidden, vocab_size=640, max_position_embeddings=64, seq_length=64)
    step = plain_models.mindspore_step(cfg, {}, jit=True, optimizer_kind="AdamWeightDecay")
    rng = np.random.default_rng(1)
    shape = (4, 64)
    data = [(mindspore.Tensor(rng.integers(0, 640, shape).astype(np.int32)),
             mindspore.Tensor(rng.integers(0, 640, shape).astype(np.int32)),
             mindspore.Tensor(np.ones(shape, np.float32))) for _ in range(4)]
    start = time.perf_counter()
    loss, _ = step(data[0])  # the one read per step, as a training loop's
    first = time.perf_counter() - start
    times = []
    for i in range(args.steps):
        start = time.perf_counter()
        step(data[i % len(data)])
        times.append(time.perf_counter() - start)
    return {"first_ms": 1e3 * first, "steady_ms": 1e3 * statistics.median(times[3:]), "first_loss": loss,
            "load": os.getloadavg()[0]}


def run(layers: int, args: argparse.Namespace, cache: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MS_DEV_HOST_BLOCKING_RUN": "1", "MS_COMPILER_CACHE_ENABLE": "1",
           "MS_COMPILER_CACHE_PATH": str(cache), "MS_DEV_RUNTIME_CONF": "compile_statistics:True"}
    cmd = [sys.executable, __file__, "--worker", "--layers", str(layers), "--hidden", str(args.hidden),
           "--steps", str(args.steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"{layers} layers failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    backend = [line for line in (proc.stdout + proc.stderr).splitlines() if "compile_backend_graph costs" in line]
    result["backend_ms"] = sum(float(line.split("costs")[1].split()[0]) for line in backend)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4], help="GPT layers, one size each")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30, help="steady steps per process (30; median after 3)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    import mindspore

    rows = []
    for layers in args.layers:
        with tempfile.TemporaryDirectory(prefix="ms_first_step_") as tmp:
            cold = run(layers, args, Path(tmp))
            cached = run(layers, args, Path(tmp))
        rows.append((layers, cold, cached))
        print(f"{layers} layers: cold first {cold['first_ms']:.0f} ms, cached first {cached['first_ms']:.0f} ms "
              f"(backend {cached['backend_ms']:.0f} ms), steady {cached['steady_ms']:.1f} ms", flush=True)
    print(f"\n{platform.machine()} CPU, {os.cpu_count()} cores, mindspore {mindspore.__version__}, plain MindSpore "
          f"GPT (hidden {args.hidden}, seq 64, batch 4), one jit graph per step, OMP_NUM_THREADS=1, "
          f"MS_DEV_HOST_BLOCKING_RUN=1\n")
    print("| layers | steady (ms) | first, cold (ms) | first, cached (ms) | of which backend compile (ms) "
          "| cold / steady | cached / steady | load |")
    print("|---|---|---|---|---|---|---|---|")
    for layers, cold, cached in rows:
        steady = cached["steady_ms"]
        print(f"| {layers} | {steady:.1f} | {cold['first_ms']:.0f} | {cached['first_ms']:.0f} | "
              f"{cached['backend_ms']:.0f} | {cold['first_ms'] / steady:.0f}x | **{cached['first_ms'] / steady:.0f}x** "
              f"| {min(cold['load'], cached['load']):.1f} to {max(cold['load'], cached['load']):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
