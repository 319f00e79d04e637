#!/usr/bin/env python3
"""MindSpore against PyTorch per iteration, the same job through mmrun's entries (a benchmark, not a test).

Workloads (one process each, fp32, CPU threads as --threads says):
  vlm-demo   models/pretrain_vlm.py with the demo's model.json and batch (scripts/finetune_qwen2vl.sh: 2 micro-batches
             of 2 samples, --seq-length 128)
  vlm-small  the same entry with benchmarks/vlm_step.py's `small` model.json (LLM 4 x 256, ViT 4 x 128), one
             micro-batch of 4
  gpt        models/pretrain_gpt.py --mock-data at benchmarks/train_throughput.py's `small` size
  vlm-demo-dp2  the demo's job on 2 data-parallel processes (`mmrun --nproc-per-node 2`, same global batch)
  vlm-demo-tp2  the demo's job with --tensor-model-parallel-size 2 (megatron-core on PyTorch, the
             mindspore-parallel engine on MindSpore)
  vlm-demo-pp2  the demo's job with --pipeline-model-parallel-size 2 (scripts/qwen2vl/model_tiny_pp2.json: the ViT
             and a decoder layer on stage 0, the other decoder layer on stage 1; the same engines)
  wan-tiny, wan-small  models/pretrain_sora.py (t2v, fp32) on benchmarks/wan_step.py's `tiny` / `small` DiT and
             latent shapes: random feature files and a MindSpeed-MM pretrain_model.json written for the run
             (`wan_files`), one micro-batch per step
  qwen2.5-vl-demo  the demo's job with its model.json made Qwen2.5-VL (RMSNorm, gated SiLU ViT MLP, 56-pixel
             windows with block 1 full, untied output; tests/training/test_vlm_parallel.py's twin)
  qwen3-vl-demo  the demo's job on Qwen3-VL (scripts/qwen3vl/model_tiny.json: DeepStack, interleaved M-RoPE,
             learned ViT positions) with the demo's Qwen3-VL data (make_demo(model="qwen3_vl"))
  qwen2.5-vl-demo-pp2, qwen3-vl-demo-pp2  the two jobs above with --pipeline-model-parallel-size 2 (ViT and decoder
             layer 0 on stage 0, layer 1 on stage 1; scripts/qwen3vl/model_tiny_pp2.json)
  vlm-video-demo, qwen2.5-vl-video-demo, qwen3-vl-video-demo  vlm-demo, qwen2.5-vl-demo and qwen3-vl-demo on the demo's data with every
             other sample a 4-frame clip of its picture instead (attr.videos, MindSpeed-MM's video form: `with_videos`),
             so batches hold images, videos or both

Each round runs every workload on PyTorch, then on MindSpore, so a change in the machine's load hits both
sides of a ratio. Reported per side: the median iteration time after --warmup, and its CPU time (the metrics'
`cpu_ms`: rank 0's process, all its threads; a shared machine's load moves it less than the wall time), the
first iteration, the compile
time MindSpore printed (`> MindSpore compiled the train step ...`, once per batch shape), the load average while
it ran; per workload the MindSpore / PyTorch ratio of each round and their median.

    python benchmarks/ms_speed.py                          # 3 rounds, every workload
    python benchmarks/ms_speed.py --only vlm-demo --rounds 2 --markdown out.md
    python benchmarks/ms_speed.py --ms-args=--no-ms-jit     # MindSpore's PyNative step, for the before/after
    python benchmarks/ms_speed.py --only vlm-demo-dp2 vlm-demo-tp2 vlm-demo-pp2 --rounds 1   # 2 processes each
    python benchmarks/ms_speed.py --ms-compile-cache   # each MindSpore job twice: the second loads the graphs

With --ms-compile-cache every MindSpore job runs twice with --ms-compile-cache (a fresh folder per pair):
the first compiles and saves the graphs (its compile is reported as `cold compile`), the second, measured,
loads them (engines/compile_cache.py).
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
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from vlm_step import model_json  # noqa: E402 - the `small` model.json, built the same way

VLM_ENTRY = ROOT / "models" / "pretrain_vlm.py"
GPT_ENTRY = ROOT / "models" / "pretrain_gpt.py"
SORA_ENTRY = ROOT / "models" / "pretrain_sora.py"
TINY_JSON = ROOT / "scripts" / "qwen2vl" / "model_tiny.json"
QWEN3_JSON = ROOT / "scripts" / "qwen3vl" / "model_tiny.json"
MODEL_FILES = {"tiny": TINY_JSON, "tiny-pp2": ROOT / "scripts" / "qwen2vl" / "model_tiny_pp2.json",
               "qwen3-tiny": QWEN3_JSON, "qwen3-tiny-pp2": ROOT / "scripts" / "qwen3vl" / "model_tiny_pp2.json"}
VLM_COMMON = ["--seq-length", "128", "--lr", "2e-3", "--weight-decay", "0", "--clip-grad", "1.0", "--eval-iters", "0"]
DEMO_BATCH = ["--micro-batch-size", "2", "--global-batch-size", "4", *VLM_COMMON]
# pretrain_sora.py: examples/wan2.1's optimizer flags, one sample per step, no recomputation (timed as it is)
WAN_ARGS = ["--micro-batch-size", "1", "--global-batch-size", "1", "--lr", "1e-5", "--weight-decay", "1e-2",
            "--clip-grad", "1.0", "--eval-iters", "0", "--seed", "1234"]
# name -> (entry, arguments without the model file, model.json size or None, processes)
WORKLOADS = {
    "vlm-demo": (VLM_ENTRY, DEMO_BATCH, "tiny", 1),
    "vlm-small": (VLM_ENTRY, ["--micro-batch-size", "4", "--global-batch-size", "4", *VLM_COMMON], "small", 1),
    "gpt": (GPT_ENTRY, ["--mock-data", "--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4",
                        "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "4",
                        "--global-batch-size", "4", "--lr", "1e-4", "--hidden-dropout", "0", "--attention-dropout",
                        "0", "--eval-iters", "0"], None, 1),
    "vlm-demo-dp2": (VLM_ENTRY, DEMO_BATCH, "tiny", 2),
    "vlm-demo-tp2": (VLM_ENTRY, [*DEMO_BATCH, "--tensor-model-parallel-size", "2"], "tiny", 2),
    "vlm-demo-pp2": (VLM_ENTRY, [*DEMO_BATCH, "--pipeline-model-parallel-size", "2"], "tiny-pp2", 2),
    "wan-tiny": (SORA_ENTRY, WAN_ARGS, "wan-tiny", 1),
    "wan-small": (SORA_ENTRY, WAN_ARGS, "wan-small", 1),
    "qwen2.5-vl-demo": (VLM_ENTRY, DEMO_BATCH, "qwen2.5-tiny", 1),
    "qwen3-vl-demo": (VLM_ENTRY, DEMO_BATCH, "qwen3-tiny", 1),
    # the same two models over 2 pipeline stages (ViT and decoder layer 0 on stage 0, layer 1 on stage 1)
    "qwen2.5-vl-demo-pp2": (VLM_ENTRY, [*DEMO_BATCH, "--pipeline-model-parallel-size", "2"], "qwen2.5-tiny-pp2", 2),
    "qwen3-vl-demo-pp2": (VLM_ENTRY, [*DEMO_BATCH, "--pipeline-model-parallel-size", "2"], "qwen3-tiny-pp2", 2),
    "vlm-video-demo": (VLM_ENTRY, DEMO_BATCH, "tiny", 1),
    "qwen2.5-vl-video-demo": (VLM_ENTRY, DEMO_BATCH, "qwen2.5-tiny", 1),
    "qwen3-vl-video-demo": (VLM_ENTRY, DEMO_BATCH, "qwen3-tiny", 1),
}
# workload -> (its demo folder, make_demo's model): data other than the Qwen2-VL demo's pictures
DEMO_DATA = {"qwen3-vl-demo": ("demo_qwen3", "qwen3_vl"), "qwen3-vl-demo-pp2": ("demo_qwen3", "qwen3_vl"),
             "vlm-video-demo": ("demo_video", "qwen2_vl"),
             "qwen2.5-vl-video-demo": ("demo_video", "qwen2_vl"),
             "qwen3-vl-video-demo": ("demo_qwen3_video", "qwen3_vl")}
VIDEO_FRAMES = 4
SINGLE = [name for name, row in WORKLOADS.items() if row[3] == 1]  # the default: one process each
CACHED_NOTE = ", MindSpore with --ms-compile-cache, its second run (the first run's compile in brackets)"
COMPILED = re.compile(r"> MindSpore compiled the train step .* in ([0-9.]+) s")


def _env(threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "PET_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK_ID", "RANK_SIZE", "MMRUN_AI_FRAMEWORK")}
    env["OMP_NUM_THREADS"] = str(threads)
    return env


def wan_files(size: str, out: Path, samples: int = 4) -> dict[str, Path]:
    """pretrain_sora.py's inputs at benchmarks/wan_step.py's `size` (its DiT, latent and prompt shapes): random
    feature files, data.jsonl, feature_data.json and a pretrain_model.json in MindSpeed-MM's keys (t2v)."""
    import numpy as np

    from mmrun.data.video import feature_files as ff
    from wan_step import SIZES

    root = out / f"wan_{size}"
    if (root / "pretrain_model.json").is_file():
        return {"data": root / "feature_data.json", "model": root / "pretrain_model.json"}
    changes, _, frames, hw, text = SIZES[size]
    h, w = hw if isinstance(hw, tuple) else (hw, hw)
    (root / "features").mkdir(parents=True)
    rng = np.random.default_rng(3)
    records = []
    for i in range(samples):
        sample = {ff.VIDEO: rng.standard_normal((16, frames, h, w)).astype(np.float32),
                  ff.PROMPT_IDS: rng.standard_normal((text, changes["text_dim"])).astype(np.float32),
                  ff.PROMPT_MASK: (np.arange(text) < text // 2 + i).astype(np.int64)}
        name = ff.feature_file_name(f"clip{i}.mp4", ff.SAFETENSORS_SUFFIX)
        ff.write_feature_file(root / "features" / name, sample)
        records.append({"path": f"clip{i}.mp4", "cap": f"caption {i}", "file": f"features/{name}"})
    ff.write_index(root / "data.jsonl", records)
    data = {"dataset_param": {"dataset_type": "feature",
                              "basic_parameters": {"data_path": str(root / "data.jsonl"), "data_folder": str(root)}},
            "dataloader_param": {"dataloader_mode": "sampler", "shuffle": True, "drop_last": True}}
    predictor = {"model_id": "wandit", "model_type": "t2v", "patch_size": [1, 2, 2], "text_len": text, "in_dim": 16,
                 "hidden_size": changes["num_attention_heads"] * changes["attention_head_dim"],
                 "ffn_dim": changes["ffn_dim"], "freq_dim": changes["freq_dim"], "text_dim": changes["text_dim"],
                 "out_dim": 16, "num_heads": changes["num_attention_heads"], "num_layers": changes["num_layers"],
                 "qk_norm": True, "qk_norm_type": "rmsnorm", "cross_attn_norm": True, "eps": 1e-6,
                 "max_seq_len": 1024}
    model = {"load_video_features": True, "load_text_features": True, "task": "t2v", "predictor": predictor,
             "diffusion": {"model_id": "wan_flow_match_scheduler", "num_train_timesteps": 1000, "shift": 5,
                           "sigma_min": 0.0, "extra_one_step": True}}
    (root / "feature_data.json").write_text(json.dumps(data, indent=1) + "\n")
    (root / "pretrain_model.json").write_text(json.dumps(model, indent=1) + "\n")
    return {"data": root / "feature_data.json", "model": root / "pretrain_model.json"}


def run_cached(workload: str, iters: int, warmup: int, out: Path, data_json: str, threads: int,
               extra: list[str]) -> dict:
    """MindSpore twice with --ms-compile-cache: the first run fills the cache, the second is the one reported."""
    # A folder of its own per call: with one per invocation, a second round's "cold" run would load the first's.
    cache = ["--ms-compile-cache", str(out / f"ms_compile_cache_{time.time_ns()}")]
    cold = run(workload, "mindspore", iters, warmup, out, data_json, threads, [*extra, *cache])
    warm = run(workload, "mindspore", iters, warmup, out, data_json, threads, [*extra, *cache])
    return {**warm, "cold_compile_s": cold["compile_s"]}


def run(workload: str, framework: str, iters: int, warmup: int, out: Path, data_json: str, threads: int,
        extra: list[str]) -> dict:
    entry, args, size, nproc = WORKLOADS[workload]
    metrics = out / f"{workload}_{framework}_{time.time_ns()}.jsonl"
    # Several processes through mmrun's launcher (rank 0 writes the metrics), one as a plain `python entry`.
    launch = [sys.executable, str(entry), "--ai-framework", framework]
    if nproc > 1:
        launch = [sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", framework, "--nproc-per-node",
                  str(nproc), "--master-port", "0", str(entry)]
    cmd = [*launch, *args, "--train-iters", str(iters), "--log-interval", "1", "--metrics-file", str(metrics), *extra]
    if size is not None and size.startswith("wan-"):
        files = wan_files(size[len("wan-"):], out)
        cmd += ["--mm-model", str(files["model"]), "--mm-data", str(files["data"])]
    elif size is not None:
        model = MODEL_FILES[size] if size in MODEL_FILES else \
            qwen2_5_json(out, stages=2 if size.endswith("-pp2") else 1) if size.startswith("qwen2.5-tiny") else \
            model_json(size, out)
        if workload in DEMO_DATA:  # its own demo data (Qwen3-VL's template, tokenizer and 16-pixel patches; videos)
            data_json = str(Path(data_json).parent.parent / DEMO_DATA[workload][0] / "data.json")
        cmd += ["--mm-model", str(model), "--mm-data", data_json]
    load_before = os.getloadavg()[0]
    proc = subprocess.run(cmd, cwd=out, capture_output=True, text=True, env=_env(threads), timeout=3600)
    load = (load_before + os.getloadavg()[0]) / 2
    if proc.returncode:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise SystemExit(f"{workload} on {framework} failed ({proc.returncode}):\n{tail}")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r["elapsed_ms"] for r in records if r["kind"] == "train"]
    cpu = [r["cpu_ms"] for r in records if r["kind"] == "train"][warmup:]  # rank 0's process, all its threads
    compile_s = sum(float(m) for m in COMPILED.findall(proc.stdout + proc.stderr))
    return {"steady_ms": statistics.median(steps[warmup:]), "first_ms": steps[0], "compile_s": compile_s,
            "load": load, "cpu_ms": statistics.median(cpu)}


def with_videos(demo: dict[str, str], frames: int = VIDEO_FRAMES) -> None:
    """make_demo's files with every other sample a `frames`-frame clip of its picture instead (its <image> a
    <video>), and data.json's attr.videos set: MindSpeed-MM's video form."""
    samples = json.loads(Path(demo["dataset"]).read_text())
    for sample in samples[::2]:
        sample["messages"][0]["content"] = sample["messages"][0]["content"].replace("<image>", "<video>")
        sample["videos"], sample["images"] = [[sample["images"][0]] * frames], []
    Path(demo["dataset"]).write_text(json.dumps(samples))
    config = json.loads(Path(demo["data_json"]).read_text())
    config["dataset_param"]["attr"]["videos"] = "videos"
    Path(demo["data_json"]).write_text(json.dumps(config, indent=1))


def qwen2_5_json(out: Path, stages: int = 1) -> Path:
    """The demo's model.json made Qwen2.5-VL (as tests/training/test_vlm_parallel.py's _qwen2_5_json), on one stage
    or two (the ViT and decoder layer 0, then decoder layer 1)."""
    path = out / f"model_qwen2_5_tiny_pp{stages}.json"
    if not path.is_file():
        raw = json.loads(TINY_JSON.read_text())
        raw["model_id"] = "qwen2_5vl"
        raw["image_encoder"]["vision_encoder"].update(
            normalization="RMSNorm", activation_func="silu", gated_linear_unit=True, window_attn_size=56,
            fullatt_block_indexes=[1], tokens_per_second=2, pipeline_num_layers=[2] + [0] * (stages - 1))
        raw["image_encoder"]["vision_projector"]["normalization"] = "RMSNorm"
        raw["text_decoder"].update(model_id="qwen2_5_lm", untie_embeddings_and_output_weights=True,
                                   pipeline_num_layers=[1, 1] if stages == 2 else [2])
        path.write_text(json.dumps(raw, indent=1))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=list(WORKLOADS), default=SINGLE,
                        help=f"workloads (default: {' '.join(SINGLE)}; the 2-process rows only when named)")
    parser.add_argument("--rounds", type=int, default=3, help="PyTorch-then-MindSpore rounds (3)")
    parser.add_argument("--iters", type=int, default=12, help="iterations per job (12, as the issue's demo run)")
    parser.add_argument("--warmup", type=int, default=3, help="iterations left out of the median (3)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each job (1)")
    parser.add_argument("--ms-args", "--ms_args", dest="ms_args", default="",
                        help="extra arguments of the MindSpore jobs, one string (e.g. --no-ms-jit)")
    parser.add_argument("--ms-compile-cache", "--ms_compile_cache", dest="ms_compile_cache", action="store_true",
                        help="run each MindSpore job twice with --ms-compile-cache and report the second")
    parser.add_argument("--markdown", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    if args.iters <= args.warmup:
        parser.error(f"--iters ({args.iters}) must exceed --warmup ({args.warmup})")
    import mindspore
    import torch

    from mmrun.data.multimodal.demo import make_demo

    results: dict[str, list[tuple[dict, dict]]] = {w: [] for w in args.only}
    with tempfile.TemporaryDirectory(prefix="ms_speed_") as tmp:
        out = Path(tmp)
        data_json = make_demo(str(out / "demo"), num_samples=64, seed=3)["data_json"]
        for folder, model in sorted({DEMO_DATA[w] for w in args.only if w in DEMO_DATA}):
            demo = make_demo(str(out / folder), num_samples=64, seed=3, model=model)
            if "video" in folder:
                with_videos(demo)
        for round_ in range(args.rounds):
            for workload in args.only:
                pt = run(workload, "pytorch", args.iters, args.warmup, out, data_json, args.threads, [])
                ms_job = run_cached if args.ms_compile_cache else partial(run, framework="mindspore")
                ms = ms_job(workload=workload, iters=args.iters, warmup=args.warmup, out=out, data_json=data_json,
                            threads=args.threads, extra=args.ms_args.split())
                pair = (pt, ms)
                results[workload].append(pair)
                cold = f" (cold compile {ms['cold_compile_s']:.1f} s)" if "cold_compile_s" in ms else ""
                print(f"round {round_ + 1} {workload}: pytorch {pt['steady_ms']:.1f} ms, mindspore "
                      f"{ms['steady_ms']:.1f} ms ({ms['steady_ms'] / pt['steady_ms']:.2f}x), CPU {pt['cpu_ms']:.1f} / "
                      f"{ms['cpu_ms']:.1f} ms ({ms['cpu_ms'] / pt['cpu_ms']:.2f}x), mindspore first "
                      f"{ms['first_ms']:.0f} ms, compile {ms['compile_s']:.1f} s{cold}, "
                      f"load {pt['load']:.1f}/{ms['load']:.1f}",
                      flush=True)
    lines = [f"{platform.machine()} CPU, {os.cpu_count()} cores, torch {torch.__version__}, mindspore "
             f"{mindspore.__version__}, OMP_NUM_THREADS={args.threads}, {args.iters} iterations, median after "
             f"{args.warmup}{', MindSpore ' + args.ms_args if args.ms_args else ''}"
             f"{CACHED_NOTE if args.ms_compile_cache else ''}",
             "",
             "| workload | PyTorch (ms/it) | MindSpore (ms/it) | MindSpore / PyTorch | MindSpore first iteration (ms) "
             "| compile (s) | first / steady | load average | CPU ms/it, PyTorch / MindSpore (rank 0) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for workload, pairs in results.items():
        ratios = [ms["steady_ms"] / pt["steady_ms"] for pt, ms in pairs]
        pt_ms = statistics.median(pt["steady_ms"] for pt, _ in pairs)
        ms_ms = statistics.median(ms["steady_ms"] for _, ms in pairs)
        first = statistics.median(ms["first_ms"] for _, ms in pairs)
        compile_s = statistics.median(ms["compile_s"] for _, ms in pairs)
        colds = [ms["cold_compile_s"] for _, ms in pairs if "cold_compile_s" in ms]
        cold = f" ({statistics.median(colds):.1f} cold)" if colds else ""
        loads = [x["load"] for pair in pairs for x in pair]
        cpu_pt, cpu_ms = (statistics.median(pair[i]["cpu_ms"] for pair in pairs) for i in (0, 1))
        lines.append(f"| {workload} | {pt_ms:.1f} | {ms_ms:.1f} | **{statistics.median(ratios):.2f}x** "
                     f"({', '.join(f'{r:.2f}' for r in ratios)}) | {first:.0f} | {compile_s:.1f}{cold} | "
                     f"{first / ms_ms:.0f}x | {min(loads):.1f} to {max(loads):.1f} | {cpu_pt:.1f} / {cpu_ms:.1f} "
                     f"(**{statistics.median(ms['cpu_ms'] / pt['cpu_ms'] for pt, ms in pairs):.2f}x**) |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        from mmrun.common.atomic_write import atomic_write

        atomic_write(args.markdown, table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
