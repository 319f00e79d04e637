#!/usr/bin/env python3
"""One Qwen2-VL training step: mmrun's models/pretrain_vlm.py against transformers' own (a benchmark, not a test).

Both sides train the same network (a Qwen2-VL config from one model.json), on the same batches (the demo's
pictures and captions, through mmrun's data pipeline, so both see the same pixel values and token ids), with
AdamW, one micro-batch per step, on the same device (CUDA when there is one, else the CPU):

  mmrun          `models/pretrain_vlm.py` as a user starts it (one process); step time from its --metrics-file,
                 peak memory from its summary record (host RSS on CPU, device memory on a GPU)
  transformers   `Qwen2VLForConditionalGeneration` + `torch.optim.AdamW`: forward with labels, backward,
                 clip, step; the reference a user would otherwise write (its own process)

Reported: median step time after --warmup steps, tokens/s (label-bearing and all non-pad tokens), images/s,
peak memory, and mmrun / transformers ratios (target: mmrun at least as fast). The ViT's attention runs per
image (ops.varlen_attention: torch's fused SDPA per segment; torch's varlen kernel on CUDA in fp16/bf16) and
never builds a patches x patches mask; transformers 5.x does the same per chunk with SDPA.

    python benchmarks/vlm_step.py                   # the small size, 20 steps
    python benchmarks/vlm_step.py --size tiny --steps 10 --markdown out.md
    python benchmarks/vlm_step.py --threads 1      # one CPU thread each side (steadier on a busy machine)
    python benchmarks/vlm_step.py --model qwen2_5_omni --steps 8 --rounds 1   # Qwen2.5-Omni's thinker (audio)

--model qwen2_5_omni: MindSpeed-MM's Omni model.json shrunk (scripts/qwen2_5omni/model_tiny.json, everything
trainable) on the synthetic audio job of tests/training/omni_job.py, against transformers'
Qwen2_5OmniThinkerForConditionalGeneration built from the same config (--size is Qwen2-VL's only).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRY = ROOT / "models" / "pretrain_vlm.py"
TINY_JSON = ROOT / "scripts" / "qwen2vl" / "model_tiny.json"
OMNI_JSON = ROOT / "scripts" / "qwen2_5omni" / "model_tiny.json"
OMNI_JOB = ROOT / "tests" / "training" / "omni_job.py"

# size -> changes to the demo's model.json (text decoder, vision encoder, projector)
SIZES = {
    "tiny": {},
    "small": {"text": {"num_layers": 4, "pipeline_num_layers": [4], "hidden_size": 256, "ffn_hidden_size": 768,
                       "num_attention_heads": 8, "num_query_groups": 2, "mrope_section": [8, 4, 4]},
              "vision": {"num_layers": 4, "pipeline_num_layers": [4], "hidden_size": 128, "ffn_hidden_size": 512,
                         "num_attention_heads": 4, "llm_hidden_size": 256},
              "projector": {"input_size": 128, "hidden_size": 256, "ffn_hidden_size": 512}},
}
MICRO_BATCH = 4
SEQ_LENGTH = 128


def model_json(size: str, out: Path) -> Path:
    raw = json.loads(TINY_JSON.read_text())
    changes = SIZES[size]
    raw["text_decoder"].update(changes.get("text", {}))
    raw["image_encoder"]["vision_encoder"].update(changes.get("vision", {}))
    raw["image_encoder"]["vision_projector"].update(changes.get("projector", {}))
    # everything trains on both sides (transformers has no freeze switches to mirror)
    raw["image_encoder"]["vision_encoder"]["freeze"] = False
    path = out / f"model_{size}.json"
    path.write_text(json.dumps(raw, indent=2))
    return path


def omni_files(out: Path) -> tuple[Path, str]:
    """(model.json with every part trainable, data.json) of the Omni job."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("omni_job", OMNI_JOB)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    paths = job.make_job(out / "omni", samples=16)
    raw = json.loads(OMNI_JSON.read_text())
    for section in (raw["image_encoder"]["vision_encoder"], raw["image_encoder"]["vision_projector"],
                    raw["audio_encoder"]["audio_encoder"]):
        section["freeze"] = False
    path = out / "model_omni.json"
    path.write_text(json.dumps(raw, indent=2))
    return path, str(paths["data_json"])


def _env(threads: int | None) -> dict[str, str]:
    """Both sides get the same number of CPU threads: with more threads than free cores, OpenMP's spinning
    threads make step times jump by several times from run to run (measured on the 2-core machine)."""
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_mmrun(model: Path, data_json: str, steps: int, out: Path, threads: int | None) -> dict:
    metrics = out / "mmrun_metrics.jsonl"
    cmd = [sys.executable, str(ENTRY), "--ai-framework", "pytorch", "--mm-model", str(model), "--mm-data", data_json,
           "--micro-batch-size", str(MICRO_BATCH), "--global-batch-size", str(MICRO_BATCH), "--seq-length",
           str(SEQ_LENGTH), "--lr", "1e-4", "--train-iters", str(steps), "--log-interval", str(steps),
           "--eval-iters", "0", "--weight-decay", "0.01", "--clip-grad", "1.0", "--metrics-file", str(metrics)]
    proc = subprocess.run(cmd, cwd=out, capture_output=True, text=True, env=_env(threads))
    if proc.returncode:
        raise SystemExit(f"mmrun run failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps_ms = [r["elapsed_ms"] for r in records if r["kind"] == "train"]
    summary = next(r for r in records if r["kind"] == "summary")
    memory = summary["peak_device_memory_mb"] or summary["peak_rss_mb"]
    return {"steps_ms": steps_ms, "memory_mb": memory, "device": summary["device"]}


def baseline_worker(model: str, data_json: str, steps: int, result: str) -> None:
    """transformers' training step on the batches mmrun reads (same order, same collation)."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from mmrun.data.multimodal.collate import collate
    from mmrun.data.multimodal.mllm_dataset import MultimodalDataset
    from mmrun.data.multimodal.rope_index import RopeConfig
    from mmrun.models.vlm.model_json import read_model_json

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    omni = "audio_encoder" in json.loads(Path(model).read_text())
    if omni:
        from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

        from mmrun.models.qwen2_5_omni.configuration import OmniConfig
        from mmrun.models.qwen2_5_omni.model_json import parse_model_json

        hf = OmniConfig.from_hf_config(parse_model_json(json.loads(Path(model).read_text())).hf_config).to_hf_config()
        torch.manual_seed(0)
        net = Qwen2_5OmniThinkerForConditionalGeneration(Qwen2_5OmniThinkerConfig(**hf)).to(device).train()
    else:
        hf = read_model_json(model).hf_config
        torch.manual_seed(0)
        net = Qwen2VLForConditionalGeneration(Qwen2VLConfig(**hf)).to(device).train()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=0.01)
    dataset = MultimodalDataset(json.loads(Path(data_json).read_text())["dataset_param"], seq_length=SEQ_LENGTH)
    rope = dataset.rope_config if omni else RopeConfig.from_model_config(hf)
    video = hf.get("video_token_id")
    times, tokens, labels, images = [], [], [], []
    for step in range(steps):
        first = step * MICRO_BATCH % len(dataset)
        batch = collate([dataset[(first + i) % len(dataset)] for i in range(MICRO_BATCH)],
                        pad_token_id=dataset.token_ids["pad"], rope_config=rope, max_length=SEQ_LENGTH)
        ids = torch.from_numpy(batch["input_ids"])
        kwargs = {"input_ids": ids, "attention_mask": torch.from_numpy(batch["attention_mask"]),
                  "labels": torch.from_numpy(batch["labels"])}
        if omni:  # the thinker's own names for the collated arrays (position_ids: mmrun's TMRoPE, transformers')
            kwargs.update({k: torch.from_numpy(batch[k]) for k in ("input_features", "feature_attention_mask",
                                                                    "pixel_values_videos", "video_grid_thw")
                           if k in batch})
            if "second_per_grid_ts" in batch:
                kwargs["video_second_per_grid"] = torch.from_numpy(batch["second_per_grid_ts"])
        else:  # transformers 5.x asks for the modality of every token when images are passed
            kwargs["mm_token_type_ids"] = (ids == hf["image_token_id"]).long() + 2 * (ids == video).long()
        if "pixel_values" in batch:
            kwargs["pixel_values"] = torch.from_numpy(batch["pixel_values"])
            kwargs["image_grid_thw"] = torch.from_numpy(batch["image_grid_thw"])
        kwargs = {k: v.to(device, non_blocking=True) for k, v in kwargs.items()}
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = net(**kwargs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = float(loss)  # one read-back per step, as mmrun's
        times.append((time.perf_counter() - start) * 1000.0)
        tokens.append(int(batch["attention_mask"].sum()))
        labels.append(int((batch["labels"] != -100).sum()))
        images.append(0 if "image_grid_thw" not in batch else len(batch["image_grid_thw"]))
        del loss_value
    memory = (torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda"
              else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    Path(result).write_text(json.dumps({"steps_ms": times, "memory_mb": memory, "tokens": tokens,
                                        "labels": labels, "images": images, "device": str(device)}))


def run_baseline(model: Path, data_json: str, steps: int, out: Path, threads: int | None) -> dict:
    result = out / "baseline.json"
    proc = subprocess.run([sys.executable, __file__, "--baseline-worker", str(model), data_json, str(steps),
                           str(result)], capture_output=True, text=True, cwd=out, env=_env(threads))
    if proc.returncode:
        raise SystemExit(f"transformers baseline failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(result.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--model", choices=("qwen2_vl", "qwen2_5_omni"), default="qwen2_vl",
                        help="the model family (qwen2_vl: the demo's pictures; qwen2_5_omni: the audio job)")
    parser.add_argument("--steps", type=int, default=20, help="training steps per side (20)")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the median (3)")
    parser.add_argument("--rounds", type=int, default=3, help="transformers-then-mmrun rounds (3)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads of each side (OMP_NUM_THREADS); default: the library's own choice")
    parser.add_argument("--markdown", default=None, help="also write the table to this file")
    parser.add_argument("--baseline-worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.baseline_worker:
        model, data_json, steps, result = args.baseline_worker
        baseline_worker(model, data_json, int(steps), result)
        return 0
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    from mmrun.data.multimodal.demo import make_demo

    with tempfile.TemporaryDirectory(prefix="vlm_step_") as tmp:
        out = Path(tmp)
        if args.model == "qwen2_5_omni":
            model, data_json = omni_files(out)
        else:
            data_json = make_demo(str(out / "demo"), num_samples=64, seed=3)["data_json"]
            model = model_json(args.size, out)
        size = args.size if args.model == "qwen2_vl" else "tiny"
        print(f"{args.model} size {size}: {args.steps} steps of {MICRO_BATCH} samples, seq <= {SEQ_LENGTH}, "
              f"{args.rounds} round(s) ...", flush=True)
        rounds = []
        for _ in range(args.rounds):  # alternate the sides, so that a change in the machine's load hits both
            rounds.append((run_baseline(model, data_json, args.steps, out, args.threads),
                           run_mmrun(model, data_json, args.steps, out, args.threads)))
    w = args.warmup
    baseline = rounds[0][0]
    tokens, labels, images = (statistics.mean(baseline[k][w:]) for k in ("tokens", "labels", "images"))
    medians = [(statistics.median(b["steps_ms"][w:]), statistics.median(m["steps_ms"][w:])) for b, m in rounds]
    rows = []
    for side, name in ((0, "transformers"), (1, "mmrun")):
        ms = statistics.median(pair[side] for pair in medians)
        result = rounds[0][side]
        rows.append((name, result["device"], ms, tokens / ms * 1000, labels / ms * 1000, images / ms * 1000,
                     max(r[side]["memory_mb"] for r in rounds)))
    speed = statistics.median(b / m for b, m in medians)  # per round, then the median: the load cancels within a round
    (_, _, _, *_, hf_mem), (_, _, _, *_, mm_mem) = rows
    lines = ["| | device | step (ms, median) | tokens/s | label tokens/s | images/s | peak memory (MB) |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {n} | {d} | {ms:.1f} | {t:.0f} | {lt:.0f} | {im:.1f} | {mem:.0f} |"
              for n, d, ms, t, lt, im, mem in rows]
    lines.append(f"| mmrun / transformers | | | {speed:.2f}x speed (median of {len(rounds)} rounds: "
                 f"{', '.join(f'{b / m:.2f}' for b, m in medians)}) | | | {mm_mem / hf_mem:.2f}x |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        from mmrun.common.atomic_write import atomic_write

        atomic_write(args.markdown, table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
