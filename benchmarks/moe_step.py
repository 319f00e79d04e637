#!/usr/bin/env python3
"""One Qwen3-VL MoE decoder step: mmrun's sparse blocks (models/qwen3_vl/moe.py) against transformers'
Qwen3VLMoeForConditionalGeneration (a benchmark, not a test).

Both sides hold the same weights (transformers' random model, saved and loaded by mmrun's from_pretrained) and run
the same text batch (random token ids, no padding): forward with labels, backward, on PyTorch on the CPU (or CUDA
when there is one). The config is tiny-wide: a small ViT (unused by text) and a text decoder of --layers sparse
layers, --experts experts of width --expert-width, --top-k per token. Reported per side, after --warmup steps (the
two sides alternate step by step, so a change of machine load hits both): the median wall time of a step and the
median CPU time of a step (the process's CPU time, every thread: time.process_time), and mmrun / transformers speed
by both. The target (>= 1.0x: mmrun at least as fast) reads the CPU-time ratio: on a shared, loaded machine the
wall clock counts the time other processes hold the cores, the CPU time counts only this process's work (with
--threads 1 it is one thread's; with more threads it also counts the pool's spinning, alike on both sides); on a
quiet machine the two ratios agree. On this text-only batch neither step runs the ViT (one process: models/vlm/
blocks.py merge_vision skips the blank image that several ranks run to keep their collectives in step; the training
step gives the ViT zero gradients): that blank ViT run is timed alone, as several ranks would add it. Also: the
two losses (equal to 1e-5), transformers' experts implementation, the load average, and a router sanity table: per
sparse layer, the tokens routed to each expert (top-k assignments) by mmrun's router on this batch.

    python benchmarks/moe_step.py                       # 2 layers, 32 experts of 256, top 4, 2 x 128 tokens
    python benchmarks/moe_step.py --threads 1 --steps 10
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--expert-width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MMRUN_AI_FRAMEWORK", "pytorch")

    import numpy as np
    import torch
    import transformers

    from mmrun.backend import autograd, ops, tensors
    from mmrun.models.qwen3_vl import from_pretrained
    from mmrun.models.qwen3_vl.moe import top_k

    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    heads = max(args.hidden // 64, 2)
    text = {"hidden_size": args.hidden, "intermediate_size": 4 * args.hidden, "num_hidden_layers": args.layers,
            "num_attention_heads": heads, "num_key_value_heads": heads, "head_dim": 64, "vocab_size": 1024,
            "num_experts": args.experts, "num_experts_per_tok": args.top_k, "moe_intermediate_size": args.expert_width,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [16, 8, 8],
                                "mrope_interleaved": True}}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": args.hidden,
              "num_position_embeddings": 16, "deepstack_visual_indexes": [0]}
    torch.manual_seed(0)
    theirs = transformers.Qwen3VLMoeForConditionalGeneration(transformers.Qwen3VLMoeConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=False)).to(device).train()
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_pretrained(folder)
        ours = from_pretrained(folder)
    ours.to(device) if device != "cpu" else None
    ours.train()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, (args.batch, args.seq)).astype(np.int64)
    positions = np.broadcast_to(np.arange(args.seq), (3, args.batch, args.seq)).copy()
    batch = {"input_ids": ids, "labels": ids, "attention_mask": np.ones_like(ids), "position_ids": positions}

    # Each step frees its gradients before it ends (mmrun's value_and_grad returns them, and they are dropped):
    # transformers' .grad kept until its next step would hold ~50 MB while mmrun's step runs, so mmrun's step
    # alone would grow the heap and, after glibc trimmed it, fault fresh pages in (measured: some of mmrun's steps
    # took 2,000-8,000 minor page faults and 10-20 ms of system time, transformers' none).
    def step_theirs():
        out = theirs(**{k: torch.from_numpy(v).to(device) for k, v in batch.items()})
        out.loss.backward()
        theirs.zero_grad(set_to_none=True)
        return float(out.loss.detach())

    params = [p for p in ours.parameters() if p.requires_grad]
    inputs = {k: tensors.from_numpy(v) for k, v in batch.items()}

    def step_ours():
        loss, _ = autograd.value_and_grad(lambda: ours(**inputs)["loss_dict"]["loss"], params)()
        return float(tensors.to_numpy(loss))

    # With several ranks mmrun's training step on a text-only batch also runs the ViT on one blank image counted zero
    # times (models/vlm/blocks.py merge_vision: MindSpeed-MM's fake image, so every rank runs the same collectives;
    # issue 37); one process skips it, as transformers' step. Timed alone beside the steps: its forward and backward
    # as such a step runs them.
    vision = ours.config.vision
    blank = ops.zeros((vision.spatial_merge_size ** 2, vision.patch_dim), like=inputs["position_ids"])
    blank_grid = np.array([[1, vision.spatial_merge_size, vision.spatial_merge_size]])
    vision_params = [p for p in ours.model.visual.parameters() if p.requires_grad]

    def blank_vit():
        def run():
            merged, stacked = ours.model.visual(blank, blank_grid)
            return ops.sum(merged) + sum(ops.sum(f) for f in stacked)
        return float(tensors.to_numpy(autograd.value_and_grad(run, vision_params)()[0]))

    steps = {"transformers": step_theirs, "mmrun": step_ours, "blank ViT": blank_vit}
    wall: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    losses: dict[str, float] = {}
    load = os.getloadavg()[0]
    for _ in range(args.warmup + args.steps):  # the two alternate, so a change of machine load hits both
        for name, step in steps.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            losses[name] = step()
            if device == "cuda":
                torch.cuda.synchronize()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    load = max(load, os.getloadavg()[0])
    median = {name: (statistics.median(wall[name][args.warmup:]), statistics.median(cpu[name][args.warmup:]))
              for name in steps}
    tokens = args.batch * args.seq
    print(f"Qwen3-VL MoE decoder step on {device} ({torch.get_num_threads()} threads): {args.layers} sparse layers, "
          f"hidden {args.hidden}, {args.experts} experts of {args.expert_width}, top {args.top_k}, {tokens} tokens; "
          f"transformers' experts implementation {theirs.config.text_config._experts_implementation!r}; "
          f"load average {load:.2f} on {os.cpu_count()} cores")
    for name in ("transformers", "mmrun"):
        seconds, cpu_seconds = median[name]
        print(f"  {name:<13} wall {1e3 * seconds:7.1f} ms/step ({tokens / seconds:6.0f} tokens/s)  "
              f"CPU {1e3 * cpu_seconds:7.1f} ms/step  loss {losses[name]:.6f}")
    by_wall = median["transformers"][0] / median["mmrun"][0]
    by_cpu = median["transformers"][1] / median["mmrun"][1]
    print(f"  mmrun / transformers speed: {by_cpu:.2f}x by CPU time (the target, >= 1.0x), {by_wall:.2f}x by wall "
          f"time; loss difference {abs(losses['mmrun'] - losses['transformers']):.1e}")
    vit_wall, vit_cpu = median["blank ViT"]
    print(f"  the blank-image ViT run that several ranks add to a text-only step (one process skips it): wall "
          f"{1e3 * vit_wall:.1f} ms, CPU {1e3 * vit_cpu:.1f} ms; with it, mmrun / transformers: "
          f"{median['transformers'][1] / (median['mmrun'][1] + vit_cpu):.2f}x by CPU time")
    # the router sanity table: top-k assignments per expert, per sparse layer, on this batch
    router_logits: list = []
    text_model = ours.model.language_model
    with torch.no_grad():
        text_model(text_model.embed_tokens(inputs["input_ids"]), inputs["position_ids"], router_logits=router_logits)
    print(f"  tokens routed per expert (mmrun's router, {tokens} tokens x top {args.top_k} per layer):")
    for layer, logits in enumerate(router_logits):
        counts = np.bincount(top_k(tensors.to_numpy(torch.softmax(logits.float(), -1)), args.top_k).reshape(-1),
                             minlength=args.experts)
        print(f"    layer {layer}: " + " ".join(f"{c:d}" for c in counts)
              + f"   (min {counts.min()}, max {counts.max()}, mean {counts.mean():.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
