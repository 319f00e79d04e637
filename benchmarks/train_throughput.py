#!/usr/bin/env python3
"""Training throughput and peak memory of models/pretrain_gpt.py on each framework (a benchmark, not a test).

Every measurement is a real job started through `mmrun` (torchrun or msrun) on --mock-data, so it
includes the data pipeline, the callbacks and the portable TrainStep. Step times come from the job's
--metrics-file (the median over the iterations after --warmup, which on MindSpore jit includes the
compilation); peak memory is rank 0's peak resident set size (CPU runs have no device memory).

Reported, all from this one invocation (the machine's load is the same for every row):
  1. tokens/s and peak RSS per framework (PyTorch eager, MindSpore PyNative, MindSpore jit), one and two
     processes, two model sizes; ratios against PyTorch on the same size and process count;
  2. the same GPT written in plain torch and plain MindSpore (PyNative and jit), timed by
     benchmarks/api_overhead.py's workers at the same sizes, and mmrun's step time over theirs;
  3. how step time grows with sequence length and with hidden size (one process);
  4. fp16 and bf16 against fp32, per mode (one process, the medium size; MindSpore has no bf16 on CPU).

    python benchmarks/train_throughput.py                 # everything (about 20-25 minutes on 2 cores)
    python benchmarks/train_throughput.py --quick         # fewer iterations and sizes
    python benchmarks/train_throughput.py --only precision --modes pytorch mindspore-jit
    python benchmarks/train_throughput.py --markdown out.md
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mmrun.common.atomic_write import atomic_write

ROOT = Path(__file__).resolve().parents[1]
ENTRY = ROOT / "models" / "pretrain_gpt.py"

# name -> (layers, hidden, heads, seq, micro batch)
SIZES = {"small": (2, 128, 4, 64, 4), "medium": (4, 256, 8, 128, 4)}
MODES = {  # label -> (framework, extra arguments)
    "pytorch": ("pytorch", []),
    "mindspore-pynative": ("mindspore", ["--no-ms-jit"]),
    "mindspore-jit": ("mindspore", ["--ms-jit"]),
}

# --fp16 starts from a low loss scale so that the few overflow-skipped iterations (cheaper: no update)
# stay out of the median.
PRECISIONS = {"fp32": [], "fp16": ["--fp16", "--initial-loss-scale", "4096"], "bf16": ["--bf16"]}
UNSUPPORTED_PRECISIONS = {("mindspore", "bf16")}  # no bf16 CPU kernels: the feature gate stops the job
SECTIONS = ("throughput", "scaling", "precision")


@dataclass
class Measurement:
    label: str
    size: str
    nproc: int
    seq: int
    hidden: int
    step_ms: float
    tokens_per_s: float
    peak_rss_mb: float
    ok: bool = True
    note: str = ""
    precision: str = "fp32"


# One intra-op thread per process for every job, references included: torchrun already sets it for
# 2 processes, and a single process with a thread per core slows down many-fold as soon as anything
# else runs on the machine (measured here: 11 ms -> 1300 ms per step at load average 5).
THREADS = {"OMP_NUM_THREADS": "1"}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "PET_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK_ID", "RANK_SIZE", "MMRUN_AI_FRAMEWORK")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(THREADS)
    return env


def run_job(label: str, size: str, layers: int, hidden: int, heads: int, seq: int, micro: int, nproc: int,
            iters: int, warmup: int, workdir: Path, precision: str = "fp32") -> Measurement:
    framework, extra = MODES[label]
    extra = [*extra, *PRECISIONS[precision]]
    metrics = workdir / f"{label}_{size}_{nproc}_{seq}_{hidden}_{precision}.jsonl"
    args = ["--mock-data", "--num-layers", str(layers), "--hidden-size", str(hidden), "--num-attention-heads",
            str(heads), "--seq-length", str(seq), "--max-position-embeddings", str(seq), "--micro-batch-size",
            str(micro), "--global-batch-size", str(micro * nproc), "--lr", "1e-4", "--train-iters", str(iters),
            "--hidden-dropout", "0", "--attention-dropout", "0", "--eval-iters", "0", "--log-interval",
            str(iters), "--metrics-file", str(metrics), *extra]
    cmd = [sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", framework, "--nproc-per-node", str(nproc),
           "--master-port", "0", str(ENTRY), *args]
    start = time.time()
    proc = subprocess.run(cmd, cwd=workdir, env=_env(), capture_output=True, text=True, timeout=1800)
    records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    steps = [r["elapsed_ms"] for r in records if r["kind"] == "train"][warmup:]
    summary = next((r for r in records if r["kind"] == "summary"), {})
    if proc.returncode != 0 or not steps:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        return Measurement(label, size, nproc, seq, hidden, float("nan"), float("nan"), float("nan"), False,
                           f"exit {proc.returncode}: {tail[0][:120]}", precision)
    step_ms = statistics.median(steps)
    tokens = micro * nproc * seq  # global batch x sequence length per step
    m = Measurement(label, size, nproc, seq, hidden, step_ms, tokens / (step_ms / 1000.0),
                    float(summary.get("peak_rss_mb", float("nan"))), precision=precision)
    print(f"  {label:19s} {precision} {size:7s} nproc={nproc} seq={seq:4d} hidden={hidden:4d}: {step_ms:8.1f} ms/step "
          f"{m.tokens_per_s:9.0f} tokens/s  peak RSS {m.peak_rss_mb:7.0f} MB  ({time.time() - start:.0f} s)",
          flush=True)
    return m


PLAIN_VARIANTS = {"pytorch": "torch-plain", "mindspore-pynative": "ms-plain-pynative", "mindspore-jit": "ms-plain-jit"}


def plain_references(sizes: dict, modes: list[str], rounds: int = 2, steps: int = 3) -> dict[tuple[str, str], float]:
    """(mode, size) -> ms/step of the same GPT written in plain torch / plain MindSpore, measured by
    benchmarks/api_overhead.py's own workers (one process per framework), at this benchmark's sizes."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import api_overhead  # the portable-API benchmark: its plain references are reused, not rewritten
    from safetensors.numpy import save_file

    found = {}
    for size, (layers, hidden, heads, seq, micro) in sizes.items():
        shape = argparse.Namespace(layers=layers, hidden=hidden, heads=heads, seq=seq, batch=micro, vocab=640)
        with tempfile.NamedTemporaryFile(suffix=".safetensors") as state:
            save_file(api_overhead.initial_state(shape), state.name)
            argv = ["--layers", str(layers), "--hidden", str(hidden), "--heads", str(heads), "--seq", str(seq),
                    "--batch", str(micro), "--vocab", "640", "--state", state.name,
                    "--rounds", str(rounds), "--steps", str(steps)]
            for framework in ("pytorch", "mindspore"):
                variants = [PLAIN_VARIANTS[m] for m in modes if MODES[m][0] == framework]
                if not variants:
                    continue
                try:
                    timing = api_overhead.run_worker(["--worker", "timing", "--variants", ",".join(variants), *argv],
                                                     timeout=3600)
                except RuntimeError as err:
                    print(f"  plain {framework} {size}: failed ({str(err).splitlines()[0]})", flush=True)
                    continue
                for mode in modes:
                    variant = PLAIN_VARIANTS[mode]
                    if variant in timing["times"]:
                        all_steps = [t for rnd in timing["times"][variant] for t in rnd]
                        found[(mode, size)] = 1e3 * statistics.median(all_steps)
                        print(f"  plain reference {variant:18s} {size:7s}: {found[(mode, size)]:8.1f} ms/step",
                              flush=True)
    return found


def markdown(results: list[Measurement], plain: dict, scaling: list[Measurement], header: str,
             precisions: list[Measurement] = ()) -> str:
    out = [header]
    if results:
        out += ["", "| mode | size | processes | ms/step | tokens/s | peak RSS (MB) | vs pytorch (tokens/s) |",
                "|---|---|---|---|---|---|---|"]
    base = {(m.size, m.nproc): m.tokens_per_s for m in results if m.label == "pytorch" and m.ok}
    for m in results:
        ratio = m.tokens_per_s / base[(m.size, m.nproc)] if (m.size, m.nproc) in base and m.ok else float("nan")
        cell = (f"{m.step_ms:.1f} | {m.tokens_per_s:.0f} | {m.peak_rss_mb:.0f} | {ratio:.2f}" if m.ok
                else f"failed: {m.note} | | |")
        out.append(f"| {m.label} | {m.size} | {m.nproc} | {cell} |")
    if plain:
        out += ["", "| mode | size | mmrun ms/step (1 process) | plain framework ms/step | mmrun / plain |",
                "|---|---|---|---|---|"]
        for m in results:
            if m.nproc == 1 and (m.label, m.size) in plain and m.ok:
                out.append(f"| {m.label} | {m.size} | {m.step_ms:.1f} | {plain[(m.label, m.size)]:.1f} | "
                           f"{m.step_ms / plain[(m.label, m.size)]:.2f} |")
    if scaling:
        out += ["", "| mode | sweep | seq | hidden | ms/step | relative to the sweep's first row |",
                "|---|---|---|---|---|---|"]
        first: dict = {}
        for m in scaling:
            first.setdefault((m.label, m.note), m.step_ms)
            rel = m.step_ms / first[(m.label, m.note)] if m.ok else float("nan")
            out.append(f"| {m.label} | {m.note} | {m.seq} | {m.hidden} | {m.step_ms:.1f} | {rel:.2f} |")
    if precisions:
        out += ["", "| mode | precision | ms/step | tokens/s | peak RSS (MB) | tokens/s vs fp32 | RSS vs fp32 |",
                "|---|---|---|---|---|---|---|"]
        fp32 = {m.label: m for m in precisions if m.precision == "fp32" and m.ok}
        for m in precisions:
            if not m.ok:
                out.append(f"| {m.label} | {m.precision} | failed: {m.note} | | | | |")
                continue
            ref = fp32.get(m.label)
            ratios = (f"{m.tokens_per_s / ref.tokens_per_s:.2f} | {m.peak_rss_mb / ref.peak_rss_mb:.2f}" if ref
                      else "n/a | n/a")
            out.append(f"| {m.label} | {m.precision} | {m.step_ms:.1f} | {m.tokens_per_s:.0f} | {m.peak_rss_mb:.0f} "
                       f"| {ratios} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer iterations, one size, shorter sweeps")
    p.add_argument("--iters", type=int, default=None, help="iterations per job (default 30, quick 12)")
    p.add_argument("--warmup", type=int, default=None, help="iterations left out of the median (default 5, quick 3)")
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    p.add_argument("--no-scaling", "--no_scaling", dest="no_scaling", action="store_true", help="skip the sweeps")
    p.add_argument("--only", choices=SECTIONS, default=None,
                   help="run one section: throughput (with the plain references), scaling or precision")
    p.add_argument("--markdown", default=None, help="also write the tables to this file")
    args = p.parse_args(argv)
    os.environ.update(THREADS)  # api_overhead's workers inherit this process's environment
    iters = args.iters or (12 if args.quick else 30)
    warmup = args.warmup if args.warmup is not None else (3 if args.quick else 5)
    sizes = {"small": SIZES["small"]} if args.quick else SIZES
    workdir = Path(tempfile.mkdtemp(prefix="mmrun_bench_"))
    load = os.getloadavg()[0]
    header = (f"train_throughput.py: {iters} iterations per job, median after {warmup}; OMP_NUM_THREADS=1; "
              f"{os.cpu_count()} CPUs, load average {load:.1f} at the start; {time.strftime('%Y-%m-%d %H:%M')}")
    print(header, flush=True)
    wanted = set(SECTIONS) - ({"scaling"} if args.no_scaling else set()) if args.only is None else {args.only}
    results, plain, scaling, precisions = [], {}, [], []
    if "throughput" in wanted:
        for size, (layers, hidden, heads, seq, micro) in sizes.items():
            for nproc in (1, 2):
                for label in args.modes:
                    results.append(run_job(label, size, layers, hidden, heads, seq, micro, nproc, iters, warmup,
                                           workdir))
        plain = plain_references(sizes, args.modes)
    if "precision" in wanted:
        size = "small" if args.quick else "medium"
        layers, hidden, heads, seq, micro = SIZES[size]
        for label in args.modes:
            for precision in PRECISIONS:
                if (MODES[label][0], precision) not in UNSUPPORTED_PRECISIONS:
                    precisions.append(run_job(label, size, layers, hidden, heads, seq, micro, 1, iters, warmup,
                                              workdir, precision))
    if "scaling" in wanted:
        seqs, hiddens = ((32, 64, 128), (64, 128, 256)) if args.quick else ((32, 64, 128, 256), (64, 128, 256, 512))
        for label in [m for m in args.modes if m != "mindspore-pynative"]:
            for seq in seqs:
                m = run_job(label, "sweep", 2, 128, 4, seq, 4, 1, iters, warmup, workdir)
                m.note = "seq"
                scaling.append(m)
            for hidden in hiddens:
                m = run_job(label, "sweep", 2, hidden, 4, 64, 4, 1, iters, warmup, workdir)
                m.note = "hidden"
                scaling.append(m)
    text = (markdown(results, plain, scaling, header, precisions)
            + f"\nload average at the end: {os.getloadavg()[0]:.1f}\n")
    print()
    print(text)
    if args.markdown:
        atomic_write(args.markdown, text)
    return 0 if all(m.ok for m in results + scaling + precisions) else 1


if __name__ == "__main__":
    sys.exit(main())
