#!/usr/bin/env python3
"""Where a compiled MindSpore training step of mmrun's GPT keeps its memory outside the pool, per layer (a benchmark).

Each case is one fresh process: build mmrun's GPT (hidden 128, 4 heads, seq 256, vocab 512, dropout 0) with
--layers-a and then --layers-b layers, compile one part of the training step with mindspore.jit on one sequence
(batch 1: the activations are a few MiB, so what is measured is the compiled graph and its kernels), call it twice,
and report the resident high-water mark minus the resident set before the first call (`step peak`, compilation
included; glibc's mmap threshold fixed at 128 KiB as in recompute_memory.py). The difference between the two layer
counts, divided by their difference, is what one more layer costs.

Parts: `forward` = the loss; `grads` = value_and_grad of the loss (the loss and the sum of squared gradients out);
`adamw` = the optimizer's update alone (AdamW on zero gradients given as one tuple); `update` = TrainStep's update
graph alone (flat buckets, norm, clipping, AdamW); `step` = TrainStep's whole compiled step (what mmrun runs:
value_and_grad and the update in one graph); `step+recompute` = the same with every layer recomputed.

    python benchmarks/ms_step_memory.py
    python benchmarks/ms_step_memory.py --parts step step+recompute --layers-a 2 --layers-b 8
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

PARTS = ("forward", "grads", "adamw", "update", "step", "step+recompute")


def measure(part: str, layers: int) -> dict:
    """In this process: compile `part` for a GPT of `layers` layers, call it twice -> step peak and after (MiB)."""
    import resource
    from types import SimpleNamespace

    import numpy as np

    from mmrun import backend

    backend.select("mindspore", source="ms_step_memory.py")
    import mindspore as ms
    from mindspore import mint, ops

    from mmrun.backend import optim, seeding, tensors, train_step
    from mmrun.models import recompute
    from mmrun.models.gpt import GPT, GPTConfig

    seeding.seed_everything(1234)
    model = GPT(GPTConfig(num_layers=layers, hidden_size=128, num_attention_heads=4, vocab_size=512,
                          max_position_embeddings=256, seq_length=256, hidden_dropout=0.0, attention_dropout=0.0))
    if part == "step+recompute":
        recompute.apply(model, recompute.plans(SimpleNamespace(**{"recompute_granularity": "full",
                        "recompute_method": "uniform", "recompute_num_layers": "1"})))
    tokens = np.random.default_rng(0).integers(0, 512, size=(1, 257)).astype(np.int64)
    batch = (tensors.from_numpy(tokens[:, :-1]), tensors.from_numpy(tokens[:, 1:]),
             tensors.from_numpy(np.ones((1, 256), np.float32)))
    opt = optim.AdamW(model.named_parameters(), lr=1e-4, weight_decay=0.0, no_decay=optim.megatron_no_decay)
    step = train_step.TrainStep(model, opt, loss_fn=gpt_loss, clip_grad=1.0, jit=True)
    zeros = ms.mutable(tuple(ops.zeros_like(p) for p in opt.params))
    if part == "forward":
        fn = ms.jit(step._loss)
        call = lambda: fn(*batch)  # noqa: E731
    elif part == "grads":
        grad_fn = step._grad_fn

        def grads(*b):
            loss, gs = grad_fn(*b)
            return loss, ops.addn([mint.sum(g * g) for g in gs])
        fn = ms.jit(grads)
        call = lambda: fn(*batch)  # noqa: E731
    elif part == "adamw":
        call = lambda: opt(zeros, opt._next_scalars())  # noqa: E731
    elif part == "update":
        call = lambda: step._compiled["update"](zeros, ms.Tensor(1.0, ms.float32), opt._next_scalars())  # noqa: E731
    else:
        call = lambda: step([batch])  # noqa: E731
    before = _rss_mib()
    for _ in range(2):
        call()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"step_peak": peak - before, "after": _rss_mib() - before}


def gpt_loss(model, tokens, labels, mask):  # a named function: mindspore.jit cannot parse a lambda argument
    return model(tokens, labels=labels, loss_mask=mask)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _run(part: str, layers: int, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MALLOC_MMAP_THRESHOLD_": "131072"}
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
            f"import ms_step_memory as m; print('RESULT ' + json.dumps(m.measure({part!r}, {layers!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{part} {layers} layers failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--layers-a", type=int, default=1)
    parser.add_argument("--layers-b", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    a, b = args.layers_a, args.layers_b
    print(f"mmrun's GPT on MindSpore, hidden 128, 1 x 256 tokens, fp32, compiled, {args.threads} thread(s); MiB\n")
    print(f"| part | step peak, {a} layer(s) | step peak, {b} layers | per layer |")
    print("|---|---|---|---|")
    for part in args.parts:
        lo, hi = _run(part, a, args.threads), _run(part, b, args.threads)
        print(f"| {part} | {lo['step_peak']:.0f} | {hi['step_peak']:.0f} | "
              f"{(hi['step_peak'] - lo['step_peak']) / (b - a):.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
