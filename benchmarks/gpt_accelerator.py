#!/usr/bin/env python3
"""GPT training speed on one accelerator: mmrun's real entry against plain torch and megatron-core, one run.

Every row is measured in this one invocation on the same device (a benchmark, not a test):

  mmrun         models/pretrain_gpt.py started through `mmrun --ai-framework pytorch` (torchrun) on
                --mock-data: the data path, the callbacks, ForwardPlan and the portable TrainStep; step
                times from its --metrics-file, peak device memory from its summary record
  mmrun-hash    the same with --dropout-impl hash (the cross-framework masks; one Triton kernel on CUDA)
  plain-torch   the same GPT written as a user would: nn.Linear/LayerNorm/Embedding, F.scaled_dot_product_attention,
                torch.optim.AdamW (fused on CUDA, as torch picks nothing faster by default), autocast for bf16
  plain-torch-compile  the same model through torch.compile (default mode; its compile time is in the warm-up
                steps, not in the timed ones); CUDA by default, --impls plain-torch-compile asks for it elsewhere
  megatron-core GPTModel with the local layer spec (no Transformer Engine) and torch.optim.AdamW, where installed

GPU size: GPT-2 small (12 layers, hidden 768, 12 heads, seq 1024, micro-batch 8, vocab 50304), fp32 and bf16,
dropout 0.1. On CPU a smaller GPT (see SIZES) so that the whole run takes a few minutes. MFU is achieved
FLOP/s (6 x params x tokens + 12 x layers x hidden x seq^2 x batch per step) over the peak this device
reaches on a large matmul in the same dtype, measured here (no vendor number is assumed).

    python benchmarks/gpt_accelerator.py                         # device detected: cuda, else cpu
    python benchmarks/gpt_accelerator.py --precisions fp32 --iters 10 --markdown out.md
    OUT=/tmp/out python benchmarks/gpt_accelerator.py            # results.json and results.md under $OUT
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mmrun.common.atomic_write import atomic_write

ROOT = Path(__file__).resolve().parents[1]
ENTRY = ROOT / "models" / "pretrain_gpt.py"
SIZES = {  # layers, hidden, heads, seq, micro batch, vocab
    "cuda": dict(layers=12, hidden=768, heads=12, seq=1024, batch=8, vocab=50304),
    "cpu": dict(layers=2, hidden=256, heads=4, seq=256, batch=4, vocab=8192),
}
DROPOUT = 0.1
IMPLS = ("mmrun", "mmrun-hash", "plain-torch", "plain-torch-compile", "megatron-core")
CUDA_ONLY = ("mmrun-hash", "plain-torch-compile")  # left out by default elsewhere (no Triton kernel; slow compile)


def _device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _env(device: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "PET_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MMRUN_AI_FRAMEWORK")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if device == "cpu":
        # One intra-op thread for every row: a shared 2-core machine otherwise swings many-fold between rows.
        env["OMP_NUM_THREADS"] = "1"
    return env


def _flops_per_step(n_params: int, s: dict) -> float:
    return 6.0 * n_params * s["batch"] * s["seq"] + 12.0 * s["layers"] * s["hidden"] * s["seq"] ** 2 * s["batch"]


def _gpt_params(s: dict) -> int:
    """Parameters of the GPT all rows train (tied output layer): embeddings, 12 H^2 + 13 H per layer, final LN."""
    h = s["hidden"]
    return s["vocab"] * h + s["seq"] * h + s["layers"] * (12 * h * h + 13 * h) + 2 * h


# ---------------------------------------------------------------------------------------- workers

def _timed_steps(step, iters: int, warmup: int, sync) -> list[float]:
    times = []
    for _ in range(warmup + iters):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return times[warmup:]


def worker_plain(s: dict, precision: str, iters: int, warmup: int, compiled: bool = False) -> dict:
    """The GPT a user writes in plain torch (nanoGPT-shaped), trained with torch's own tools (and torch.compile)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    dev = _device()
    H, nh = s["hidden"], s["heads"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
            self.qkv, self.proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
            self.fc, self.out = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)
            self.drop = nn.Dropout(DROPOUT)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = (t.view(B, T, nh, C // nh).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(C, 2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=DROPOUT if self.training else 0.0)
            x = x + self.drop(self.proj(y.transpose(1, 2).reshape(B, T, C)))
            return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(s["vocab"], H), nn.Embedding(s["seq"], H)
            self.blocks = nn.ModuleList(Block() for _ in range(s["layers"]))
            self.lnf, self.drop = nn.LayerNorm(H), nn.Dropout(DROPOUT)

        def forward(self, idx, tgt):
            x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)))
            for block in self.blocks:
                x = block(x)
            logits = self.lnf(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.float().view(-1, s["vocab"]), tgt.view(-1))

    torch.manual_seed(0)
    model = GPT()
    for name, param in model.named_parameters():  # GPT-2's init, as nanoGPT (and Megatron) do
        if param.dim() > 1:
            torch.nn.init.normal_(param, 0.0, 0.02)
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=dev == "cuda")
    forward = torch.compile(model) if compiled else model
    ctx = (torch.autocast(dev, dtype=torch.bfloat16) if precision == "bf16"
           else torch.autocast(dev, enabled=False))
    idx = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), device=dev)
    tgt = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), device=dev)
    last = {}

    def step():
        with ctx:
            loss = forward(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        last["loss"] = loss

    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    times = _timed_steps(step, iters, warmup, sync)
    return {"step_times": times, "loss": float(last["loss"]), "params": sum(p.numel() for p in model.parameters()),
            "peak_device_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if dev == "cuda" else None}


def worker_mcore(s: dict, precision: str, iters: int, warmup: int) -> dict:
    """megatron-core's GPTModel (local spec, no Transformer Engine) with torch.optim.AdamW."""
    import torch
    import torch.distributed as dist

    dev = _device()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("nccl" if dev == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(1, 1)
    if dev == "cuda":
        tensor_parallel.model_parallel_cuda_manual_seed(0)
    else:
        # megatron-core assumes CUDA; on CPU the row runs with the same shims mmrun's megatron-core engine uses
        from mmrun.backend.torch.megatron_core import cpu_shims

        cpu_shims.install()
        torch.manual_seed(0)
        tensor_parallel.model_parallel_cuda_manual_seed(0)
    bf16 = precision == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    cfg = TransformerConfig(num_layers=s["layers"], hidden_size=s["hidden"], num_attention_heads=s["heads"],
                            use_cpu_initialization=dev == "cpu", pipeline_dtype=dtype, bf16=bf16, params_dtype=dtype,
                            hidden_dropout=DROPOUT, attention_dropout=DROPOUT)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=s["vocab"],
                     max_sequence_length=s["seq"], position_embedding_type="learned_absolute",
                     share_embeddings_and_output_weights=True).to(dev)  # tied, as the other rows
    if bf16:  # Megatron's own bf16 wrapper: casts the embedding output to bf16 and the loss back to fp32
        from megatron.core.transformer.module import Float16Module
        model = Float16Module(cfg, model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=dev == "cuda")
    B, T = s["batch"], s["seq"]
    idx = torch.randint(0, s["vocab"], (B, T), device=dev)
    tgt = torch.randint(0, s["vocab"], (B, T), device=dev)
    pos = torch.arange(T, device=dev).unsqueeze(0).expand(B, -1)
    mask = torch.ones(B, 1, T, T, dtype=torch.bool, device=dev).triu(1)
    last = {}

    def step():
        loss = model(idx, pos, mask, labels=tgt).float().mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        last["loss"] = loss

    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    times = _timed_steps(step, iters, warmup, sync)
    result = {"step_times": times, "loss": float(last["loss"]), "params": sum(p.numel() for p in model.parameters()),
              "peak_device_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if dev == "cuda" else None}
    dist.destroy_process_group()
    return result


def worker_peak(s: dict, precision: str, iters: int, warmup: int) -> dict:
    """This device's matmul FLOP/s in the precision: the MFU denominator."""
    import torch

    dev = _device()
    n = 8192 if dev == "cuda" else 2048
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = (torch.randn(n, n, device=dev, dtype=dtype) for _ in range(2))
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    times = _timed_steps(lambda: a @ b, 5, 2, sync)
    return {"flops_per_s": 2.0 * n ** 3 / min(times)}


WORKERS = {"plain-torch": worker_plain, "plain-torch-compile": functools.partial(worker_plain, compiled=True),
           "megatron-core": worker_mcore, "peak": worker_peak}


# ------------------------------------------------------------------------------------ the driver

def _run_worker(name: str, s: dict, precision: str, iters: int, warmup: int, device: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", name, "--precision", precision, "--size", json.dumps(s),
           "--iters", str(iters), "--warmup", str(warmup)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(device), timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {proc.returncode}: {tail[0][:300]}"}
    return json.loads(lines[-1])


def _run_mmrun(s: dict, precision: str, iters: int, warmup: int, device: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="mmrun_bench_") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        args = ["--num-layers", s["layers"], "--hidden-size", s["hidden"], "--num-attention-heads", s["heads"],
                "--seq-length", s["seq"], "--max-position-embeddings", s["seq"], "--micro-batch-size", s["batch"],
                "--global-batch-size", s["batch"], "--make-vocab-size-divisible-by", 128,
                # NullTokenizer adds the end-of-document token: vocab - 1 pads to exactly vocab (50304, 8192)
                "--vocab-size", s["vocab"] - 1,
                "--lr", "1e-4", "--train-iters", warmup + iters, "--hidden-dropout", DROPOUT,
                "--attention-dropout", DROPOUT, "--weight-decay", "0.01", "--clip-grad", "1.0", "--mock-data",
                "--eval-iters", "0", "--log-interval", warmup + iters, "--metrics-file", metrics, *extra]
        if precision == "bf16":
            args.append("--bf16")
        cmd = [sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", "pytorch", "--nproc-per-node", "1",
               "--master-port", "0", str(ENTRY), *map(str, args)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(device), cwd=tmp, timeout=3600)
        records = [json.loads(ln) for ln in metrics.read_text().splitlines()] if metrics.exists() else []
    train = [r for r in records if r["kind"] == "train"]
    summary = next((r for r in records if r["kind"] == "summary"), {})
    if proc.returncode != 0 or len(train) < warmup + iters:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {proc.returncode}: {tail[0][:300]}"}
    return {"step_times": [r["elapsed_ms"] / 1000.0 for r in train[warmup:]], "loss": train[-1]["lm_loss"],
            "params": _gpt_params(s), "peak_device_memory_mb": summary.get("peak_device_memory_mb"),
            "where": summary.get("device")}


def _row(impl: str, precision: str, raw: dict, s: dict, peak: float | None) -> dict:
    row = {"impl": impl, "precision": precision}
    if "error" in raw:
        return {**row, "error": raw["error"]}
    step = statistics.median(raw["step_times"])
    tokens = s["batch"] * s["seq"]
    achieved = _flops_per_step(raw["params"], s) / step
    return {**row, "step_ms": round(step * 1000.0, 2), "tokens_per_s": round(tokens / step),
            "peak_device_memory_mb": None if raw["peak_device_memory_mb"] is None else round(raw["peak_device_memory_mb"]),
            "mfu": None if not peak else round(achieved / peak, 4), "tflops": round(achieved / 1e12, 2),
            "loss": round(raw["loss"], 4), "where": raw.get("where")}


def _markdown(device_name: str, s: dict, rows: list[dict]) -> str:
    lines = [f"GPT {s['layers']} layers, hidden {s['hidden']}, {s['heads']} heads, seq {s['seq']}, micro-batch "
             f"{s['batch']}, vocab {s['vocab']}, dropout {DROPOUT}; device: {device_name}", "",
             "| impl | precision | step ms | tokens/s | TFLOP/s | MFU | peak device MB | mmrun / this (tokens/s) |",
             "|---|---|---|---|---|---|---|---|"]
    mmrun = {r["precision"]: r for r in rows if r["impl"] == "mmrun" and "error" not in r}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['impl']} | {r['precision']} | failed: {r['error']} | | | | | |")
            continue
        ref = mmrun.get(r["precision"])
        ratio = f"{ref['tokens_per_s'] / r['tokens_per_s']:.2f}" if ref and r["impl"] != "mmrun" else "-"
        mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f} %"
        mem = "-" if r["peak_device_memory_mb"] is None else f"{r['peak_device_memory_mb']}"
        lines.append(f"| {r['impl']} | {r['precision']} | {r['step_ms']} | {r['tokens_per_s']} | {r['tflops']} | "
                     f"{mfu} | {mem} | {ratio} |")
    return "\n".join(lines) + "\n"


def _device_name(device: str) -> str:
    import platform

    import torch
    if device == "cuda":
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, 1 thread per run), torch {torch.__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=None,
                        help="rows to measure (default: all; mmrun-hash and plain-torch-compile only on CUDA)")
    parser.add_argument("--iters", type=int, default=None, help="timed steps per row (GPU 20, CPU 10)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (GPU 10, CPU 3)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="rounds of every row, alternating, the fastest kept (GPU 1, CPU 2)")
    parser.add_argument("--markdown", default=None, help="also write the table to this file")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    parser.add_argument("--size", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = WORKERS[args.worker](json.loads(args.size), args.precision, args.iters, args.warmup)
        print(json.dumps(result))
        return 0

    device = _device()
    s = SIZES[device]
    iters = args.iters or (20 if device == "cuda" else 10)
    warmup = args.warmup or (10 if device == "cuda" else 3)
    repeat = args.repeat or (1 if device == "cuda" else 2)
    impls = args.impls or [i for i in IMPLS if i not in CUDA_ONLY or device == "cuda"]
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        impls = [i for i in impls if i != "megatron-core"]
        print("megatron-core is not installed here: its rows are left out", file=sys.stderr)
    rows = []
    for precision in args.precisions:
        peak = 0.0
        best: dict[str, dict] = {}
        # Rounds alternate the rows, and each row keeps its fastest round: load that comes and goes on a
        # shared machine then hits every row alike instead of whichever ran at the time.
        for round_ in range(repeat):
            # The MFU denominator, measured every round and the best kept, as the rows are.
            peak = max(peak, _run_worker("peak", s, precision, iters, warmup, device).get("flops_per_s", 0.0))
            for impl in impls:
                print(f"[{time.strftime('%H:%M:%S')}] {impl} {precision} (round {round_ + 1}/{repeat}) ...",
                      file=sys.stderr, flush=True)
                if impl.startswith("mmrun"):
                    extra = ["--dropout-impl", "hash"] if impl == "mmrun-hash" else []
                    raw = _run_mmrun(s, precision, iters, warmup, device, extra)
                else:
                    raw = _run_worker(impl, s, precision, iters, warmup, device)
                kept = best.get(impl)
                if kept is None or "error" in kept or ("error" not in raw and statistics.median(raw["step_times"])
                                                        < statistics.median(kept["step_times"])):
                    best[impl] = raw
        for impl in impls:
            rows.append(_row(impl, precision, best[impl], s, peak))
            print(json.dumps(rows[-1]), flush=True)
    table = _markdown(_device_name(device), s, rows)
    print(table)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        atomic_write(Path(out) / "gpt_accelerator.json", json.dumps({"device": _device_name(device), "size": s,
                                                                      "rows": rows}, indent=1) + "\n")
        atomic_write(Path(out) / "gpt_accelerator.md", table)
    if args.markdown:
        atomic_write(args.markdown, table)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
