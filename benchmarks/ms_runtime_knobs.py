#!/usr/bin/env python3
"""MindSpore alone: what its CPU runtime's settings do to one compiled GPT train step (a benchmark, not a test).

The step is the portable TrainStep (forward, backward, clip and AdamW in one mindspore.jit graph) on the GPT of
benchmarks/ms_speed.py's `gpt` row, or with --plain the same model written in plain MindSpore
(benchmarks/plain_models.py), so what is measured is MindSpore's, not mmrun's. Each setting runs in its own
process (they are process-wide), the settings alternate round by round, and each process reports the median
wall and CPU time of its steps after warm-up: CPU time is what the machine's load does not change much.

Settings (KNOBS): `spin` is MindSpore's own default (MS_DEV_HOST_BLOCKING_RUN=0: the Python thread waits for a
graph by spinning in AsyncRQueue::Wait), `host-blocking` what mmrun's backend sets on CPU (=1), and a few that
were tried and are kept for the record.

    python benchmarks/ms_runtime_knobs.py                       # spin against host-blocking, 3 rounds
    python benchmarks/ms_runtime_knobs.py --knobs spin host-blocking launch-blocking --plain
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# name -> (environment variables, Python run after import, before the first graph)
KNOBS: dict[str, tuple[dict[str, str], str]] = {
    "spin": ({"MS_DEV_HOST_BLOCKING_RUN": "0"}, ""),
    "host-blocking": ({"MS_DEV_HOST_BLOCKING_RUN": "1"}, ""),
    "launch-blocking": ({"MS_DEV_HOST_BLOCKING_RUN": "0"}, "mindspore.runtime.launch_blocking()"),
    "pipeline-off": ({"MS_DEV_HOST_BLOCKING_RUN": "0", "MS_DEV_RUNTIME_CONF": "pipeline:False"}, ""),
    "op-threads-1": ({"MS_DEV_HOST_BLOCKING_RUN": "0"}, "mindspore.device_context.cpu.op_tuning.threads_num(1)"),
}


def worker(args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(HERE))
    import mmrun.backend.mindspore  # noqa: F401 - sets the device (and, on CPU, the default knob: overridden below)
    import mindspore

    env, code = KNOBS[args.worker]
    os.environ.update(env)  # after the backend's setdefault: the knob under test wins
    if code:
        exec(code, {"mindspore": mindspore})  # noqa: S102 - one of KNOBS' fixed lines, not user text
    import api_overhead
    import plain_models

    shape = argparse.Namespace(layers=2, hidden=128, heads=4, seq=64, batch=4, vocab=640, threads=1)
    state = api_overhead.initial_state(shape)
    if args.plain:
        step = plain_models.mindspore_step(api_overhead.gpt_config(shape, "mindspore"), state, jit=True)
    else:
        step = api_overhead.api_step("mindspore", shape, state, jit=True)
    data = [tuple(mindspore.Tensor(a) for a in b) for b in api_overhead.batches(shape)]
    start = time.perf_counter()
    loss = float(api_overhead._first_loss(step(data[0])))
    compile_s = time.perf_counter() - start
    wall, cpu = [], []
    for i in range(args.steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        float(api_overhead._first_loss(step(data[i % len(data)])))  # the loop's one read per step
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    skip = min(3, args.steps - 1)
    return {"wall_ms": 1e3 * statistics.median(wall[skip:]), "cpu_ms": 1e3 * statistics.median(cpu[skip:]),
            "first_loss": loss, "compile_s": compile_s, "load": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--knobs", nargs="+", choices=list(KNOBS), default=["spin", "host-blocking"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per process (30)")
    parser.add_argument("--plain", action="store_true", help="plain MindSpore's step instead of mmrun's TrainStep")
    parser.add_argument("--worker", choices=list(KNOBS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rows: dict[str, list[dict]] = {k: [] for k in args.knobs}
    for round_ in range(args.rounds):
        for knob in args.knobs:
            cmd = [sys.executable, __file__, "--worker", knob, "--steps", str(args.steps)] + (["--plain"] * args.plain)
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
            if proc.returncode:
                raise SystemExit(f"{knob} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            rows[knob].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            r = rows[knob][-1]
            print(f"round {round_ + 1} {knob}: wall {r['wall_ms']:.1f} ms, cpu {r['cpu_ms']:.1f} ms, first loss "
                  f"{r['first_loss']:.6f}, load {r['load']:.1f}", flush=True)
    import mindspore

    base = args.knobs[0]
    print(f"\n{platform.machine()} CPU, {os.cpu_count()} cores, mindspore {mindspore.__version__}, "
          f"{'plain MindSpore' if args.plain else 'mmrun TrainStep'}, GPT 2 x 128, seq 64, batch 4, "
          f"median of {args.rounds} rounds\n")
    print(f"| setting | wall (ms/step) | CPU (ms/step) | wall / {base} | CPU / {base} | first loss | load |")
    print("|---|---|---|---|---|---|---|")
    for knob, results in rows.items():
        ratio = {k: statistics.median(r[k] / b[k] for r, b in zip(results, rows[base])) for k in ("wall_ms", "cpu_ms")}
        loads = [r["load"] for r in results]
        print(f"| {knob} | {statistics.median(r['wall_ms'] for r in results):.1f} | "
              f"{statistics.median(r['cpu_ms'] for r in results):.1f} | {ratio['wall_ms']:.2f}x | "
              f"{ratio['cpu_ms']:.2f}x | {results[0]['first_loss']:.6f} | {min(loads):.1f} to {max(loads):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
