#!/usr/bin/env python3
"""Tokens per second per process of the MindSpore tensor/pipeline-parallel engine against data parallelism
(a benchmark, not a test).

Every row is a real job started through `mmrun --ai-framework mindspore` (msrun): this file, run by msrun with
--as-rank, builds engines/mindspore/parallel/gpt.py build_engine from Megatron-style arguments and times ParallelTrainStep on random
tokens. All rows train the same model on the same global batch per step (so the same tokens per step); the
time of a step is the slowest rank's median over the iterations after --warmup (the first ones compile the
mindspore.jit graphs). Reported per row: tokens/s for the whole job, tokens/s per process, and that against
the data-parallel row with the same number of processes (the "bare" way to use them).

    python benchmarks/ms_parallel_scaling.py                  # about 5 minutes on 2 cores
    python benchmarks/ms_parallel_scaling.py --quick          # a smaller model, fewer iterations
    python benchmarks/ms_parallel_scaling.py --markdown out.md
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
from pathlib import Path

from mmrun.common.atomic_write import atomic_write

# label -> (processes, tensor size, pipeline size, sequence parallel); data parallel = processes / (tp x pp)
CONFIGS = {
    "1 process": (1, 1, 1, False),
    "DP=2": (2, 1, 1, False),
    "TP=2": (2, 2, 1, False),
    "TP=2 +SP": (2, 2, 1, True),
    "PP=2": (2, 1, 2, False),
}
# name -> (layers, hidden, heads, seq, micro batch, micro-batches per step over the whole job)
SIZES = {"full": (4, 256, 8, 128, 4, 4), "quick": (2, 128, 4, 64, 2, 4)}


def worker(args: argparse.Namespace) -> None:
    """One rank: build the engine from Megatron-style arguments, train on random tokens, write step times."""
    import numpy as np

    from mmrun import backend

    backend.init_distributed()
    from mmrun.engines.mindspore.parallel.gpt import build_engine

    layers, hidden, heads, seq, micro, micro_batches = SIZES[args.size]
    vocab = 1024
    megatron_args = argparse.Namespace(
        tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp, sequence_parallel=args.sp,
        num_layers=layers, hidden_size=hidden, num_attention_heads=heads, ffn_hidden_size=None,
        padded_vocab_size=vocab, max_position_embeddings=seq, seq_length=seq, hidden_dropout=0.0,
        attention_dropout=0.0, norm_epsilon=1e-5, init_method_std=0.02, untie_embeddings_and_output_weights=False,
        dropout_impl="auto", seed=1234, lr=1e-4, adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8,
        weight_decay=0.01, clip_grad=1.0)
    engine = build_engine(megatron_args, jit=True)
    state = engine.state
    per_rank = micro_batches // state.data_parallel_size
    rng = np.random.default_rng([7, state.dp_rank])
    positions = np.broadcast_to(np.arange(seq), (micro, seq)).copy()
    ones = np.ones((micro, seq), np.float32)
    times = []
    for _ in range(args.warmup + args.iters):
        batches = []
        for _ in range(per_rank):
            tokens = rng.integers(0, vocab, (micro, seq + 1))
            batches.append((tokens[:, :-1], positions, tokens[:, 1:], ones))
        start = time.perf_counter()
        engine(batches)
        times.append(time.perf_counter() - start)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = backend.current().device_kind
    (out / f"rank{state.rank}.json").write_text(json.dumps({"times": times[args.warmup:], "device": device}))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MMRUN_", "MS_", "PET_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(OMP_NUM_THREADS="1", GLOG_v="3")
    return env


def run_config(label: str, size: str, warmup: int, iters: int, scratch: Path) -> dict:
    nproc, tp, pp, sp = CONFIGS[label]
    out = scratch / label.replace(" ", "_").replace("=", "").replace("+", "")
    cmd = [sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", "mindspore", "--nproc-per-node", str(nproc),
           "--master-port", "0", "--log-dir", str(out) + "_logs", __file__, "--as-rank", "--size", size,
           "--tp", str(tp), "--pp", str(pp), "--warmup", str(warmup), "--iters", str(iters), "--out-dir", str(out)]
    if sp:
        cmd.append("--sp")
    print(f"> {label}: {nproc} process(es), tp={tp} pp={pp} sp={sp} ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=1800, start_new_session=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: the {label} job failed (exit {proc.returncode}); see {out}_logs\n"
                         + proc.stdout[-2000:])
    results = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    step = max(statistics.median(r["times"]) for r in results)  # the job moves at its slowest rank
    layers, hidden, heads, seq, micro, micro_batches = SIZES[size]
    tokens = micro * micro_batches * seq
    return {"label": label, "nproc": nproc, "device": results[0]["device"], "step_s": step,
            "tokens_per_s": tokens / step,
            "tokens_per_s_per_process": tokens / step / nproc}


def table(rows: list[dict], size: str) -> str:
    layers, hidden, heads, seq, micro, micro_batches = SIZES[size]
    dp = {r["nproc"]: r["tokens_per_s_per_process"] for r in rows if r["label"].startswith(("DP", "1 process"))}
    lines = [f"model: {layers} layers, hidden {hidden}, {heads} heads, seq {seq}; {micro_batches} micro-batches of "
             f"{micro} per step ({micro * micro_batches * seq} tokens); fp32; median step after warm-up",
             "", "| run | processes | step (s) | tokens/s | tokens/s per process | per process vs DP |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["tokens_per_s_per_process"] / dp[r["nproc"]]
        lines.append(f"| {r['label']} | {r['nproc']} | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} | "
                     f"{r['tokens_per_s_per_process']:.0f} | {ratio:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smaller model and fewer iterations")
    parser.add_argument("--markdown", "--markdown_file", type=Path, help="also write the table to this file")
    parser.add_argument("--only", nargs="+", choices=list(CONFIGS), help="run these rows only")
    # Not --worker: msrun 2.10 reads the script's options too and takes it for an abbreviation of its --worker_num.
    parser.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--size", choices=list(SIZES), default="full", help=argparse.SUPPRESS)
    parser.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--pp", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--sp", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--iters", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", "--out_dir", help=argparse.SUPPRESS)
    parser.add_argument("--ai-framework", help=argparse.SUPPRESS)  # mmrun passes it on to the script
    args = parser.parse_args()
    if args.as_rank:
        worker(args)
        return
    size = "quick" if args.quick else "full"
    iters = 3 if args.quick else args.iters
    labels = args.only or list(CONFIGS)
    if any(CONFIGS[label][0] == 2 for label in labels) and "DP=2" not in labels:
        labels = ["DP=2", *labels]  # the baseline of every 2-process row
    if "1 process" not in labels:
        labels = ["1 process", *labels]
    with tempfile.TemporaryDirectory(prefix="mmrun-ms-parallel-") as scratch:
        rows = [run_config(label, size, args.warmup, iters, Path(scratch)) for label in labels]
    where = f"{rows[0]['device']}" + (f" ({os.cpu_count()} cores)" if rows[0]["device"] == "cpu" else "")
    text = f"MindSpore tensor/pipeline-parallel engine on {where}, mindspore jit\n\n" + table(rows, size)
    print(text)
    if args.markdown:
        atomic_write(args.markdown, text + "\n")


if __name__ == "__main__":
    main()
