#!/usr/bin/env python3
"""Plot the training loss of the same seeded run under PyTorch and MindSpore (docs/loss_curve.png).

Reads Megatron-format training logs (`iteration N/M | ... | lm loss: X |` lines; use --log-interval 1)
or mmrun --metrics-file JSON lines, one per framework, and draws the loss curves over each other and,
below, their per-iteration absolute difference.

    python scripts/plot_loss_curves.py --log pytorch=out/pt.log --log mindspore=out/ms.log \\
        --output docs/loss_curve.png
    # or let it train both first (20 iterations on the demo corpus, through mmrun):
    python scripts/plot_loss_curves.py --run --output docs/loss_curve.png

exit status: 0 done, 1 a training run failed, 2 usage error (bad --log, no losses in a log).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mmrun.training.training_log import parse_log

ROOT = Path(__file__).resolve().parents[1]
RUN_ARGS = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--max-position-embeddings", "32", "--micro-batch-size", "4", "--global-batch-size", "8",
            "--lr", "2e-3", "--min-lr", "1e-5", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2",
            "--train-iters", "20", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "1234",
            "--split", "949,50,1", "--log-interval", "1", "--eval-interval", "10", "--eval-iters", "1"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def read_losses(path: Path) -> dict[int, float]:
    """iteration -> lm loss from a Megatron log or a --metrics-file."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".jsonl":
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
        return {r["iteration"]: r["lm_loss"] for r in records if r.get("kind") == "train"}
    return dict(parse_log(text)["train"])


def train_both(workdir: Path) -> dict[str, Path]:
    """Tokenize the demo corpus and run the 20-iteration job on each framework; returns the logs."""
    corpus = ROOT / "data" / "corpus"
    mmrun = [sys.executable, "-m", "mmrun.launchers.cli"]
    prefix = workdir / "demo"
    files = ["--vocab-file", str(corpus / "gpt2-vocab.json"), "--merge-file", str(corpus / "gpt2-merges.txt")]
    subprocess.run([*mmrun, "preprocess-data", "--input", str(corpus / "demo_corpus.jsonl"), "--output-prefix",
                    str(prefix), "--tokenizer-type", "GPT2BPETokenizer", *files, "--append-eod"], check=True)
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    logs = {}
    for framework in ("pytorch", "mindspore"):
        log = workdir / f"{framework}.log"
        print(f"training on {framework} -> {log}", flush=True)
        with open(log, "w", encoding="utf-8") as out:
            proc = subprocess.run([*mmrun, "--ai-framework", framework, "--nproc-per-node", "1", "--master-port", "0",
                                   str(ROOT / "models" / "pretrain_gpt.py"), *RUN_ARGS,
                                   "--data-path", f"{prefix}_text_document", *files],
                                  stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir)
        if proc.returncode != 0:
            raise RuntimeError(f"the {framework} run failed with exit code {proc.returncode}; see {log}")
        logs[framework] = log
    return logs


def plot(curves: dict[str, dict[int, float]], output: Path, title: str) -> float:
    """Draw the curves and their difference; returns the largest per-iteration difference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    (name_a, a), (name_b, b) = curves.items()
    common = sorted(set(a) & set(b))
    diffs = [abs(a[i] - b[i]) for i in common]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]})
    top.plot(sorted(a), [a[i] for i in sorted(a)], "o-", label=name_a, linewidth=2, markersize=4)
    top.plot(sorted(b), [b[i] for i in sorted(b)], "x--", label=name_b, linewidth=1.5, markersize=6)
    top.set_ylabel("lm loss")
    top.set_title(title)
    top.legend()
    top.grid(alpha=0.3)
    bottom.semilogy(common, [max(d, 1e-9) for d in diffs], "s-", color="tab:red", markersize=3)
    bottom.axhline(1e-4, color="gray", linestyle=":", label="1e-4 (the parity bound)")
    bottom.set_xlabel("iteration")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_ylabel(f"|{name_a} - {name_b}|")
    bottom.legend(loc="upper left")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    return max(diffs) if diffs else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = _Parser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log", action="append", default=[], metavar="NAME=PATH",
                   help="a framework's training log or metrics file (give two)")
    p.add_argument("--run", action="store_true", help="train both frameworks first (about a minute on CPU)")
    p.add_argument("--output", "-o", default=str(ROOT / "docs" / "loss_curve.png"), help="PNG to write")
    p.add_argument("--title", default="Tiny GPT, demo corpus, seed 1234: PyTorch vs MindSpore")
    args = p.parse_args(argv)
    if args.run == bool(args.log):
        p.error("give either --run or two --log NAME=PATH. Received: "
                + ("both" if args.run else "neither"))
    if args.run:
        workdir = Path(tempfile.mkdtemp(prefix="mmrun_curves_"))
        try:
            logs = train_both(workdir)
        except RuntimeError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    else:
        if len(args.log) != 2 or any("=" not in item for item in args.log):
            p.error(f"--log takes NAME=PATH, exactly twice. Received: {args.log}")
        logs = {name: Path(path) for name, path in (item.split("=", 1) for item in args.log)}
    curves = {}
    for name, path in logs.items():
        if not path.is_file():
            p.error(f"--log {name}={path}: no such file")
        curves[name] = read_losses(path)
        if not curves[name]:
            p.error(f"--log {name}={path}: no 'iteration ... | lm loss: ...' lines found (log with --log-interval 1)")
    worst = plot(curves, Path(args.output), args.title)
    print(f"wrote {args.output}: {len(next(iter(curves.values())))} iterations, largest |difference| {worst:.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
