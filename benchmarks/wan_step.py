#!/usr/bin/env python3
"""One Wan2.1 DiT training step: mmrun's against diffusers' own (a benchmark, not a test).

Both PyTorch sides train the same network from the same weights (Wan's initialisation from the seed,
models/wan/transformer.py's initial_state, its zero tensors drawn small; loaded by name into both) on the same
batches: latents and prompt embeddings from the seed, the timestep, noise, noisy input, target and weight of
models/wan/flow_match.py's objective (the numbers pretrain_sora.py trains on), prompt embeddings past each
prompt's length zeroed:

  mmrun       mmrun.models.wan's WanTransformer3DModel + the portable AdamW (Megatron's no-decay rule) and
              TrainStep, the loss pretrain_sora.py's loss_func (mse in fp32 times the timestep's weight): what
              pretrain_sora.py's engine runs per iteration (forward, backward, clip at 1.0, AdamW, one read-back
              of loss and gradient norm); bf16: the model cast to bf16, fp32 main params in the optimizer
  diffusers   diffusers' WanTransformer3DModel + torch.optim.AdamW (the same parameter groups) and the same
              objective in plain torch: forward, mse, backward, clip_grad_norm_, step, zero_grad, one read-back;
              bf16: fp32 parameters under torch.autocast(bf16), the way diffusers' training scripts run it
  mindspore   mmrun's side again on MindSpore (its own process, MMRUN_AI_FRAMEWORK=mindspore), compiled with
              mindspore.jit as pretrain_sora.py's step runs there (--ms-pynative: PyNative, the step before),
              against mmrun on PyTorch; the first step, which compiles, is timed on its own

The PyTorch sides alternate in rounds in one process (a change in the machine's load hits both); the step time
is the median after --warmup steps, per round, in wall time and in the process's CPU time (steadier on a busy
machine); the speed ratio diffusers / mmrun is the median of the rounds' ratios (>= 1.0: mmrun at least as
fast). MindSpore runs after the rounds, in its own process, the same steps and rounds. The first-step losses and
gradient norms of the two PyTorch sides are compared once (the same work is measured; equal in fp32 on a CPU);
MindSpore's first loss is printed beside them.

    python benchmarks/wan_step.py --size tiny                   # a smoke run (PyTorch: seconds; MindSpore's
                                                                # compile: 20 s to minutes on 2 cores)
    python benchmarks/wan_step.py --size small --rounds 3       # the table of docs/generation.md
    python benchmarks/wan_step.py --size 1.3b --device cuda --precision bf16 --no-mindspore   # a GPU owner's
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

import numpy as np

# size -> (diffusers config changes, batch, latent frames, latent height/width, text length)
SIZES = {
    "tiny": ({"num_attention_heads": 2, "attention_head_dim": 16, "ffn_dim": 64, "num_layers": 2, "text_dim": 32,
              "freq_dim": 32}, 1, 2, 8, 16),
    "small": ({"num_attention_heads": 4, "attention_head_dim": 64, "ffn_dim": 1024, "num_layers": 4,
               "text_dim": 256, "freq_dim": 256}, 1, 3, 16, 64),
    # Wan2.1-T2V-1.3B: 81 frames at 480x832 are 21 x 60 x 104 latents; the prompt is umT5's 512 tokens
    "1.3b": ({"num_attention_heads": 12, "attention_head_dim": 128, "ffn_dim": 8960, "num_layers": 30,
              "text_dim": 4096, "freq_dim": 256}, 1, 21, (60, 104), 512),
}
OPTIMIZER = {"lr": 1e-5, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
CLIP = 1.0
SEED = 1234
NUM_BATCHES = 3


def config(size: str):
    from mmrun.models.wan.configuration import WanTransformerConfig

    changes, *_ = SIZES[size]
    return WanTransformerConfig.from_diffusers({"patch_size": [1, 2, 2], "in_channels": 16, "out_channels": 16,
                                                "qk_norm": "rms_norm_across_heads", "cross_attn_norm": True,
                                                "eps": 1e-6, **changes})


def initial_weights(size: str) -> dict[str, np.ndarray]:
    """Wan's initialisation from the seed, with the tensors it starts at zero (proj_out, the biases) drawn small
    instead: with a zero head the first output is 0 whatever the network, and the first-step losses of the two
    sides would agree without checking their models."""
    from mmrun.models.wan.transformer import initial_state

    rng = np.random.default_rng(SEED + 1)
    return {name: (0.02 * rng.standard_normal(v.shape)).astype(np.float32) if not v.any() else v
            for name, v in initial_state(config(size), SEED).items()}


def make_batches(size: str) -> list[dict[str, np.ndarray]]:
    """NUM_BATCHES micro-batches as pretrain_sora.py's collate makes them (flow_match.training_batch)."""
    from mmrun.models.wan.flow_match import FlowMatchConfig, FlowMatchTraining

    changes, batch, frames, hw, text = SIZES[size]
    h, w = hw if isinstance(hw, tuple) else (hw, hw)
    flow = FlowMatchTraining(FlowMatchConfig())
    rng = np.random.default_rng(SEED)
    out = []
    for i in range(NUM_BATCHES):
        latents = rng.standard_normal((batch, 16, frames, h, w), dtype=np.float32)
        prompt = rng.standard_normal((batch, text, changes["text_dim"]), dtype=np.float32)
        lengths = rng.integers(text // 4, text + 1, batch)
        prompt[np.arange(text)[None, :] >= lengths[:, None]] = 0  # as pretrain_sora.py's collate
        one = flow.training_batch(latents, SEED, [i * batch + j for j in range(batch)])
        one["encoder_hidden_states"] = prompt
        out.append(one)
    return out


def no_decay(name: str, shape: tuple[int, ...]) -> bool:
    """Megatron's rule (mmrun's AdamW default in pretrain): no weight decay on biases and 1-D parameters."""
    return name.endswith(".bias") or len(shape) == 1


# ------------------------------------------------------------------------------------------------ sides

def mmrun_side(size: str, state: dict[str, np.ndarray], batches: list, precision: str, jit: bool = True):
    """(step(i) -> (loss, grad norm), description): pretrain_sora.py's model, loss, AdamW and TrainStep."""
    from mmrun import backend
    from mmrun.backend import tensors
    from mmrun.backend.lr_schedule import LRSchedule
    from mmrun.models import pretrain_sora
    from mmrun.models.wan import transformer

    model = transformer.WanTransformer3DModel(config(size))
    transformer.load_diffusers_weights(model, state)
    model = backend.device.to_device(model)
    compute = None if precision == "fp32" else precision
    if compute:
        model.to(tensors.dtype(compute))  # the engine's Float16Module: fp32 main params live in the optimizer
    optimizer = backend.optim.AdamW(model.named_parameters(), **OPTIMIZER, no_decay=backend.optim.megatron_no_decay)
    schedule = LRSchedule(max_lr=OPTIMIZER["lr"], lr_decay_steps=10**6, lr_decay_style="constant")
    extra = {"jit": jit} if os.environ.get("MMRUN_AI_FRAMEWORK") == "mindspore" else {}
    model.train()

    def loss_fn(net, x, t, prompt, target, weight):  # pretrain_sora.forward_step + its loss_func
        return pretrain_sora.loss_func(target, weight, net(x, t, prompt))[0]

    step = backend.train_step.TrainStep(model, optimizer, loss_fn=loss_fn, lr_scheduler=schedule, clip_grad=CLIP,
                                        **extra)
    fp32 = ("timestep", "target", "loss_weight")  # pretrain_sora.get_batch: these stay fp32
    keys = ("hidden_states", "timestep", "encoder_hidden_states", "target", "loss_weight")
    device_batches = [tuple(backend.device.to_device(tensors.from_numpy(b[k], dtype=None if k in fp32 else compute))
                            for k in keys) for b in batches]

    def run(i: int) -> tuple[float, float]:
        result = step([device_batches[i % len(device_batches)]])
        return result.loss, result.grad_norm
    return run


def diffusers_side(size: str, state: dict[str, np.ndarray], batches: list, precision: str, device: str):
    """diffusers' WanTransformer3DModel + torch.optim.AdamW + the objective in plain torch."""
    import torch
    import torch.nn.functional as F
    from diffusers import WanTransformer3DModel

    net = WanTransformer3DModel(**config(size).to_diffusers())
    missing, unexpected = net.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise SystemExit(f"diffusers' model does not take mmrun's weights: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    net = net.to(device).train()
    named = list(net.named_parameters())
    groups = [{"params": [p for n, p in named if not no_decay(n, tuple(p.shape))]},
              {"params": [p for n, p in named if no_decay(n, tuple(p.shape))], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, **OPTIMIZER)
    params = [p for _, p in named]
    keys = ("hidden_states", "timestep", "encoder_hidden_states", "target", "loss_weight")
    device_batches = [tuple(torch.as_tensor(b[k]).to(device) for k in keys) for b in batches]
    autocast = precision != "fp32"

    def run(i: int) -> tuple[float, float]:
        x, t, prompt, target, weight = device_batches[i % len(device_batches)]
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
            out = net(hidden_states=x, timestep=t, encoder_hidden_states=prompt, return_dict=False)[0]
        loss = F.mse_loss(out.float(), target.float()) * weight
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value, norm_value = torch.stack([loss.detach(), norm]).tolist()  # one read-back, as mmrun's
        return loss_value, norm_value
    return run


def timed(run, steps: int, offset: int, sync) -> tuple[list[float], list[float]]:
    """Wall and CPU times (ms) of `steps` steps starting at batch `offset`. The process's CPU time hardly moves
    with the machine's load (one thread per side), wall time does: both are reported."""
    wall, cpu = [], []
    for i in range(steps):
        sync()
        start, start_cpu = time.perf_counter(), time.process_time()
        run(offset + i)
        sync()
        wall.append((time.perf_counter() - start) * 1000.0)
        cpu.append((time.process_time() - start_cpu) * 1000.0)
    return wall, cpu


# ---------------------------------------------------------------------------------------- MindSpore row

def mindspore_worker(size: str, precision: str, steps: int, rounds: int, tmp: str, jit: bool = True) -> None:
    """mmrun's side on MindSpore (MMRUN_AI_FRAMEWORK=mindspore): the first loss and the first step's time (the
    compile, when jit), then `rounds` timed runs."""
    from safetensors.numpy import load_file

    state = load_file(Path(tmp) / "state.safetensors")
    run = mmrun_side(size, state, make_batches(size), precision, jit)
    start = time.perf_counter()
    first, _ = run(0)
    first_s = time.perf_counter() - start
    runs = [timed(run, steps, 1 + r * steps, lambda: None) for r in range(rounds)]
    from mmrun import backend
    Path(tmp, "mindspore.json").write_text(json.dumps({"first_loss": first, "first_s": first_s, "runs": runs,
                                                       "version": backend.load().version()}))


def run_mindspore(args: argparse.Namespace, tmp: str, threads: int | None) -> dict | None:
    env = {k: v for k, v in os.environ.items() if k not in ("MMRUN_AI_FRAMEWORK",)}
    env.update({"MMRUN_AI_FRAMEWORK": "mindspore", "GLOG_v": "3"})
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, __file__, "--mindspore-worker", tmp, "--size", args.size, "--precision", args.precision,
           "--steps", str(args.steps), "--rounds", str(args.rounds)] + (["--ms-pynative"] if args.ms_pynative else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        print(f"mindspore row left out: the worker failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}",
              file=sys.stderr)
        return None
    return json.loads(Path(tmp, "mindspore.json").read_text())


# ------------------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=list(SIZES), default="small")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--steps", type=int, default=12, help="timed steps per side per round (12)")
    parser.add_argument("--warmup", type=int, default=2, help="steps of each round left out of the median (2)")
    parser.add_argument("--rounds", type=int, default=3, help="diffusers-then-mmrun rounds (3)")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads per side (torch.set_num_threads / OMP_NUM_THREADS; 1: steadiest on a "
                             "shared machine; 0: the library's choice)")
    parser.add_argument("--no-mindspore", "--no_mindspore", dest="no_mindspore", action="store_true",
                        help="leave out the MindSpore row")
    parser.add_argument("--ms-pynative", "--ms_pynative", dest="ms_pynative", action="store_true",
                        help="MindSpore's step in PyNative instead of compiled (the row before graph mode)")
    parser.add_argument("--markdown", default=None, help="also write the table to this file")
    parser.add_argument("--mindspore-worker", dest="mindspore_worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    if args.mindspore_worker:
        mindspore_worker(args.size, args.precision, args.steps, args.rounds, args.mindspore_worker,
                         jit=not args.ms_pynative)
        return 0
    os.environ["MMRUN_AI_FRAMEWORK"] = "pytorch"
    if args.device == "cpu":  # mmrun's backend takes the accelerator it finds: show it none
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"--device cuda: torch {torch.__version__} sees no CUDA device; pass --device cpu", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    import diffusers
    from safetensors.numpy import save_file

    cfg = config(args.size)
    state = initial_weights(args.size)
    batches = make_batches(args.size)
    _, batch, frames, hw, text = SIZES[args.size]
    h, w = hw if isinstance(hw, tuple) else (hw, hw)
    params = sum(v.size for v in state.values())
    load_start = os.getloadavg()[0]
    print(f"size {args.size}: hidden {cfg.inner_dim}, {cfg.num_layers} layers, {params / 1e6:.1f}M parameters; "
          f"latents {batch}x16x{frames}x{h}x{w} ({frames * h * w // 4} tokens), text {text}; {args.precision} on "
          f"{args.device}, {args.steps} steps x {args.rounds} rounds", flush=True)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    sides = {"diffusers": diffusers_side(args.size, state, batches, args.precision, args.device),
             "mmrun": mmrun_side(args.size, state, batches, args.precision)}
    first = {name: run(0) for name, run in sides.items()}  # both from the same weights, on batch 0
    (loss_d, norm_d), (loss_m, norm_m) = first["diffusers"], first["mmrun"]
    print(f"first step: loss diffusers {loss_d:.7f}, mmrun {loss_m:.7f}, |difference| {abs(loss_d - loss_m):.2e}; "
          f"gradient norm diffusers {norm_d:.6f}, mmrun {norm_m:.6f}, relative difference "
          f"{abs(norm_d - norm_m) / norm_d:.2e}", flush=True)
    medians: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(args.rounds):  # alternate: a change in the machine's load hits both sides
        for name, run in sides.items():
            wall, cpu_ms = timed(run, args.steps, 1 + r * args.steps, sync)
            medians[name].append(statistics.median(wall[args.warmup:]))
            cpu[name].append(statistics.median(cpu_ms[args.warmup:]))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {m[-1]:.1f} ms" for n, m in medians.items()),
              flush=True)
    peak = (f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MB device memory (both sides)"
            if args.device == "cuda" else None)
    ms = None
    if not args.no_mindspore:
        if args.device != "cpu":
            print("mindspore row left out: it runs on the CPU only here", file=sys.stderr)
        else:
            with tempfile.TemporaryDirectory(prefix="wan_step_") as tmp:
                save_file(state, str(Path(tmp) / "state.safetensors"))
                ms = run_mindspore(args, tmp, args.threads)
    if ms is not None:
        medians["mindspore"] = [statistics.median(wall[args.warmup:]) for wall, _ in ms["runs"]]
        cpu["mindspore"] = [statistics.median(cpu_ms[args.warmup:]) for _, cpu_ms in ms["runs"]]
        print(f"mindspore first-step loss {ms['first_loss']:.7f} (|difference| to mmrun on PyTorch "
              f"{abs(ms['first_loss'] - loss_m):.2e}); its first step {ms['first_s']:.1f} s"
              f"{'' if args.ms_pynative else ' (the compile)'}", flush=True)
    tokens = batch * frames * h * w // 4
    step = {name: statistics.median(m) for name, m in medians.items()}
    step_cpu = {name: statistics.median(m) for name, m in cpu.items()}

    def ratios(num: dict, den: dict, a: str, b: str) -> str:
        per_round = [x / y for x, y in zip(num[a], den[b])]
        return f"**{statistics.median(per_round):.2f}x** ({', '.join(f'{x:.2f}' for x in per_round)})"
    lines = ["| side | framework | step (ms, wall) | step (ms, CPU) | tokens/s (wall) | ratio, wall (rounds) | "
             "ratio, CPU (rounds) |", "|---|---|---|---|---|---|---|"]
    row = "| {} | {} | {:.1f} | {:.1f} | {:.0f} | {} | {} |"
    lines.append(row.format("diffusers WanTransformer3DModel + torch.optim.AdamW",
                            f"torch {torch.__version__}, diffusers {diffusers.__version__}", step["diffusers"],
                            step_cpu["diffusers"], tokens / step["diffusers"] * 1e3, "", ""))
    lines.append(row.format("mmrun WanTransformer3DModel + TrainStep/AdamW", f"torch {torch.__version__}",
                            step["mmrun"], step_cpu["mmrun"], tokens / step["mmrun"] * 1e3,
                            "diffusers / mmrun " + ratios(medians, medians, "diffusers", "mmrun"),
                            ratios(cpu, cpu, "diffusers", "mmrun")))
    if ms is not None:
        mode = "PyNative" if args.ms_pynative else "mindspore.jit"
        lines.append(row.format(f"mmrun on MindSpore ({mode}, its own process, after the rounds)",
                                f"mindspore {ms['version']}", step["mindspore"], step_cpu["mindspore"],
                                tokens / step["mindspore"] * 1e3,
                                "mindspore / mmrun-PyTorch " + ratios(medians, medians, "mindspore", "mmrun"),
                                ratios(cpu, cpu, "mindspore", "mmrun")))
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs ({args.threads or 'default'} thread(s) per side), "
               f"{args.device}; load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
               f"{time.strftime('%Y-%m-%d %H:%M')}" + (f"; peak {peak}" if peak else ""))
    table = "\n".join(lines) + "\n\n" + machine
    print(table)
    if args.markdown:
        from mmrun.common.atomic_write import atomic_write

        atomic_write(args.markdown, table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
