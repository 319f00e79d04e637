#!/usr/bin/env python3
"""Every PyTorch engine trains, saves and resumes, for the GPT and the VLM, in fp32 and bf16 (a check, not a test).

Each cell is two real jobs through `mmrun --ai-framework pytorch --nproc-per-node 1` on this machine's device:
train 4 iterations and save, then resume from that checkpoint and train 2 more (iterations 5 and 6). A cell
passes when both jobs exit 0, the first trains iterations 1-4 and checkpoints iteration 4, the second trains
exactly 5-6 (it resumed), every loss is finite, and both ran on the device this machine has (the summary
record's device). What a cell cannot run here (megatron-core not installed, bf16 where the device has no
bf16 kernels) is a row that says so, not a failure of the script.

  engine                 flags
  portable               (none: mmrun's own data-parallel engine)
  megatron-core          --use-mcore-models
  megatron-core+distopt  --use-mcore-models --use-distributed-optimizer
  fsdp2                  --use-torch-fsdp2 --fsdp2-config-path <file> --ckpt-format torch_dcp

    python benchmarks/engine_matrix.py                       # every cell; --jobs cells at once (CUDA 4, CPU 1)
    python benchmarks/engine_matrix.py --cpu-smoke           # four fp32 cells that cover every engine, on CPU
    OUT=/tmp/out python benchmarks/engine_matrix.py          # engine_matrix.json / engine_matrix.md under $OUT

Cells running at once share the device, so the step times here are not speed figures (benchmarks/gpt_accelerator.py
and benchmarks/vlm_engines.py measure speed one job at a time).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mmrun.common.atomic_write import atomic_write

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = {"gpt": ROOT / "models" / "pretrain_gpt.py", "vlm": ROOT / "models" / "pretrain_vlm.py"}
COMMON = ["--eval-iters", "0", "--log-interval", "1", "--seed", "1234", "--lr", "1e-3", "--clip-grad", "1.0",
          "--lr-warmup-iters", "1", "--weight-decay", "0.01"]
MODEL_ARGS = {
    "gpt": ["--mock-data", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length",
            "64", "--max-position-embeddings", "64", "--micro-batch-size", "4", "--global-batch-size", "8",
            "--hidden-dropout", "0", "--attention-dropout", "0"],
    "vlm": ["--mm-model", str(ROOT / "scripts" / "qwen2vl" / "model_tiny.json"), "--micro-batch-size", "2",
            "--global-batch-size", "4", "--seq-length", "128"],
}
ENGINES = {
    "portable": [],
    "megatron-core": ["--use-mcore-models"],
    "megatron-core+distopt": ["--use-mcore-models", "--use-distributed-optimizer"],
    "fsdp2": ["--use-torch-fsdp2", "--ckpt-format", "torch_dcp"],
}
# What FSDP2 wraps in each model (its blocks), as the FSDP2 file's sub_modules_to_wrap.
FSDP2_WRAP = {"gpt": "['h.{*}']", "vlm": "['visual.blocks.{*}', 'model.layers.{*}']"}
PRECISIONS = {"fp32": [], "bf16": ["--bf16"]}
# The smoke: every engine once, both models, fp32 only (a 2-core CPU runs it in a couple of minutes).
SMOKE = [("gpt", "portable", "fp32"), ("gpt", "megatron-core+distopt", "fp32"), ("vlm", "megatron-core", "fp32"),
         ("vlm", "fsdp2", "fp32")]
TRAIN_ITERS, RESUME_ITERS = 4, 6


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "PET_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MMRUN_AI_FRAMEWORK")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def missing(engine: str, device: str) -> str | None:
    """Why this engine cannot run here, or None."""
    if engine.startswith("megatron-core") and importlib.util.find_spec("megatron") is None:
        return "megatron-core is not installed (pip install megatron-core)"
    if engine == "fsdp2":
        import torch.distributed.fsdp as fsdp
        if not hasattr(fsdp, "fully_shard"):
            return "this torch has no FSDP2 (torch.distributed.fsdp.fully_shard)"
    return None


def _job(workdir: Path, entry: Path, args: list[str], timeout: float) -> tuple[int, str, list[dict]]:
    metrics = workdir / f"metrics-{time.monotonic_ns()}.jsonl"
    cmd = [sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", "pytorch", "--nproc-per-node", "1",
           "--master-port", "0", str(entry), *args, "--metrics-file", str(metrics)]
    try:
        proc = subprocess.run(cmd, cwd=workdir, env=_env(), capture_output=True, text=True, timeout=timeout)
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:
        code, output = 124, f"timed out after {timeout:.0f} s\n{err.stdout or ''}{err.stderr or ''}"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    return code, output, records


def _error_line(output: str) -> str:
    """The line that says what went wrong (the last error-looking line, else the last line)."""
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    for line in reversed(lines):
        if any(word in line for word in ("Error", "error:", "FAILED", "Traceback", "timed out")):
            return line[:240]
    return (lines[-1] if lines else "no output")[:240]


def run_cell(model: str, engine: str, precision: str, device: str, base: Path, demo: str | None,
             timeout: float) -> dict:
    cell = {"model": model, "engine": engine, "precision": precision}
    why = missing(engine, device)
    if why:
        return {**cell, "status": "skipped", "detail": why}
    work = base / f"{model}-{engine}-{precision}"
    work.mkdir(parents=True, exist_ok=True)
    args = [*COMMON, *MODEL_ARGS[model], *ENGINES[engine], *PRECISIONS[precision]]
    if model == "vlm":
        args += ["--mm-data", str(demo)]
    if engine == "fsdp2":
        (work / "fsdp2.yaml").write_text(f"sharding_size: auto\nsub_modules_to_wrap: {FSDP2_WRAP[model]}\n")
        args += ["--fsdp2-config-path", str(work / "fsdp2.yaml")]
    ckpt = work / "ckpt"
    started = time.monotonic()
    steps = {}
    # One schedule for both jobs (--train-iters 6): the first stops at 4 (--exit-interval) after its save there.
    args += ["--train-iters", str(RESUME_ITERS)]
    for phase, extra in (("train", ["--save", str(ckpt), "--save-interval", str(TRAIN_ITERS),
                                    "--exit-interval", str(TRAIN_ITERS)]),
                         ("resume", ["--load", str(ckpt)])):
        code, output, records = _job(work, ENTRIES[model], [*args, *extra], timeout)
        (work / f"{phase}.log").write_text(output)
        train = {r["iteration"]: r["lm_loss"] for r in records if r["kind"] == "train"}
        summary = next((r for r in records if r["kind"] == "summary"), {})
        want = list(range(1, TRAIN_ITERS + 1)) if phase == "train" else list(range(TRAIN_ITERS + 1, RESUME_ITERS + 1))
        problem = (f"exit {code}: {_error_line(output)}" if code != 0 else
                   f"trained iterations {sorted(train)}, expected {want}" if sorted(train) != want else
                   "a loss is not finite" if not all(math.isfinite(v) for v in train.values()) else
                   f"ran on {summary.get('device')}, this machine's device is {device}"
                   if not str(summary.get("device", "")).startswith(device) else None)
        if phase == "train" and problem is None and not (ckpt / "latest_checkpointed_iteration.txt").exists():
            problem = "no checkpoint tracker after the save"
        steps[phase] = {"ok": problem is None, "problem": problem, "losses": train, "engine": summary.get("engine")}
        if problem:
            return {**cell, "status": "FAILED", "detail": f"{phase}: {problem}", "log": str(work / f"{phase}.log"),
                    "seconds": round(time.monotonic() - started, 1)}
    losses = {**steps["train"]["losses"], **steps["resume"]["losses"]}
    return {**cell, "status": "ok", "seconds": round(time.monotonic() - started, 1),
            "detail": f"engine {steps['train']['engine']}; loss {losses[1]:.4f} -> {losses[TRAIN_ITERS]:.4f} "
                      f"(saved) -> {losses[RESUME_ITERS]:.4f} (resumed)"}


def markdown(device: str, cells: list[dict]) -> str:
    lines = [f"train {TRAIN_ITERS} iterations + save, resume to {RESUME_ITERS}, one process on {device}", "",
             "| model | engine | precision | result | detail |", "|---|---|---|---|---|"]
    for c in cells:
        lines.append(f"| {c['model']} | {c['engine']} | {c['precision']} | {c['status']} | {c['detail']} |")
    return "\n".join(lines) + "\n"


def _write(device: str, results: list[dict], planned: int) -> None:
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        atomic_write(Path(out) / "engine_matrix.json",
                     json.dumps({"device": device, "planned": planned, "cells": results}, indent=1) + "\n")
        atomic_write(Path(out) / "engine_matrix.md", markdown(device, results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", "--cpu_smoke", dest="cpu_smoke", action="store_true",
                        help="the four fp32 cells of SMOKE on the CPU (checks the script)")
    parser.add_argument("--models", nargs="+", choices=sorted(MODEL_ARGS), default=sorted(MODEL_ARGS))
    parser.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES))
    parser.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
    parser.add_argument("--jobs", type=int, default=None, help="cells at once (CUDA 4, CPU 1)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per job")
    args = parser.parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.cpu_smoke else "cpu"
    if args.cpu_smoke:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the jobs too
    cells = SMOKE if args.cpu_smoke else [(m, e, p) for m in args.models for e in args.engines
                                          for p in args.precisions]
    jobs = args.jobs or (4 if device == "cuda" else 1)
    with tempfile.TemporaryDirectory(prefix="mmrun_matrix_") as tmp:
        base = Path(os.environ.get("OUT", tmp)) / "engine_matrix"
        demo = None
        if any(m == "vlm" for m, _, _ in cells):
            from mmrun.data.multimodal.demo import make_demo

            demo = make_demo(str(base / "demo"), num_samples=16, seed=7)["data_json"]
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_cell, m, e, p, device, base, demo, args.timeout) for m, e, p in cells]
            results = []
            for future in futures:
                results.append(future.result())
                r = results[-1]
                print(f"[{time.strftime('%H:%M:%S')}] {r['model']} {r['engine']} {r['precision']}: {r['status']} "
                      f"{r['detail']}", file=sys.stderr, flush=True)
                _write(device, results, len(cells))  # after every cell: a time limit leaves what was done
    print(markdown(device, results))
    return 0 if all(r["status"] != "FAILED" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
