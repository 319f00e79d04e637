#!/usr/bin/env python3
"""Activation recomputation: peak resident memory and step time of a training step with and without it (a benchmark).

Each measurement is one fresh process training mmrun's GPT (models/gpt.py, fp32, the backend's TrainStep) on a
shape whose activations dominate (many tokens, a small model): --steps steps, with no recomputation, then with
--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 (models/recompute.py, every layer
recomputed in backward). Memory is the process's resident set (glibc's mmap threshold fixed at 128 KiB, so
freed tensors leave it): `peak` is the high-water mark (ru_maxrss) at the
end, `step peak` that minus the resident set just before the first step (model, optimizer state and the
framework's own footprint excluded). MindSpore's pool peak is its memory pool's "peak used mem"
(`MS_DEV_RUNTIME_CONF=memory_statistics:True`: activations, gradients, workspaces); the rest of its step peak is
memory outside the pool (compiled graphs and kernels, about 155 MiB a GPT layer whatever the tokens). Step time
is the median over the steps after the first (PyTorch) or after compilation (MindSpore's compiled step). Ratios
are recompute / none.

    python benchmarks/recompute_memory.py                                  # both frameworks, MindSpore jit and PyNative
    python benchmarks/recompute_memory.py --frameworks pytorch --markdown out.md
    python benchmarks/recompute_memory.py --layers 16 --batch 16 --no-ms-jit   # activations dominate more
    python benchmarks/recompute_memory.py --no-pynative --batch 96 --steps 2    # enough for MindSpore's compiled step
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
from pathlib import Path

REPO_PARENT = Path(__file__).resolve().parents[2]
POOL_PEAK = r"Common mem pool info:.*?peak used mem:(\d+)M"
RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": "1"}


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def gpt_loss(model, tokens, labels, mask):  # a named function: mindspore.jit cannot parse a lambda argument
    return model(tokens, labels=labels, loss_mask=mask)


def measure(framework: str, mode: str, jit: bool, shape: dict) -> dict:
    """In this process: build, train --steps steps, return memory (MiB) and step times (s)."""
    import resource
    import time
    from types import SimpleNamespace

    import numpy as np

    from mmrun import backend

    backend.select(framework, source="recompute_memory.py")
    if framework == "mindspore" and shape.get("ms_memory_level"):
        import mindspore

        mindspore.runtime.set_memory(optimize_level=shape["ms_memory_level"])  # O1: memory reuse between nodes
    from mmrun.backend import optim, seeding, tensors, train_step
    from mmrun.models import recompute
    from mmrun.models.gpt import GPT, GPTConfig

    seeding.seed_everything(1234)
    config = GPTConfig(num_layers=shape["layers"], hidden_size=shape["hidden"], num_attention_heads=shape["heads"],
                       vocab_size=shape["vocab"], max_position_embeddings=shape["seq"], seq_length=shape["seq"],
                       hidden_dropout=0.0, attention_dropout=0.0)
    model = GPT(config)
    said = recompute.apply(model, recompute.plans(SimpleNamespace(**RECOMPUTE))) if mode == "recompute" else []
    opt = optim.AdamW(model.named_parameters(), lr=1e-4, weight_decay=0.0, no_decay=optim.megatron_no_decay)
    step = train_step.TrainStep(model, opt, loss_fn=gpt_loss, clip_grad=1.0,
                                **({"jit": jit} if framework == "mindspore" else {}))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, shape["vocab"], size=(shape["batch"], shape["seq"] + 1)).astype(np.int64)
    batch = (tensors.from_numpy(tokens[:, :-1]), tensors.from_numpy(tokens[:, 1:]),
             tensors.from_numpy(np.ones((shape["batch"], shape["seq"]), np.float32)))
    before = _rss_kib()
    times, losses = [], []
    for _ in range(shape["steps"]):
        start = time.perf_counter()
        out = step([batch])
        times.append(time.perf_counter() - start)
        losses.append(out.loss)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"framework": framework, "mode": mode, "jit": jit, "recomputed": said, "losses": losses,
            "peak_mib": peak / 1024, "step_peak_mib": (peak - before) / 1024, "before_mib": before / 1024,
            "step_s": statistics.median(times[1:]), "first_step_s": times[0]}


def _run(framework: str, mode: str, jit: bool, shape: dict) -> dict:
    # A fixed mmap threshold: glibc otherwise raises it to the largest freed block, so later tensors of that size come
    # from the heap and stay resident after they are freed, and the high-water mark measures fragmentation, not tensors.
    env = {**os.environ, "OMP_NUM_THREADS": str(shape["threads"]), "MALLOC_MMAP_THRESHOLD_": "131072",
           **({"MS_DEV_RUNTIME_CONF": "memory_statistics:True"} if framework == "mindspore" else {})}
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
            f"import recompute_memory as r; print('RESULT ' + json.dumps(r.measure({framework!r}, {mode!r}, {jit!r}, "
            f"{shape!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{framework} {mode} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    pools = re.findall(POOL_PEAK, done.stdout + done.stderr)  # MindSpore's pool peak (MB), as it prints it
    return {**json.loads(lines[-1][len("RESULT "):]), "pool_peak": int(pools[-1]) if pools else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", nargs="+", default=["pytorch", "mindspore"])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-pynative", action="store_true", help="MindSpore: the compiled step only")
    parser.add_argument("--no-ms-jit", action="store_true", help="MindSpore: the PyNative step only (what mmrun runs "
                        "with recomputation on a CPU)")
    parser.add_argument("--ms-memory-level", choices=("O0", "O1"), default=None,
                        help="MindSpore: mindspore.runtime.set_memory(optimize_level=...) (default: MindSpore's, O0)")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    shape = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq", "batch", "vocab", "steps", "threads",
                                      "ms_memory_level")}
    cases = []
    for fw in args.frameworks:
        for jit in ((False,) if fw == "pytorch" or args.no_ms_jit else (True,) if args.no_pynative else (True, False)):
            cases.append((fw, jit))
    rows = [f"GPT {shape['layers']} layers, hidden {shape['hidden']}, {shape['batch']} x {shape['seq']} tokens, fp32, "
            f"{shape['steps']} steps, {shape['threads']} threads; {platform.processor() or platform.machine()}, "
            f"Python {platform.python_version()}", "",
            "| framework | step | peak none -> recompute (MiB) | ratio | step peak none -> recompute (MiB) | ratio "
            "| MindSpore pool peak none -> recompute (MB) | step time none -> recompute (s) | ratio "
            "| losses equal |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for fw, jit in cases:
        none, full = _run(fw, "none", jit, shape), _run(fw, "recompute", jit, shape)
        step = ("compiled (mindspore.jit)" if jit else "PyNative") if fw == "mindspore" else "eager"
        rows.append(f"| {fw} | {step} | {none['peak_mib']:.0f} -> {full['peak_mib']:.0f} | "
                    f"{full['peak_mib'] / none['peak_mib']:.2f} | {none['step_peak_mib']:.0f} -> "
                    f"{full['step_peak_mib']:.0f} | {full['step_peak_mib'] / none['step_peak_mib']:.2f} | "
                    f"{none['pool_peak'] or '-'} -> {full['pool_peak'] or '-'} | "
                    f"{none['step_s']:.2f} -> {full['step_s']:.2f} | {full['step_s'] / none['step_s']:.2f} | "
                    f"{'yes' if none['losses'] == full['losses'] else 'no: ' + str((none['losses'], full['losses']))} |")
        print(rows[-1], flush=True)
    text = "\n".join(rows) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
