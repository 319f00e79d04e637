#!/usr/bin/env python3
"""Peak resident memory of the whole process, PyTorch against MindSpore, the same job through mmrun (a benchmark,
not a test).

Each job runs in its own process (launched from here, so no framework is imported in this one); its peak is the
kernel's count for that process (os.wait4's ru_maxrss: every byte it touched, the framework's import, its
compiled graphs, its memory pool and the host tensors included). Workloads:

  gpt        models/pretrain_gpt.py --mock-data, 8 layers x hidden 256, 8 heads, seq 512, micro-batch 2,
             3 iterations (issue 40's job; never larger: MindSpore's CPU peak grows past this machine's memory)
  vlm-demo   models/pretrain_vlm.py with the demo's model.json and batch (scripts/finetune_qwen2vl.sh: 2
             micro-batches of 2 samples, --seq-length 128), 3 iterations
  wan-tiny   one Wan2.1 DiT train step as pretrain_sora.py runs it (benchmarks/wan_step.py's mmrun side,
             size tiny), 3 steps

  optimizer-state  the distributed optimizer on MindSpore (--use-distributed-optimizer, backend/mindspore/parallel/zero.py):
             models/pretrain_gpt.py --mock-data, 2 layers x hidden 256, seq 128, on 1 and 2 processes; the bytes
             of optimizer state rank 0 holds, as its log line reports them (summed from the tensors it keeps),
             and rank 0's peak RSS (a table of its own)

Per workload: PyTorch, MindSpore as mmrun runs it by default (the compiled step), the same without the C heap
trimmed while the graph compiles (MMRUN_MS_HEAP_TRIM=0, common/heap_trim.py), the same with MindSpore's own
broadcasting masked_fill and softmax backward (MMRUN_MS_CPU_BROADCAST=1: what mmrun ran before it gave those kernels
operands of one shape, docs/memory-and-speed.md), and MindSpore's PyNative step (--no-ms-jit; Wan's MindSpore step is
PyNative already), each --rounds times, and the ratio MindSpore / PyTorch. `--gpt-layers 4` halves the GPT (the
8-layer job with MindSpore's broadcasting kernels peaks at about 4.4 GB).

    python benchmarks/memory.py                       # 2 rounds, every workload
    python benchmarks/memory.py --only wan-tiny --rounds 1
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks"
ITERS = 3
GPT_ARGS = ["--mock-data", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length",
            "512", "--max-position-embeddings", "512", "--micro-batch-size", "2", "--global-batch-size", "2",
            "--lr", "1e-4", "--hidden-dropout", "0", "--attention-dropout", "0", "--eval-iters", "0"]
VLM_ARGS = ["--micro-batch-size", "2", "--global-batch-size", "4", "--seq-length", "128", "--lr", "2e-3",
            "--weight-decay", "0", "--clip-grad", "1.0", "--eval-iters", "0",
            "--mm-model", str(ROOT / "scripts" / "qwen2vl" / "model_tiny.json")]
BROADCAST = {"MMRUN_MS_CPU_BROADCAST": "1"}
NO_TRIM = {"MMRUN_MS_HEAP_TRIM": "0"}  # common/heap_trim.py off: the compile's freed heap kept
# workload -> the variants measured: (label, framework, extra arguments, extra environment)
VARIANTS = {
    "gpt": [("pytorch", "pytorch", [], {}), ("mindspore", "mindspore", [], {}),
            ("mindspore, MMRUN_MS_HEAP_TRIM=0 (before the heap trim)", "mindspore", [], NO_TRIM),
            ("mindspore, MMRUN_MS_CPU_BROADCAST=1 (before)", "mindspore", [], BROADCAST),
            ("mindspore --no-ms-jit", "mindspore", ["--no-ms-jit"], {})],
    "vlm-demo": [("pytorch", "pytorch", [], {}), ("mindspore", "mindspore", [], {}),
                 ("mindspore, MMRUN_MS_HEAP_TRIM=0 (before the heap trim)", "mindspore", [], NO_TRIM),
                 ("mindspore, MMRUN_MS_CPU_BROADCAST=1 (before)", "mindspore", [], BROADCAST),
                 ("mindspore --no-ms-jit", "mindspore", ["--no-ms-jit"], {})],
    "wan-tiny": [("pytorch", "pytorch", [], {}),
                 ("mindspore (compiled, as pretrain_sora.py runs it)", "mindspore", [], {}),
                 ("mindspore, MMRUN_MS_HEAP_TRIM=0 (before the heap trim)", "mindspore", [], NO_TRIM),
                 ("mindspore (PyNative)", "mindspore", ["--ms-pynative"], {})],
}


def _env(framework: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "PET_")) and k not in (
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK_ID", "RANK_SIZE", "MMRUN_AI_FRAMEWORK", *BROADCAST, *NO_TRIM)}
    env.update(GLOG_v="3", OMP_NUM_THREADS="1", MMRUN_AI_FRAMEWORK=framework)
    return env


def command(workload: str, framework: str, extra: list[str], data_json: str, gpt_layers: int = 8) -> list[str]:
    if workload == "gpt":
        return [sys.executable, str(ROOT / "models" / "pretrain_gpt.py"), "--ai-framework", framework, *GPT_ARGS,
                "--num-layers", str(gpt_layers), "--train-iters", str(ITERS), "--log-interval", "1", *extra]
    if workload == "vlm-demo":
        return [sys.executable, str(ROOT / "models" / "pretrain_vlm.py"), "--ai-framework", framework, *VLM_ARGS,
                "--mm-data", data_json, "--train-iters", str(ITERS), "--log-interval", "1", *extra]
    return [sys.executable, __file__, "--wan-worker", *extra]


def wan_worker(jit: bool = True) -> None:
    """wan_step.py's mmrun side (pretrain_sora.py's model, loss, AdamW, TrainStep) on MMRUN_AI_FRAMEWORK, 3 steps;
    on MindSpore compiled unless `jit` is False."""
    sys.path.insert(0, str(HERE))
    import wan_step
    run = wan_step.mmrun_side("tiny", wan_step.initial_weights("tiny"), wan_step.make_batches("tiny"), "fp32", jit)
    for i in range(ITERS):
        loss, _ = run(i)
    print(f"wan-tiny loss after {ITERS} steps: {loss:.6f}")


ZERO_ARGS = ["--mock-data", "--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length",
             "128", "--max-position-embeddings", "128", "--micro-batch-size", "2", "--global-batch-size", "4",
             "--lr", "1e-4", "--hidden-dropout", "0", "--attention-dropout", "0", "--eval-iters", "0",
             "--train-iters", "1", "--use-distributed-optimizer"]
ZERO_BYTES = re.compile(r"sharded over (\d+) data-parallel ranks, (\d+) bytes of optimizer state")
RANK0_RSS = re.compile(r"\[Rank 0\] peak host memory \(RSS\): ([\d.]+) MB")


def optimizer_state_table(cwd: str, rounds: int) -> str:
    """The distributed optimizer's state per rank on MindSpore, 1 and 2 data-parallel processes (measured)."""
    rows = ["| processes | optimizer state on rank 0 (bytes) | / 1 process | rank 0 peak RSS (MB) |",
            "|---|---|---|---|"]
    first = None
    for nproc in (1, 2):
        for _ in range(rounds):
            cmd = [sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", "mindspore", "--nproc-per-node",
                   str(nproc), "--master-port", "0", str(ROOT / "models" / "pretrain_gpt.py"), *ZERO_ARGS]
            out = subprocess.run(cmd, env=_env("mindspore"), cwd=cwd, capture_output=True, text=True)
            text = out.stdout + out.stderr
            found, rss = ZERO_BYTES.search(text), RANK0_RSS.search(text)
            if out.returncode or not found:
                raise SystemExit(f"optimizer-state on {nproc} process(es) failed ({out.returncode}):\n{text[-3000:]}")
            held = int(found.group(2))
            first = first or held
            rows.append(f"| {nproc} | {held:,} | {held / first:.3f} | {rss.group(1) if rss else '?'} |")
            print(f"optimizer-state, {nproc} process(es): {held:,} bytes on rank 0", flush=True)
    return "\n".join(["MindSpore, --use-distributed-optimizer, " + " ".join(ZERO_ARGS[1:9]), "", *rows])


def peak_mib(cmd: list[str], env: dict[str, str], cwd: str) -> float:
    """The process's peak resident set size (MiB), from the kernel at its exit."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-3000:]
            raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}):\n{tail}")
    return usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=[*VARIANTS, "optimizer-state"], default=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=2, help="every variant this many times (2)")
    parser.add_argument("--markdown", default=None, help="also write the table to this file")
    parser.add_argument("--gpt-layers", type=int, default=8, help="the GPT's layers (8, issue 40's job)")
    parser.add_argument("--leave-out", nargs="*", default=[], metavar="TEXT",
                        help="skip the variants whose label contains TEXT (BROADCAST: the 8-layer GPT's 4.4 GB run)")
    parser.add_argument("--wan-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ms-pynative", action="store_true", help=argparse.SUPPRESS)  # the wan worker's PyNative row
    args = parser.parse_args(argv)
    if args.wan_worker:
        wan_worker(jit=not args.ms_pynative)
        return 0
    peaks: dict[tuple[str, str], list[float]] = {}
    loads: list[float] = []
    tables = []
    if "optimizer-state" in args.only:
        with tempfile.TemporaryDirectory(prefix="memory_") as tmp:
            tables.append(optimizer_state_table(tmp, args.rounds))
        args.only = [w for w in args.only if w != "optimizer-state"]
    with tempfile.TemporaryDirectory(prefix="memory_") as tmp:
        data_json = ""
        if "vlm-demo" in args.only:
            data_json = subprocess.run(
                [sys.executable, "-c", "import sys; from mmrun.data.multimodal.demo import make_demo; "
                 "print(make_demo(sys.argv[1], num_samples=64, seed=3)['data_json'])", str(Path(tmp) / "demo")],
                capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        for round_ in range(args.rounds):
            for workload in args.only:
                for label, framework, extra, env in VARIANTS[workload]:
                    if any(text in label for text in args.leave_out):
                        continue
                    start = time.perf_counter()
                    peak = peak_mib(command(workload, framework, extra, data_json, args.gpt_layers),
                                    {**_env(framework), **env}, tmp)
                    loads.append(os.getloadavg()[0])
                    peaks.setdefault((workload, label), []).append(peak)
                    print(f"round {round_ + 1} {workload} {label}: peak {peak:.0f} MiB "
                          f"({time.perf_counter() - start:.0f} s, load {loads[-1]:.1f})", flush=True)
    lines = [] if not args.only else [
        f"{platform.machine()} CPU, {os.cpu_count()} cores, OMP_NUM_THREADS=1, {args.rounds} round(s), "
        f"load {min(loads):.1f} to {max(loads):.1f}; " + (f"gpt: {args.gpt_layers} layers; " if "gpt" in args.only else "")
        + "peak RSS of the whole process, MiB", "",
        "| workload | variant | peak RSS (each round) | median | / PyTorch |", "|---|---|---|---|---|"]
    for workload in args.only:
        base = statistics.median(peaks[(workload, "pytorch")])
        for label, *_ in VARIANTS[workload]:
            if (workload, label) not in peaks:
                continue
            values = peaks[(workload, label)]
            med = statistics.median(values)
            lines.append(f"| {workload} | {label} | {', '.join(f'{v:.0f}' for v in values)} | {med:.0f} "
                         f"| {med / base:.2f}x |")
    table = "\n\n".join(tables + (["\n".join(lines)] if lines else []))
    print("\n" + table)
    if args.markdown:
        from mmrun.common.atomic_write import atomic_write
        atomic_write(args.markdown, table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
