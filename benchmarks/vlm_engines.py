#!/usr/bin/env python3
"""The VLM's training speed on megatron-core's engine against mmrun's portable engine, in the SAME precision.

Issue 27 saw 296 tokens/s on megatron-core (fp32) against 1220 on the portable engine (bf16) for the demo on an
H100: not like for like. Here every row is models/pretrain_vlm.py on the offline demo (scripts/qwen2vl/
model_tiny.json unless --mm-model), one process through `mmrun`, on this machine's device; the two engines
alternate round by round in each precision, and each row keeps the median step time after --warmup steps
(from the job's --metrics-file) of its best round. tokens/s is the entry's own (global batch x --seq-length
per step), the same definition for both engines, so their ratio is the speed ratio.

    python benchmarks/vlm_engines.py                        # fp32 and bf16, 20 steps after 5 warm-up
    python benchmarks/vlm_engines.py --cpu-smoke            # fp32, 3 steps: checks the script
    OUT=/tmp/out python benchmarks/vlm_engines.py           # vlm_engines.json / vlm_engines.md under $OUT
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from mmrun.common.atomic_write import atomic_write

ROOT = Path(__file__).resolve().parents[1]
ENTRY = ROOT / "models" / "pretrain_vlm.py"
ENGINES = {"portable": [], "megatron-core": ["--use-mcore-models"]}
ARGS = ["--micro-batch-size", "2", "--global-batch-size", "4", "--seq-length", "128", "--lr", "1e-4",
        "--eval-iters", "0", "--seed", "42", "--weight-decay", "0", "--clip-grad", "1.0"]


def run(engine: str, precision: str, model_json: str, data_json: str, warmup: int, iters: int, env: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="mmrun_vlm_engines_") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        cmd = [sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", "pytorch", "--nproc-per-node", "1",
               "--master-port", "0", str(ENTRY), *ARGS, "--mm-model", model_json, "--mm-data", data_json,
               "--train-iters", str(warmup + iters), "--log-interval", str(warmup + iters),
               "--metrics-file", str(metrics), *ENGINES[engine], *(["--bf16"] if precision == "bf16" else [])]
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
        records = [json.loads(ln) for ln in metrics.read_text().splitlines()] if metrics.exists() else []
    train = [r for r in records if r["kind"] == "train"][warmup:]
    summary = next((r for r in records if r["kind"] == "summary"), {})
    if proc.returncode != 0 or len(train) < iters:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {proc.returncode}: {tail[0][:240]}"}
    step = statistics.median(r["elapsed_ms"] for r in train)
    tokens = train[0]["tokens_per_second"] * train[0]["elapsed_ms"] / 1e3  # per step: global batch x --seq-length
    return {"step_ms": round(step, 2), "tokens_per_s": round(tokens / step * 1e3),
            "engine": summary.get("engine"), "device": summary.get("device"),
            "peak_device_memory_mb": summary.get("peak_device_memory_mb"), "loss": train[-1]["lm_loss"]}


def markdown(device: str, rows: list[dict]) -> str:
    lines = [f"VLM demo (one process) on {device}: megatron-core's engine against the portable engine", "",
             "| precision | engine | step ms | tokens/s | megatron-core / portable (tokens/s) |",
             "|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['precision']} | {r['impl']} | failed: {r['error']} | | |")
            continue
        base = next((b for b in rows if b["precision"] == r["precision"] and b["impl"] == "portable"
                     and "error" not in b), None)
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base and r["impl"] != "portable" else "-"
        lines.append(f"| {r['precision']} | {r['impl']} | {r['step_ms']} | {r['tokens_per_s']} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", "--cpu_smoke", dest="cpu_smoke", action="store_true")
    parser.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), default=None)
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default 5, smoke 1)")
    parser.add_argument("--iters", type=int, default=None, help="timed steps (default 20, smoke 2)")
    parser.add_argument("--repeat", type=int, default=None, help="alternating rounds (default 2, smoke 1)")
    parser.add_argument("--mm-model", "--mm_model", dest="mm_model",
                        default=str(ROOT / "scripts" / "qwen2vl" / "model_tiny.json"))
    args = parser.parse_args(argv)
    import torch

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "PET_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MMRUN_AI_FRAMEWORK")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if args.cpu_smoke:
        env["CUDA_VISIBLE_DEVICES"] = ""
    device = "cuda" if torch.cuda.is_available() and not args.cpu_smoke else "cpu"
    precisions = args.precisions or (["fp32"] if args.cpu_smoke else ["fp32", "bf16"])
    warmup, iters = args.warmup or (1 if args.cpu_smoke else 5), args.iters or (2 if args.cpu_smoke else 20)
    repeat = args.repeat or (1 if args.cpu_smoke else 2)
    engines = list(ENGINES)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mmrun_vlm_demo_") as tmp:
        from mmrun.data.multimodal.demo import make_demo

        data_json = make_demo(tmp, num_samples=64, seed=7)["data_json"]
        for precision in precisions:
            best: dict[str, dict] = {}
            for _ in range(repeat):
                for engine in engines:
                    if engine == "megatron-core" and importlib.util.find_spec("megatron") is None:
                        best[engine] = {"error": "megatron-core is not installed"}
                        continue
                    raw = run(engine, precision, args.mm_model, data_json, warmup, iters, env)
                    kept = best.get(engine)
                    if kept is None or "error" in kept or ("error" not in raw and raw["step_ms"] < kept["step_ms"]):
                        best[engine] = raw
            rows += [{"impl": e, "precision": precision, **best[e]} for e in engines]
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    table = markdown(name, rows)
    print(table)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        atomic_write(Path(out) / "vlm_engines.json", json.dumps({"device": name, "rows": rows}, indent=1) + "\n")
        atomic_write(Path(out) / "vlm_engines.md", table)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
