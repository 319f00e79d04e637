"""What both sides of the parity runs share, framework-free: the model sizes, the initial weights, the
micro-batches and the optimizer settings, all from numpy seeds, and the result files."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from mmrun.models.mcore_layout import GPTLayout

SIZES = dict(num_layers=4, hidden_size=32, num_attention_heads=4, ffn_hidden_size=128, vocab_size=64,
             max_position_embeddings=16)
SEQ, MICRO_BATCH = 16, 2
OPTIMIZER = dict(lr=2e-3, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8, clip_grad=1.0)
WEIGHTS_SEED, DATA_SEED, INIT_STD = 1234, 99, 0.02


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--untie", action="store_true", help="untie the embeddings and the output layer")
    parser.add_argument("--dropout", type=float, default=0.0, help="hidden and attention dropout (MindSpore only)")
    parser.add_argument("--jit", choices=["on", "off"], default="off")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--ai-framework", help="appended by mmrun; the framework is the backend's choice")
    return parser.parse_args()


def layout(untie: bool = False) -> GPTLayout:
    return GPTLayout(**SIZES, untie_embeddings_and_output_weights=untie)


def full_weights(untie: bool = False) -> dict[str, np.ndarray]:
    return layout(untie).init_full(WEIGHTS_SEED, INIT_STD)


def micro_batches(iteration: int, count: int, dp_rank: int, dp_size: int) -> list[tuple[np.ndarray, ...]]:
    """(tokens, position_ids, labels, loss_mask) of each micro-batch this data-parallel rank trains on."""
    rng = np.random.default_rng([DATA_SEED, iteration])
    batches = []
    for _ in range(count * dp_size):
        tokens = rng.integers(0, SIZES["vocab_size"], (MICRO_BATCH, SEQ + 1))
        mask = (rng.random((MICRO_BATCH, SEQ)) > 0.15).astype(np.float32)
        positions = np.broadcast_to(np.arange(SEQ), (MICRO_BATCH, SEQ)).copy()
        batches.append((tokens[:, :-1].copy(), positions, tokens[:, 1:].copy(), mask))
    return batches[dp_rank::dp_size]


def write_result(out_dir: Path, rank: int, result: dict, grads: dict[str, np.ndarray]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    np.savez(out_dir / f"grads_rank{rank}.npz", **grads)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
