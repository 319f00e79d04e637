#!/usr/bin/env python3
"""Tensor/pipeline/context-parallel scaling of the megatron-core engine against data parallelism (a benchmark).

Every measurement is a real job of models/pretrain_gpt.py started through `mmrun` (torchrun) on --mock-data;
step times come from the job's --metrics-file (median after --warmup iterations). Each layout trains the
same global batch (micro-batch 4 x 4 micro-batches per data-parallel rank), so tokens/s per process says
what each process gets done; the ratio column compares a layout with data parallelism on the same number
of processes (megatron-core's DP, and mmrun's own engine's DP).

Also measured, in one process: mmrun's GPT on mmrun's engine against megatron-core's GPTModel (the engine's
cost: DDP buffers, schedules, the CPU shims), and the CPU shims' TorchFunctionMode alone (the same forward
and backward of mmrun's GPT with and without it).

    python benchmarks/parallel_scaling.py                       # everything (about 10 minutes on 2 cores)
    python benchmarks/parallel_scaling.py --quick               # fewer iterations, 2-process layouts only
    python benchmarks/parallel_scaling.py --markdown out.md

CPU figures (gloo, one thread per process) are for shape, not speed: on a 2-core machine 4 processes share
2 cores, and communication is a memory copy. On GPUs/NPUs tensor and pipeline parallelism pay off where a
model does not fit one device, which no CPU run shows.
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
from dataclasses import dataclass
from pathlib import Path

from mmrun.common.atomic_write import atomic_write

ROOT = Path(__file__).resolve().parents[1]
ENTRY = ROOT / "models" / "pretrain_gpt.py"
LAYERS, HIDDEN, HEADS, SEQ, MICRO, MICRO_BATCHES = 4, 256, 8, 128, 4, 4

# label -> (processes, data-parallel size, extra arguments)
LAYOUTS = {
    "mmrun DP1": (1, 1, []),
    "mcore DP1": (1, 1, ["--use-mcore-models"]),
    "mmrun DP2": (2, 2, []),
    "mcore DP2": (2, 2, ["--use-mcore-models"]),
    "mcore DP2 + distributed optimizer": (2, 2, ["--use-mcore-models", "--use-distributed-optimizer"]),
    "mcore TP2": (2, 1, ["--use-mcore-models", "--tensor-model-parallel-size", "2"]),
    "mcore TP2 + SP": (2, 1, ["--use-mcore-models", "--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    "mcore PP2": (2, 1, ["--use-mcore-models", "--pipeline-model-parallel-size", "2"]),
    "mcore PP2 x VPP2": (2, 1, ["--use-mcore-models", "--pipeline-model-parallel-size", "2",
                                "--virtual-pipeline-model-parallel-size", "2"]),
    "mcore CP2": (2, 1, ["--use-mcore-models", "--context-parallel-size", "2"]),
    "mcore DP4": (4, 4, ["--use-mcore-models"]),
    "mcore TP2 x PP2": (4, 1, ["--use-mcore-models", "--tensor-model-parallel-size", "2",
                               "--pipeline-model-parallel-size", "2"]),
    "mcore TP2 x DP2": (4, 2, ["--use-mcore-models", "--tensor-model-parallel-size", "2"]),
}
THREADS = {"OMP_NUM_THREADS": "1"}  # one intra-op thread per process, as torchrun sets it


@dataclass
class Measurement:
    label: str
    nproc: int
    step_ms: float
    tokens_per_s: float
    peak_rss_mb: float
    ok: bool = True
    note: str = ""

    @property
    def per_process(self) -> float:
        return self.tokens_per_s / self.nproc


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "PET_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK_ID", "RANK_SIZE", "MMRUN_AI_FRAMEWORK")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(THREADS)
    return env


def run_job(label: str, iters: int, warmup: int, workdir: Path) -> Measurement:
    nproc, dp, extra = LAYOUTS[label]
    metrics = workdir / f"{label.replace(' ', '_')}.jsonl"
    global_batch = MICRO * MICRO_BATCHES * dp
    args = ["--mock-data", "--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN), "--num-attention-heads",
            str(HEADS), "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ), "--micro-batch-size",
            str(MICRO), "--global-batch-size", str(global_batch), "--lr", "1e-4", "--train-iters", str(iters),
            "--hidden-dropout", "0", "--attention-dropout", "0", "--eval-iters", "0", "--log-interval", str(iters),
            "--metrics-file", str(metrics), *extra]
    cmd = [sys.executable, "-m", "mmrun.launchers.cli", "--nproc-per-node", str(nproc), "--master-port", "0",
           str(ENTRY), *args]
    start = time.time()
    proc = subprocess.run(cmd, cwd=workdir, env=_env(), capture_output=True, text=True, timeout=1800)
    records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    steps = [r["elapsed_ms"] for r in records if r["kind"] == "train"][warmup:]
    summary = next((r for r in records if r["kind"] == "summary"), {})
    if proc.returncode != 0 or not steps:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        return Measurement(label, nproc, float("nan"), float("nan"), float("nan"), False,
                           f"exit {proc.returncode}: {tail[0][:120]}")
    step_ms = statistics.median(steps)
    m = Measurement(label, nproc, step_ms, global_batch * SEQ / (step_ms / 1000.0),
                    float(summary.get("peak_rss_mb", float("nan"))))
    print(f"  {label:34s} {nproc} processes: {step_ms:8.1f} ms/step {m.tokens_per_s:9.0f} tokens/s "
          f"({m.per_process:7.0f} per process), rank 0 peak RSS {m.peak_rss_mb:6.0f} MB ({time.time() - start:.0f} s)",
          flush=True)
    return m


SHIM_WORKER = """
import statistics, sys, time
import numpy as np
import torch
torch.set_num_threads(1)
from mmrun.models.gpt import GPT, GPTConfig
from mmrun.backend.torch.megatron_core.cpu_shims import CudaOnCpu
cfg = GPTConfig(num_layers=%d, hidden_size=%d, num_attention_heads=%d, seq_length=%d, max_position_embeddings=%d,
                vocab_size=640, hidden_dropout=0.0, attention_dropout=0.0)
model = GPT(cfg)
tokens = torch.from_numpy(np.random.default_rng(0).integers(0, 640, (%d, %d)))
def step():
    model.zero_grad(set_to_none=True)
    loss = model(tokens, labels=tokens).mean()
    loss.backward()
def timed(n):
    out = []
    for _ in range(n):
        t = time.perf_counter(); step(); out.append(time.perf_counter() - t)
    return statistics.median(out)
step()
plain, shimmed = [], []
for _ in range(%d):
    plain.append(timed(5))
    with CudaOnCpu():
        shimmed.append(timed(5))
print(min(plain) * 1e3, min(shimmed) * 1e3)
"""


def shim_overhead(rounds: int) -> tuple[float, float]:
    """(ms/step without, with the CPU shims' TorchFunctionMode) for mmrun's GPT forward + backward."""
    code = SHIM_WORKER % (LAYERS, HIDDEN, HEADS, SEQ, SEQ, MICRO, SEQ, rounds)
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1])
    plain, shimmed = map(float, done.stdout.split())
    print(f"  CPU shims' TorchFunctionMode: {plain:.1f} ms/step without, {shimmed:.1f} with", flush=True)
    return plain, shimmed


def markdown(results: list[Measurement], shims: tuple[float, float] | None, header: str) -> str:
    dp = {m.nproc: m for m in results if m.ok and m.label in ("mcore DP1", "mcore DP2", "mcore DP4")}
    own_dp = {m.nproc: m for m in results if m.ok and m.label in ("mmrun DP1", "mmrun DP2")}
    out = [header, "", "| layout | processes | ms/step | tokens/s | tokens/s per process | vs megatron-core DP "
           "(same processes) | vs mmrun's DP | rank 0 peak RSS (MB) |", "|---|---|---|---|---|---|---|---|"]
    for m in results:
        if not m.ok:
            out.append(f"| {m.label} | {m.nproc} | failed: {m.note} | | | | | |")
            continue
        ratio = f"{m.tokens_per_s / dp[m.nproc].tokens_per_s:.2f}" if m.nproc in dp else "n/a"
        own = f"{m.tokens_per_s / own_dp[m.nproc].tokens_per_s:.2f}" if m.nproc in own_dp else "n/a"
        out.append(f"| {m.label} | {m.nproc} | {m.step_ms:.1f} | {m.tokens_per_s:.0f} | {m.per_process:.0f} | "
                   f"{ratio} | {own} | {m.peak_rss_mb:.0f} |")
    if shims:
        plain, shimmed = shims
        out += ["", "| mmrun's GPT forward + backward, one process | ms/step | relative |", "|---|---|---|",
                f"| plain torch | {plain:.1f} | 1.00 |",
                f"| inside the CPU shims' TorchFunctionMode | {shimmed:.1f} | {shimmed / plain:.2f} |"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer iterations; 1- and 2-process layouts only")
    p.add_argument("--iters", type=int, default=None, help="iterations per job (default 14, quick 8)")
    p.add_argument("--warmup", type=int, default=None, help="iterations left out of the median (default 4, quick 3)")
    p.add_argument("--only", nargs="+", choices=list(LAYOUTS), default=None, help="these layouts only")
    p.add_argument("--markdown", "--markdown-file", dest="markdown", default=None, help="also write the tables here")
    args = p.parse_args(argv)
    iters = args.iters or (8 if args.quick else 14)
    warmup = args.warmup if args.warmup is not None else (3 if args.quick else 4)
    labels = args.only or [k for k, (n, _, _) in LAYOUTS.items() if not (args.quick and n > 2)]
    load = os.getloadavg()[0]
    header = (f"GPT {LAYERS} layers x hidden {HIDDEN} x {HEADS} heads, seq {SEQ}, micro-batch {MICRO} x "
              f"{MICRO_BATCHES} per data-parallel rank, fp32, {iters} iterations (median after {warmup}); device: "
              f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, gloo, 1 thread per "
              f"process), load average {load:.1f} at start")
    print(header, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        results = [run_job(label, iters, warmup, Path(tmp)) for label in labels]
    shims = shim_overhead(2 if args.quick else 4)
    table = markdown(results, shims, header)
    print(table)
    if args.markdown:
        atomic_write(args.markdown, table)
    return 0 if all(m.ok for m in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
