#!/usr/bin/env python3
"""Where plain MindSpore's memory goes on CPU: the GPT of benchmarks/plain_models.py (written directly in MindSpore,
no mmrun), one process per setting, its peak resident set size (the whole process) against one knob at a time.

Each worker imports MindSpore, applies one setting from KNOBS, builds the GPT and its jit train step (value_and_grad,
clipping, AdamW), runs --steps steps and prints the process's RSS after import, after the build, and its peak
(getrusage ru_maxrss). A benchmark, not a test; never run it past the 8 x 256, seq 512, batch 2 size (a 1024 x 4 run
passed 23 GB).

    python benchmarks/ms_memory_knobs.py --knobs baseline malloc-arena-2 --layers 2 --seq 128   # small first
    python benchmarks/ms_memory_knobs.py --rounds 2                                               # the 8 x 256 target
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent

# name -> (environment for the worker, code run after `import mindspore` before the build, jit keyword arguments)
KNOBS: dict[str, tuple[dict[str, str], str, dict]] = {
    "baseline": ({}, "", {}),
    "pynative": ({}, "", {"pynative": True}),
    "lazy-inline": ({}, "", {"lazy_inline": True}),
    "jit-O1": ({}, "", {"jit_level": "O1"}),
    "jit-dynamic": ({}, "", {"dynamic": 1}),
    "jit-bytecode": ({}, "", {"capture_mode": "bytecode"}),
    "mem-O1": ({}, "mindspore.runtime.set_memory(optimize_level='O1')", {}),
    "pool-small": ({}, "mindspore.runtime.set_memory(init_size='0.1GB', increase_size='0.1GB')", {}),
    "pool-1g-max": ({}, "mindspore.runtime.set_memory(init_size='0.1GB', increase_size='0.1GB', max_size='1GB')", {}),
    "malloc-arena-2": ({"MALLOC_ARENA_MAX": "2"}, "", {}),
    "malloc-trim": ({"MALLOC_ARENA_MAX": "2", "MALLOC_TRIM_THRESHOLD_": "0", "MALLOC_MMAP_THRESHOLD_": "65536"}, "", {}),
    "malloc-arena-1": ({"MALLOC_ARENA_MAX": "1"}, "", {}),
    "trim-after-step": ({}, "", {"trim": True}),
    "pipeline-off": ({"MS_DEV_RUNTIME_CONF": "pipeline:False"}, "", {}),
    # the compile cache: the first process of a shape compiles and saves, each later one loads (--rounds 2+)
    "compile-cache": ({"MS_COMPILER_CACHE_ENABLE": "1", "MS_COMPILER_CACHE_PATH": "{cache}"}, "", {}),
    "onednn-cache-0": ({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}, "", {}),
    "threads-1": ({}, "mindspore.device_context.cpu.op_tuning.threads_num(1)", {}),
    "vmm-off": ({"MS_ALLOC_CONF": "enable_vmm:False"}, "", {}),
}


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(args: argparse.Namespace) -> dict:
    env, code, jit_kw = KNOBS[args.worker]
    import mindspore
    mindspore.set_device("CPU")
    if code:
        exec(code, {"mindspore": mindspore})  # noqa: S102 - one of KNOBS' fixed lines, not user text
    after_import = _rss_mib()
    sys.path.insert(0, str(HERE))
    import numpy as np
    import plain_models
    cfg = SimpleNamespace(num_layers=args.layers, hidden_size=args.hidden, ffn_hidden_size=4 * args.hidden,
                          num_attention_heads=args.heads, vocab_size=args.vocab, max_position_embeddings=args.seq)
    jit_kw = dict(jit_kw)
    pynative = jit_kw.pop("pynative", False)
    lazy_inline = jit_kw.pop("lazy_inline", False)
    trim = jit_kw.pop("trim", False)
    if jit_kw:  # plain_models builds with ms.jit(fn): give it the keyword this knob tries
        real = mindspore.jit
        mindspore.jit = lambda fn: real(fn, **jit_kw)
    step = plain_models.mindspore_step(cfg, {}, jit=not pynative, lazy_inline=lazy_inline)
    rng = np.random.default_rng(1)
    shape = (args.batch, args.seq)
    data = [(mindspore.Tensor(rng.integers(0, args.vocab, shape)), mindspore.Tensor(rng.integers(0, args.vocab, shape)),
             mindspore.Tensor(np.ones(shape, np.float32))) for _ in range(2)]
    after_build = _rss_mib()
    times, losses, per_step = [], [], []
    for i in range(args.steps):
        start = time.perf_counter()
        try:
            losses.append(step(data[i % 2])[0])
        except TypeError:  # MS_DEV_PRECOMPILE_ONLY=1: compiled, not run, nothing returned
            losses.append(float("nan"))
        times.append(time.perf_counter() - start)
        if trim:  # hand glibc's free pages back to the system after each step
            import ctypes
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        per_step.append(round(_rss_mib()))
    return {"rss_per_step_mib": per_step, "after_import_mib": after_import, "after_build_mib": after_build, "after_steps_mib": _rss_mib(),
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "step_s": sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0], "loss": losses[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--knobs", nargs="+", choices=list(KNOBS), default=list(KNOBS))
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--worker", choices=list(KNOBS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.seq * args.batch * args.layers * args.hidden > 512 * 2 * 8 * 256:
        parser.error("larger than the 8 x 256, seq 512, batch 2 GPT: MindSpore's CPU peak grows past this machine's memory")
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    shape = ["--layers", str(args.layers), "--hidden", str(args.hidden), "--heads", str(args.heads), "--seq",
             str(args.seq), "--batch", str(args.batch), "--vocab", str(args.vocab), "--steps", str(args.steps)]
    print(f"plain MindSpore GPT {args.layers} x {args.hidden}, seq {args.seq}, batch {args.batch}, vocab {args.vocab}, "
          f"{args.steps} steps; MiB")
    print("| setting | round | after import | after build | after steps | peak RSS | step s | loss | load | RSS after each step |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for round_ in range(args.rounds):
        for knob in args.knobs:
            cache = os.path.join(tempfile.gettempdir(), "ms_memory_knobs_cache_" + "_".join(shape[1::2]))
            env = {**os.environ, "GLOG_v": "3", **{k: v.replace("{cache}", cache) for k, v in KNOBS[knob][0].items()}}
            proc = subprocess.run([sys.executable, __file__, "--worker", knob, *shape], capture_output=True,
                                  text=True, env=env, timeout=1800)
            if proc.returncode:
                print(f"| {knob} | {round_ + 1} | failed ({proc.returncode}): "
                      f"{proc.stderr.strip().splitlines()[-1][:200] if proc.stderr.strip() else ''} |||||||", flush=True)
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"| {knob} | {round_ + 1} | {r['after_import_mib']:.0f} | {r['after_build_mib']:.0f} "
                  f"| {r['after_steps_mib']:.0f} | {r['peak_mib']:.0f} | {r['step_s']:.2f} | {r['loss']:.5f} "
                  f"| {os.getloadavg()[0]:.1f} | {r['rss_per_step_mib']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
