#!/usr/bin/env python3
"""Tensor/pipeline scaling of the vision-language model on megatron-core, next to the text-only GPT (a benchmark).

Every measurement is a real job through `mmrun` (torchrun): models/pretrain_vlm.py on the offline demo
(pictures + captions, mmrun.data.multimodal.demo) with a model.json whose text decoder has the sizes of
benchmarks/parallel_scaling.py's GPT (4 layers x hidden 256 x 8 heads, micro-batch 4 x 4 micro-batches,
sequences up to 128), plus a small ViT on pipeline stage 0; and megatron-core's GPTModel at those sizes
through parallel_scaling.run_job (the same runner, --mock-data, seq 128). Step times are medians after the
warm-up iterations, from each job's --metrics-file. The table gives each layout's step time relative to
its model's one-process megatron-core run (TP1): the scaling of the VLM against the scaling of the GPT.

    python benchmarks/vlm_parallel_scaling.py                  # TP1, TP2, PP2, PP2 x VPP2 of both models (about 3 minutes)
    python benchmarks/vlm_parallel_scaling.py --markdown out.md

On a CPU (gloo, one thread per process) figures are for shape, not speed: two processes share the cores
and communication is a memory copy. The device is whatever `mmrun` detects (a CUDA GPU when present).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mmrun.common.atomic_write import atomic_write

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the GPT benchmark beside this file (benchmarks/ is no package)
import parallel_scaling as gpt_bench  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VLM_ENTRY = ROOT / "models" / "pretrain_vlm.py"
TINY_JSON = ROOT / "scripts" / "qwen2vl" / "model_tiny.json"
VIT_LAYERS, VIT_HIDDEN, VIT_HEADS = 2, 128, 4

# label -> (processes, extra arguments of the VLM job, parallel_scaling's GPT layout at the same split)
LAYOUTS = {
    "TP1": (1, ["--use-mcore-models"], "mcore DP1"),
    "TP2": (2, ["--tensor-model-parallel-size", "2"], "mcore TP2"),
    "PP2": (2, ["--pipeline-model-parallel-size", "2"], "mcore PP2"),
    # batches padded to --seq-length here (the interleaved schedule sends fixed shapes), as the GPT's always are
    "PP2xVPP2": (2, ["--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2"],
                 "mcore PP2 x VPP2"),
}


def model_json(out: Path, pipeline_stages: int, chunks: int = 1) -> Path:
    """The demo's model.json with parallel_scaling's GPT as its text decoder, split over `pipeline_stages` (and
    `chunks` virtual stages each: MindSpeed-MM's lists of lists)."""
    raw = json.loads(TINY_JSON.read_text())
    layers, hidden, heads = gpt_bench.LAYERS, gpt_bench.HIDDEN, gpt_bench.HEADS
    head_dim = hidden // heads
    per_stage = [layers // (pipeline_stages * chunks)] * pipeline_stages
    raw["text_decoder"].update(num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden,
                               num_attention_heads=heads, group_query_attention=False,
                               mrope_section=[head_dim // 4, head_dim // 8, head_dim // 8],
                               pipeline_num_layers=_lists(per_stage, chunks, per_stage))
    encoder, projector = raw["image_encoder"]["vision_encoder"], raw["image_encoder"]["vision_projector"]
    encoder.update(num_layers=VIT_LAYERS, hidden_size=VIT_HIDDEN, ffn_hidden_size=4 * VIT_HIDDEN, llm_hidden_size=hidden,
                   num_attention_heads=VIT_HEADS,
                   pipeline_num_layers=_lists([VIT_LAYERS] + [0] * (pipeline_stages - 1), chunks, [0] * pipeline_stages))
    projector.update(input_size=VIT_HIDDEN, hidden_size=hidden, ffn_hidden_size=4 * VIT_HIDDEN)
    path = out / f"model_pp{pipeline_stages}_vpp{chunks}.json"
    path.write_text(json.dumps(raw, indent=1))
    return path


def _lists(first: list[int], chunks: int, others: list[int]) -> list:
    """One count per stage (chunks 1), or one such list per virtual chunk: `first`, then `others`."""
    return first if chunks == 1 else [first] + [others] * (chunks - 1)


def run_vlm(label: str, iters: int, warmup: int, workdir: Path, data_json: str) -> gpt_bench.Measurement:
    nproc, extra, _ = LAYOUTS[label]
    stages = 2 if "--pipeline-model-parallel-size" in extra else 1
    chunks = 2 if "--virtual-pipeline-model-parallel-size" in extra else 1
    metrics = workdir / f"vlm_{label}.jsonl"
    global_batch = gpt_bench.MICRO * gpt_bench.MICRO_BATCHES
    args = ["--mm-model", str(model_json(workdir, stages, chunks)), "--mm-data", data_json, "--micro-batch-size",
            str(gpt_bench.MICRO), "--global-batch-size", str(global_batch), "--seq-length", str(gpt_bench.SEQ),
            "--lr", "1e-4", "--train-iters", str(iters), "--eval-iters", "0", "--log-interval", str(iters),
            "--metrics-file", str(metrics), *extra]
    cmd = [sys.executable, "-m", "mmrun.launchers.cli", "--nproc-per-node", str(nproc), "--master-port", "0",
           str(VLM_ENTRY), *args]
    start = time.time()
    proc = subprocess.run(cmd, cwd=workdir, env=gpt_bench._env(), capture_output=True, text=True, timeout=1800)
    records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    steps = [r["elapsed_ms"] for r in records if r["kind"] == "train"][warmup:]
    summary = next((r for r in records if r["kind"] == "summary"), {})
    if proc.returncode != 0 or not steps:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        return gpt_bench.Measurement(f"VLM {label}", nproc, float("nan"), float("nan"), float("nan"), False,
                                     f"exit {proc.returncode}: {tail[0][:120]}")
    step_ms = statistics.median(steps)
    tokens = float(summary.get("tokens_per_s", float("nan")))
    m = gpt_bench.Measurement(f"VLM {label}", nproc, step_ms, tokens, float(summary.get("peak_rss_mb", float("nan"))))
    print(f"  VLM {label:8s} {nproc} processes: {step_ms:8.1f} ms/step, rank 0 peak RSS {m.peak_rss_mb:6.0f} MB "
          f"({time.time() - start:.0f} s)", flush=True)
    return m


def _faster(kept: gpt_bench.Measurement | None, new: gpt_bench.Measurement) -> gpt_bench.Measurement:
    if kept is None or not kept.ok:
        return new
    return new if new.ok and new.step_ms < kept.step_ms else kept


def markdown(vlm: dict[str, gpt_bench.Measurement], gpt: dict[str, gpt_bench.Measurement], header: str) -> str:
    out = [header, "", "| layout | processes | VLM ms/step | VLM vs its TP1 | GPT ms/step | GPT vs its TP1 | "
           "VLM / GPT step time |", "|---|---|---|---|---|---|---|"]
    base_v, base_g = vlm["TP1"].step_ms, gpt["TP1"].step_ms
    for label, (nproc, _, _) in LAYOUTS.items():
        v, g = vlm[label], gpt[label]
        if not (v.ok and g.ok):
            out.append(f"| {label} | {nproc} | failed: {v.note or g.note} | | | | |")
            continue
        out.append(f"| {label} | {nproc} | {v.step_ms:.1f} | {v.step_ms / base_v:.2f} | {g.step_ms:.1f} | "
                   f"{g.step_ms / base_g:.2f} | {v.step_ms / g.step_ms:.2f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    from mmrun.data.multimodal.demo import make_demo

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=12, help="iterations per job (default 12)")
    p.add_argument("--warmup", type=int, default=4, help="iterations left out of the median (default 4)")
    p.add_argument("--rounds", type=int, default=2,
                   help="run every job this many times, round-robin, and keep each one's fastest median (default 2): "
                        "on a shared machine the slowest rounds measure the neighbours")
    p.add_argument("--markdown", "--markdown-file", dest="markdown", default=None, help="also write the table here")
    args = p.parse_args(argv)
    header = (f"text decoder {gpt_bench.LAYERS} layers x hidden {gpt_bench.HIDDEN} x {gpt_bench.HEADS} heads (VLM: "
              f"+ ViT {VIT_LAYERS} x {VIT_HIDDEN} on stage 0, demo pictures, sequences up to {gpt_bench.SEQ}; GPT: "
              f"--mock-data, seq {gpt_bench.SEQ}), micro-batch {gpt_bench.MICRO} x {gpt_bench.MICRO_BATCHES}, fp32, "
              f"{args.iters} iterations (median after {args.warmup}, best of {args.rounds} rounds); CPU ({platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} cores, gloo, 1 thread per process) unless a GPU was found; load average "
              f"{os.getloadavg()[0]:.1f} at start")
    print(header, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        demo = make_demo(str(work / "demo"), num_samples=64, seed=7)
        vlm: dict[str, gpt_bench.Measurement] = {}
        gpt: dict[str, gpt_bench.Measurement] = {}
        for _ in range(args.rounds):
            for label, (_, _, layout) in LAYOUTS.items():
                vlm[label] = _faster(vlm.get(label), run_vlm(label, args.iters, args.warmup, work, demo["data_json"]))
                gpt[label] = _faster(gpt.get(label), gpt_bench.run_job(layout, args.iters, args.warmup, work))
    table = markdown(vlm, gpt, header)
    print(table)
    if args.markdown:
        atomic_write(args.markdown, table)
    return 0 if all(m.ok for m in [*vlm.values(), *gpt.values()]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
