#!/usr/bin/env python
"""What the portable API costs: GPT train-step time and peak memory through mmrun.backend against the
same model and step written directly in plain torch and in plain MindSpore, in the same run.

Timing runs one worker process per framework (so the two runtimes' thread pools never compete) that
builds every variant of that framework, compiles/warms each, then runs rounds in which each variant
does a few steps, the variant order rotating every round. Ratios are taken per round (API over plain,
adjacent in time, so background load mostly cancels) and the median over rounds is reported, with
the spread. Peak memory is the peak RSS of a separate process per variant (import + build + 3 steps).

examples:
  python benchmarks/api_overhead.py
  python benchmarks/api_overhead.py --rounds 3 --steps 3 --no-memory
  python benchmarks/api_overhead.py --layers 2 --hidden 128 --seq 128 --framework pytorch
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

HERE = Path(__file__).resolve().parent

# variant -> (framework, description). "plain" = written directly in the framework (benchmarks/plain_models.py).
VARIANTS: dict[str, tuple[str, str]] = {
    "torch-plain": ("pytorch", "plain torch, torch.optim.AdamW"),
    "torch-api": ("pytorch", "portable API, TrainStep"),
    "ms-plain-pynative": ("mindspore", "plain MindSpore PyNative, experimental AdamW"),
    "ms-api-pynative": ("mindspore", "portable API PyNative, TrainStep(jit=False)"),
    "ms-plain-jit": ("mindspore", "plain MindSpore jit, experimental AdamW"),
    "ms-api-jit": ("mindspore", "portable API jit, TrainStep (fused AdamW)"),
    "ms-api-jit-torch-order": ("mindspore", "portable API jit, AdamW(fused=False)"),
    "ms-plain-jit-adamweightdecay": ("mindspore", "plain MindSpore jit, nn.AdamWeightDecay (not torch AdamW)"),
}
RATIOS = [  # (label, numerator, denominator)
    ("API / plain torch", "torch-api", "torch-plain"),
    ("API / plain MindSpore, PyNative", "ms-api-pynative", "ms-plain-pynative"),
    ("API / plain MindSpore, jit", "ms-api-jit", "ms-plain-jit"),
    ("MindSpore API: PyNative / jit", "ms-api-pynative", "ms-api-jit"),
    ("plain MindSpore: PyNative / jit", "ms-plain-pynative", "ms-plain-jit"),
    ("API jit: torch-order / fused AdamW", "ms-api-jit-torch-order", "ms-api-jit"),
    ("API jit fused AdamW / plain jit nn.AdamWeightDecay", "ms-api-jit", "ms-plain-jit-adamweightdecay"),
    ("MindSpore API jit / torch API", "ms-api-jit", "torch-api"),
]


def gpt_config(args: argparse.Namespace, framework: str = "pytorch") -> Any:
    from mmrun.backend import side_by_side
    gpt = side_by_side.load_module("mmrun.models.gpt", framework)
    return gpt.GPTConfig(num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
                         vocab_size=args.vocab, max_position_embeddings=args.seq, seq_length=args.seq,
                         hidden_dropout=0.0, attention_dropout=0.0)


def initial_state(args: argparse.Namespace) -> dict[str, np.ndarray]:
    """The same initial weights for every variant (a torch-built GPT from seed 0, as numpy)."""
    import torch
    from mmrun.backend.torch import tensors
    from mmrun.backend import side_by_side
    torch.manual_seed(0)
    gpt = side_by_side.load_module("mmrun.models.gpt", "pytorch")
    return tensors.state_dict_to_numpy(gpt.GPT(gpt_config(args)).state_dict())


def batches(args: argparse.Namespace, count: int = 4) -> list[tuple[np.ndarray, ...]]:
    rng = np.random.default_rng(1)
    shape = (args.batch, args.seq)
    return [(rng.integers(0, args.vocab, shape), rng.integers(0, args.vocab, shape), np.ones(shape, np.float32))
            for _ in range(count)]


def api_step(framework: str, args: argparse.Namespace, state: dict[str, np.ndarray], jit: bool | None,
             fused: bool = True) -> Callable[[tuple], Any]:
    from mmrun.backend.lr_schedule import LRSchedule
    from mmrun.backend import side_by_side
    sys.path.insert(0, str(HERE))
    from plain_models import OPTIMIZER
    package = side_by_side.backend_package(framework)
    for sub in ("tensors", "optim", "train_step"):
        __import__(f"{package.__name__}.{sub}")
    gpt = side_by_side.load_module("mmrun.models.gpt", framework)
    model = gpt.GPT(gpt_config(args, framework))
    model.load_state_dict(package.tensors.state_dict_from_numpy(state))
    extra = {"fused": fused} if framework == "mindspore" else {}
    optimizer = package.optim.AdamW(model.named_parameters(), no_decay=package.optim.megatron_no_decay,
                                    **OPTIMIZER, **extra)
    schedule = LRSchedule(max_lr=OPTIMIZER["lr"], lr_decay_steps=10**6, lr_decay_style="constant")
    step = package.train_step.TrainStep(model, optimizer, loss_fn=gpt.gpt_loss, lr_scheduler=schedule,
                                        clip_grad=1.0, **({"jit": jit} if framework == "mindspore" else {}))
    return lambda batch: step([batch])


def build(variant: str, args: argparse.Namespace, state: dict[str, np.ndarray]) -> tuple[Callable, Callable]:
    """(step(batch) -> result, to_framework(numpy batch) -> batch) for a variant."""
    sys.path.insert(0, str(HERE))
    import plain_models
    framework = VARIANTS[variant][0]
    if framework == "pytorch":
        import torch
        if args.threads:
            torch.set_num_threads(args.threads)
        convert = lambda b: tuple(torch.from_numpy(np.array(a)) for a in b)  # noqa: E731
        if variant == "torch-plain":
            return plain_models.torch_step(gpt_config(args), state), convert
        return api_step("pytorch", args, state, None), convert
    import mmrun.backend.mindspore  # noqa: F401 - sets the device, which must precede any MindSpore kernel
    import mindspore
    convert = lambda b: tuple(mindspore.Tensor(a) for a in b)  # noqa: E731
    cfg = gpt_config(args, "mindspore")
    return {
        "ms-plain-pynative": lambda: plain_models.mindspore_step(cfg, state, jit=False),
        "ms-plain-jit": lambda: plain_models.mindspore_step(cfg, state, jit=True),
        "ms-plain-jit-adamweightdecay": lambda: plain_models.mindspore_step(cfg, state, jit=True,
                                                                            optimizer_kind="AdamWeightDecay"),
        "ms-api-pynative": lambda: api_step("mindspore", args, state, jit=False),
        "ms-api-jit": lambda: api_step("mindspore", args, state, jit=True),
        "ms-api-jit-torch-order": lambda: api_step("mindspore", args, state, jit=True, fused=False),
    }[variant](), convert


def _first_loss(result: Any) -> float:
    return float(result.loss if hasattr(result, "loss") else result[0])


def load_state(args: argparse.Namespace) -> dict[str, np.ndarray]:
    # Weights come from a file the parent wrote, so a MindSpore worker never imports torch (its memory counts).
    from safetensors.numpy import load_file
    return load_file(args.state)


def worker_timing(args: argparse.Namespace, variants: list[str]) -> dict[str, Any]:
    state, data = load_state(args), batches(args)
    steps, first_loss, warm = {}, {}, {}
    times, cpu = {v: [] for v in variants}, {v: [] for v in variants}
    for v in variants:
        step, convert = build(v, args, state)
        converted = [convert(b) for b in data]
        start = time.perf_counter()
        first_loss[v] = _first_loss(step(converted[0]))  # compiles under jit
        warm[v] = time.perf_counter() - start
        step(converted[1])
        steps[v] = (step, converted)
        print(f"[bench] built {v}: first step {warm[v]:.1f}s, loss {first_loss[v]:.6f}", file=sys.stderr, flush=True)
    for r in range(args.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            step, converted = steps[v]
            per_step, per_step_cpu = [], []
            for i in range(args.steps):
                start, start_cpu = time.perf_counter(), time.process_time()
                step(converted[i % len(converted)])
                per_step.append(time.perf_counter() - start)
                per_step_cpu.append(time.process_time() - start_cpu)
            times[v].append(per_step)
            cpu[v].append(per_step_cpu)
        print(f"[bench] round {r + 1}/{args.rounds}: " + ", ".join(
            f"{v} {1e3 * statistics.median(times[v][-1]):.0f} ms" for v in variants), file=sys.stderr, flush=True)
    return {"times": times, "cpu": cpu, "first_loss": first_loss, "first_step_s": warm}


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker_memory(args: argparse.Namespace, variant: str) -> dict[str, float]:
    state, data = load_state(args), batches(args)
    step, convert = build(variant, args, state)
    converted = [convert(b) for b in data]
    before = _rss_mib()
    for i in range(3):
        step(converted[i % len(converted)])
    return {"rss_before_steps_mib": before, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_worker(argv: list[str], timeout: float) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "GLOG_v": "3"})
    for line in proc.stderr.splitlines():
        if line.startswith("[bench]"):
            print(line, flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark worker {argv} failed with exit code {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratios(series: dict[str, list[list[float]]], num: str, den: str) -> list[float]:
    """Per-round ratio of the two variants' round medians (adjacent in time, so background load cancels)."""
    return [statistics.median(a) / statistics.median(b) for a, b in zip(series[num], series[den])]


def summarise(timing: dict[str, Any], memory: dict[str, dict[str, float]]) -> str:
    times, cpu = timing["times"], timing["cpu"]
    flat = lambda rounds: [t for rnd in rounds for t in rnd]  # noqa: E731
    lines = ["| variant | median step ms (wall) | spread of round medians ms | median step CPU ms "
             "| first step s (compile) | loss at step 1 | peak RSS MiB |", "|---|---|---|---|---|---|---|"]
    for v in times:
        rounds = [1e3 * statistics.median(r) for r in times[v]]
        mem = memory.get(v, {}).get("peak_rss_mib")
        lines.append(f"| {v}: {VARIANTS[v][1]} | {1e3 * statistics.median(flat(times[v])):.1f} "
                     f"| {min(rounds):.1f} - {max(rounds):.1f} | {1e3 * statistics.median(flat(cpu[v])):.1f} "
                     f"| {timing['first_step_s'][v]:.1f} | {timing['first_loss'][v]:.6f} "
                     f"| {'-' if mem is None else f'{mem:.0f}'} |")
    lines += ["", "| ratio | wall: median over rounds | wall: min - max | CPU time: median over rounds "
              "| CPU time: min - max | peak RSS ratio |", "|---|---|---|---|---|---|"]
    for label, num, den in RATIOS:
        if num in times and den in times:
            wall, cpu_ratio = _ratios(times, num, den), _ratios(cpu, num, den)
            mem = ""
            if num in memory and den in memory:
                mem = f"{memory[num]['peak_rss_mib'] / memory[den]['peak_rss_mib']:.3f}"
            lines.append(f"| {label} | {statistics.median(wall):.3f} | {min(wall):.3f} - {max(wall):.3f} "
                         f"| {statistics.median(cpu_ratio):.3f} | {min(cpu_ratio):.3f} - {max(cpu_ratio):.3f} "
                         f"| {mem} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="examples:" + __doc__.split("examples:")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--steps", type=int, default=4, help="steps per variant per round (default 4)")
    parser.add_argument("--framework", choices=["pytorch", "mindspore", "both"], default="both")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated subset of: {', '.join(VARIANTS)}")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads (torch.set_num_threads); 0 keeps torch's default")
    parser.add_argument("--no-memory", "--no_memory", dest="memory", action="store_false",
                        help="skip the per-variant peak-memory processes")
    parser.add_argument("--worker", choices=["timing", "memory"], help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if args.framework != "both":
        variants = [v for v in variants if VARIANTS[v][0] == args.framework]
    if args.worker == "timing":
        print(json.dumps(worker_timing(args, variants)))
        return 0
    if args.worker == "memory":
        print(json.dumps(worker_memory(args, variants[0])))
        return 0

    from safetensors.numpy import save_file
    state_file = tempfile.NamedTemporaryFile(suffix=".safetensors", delete=False)
    state_file.close()
    save_file(initial_state(args), state_file.name)
    try:
        return _drive(args, variants, state_file.name)
    finally:
        os.unlink(state_file.name)


def _drive(args: argparse.Namespace, variants: list[str], state_path: str) -> int:
    shape = ["--layers", str(args.layers), "--hidden", str(args.hidden), "--heads", str(args.heads),
             "--seq", str(args.seq), "--batch", str(args.batch), "--vocab", str(args.vocab), "--state", state_path,
             "--threads", str(args.threads)]
    timing: dict[str, Any] = {"times": {}, "cpu": {}, "first_loss": {}, "first_step_s": {}}
    for framework in ("pytorch", "mindspore"):
        chosen = [v for v in variants if VARIANTS[v][0] == framework]
        if chosen:
            print(f"[bench] timing {framework}: {', '.join(chosen)}", flush=True)
            result = run_worker(["--worker", "timing", "--variants", ",".join(chosen), "--rounds", str(args.rounds),
                                 "--steps", str(args.steps), *shape], timeout=3600)
            for key in timing:
                timing[key].update(result[key])
    memory: dict[str, dict[str, float]] = {}
    if args.memory:
        for v in variants:
            print(f"[bench] peak memory: {v}", flush=True)
            memory[v] = run_worker(["--worker", "memory", "--variants", v, *shape], timeout=1800)
    print(f"\nGPT {args.layers} layers, hidden {args.hidden}, {args.heads} heads, seq {args.seq}, batch {args.batch}, "
          f"vocab {args.vocab}; {args.rounds} rounds x {args.steps} steps per variant; torch threads "
          f"{args.threads or 'default'}; load average at the end "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print(summarise(timing, memory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
