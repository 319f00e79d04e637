"""Train a tiny GPT 2 steps with and without activation recomputation on one framework; print JSON lines.

    python recompute_run.py FRAMEWORK [--jit on|off]

Each line: {"plan": name, "recomputed": [...], "losses": [...], "grad_norms": [...], "params": sha of the final
weights' bytes, "max_param_diff": largest |difference| from the run without recomputation}.
"""
from __future__ import annotations

import argparse
import json
import sys
from types import SimpleNamespace

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("framework")
parser.add_argument("--jit", choices=("on", "off"), default="off")
parser.add_argument("--dropout", type=float, default=0.0)
parser.add_argument("--plans", default="none,full-uniform-1,full-block-1,selective")
args = parser.parse_args()

from mmrun import backend  # noqa: E402

backend.select(args.framework, source="recompute_run.py")
from mmrun.backend import optim, seeding, tensors, train_step  # noqa: E402
from mmrun.models import recompute  # noqa: E402
from mmrun.models.gpt import GPT, GPTConfig  # noqa: E402

PLANS = {
    "none": None,
    "full-uniform-1": SimpleNamespace(recompute_granularity="full", recompute_method="uniform", recompute_num_layers="1"),
    "full-block-1": SimpleNamespace(recompute_granularity="full", recompute_method="block", recompute_num_layers="1"),
    "selective": SimpleNamespace(recompute_granularity=None, recompute_activations=True),
}
rng = np.random.default_rng(0)
tokens = rng.integers(0, 64, size=(2, 17)).astype(np.int64)
batch = (tensors.from_numpy(tokens[:, :-1]), tensors.from_numpy(tokens[:, 1:]), tensors.from_numpy(np.ones((2, 16), np.float32)))


def gpt_loss(model, tokens, labels, mask):
    return model(tokens, labels=labels, loss_mask=mask)


reference = None
for name in args.plans.split(","):
    flags = PLANS[name]
    seeding.seed_everything(1234)
    config = GPTConfig(num_layers=3, hidden_size=32, num_attention_heads=4, vocab_size=64, max_position_embeddings=16,
                       seq_length=16, hidden_dropout=args.dropout, attention_dropout=args.dropout, dropout_impl="hash")
    model = GPT(config)
    model.train()  # a MindSpore Cell starts in eval mode (no dropout)
    said = recompute.apply(model, recompute.plans(flags)) if flags is not None else []
    opt = optim.AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.0, no_decay=optim.megatron_no_decay)
    step = train_step.TrainStep(model, opt, loss_fn=gpt_loss, clip_grad=1.0, jit=args.jit == "on")
    losses, norms = [], []
    calls = [0] * config.num_layers  # MLP forwards per layer: a recomputed layer runs its MLP twice (PyTorch)
    if args.framework == "pytorch":
        for i, block in enumerate(model.h):
            block.mlp.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    for _ in range(2):
        out = step([batch])
        losses.append(out.loss)
        norms.append(out.grad_norm)
    params = {n: tensors.to_numpy(p).astype(np.float64) for n, p in model.named_parameters()}
    if reference is None:
        reference = params
    diff = max(float(np.abs(params[n] - reference[n]).max()) for n in params)
    print(json.dumps({"plan": name, "recomputed": said, "losses": losses, "grad_norms": norms,
                      "max_param_diff": diff, "mlp_calls": calls}), flush=True)
sys.exit(0)
