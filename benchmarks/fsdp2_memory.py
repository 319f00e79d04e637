#!/usr/bin/env python3
"""FSDP2 full shard against torch's DDP: per-rank parameter + gradient + optimizer memory, and step time (a benchmark).

Every measurement is a real job of models/pretrain_transformers.py started through `mmrun` on N processes (a
transformers Qwen2ForCausalLM built from a config, Megatron's mock samples), once under DDP and once under
FSDP2 (`sharding_size: auto`, every decoder layer a unit), the same global batch. The bytes are the engine's
own count of the tensors rank 0 holds after the first step (engines/torch/fsdp2/engine.py logs them: its
shards under FSDP2, whole tensors under DDP); the step time is the median of the job's --metrics-file after
--warmup steps. Both are reported as FSDP2 / DDP ratios: full shard should hold about 1/N of DDP's state.

    python benchmarks/fsdp2_memory.py                    # 2 processes (about a minute on 2 cores)
    python benchmarks/fsdp2_memory.py --nproc 2 4 --markdown out.md

CPU figures (gloo, one thread per process) are for shape, not speed: the all-gathers and reduce-scatters
FSDP2 adds are memory copies here, and on a 2-core machine 4 processes share 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mmrun.common.atomic_write import atomic_write

ROOT = Path(__file__).resolve().parents[1]
ENTRY = ROOT / "models" / "pretrain_transformers.py"
MODEL = {"model_type": "qwen2", "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 704,
         "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 256,
         "tie_word_embeddings": False}
SEQ, MICRO, GLOBAL = 128, 2, 16
STATE = re.compile(r"state on rank 0 after the first step: parameters ([\d.]+) MB, gradients ([\d.]+) MB, "
                   r"optimizer ([\d.]+) MB")


@dataclass
class Measurement:
    engine: str
    nproc: int
    parameters_mb: float
    gradients_mb: float
    optimizer_mb: float
    step_ms: float

    @property
    def state_mb(self) -> float:
        return self.parameters_mb + self.optimizer_mb

    @property
    def total_mb(self) -> float:
        return self.parameters_mb + self.gradients_mb + self.optimizer_mb


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "PET_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK_ID", "RANK_SIZE", "MMRUN_AI_FRAMEWORK")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_job(engine: str, nproc: int, iters: int, warmup: int, workdir: Path) -> Measurement:
    (workdir / "model.json").write_text(json.dumps({"hf_config": MODEL}))
    (workdir / "data.json").write_text(json.dumps({"dataset_param": {"dataset_type": "mock"}}))
    (workdir / "full.yaml").write_text("sharding_size: auto\nsub_modules_to_wrap: ['model.layers.{*}']\n")
    metrics = workdir / f"{engine}-{nproc}.jsonl"
    args = ["--mm-model", "model.json", "--mm-data", "data.json", "--seq-length", str(SEQ), "--micro-batch-size",
            str(MICRO), "--global-batch-size", str(GLOBAL), "--train-iters", str(iters), "--eval-iters", "0",
            "--log-interval", str(iters), "--lr", "1e-4", "--distributed-backend", "gloo", "--metrics-file", str(metrics)]
    if engine == "fsdp2":
        args += ["--use-torch-fsdp2", "--fsdp2-config-path", "full.yaml"]
    cmd = [sys.executable, "-m", "mmrun.launchers.cli", "--nproc-per-node", str(nproc), "--master-port", "0",
           str(ENTRY), *args]
    proc = subprocess.run(cmd, cwd=workdir, env=_env(), capture_output=True, text=True, timeout=1800)
    found = STATE.search(proc.stdout)
    if proc.returncode != 0 or found is None:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        raise SystemExit(f"fsdp2_memory: the {engine} job on {nproc} processes failed (exit {proc.returncode}): "
                         + " | ".join(tail))
    steps = [r["elapsed_ms"] for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "train"]
    m = Measurement(engine, nproc, *map(float, found.groups()), statistics.median(steps[warmup:]))
    print(f"  {engine:5s} {nproc} processes: parameters {m.parameters_mb:6.2f} MB, gradients {m.gradients_mb:6.2f} MB, "
          f"optimizer {m.optimizer_mb:6.2f} MB per rank; {m.step_ms:7.1f} ms/step", flush=True)
    return m


def table(pairs: list[tuple[Measurement, Measurement]]) -> str:
    rows = ["| processes | DDP params+optimizer per rank | FSDP2 full shard | ratio (1/N expected) | "
            "with gradients: DDP / FSDP2 / ratio | step time DDP / FSDP2 / ratio |",
            "|---|---|---|---|---|---|"]
    for ddp, fsdp in pairs:
        rows.append(f"| {ddp.nproc} | {ddp.state_mb:.2f} MB | {fsdp.state_mb:.2f} MB | "
                    f"{fsdp.state_mb / ddp.state_mb:.3f} (1/{ddp.nproc} = {1 / ddp.nproc:.3f}) | "
                    f"{ddp.total_mb:.2f} / {fsdp.total_mb:.2f} MB / {fsdp.total_mb / ddp.total_mb:.3f} | "
                    f"{ddp.step_ms:.1f} / {fsdp.step_ms:.1f} ms / {fsdp.step_ms / ddp.step_ms:.2f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/fsdp2_memory.py", description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[2], help="process counts (2)")
    parser.add_argument("--iters", type=int, default=12, help="training steps per job (12)")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the median (2)")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args(argv)
    if any(n < 2 for n in args.nproc) or args.warmup >= args.iters:
        parser.error(f"--nproc must be 2 or more and --warmup below --iters. Received: --nproc {args.nproc}, "
                     f"--warmup {args.warmup}, --iters {args.iters}")
    print(f"FSDP2 vs DDP: transformers Qwen2 (hidden {MODEL['hidden_size']}, {MODEL['num_hidden_layers']} layers, "
          f"vocab {MODEL['vocab_size']}), seq {SEQ}, global batch {GLOBAL}, fp32 AdamW; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores", flush=True)
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.nproc:
            pairs.append((run_job("ddp", n, args.iters, args.warmup, Path(tmp)),
                          run_job("fsdp2", n, args.iters, args.warmup, Path(tmp))))
    out = table(pairs)
    print(out)
    if args.markdown:
        atomic_write(args.markdown, out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
