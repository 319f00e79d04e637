#!/usr/bin/env python
"""What the precision tools cost per train step: the layer-wise dump (statistics), anomaly detection and
monitoring (TensorBoard scalars, per-phase timers, throughput), on and off, as ratios of the step time without them, for a GPT trained through mmrun's TrainStep.

One process per framework. Variants: `off` (no probe: what the trainer does without the flags), `probe
idle` (a TrainingProbe with both features off on this step: the per-step `if`s), `anomaly` (hooks on every
module, NaN/Inf and spike checks), `dump` (statistics of every module's inputs, outputs and gradients,
written to disk, every step), `monitor idle` (the run monitor with every monitoring flag off), `monitor`
(TensorBoard scalars, level-1 timers and the throughput field on every step). Rounds rotate the variant order; per-round ratios against `off`, median and
spread reported. MindSpore runs every variant in PyNative (the mode the hooks need), so its `off` is
PyNative too; the trainer's default (mindspore.jit) is faster still, and the probe flags switch it off.

examples:
  python benchmarks/precision_overhead.py
  python benchmarks/precision_overhead.py --framework mindspore --rounds 3 --steps 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = r'''
import json, sys, tempfile, time
import numpy as np
framework, layers, hidden, seq, rounds, steps = sys.argv[1], *map(int, sys.argv[2:7])
from mmrun import backend
backend.select(framework)
from mmrun.backend import optim, tensors, train_step
from mmrun.models.gpt import GPT, GPTConfig, gpt_loss
from mmrun.precision.anomaly import SpikeRule
from mmrun.precision.dump_config import DumpConfig
from mmrun.precision.training_probe import TrainingProbe
backend.seeding.seed_everything(1234)
model = GPT(GPTConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=4, vocab_size=1024,
                      max_position_embeddings=seq, seq_length=seq, hidden_dropout=0.0, attention_dropout=0.0))
opt = optim.AdamW(model.named_parameters(), lr=1e-4, weight_decay=0.0, no_decay=optim.megatron_no_decay)
step = train_step.TrainStep(model, opt, loss_fn=gpt_loss, clip_grad=1.0, jit=False)
rng = np.random.default_rng(0)
tok = rng.integers(0, 1024, size=(4, seq + 1))
batch = (tensors.from_numpy(tok[:, :-1]), tensors.from_numpy(tok[:, 1:]), tensors.from_numpy(np.ones((4, seq), np.float32)))
out = tempfile.mkdtemp()
probes = {"off": None,
          "probe idle": TrainingProbe(framework, 0, model, lambda m: None, DumpConfig(steps=(10**9,), dump_path=out), "off", SpikeRule()),
          "anomaly": TrainingProbe(framework, 0, model, lambda m: None, None, "log", SpikeRule()),
          "dump": TrainingProbe(framework, 0, model, lambda m: None, DumpConfig(dump_path=out), "off", SpikeRule())}
for p in probes.values():
    if p is not None: p.close()  # attached per variant below
# Monitoring: `monitor idle` is the RunMonitor every run has (all flags off); `monitor` writes TensorBoard
# scalars every step and times the phases (--tensorboard-dir, --tensorboard-log-interval 1, --timing-log-level 1,
# --log-throughput), with the timer gather and block of each --log-interval 1 line.
import types
from mmrun.precision.monitor import RunMonitor
from mmrun.training.training_log import IntervalStats
def monitor_args(on):
    return types.SimpleNamespace(world_size=1, tensorboard_dir=tempfile.mkdtemp() if on else None, wandb_project=None,
        tensorboard_log_interval=1, tensorboard_queue_size=1000, timing_log_level=1 if on else 0, timing_log_option="minmax",
        log_timers_to_tensorboard=on, log_throughput=on, profile=False, global_batch_size=4, seq_length=seq,
        num_layers=layers, hidden_size=hidden, ffn_hidden_size=None, padded_vocab_size=1024,
        no_log_learnig_rate_to_tensorboard=False, log_batch_size_to_tensorboard=False,
        no_log_loss_scale_to_tensorboard=False, log_world_size_to_tensorboard=False, log_memory_to_tensorboard=False,
        log_validation_ppl_to_tensorboard=False)
monitors = {"monitor idle": False, "monitor": True}
def run(name, n):
    if name in monitors:
        holder = types.SimpleNamespace()
        mon = RunMonitor.create(monitor_args(monitors[name]), framework, 0, holder, lambda m: None)
        step.timers = getattr(holder, "timers", step.timers)
        start = time.perf_counter()
        for i in range(n):
            mon.before_step(i + 1)
            t0 = time.perf_counter()
            r = step([batch])
            stats = IntervalStats()
            stats.add({"lm loss": r.loss}, time.perf_counter() - t0)
            mon.after_step(i + 1, r, time.perf_counter() - t0, 4 * (i + 1))
            mon.log_interval(i + 1, stats)
            mon.flush_timers()
        elapsed = (time.perf_counter() - start) / n
        mon.close()
        from mmrun.precision.timers import NO_TIMERS
        step.timers = NO_TIMERS
        return elapsed
    p = probes[name]
    if name == "anomaly":
        p._remove.append(p.probe.attach(model, p._checker.forward, p._checker.backward))
    start = time.perf_counter()
    for i in range(n):
        if p is not None: p.before_step(i + 1)
        r = step([batch])
        if p is not None: p.after_step(i + 1, r.loss, r.grad_norm)
    elapsed = (time.perf_counter() - start) / n
    if p is not None: p.close()
    return elapsed
names = list(probes) + list(monitors)
for name in names: run(name, 2)  # warm-up
times = {n: [] for n in names}
for r in range(rounds):
    order = names[r % len(names):] + names[:r % len(names)]
    for name in order:
        times[name].append(run(name, steps))
print(json.dumps(times))
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", choices=("pytorch", "mindspore", "both"), default="both")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    frameworks = ("pytorch", "mindspore") if args.framework == "both" else (args.framework,)
    print(f"GPT {args.layers} layers, hidden {args.hidden}, seq {args.seq}, micro-batch 4; {args.rounds} rounds of "
          f"{args.steps} steps; ratio = variant step time / off, median over rounds [min, max]")
    for framework in frameworks:
        with tempfile.TemporaryDirectory():
            result = subprocess.run([sys.executable, "-c", WORKER, framework, str(args.layers), str(args.hidden),
                                     str(args.seq), str(args.rounds), str(args.steps)], capture_output=True, text=True)
        if result.returncode != 0:
            print(result.stderr[-2000:], file=sys.stderr)
            return 1
        times = json.loads(result.stdout.strip().splitlines()[-1])
        off = times["off"]
        for name, values in times.items():
            ratios = [v / o for v, o in zip(values, off)]
            print(f"{framework:<10} {name:<11} step {statistics.median(values) * 1000:8.1f} ms   ratio "
                  f"{statistics.median(ratios):5.2f} [{min(ratios):.2f}, {max(ratios):.2f}]")
    return 0


if __name__ == "__main__":
    t = time.time()
    code = main()
    print(f"({time.time() - t:.0f} s)")
    sys.exit(code)
