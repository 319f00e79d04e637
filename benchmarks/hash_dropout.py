#!/usr/bin/env python3
"""The hash dropout (mmrun's cross-framework masks) against F.dropout: time and memory, one run, alternating.

On CUDA the hash runs as one Triton kernel (backend/torch/_triton_hash_dropout.py); elsewhere it is the eager
hash of backend/torch/ops.py (CPU: chunked passes). Every figure is measured in this invocation, the two
implementations alternating round by round so that a busy machine slows both alike; the table reports medians
and the ratio hash / F.dropout (issue 27's target on an H100: at most 1.5x).

Rows, per dtype and size:
  forward          one `ops.dropout(x, p, True, "hash")` against `F.dropout(x, p, True)`, host work included
                   (what a training step pays when it is host-bound)
  forward+backward the same with the backward pass (the hash redraws its mask; F.dropout reads its saved one)
  graph            CUDA only: the forward kernels replayed from a CUDA graph, so the host's launch cost is out
                   and what remains is the kernel's memory traffic
  kept MiB         memory that stays allocated after the forward pass besides the output (what backward keeps)

    python benchmarks/hash_dropout.py                     # cuda if present, else cpu
    python benchmarks/hash_dropout.py --cpu-smoke         # tiny sizes, a few seconds (checks the script)
    OUT=/tmp/out python benchmarks/hash_dropout.py        # also hash_dropout.json / hash_dropout.md under $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from mmrun.common.atomic_write import atomic_write

P = 0.1
SIZES = {"cuda": [(8, 1024, 768), (64, 1024, 1024)], "cpu": [(8, 256, 256)], "smoke": [(2, 64, 64)]}
DTYPES = {"cuda": ("float32", "bfloat16", "float16"), "cpu": ("float32", "bfloat16"), "smoke": ("float32",)}


def _timer(device: str):
    import torch

    def timed(fn, reps: int) -> float:
        """Seconds per call, wall clock, device drained before and after."""
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / reps
    return timed


def _graph_time(fn, reps: int) -> float | None:
    """Seconds per call of `fn`'s kernels replayed from a CUDA graph (no host work); None if it cannot be captured."""
    import torch

    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / reps
    except Exception as exc:  # noqa: BLE001  a row says why instead of the benchmark dying
        print(f"CUDA graph capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", file=sys.stderr)
        return None


def _kept_bytes(fn, x) -> int:
    """Bytes still allocated after fn(x)'s forward pass, beyond its output: what autograd keeps for backward."""
    import torch

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = fn(x)
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
    del y
    return kept


def measure(device: str, shape: tuple[int, ...], dtype_name: str, rounds: int, reps: int) -> dict:
    import torch
    import torch.nn.functional as F

    from mmrun.backend.torch import kernels, ops, seeding

    dtype = getattr(torch, dtype_name)
    seeding.seed_everything(0)
    x = torch.randn(*shape, device=device).to(dtype).requires_grad_()
    grad = torch.ones_like(x)
    impls = {"hash": lambda t: ops.dropout(t, P, True, "hash"), "native": lambda t: F.dropout(t, P, True)}
    timed = _timer(device)
    for fn in impls.values():  # first calls compile (Triton) and warm the allocator and autograd
        torch.autograd.grad(fn(x), x, grad)
        with torch.no_grad():
            fn(x)
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for name, fn in impls.items():  # alternating: the two see the same machine
            with torch.no_grad():
                samples.setdefault((name, "forward"), []).append(timed(lambda: fn(x), reps))
            samples.setdefault((name, "forward+backward"), []).append(
                timed(lambda: torch.autograd.grad(fn(x), x, grad), reps))
    row = {"shape": list(shape), "dtype": dtype_name, "device": device,
           "kernel": "triton" if kernels.has_fused_hash_dropout(device) else "eager"}
    for what in ("forward", "forward+backward"):
        hash_s, native_s = (statistics.median(samples[(n, what)]) for n in ("hash", "native"))
        row[what] = {"hash_ms": hash_s * 1e3, "native_ms": native_s * 1e3, "ratio": hash_s / native_s}
    if device == "cuda":
        with torch.no_grad():
            hash_s, native_s = (_graph_time(lambda fn=fn: fn(x), reps) for fn in impls.values())
        row["graph"] = {"hash_ms": hash_s and hash_s * 1e3, "native_ms": native_s and native_s * 1e3,
                         "ratio": hash_s / native_s if hash_s and native_s else None}
        row["kept_mib"] = {n: _kept_bytes(fn, x) / 2**20 for n, fn in impls.items()}
    return row


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def table(rows: list[dict]) -> str:
    lines = ["| shape | dtype | kernel | timing | hash ms | F.dropout ms | hash / F.dropout |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        for what in ("forward", "forward+backward", "graph"):
            if isinstance(r.get(what), dict):
                t = r[what]
                lines.append(f"| {'x'.join(map(str, r['shape']))} | {r['dtype']} | {r['kernel']} | {what} | "
                             f"{_fmt(t['hash_ms'])} | {_fmt(t['native_ms'])} | {_fmt(t['ratio'], 2)}x |")
        if "kept_mib" in r:
            k = r["kept_mib"]
            lines.append(f"| {'x'.join(map(str, r['shape']))} | {r['dtype']} | {r['kernel']} | kept for backward "
                         f"(MiB) | {k['hash']:.1f} | {k['native']:.1f} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", "--cpu_smoke", dest="cpu_smoke", action="store_true",
                        help="tiny sizes on the CPU, a few seconds: checks the script, measures nothing of note")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 5, smoke 1)")
    parser.add_argument("--reps", type=int, default=None, help="calls per timing (default 50, smoke 20)")
    args = parser.parse_args(argv)
    import torch

    device = "cpu" if args.cpu_smoke or not torch.cuda.is_available() else "cuda"
    sizes_of = "smoke" if args.cpu_smoke else device
    rounds = args.rounds or (1 if args.cpu_smoke else 5)
    reps = args.reps or (20 if args.cpu_smoke else 50)
    rows = [measure(device, shape, dtype, rounds, reps) for shape in SIZES[sizes_of] for dtype in DTYPES[sizes_of]]
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    text = (f"hash dropout vs F.dropout, p={P}, on {name} (torch {torch.__version__}); medians of {rounds} "
            f"alternating rounds of {reps} calls\n\n{table(rows)}")
    print(text)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        atomic_write(Path(out) / "hash_dropout.json", json.dumps(rows, indent=1) + "\n")
        atomic_write(Path(out) / "hash_dropout.md", text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
