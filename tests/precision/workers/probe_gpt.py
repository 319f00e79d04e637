"""One train step of a tiny GPT from one checkpoint (numpy weights, the same on both frameworks), probed.

    python probe_gpt.py FRAMEWORK OUT_DIR [--task statistics|tensor] [--perturb PARAM] [--scale-grad MODULE]
                        [--inf-grad MODULE --at STEP] [--steps N] [--anomaly off|log|stop]

--perturb adds 1e-2 x N(0, 1) noise to one parameter (a "checkpoint with one layer's weight perturbed");
--scale-grad and --inf-grad are test-only hooks, registered here (never in mmrun), that scale by 1.5 or
replace with Inf the gradients MODULE passes back to its inputs. Prints one JSON line per step.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("framework")
p.add_argument("out")
p.add_argument("--task", default="statistics")
p.add_argument("--perturb")
p.add_argument("--scale-grad")
p.add_argument("--inf-grad")
p.add_argument("--at", type=int, default=1)
p.add_argument("--steps", type=int, default=1)
p.add_argument("--anomaly", default="off")
p.add_argument("--dump-step", type=int, action="append")
args = p.parse_args()

from mmrun import backend  # noqa: E402

backend.select(args.framework)
from mmrun.backend import optim, tensors, train_step  # noqa: E402
from mmrun.models.gpt import GPT, GPTConfig, gpt_loss  # noqa: E402
from mmrun.precision.anomaly import SpikeRule  # noqa: E402
from mmrun.precision.dump_config import DumpConfig  # noqa: E402
from mmrun.precision.training_probe import AnomalyStop, TrainingProbe  # noqa: E402

backend.seeding.seed_everything(1234)
config = GPTConfig(num_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=128, max_position_embeddings=16,
                   seq_length=16, hidden_dropout=0.0, attention_dropout=0.0)
model = GPT(config)
rng = np.random.default_rng(0)
tokens = rng.integers(0, 128, size=(2, 17))  # drawn first: a perturbed run trains on the same batch
weights = {name: (0.02 * rng.standard_normal(value.shape)).astype(np.float32) if not name.endswith("weight") or
           ".ln_" in name or name.startswith("ln_") else (0.02 * rng.standard_normal(value.shape)).astype(np.float32)
           for name, value in tensors.state_dict_to_numpy(model.state_dict()).items()}
for name in weights:
    if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
        weights[name] = np.ones_like(weights[name])
if args.perturb:
    weights[args.perturb] = weights[args.perturb] + 1e-2 * rng.standard_normal(weights[args.perturb].shape).astype(np.float32)
model.load_state_dict(tensors.state_dict_from_numpy(weights))

calls = {"n": 0}


def hook_on(name: str, change):
    module = dict(model.named_modules() if args.framework == "pytorch" else model.cells_and_names())[name]

    def hook(_module, grad_input, grad_output):
        calls["n"] += 1
        return tuple(None if g is None else change(g) for g in grad_input)
    if args.framework == "pytorch":
        module.register_full_backward_hook(hook)
    else:
        module.register_backward_hook(hook)


if args.scale_grad:
    hook_on(args.scale_grad, lambda g: g * 1.5)
if args.inf_grad:
    hook_on(args.inf_grad, lambda g: g * float("inf") if calls["n"] == args.at else g)

opt = optim.AdamW(model.named_parameters(), lr=1e-3, weight_decay=0.0, no_decay=optim.megatron_no_decay)
step = train_step.TrainStep(model, opt, loss_fn=gpt_loss, clip_grad=1.0, jit=False)
dump = DumpConfig(task=args.task, dump_path=args.out, steps=tuple(args.dump_step or ()))
probe = TrainingProbe(args.framework, 0, model, print, dump, args.anomaly, SpikeRule())
batch = (tensors.from_numpy(tokens[:, :-1]), tensors.from_numpy(tokens[:, 1:]),
         tensors.from_numpy(np.ones((2, 16), np.float32)))
try:
    for it in range(1, args.steps + 1):
        probe.before_step(it)
        out = step([batch])
        probe.after_step(it, out.loss, out.grad_norm)
        print(json.dumps({"iteration": it, "loss": out.loss, "grad_norm": out.grad_norm}), flush=True)
except AnomalyStop as err:
    print(f"error: {err}", flush=True)
    raise SystemExit(1)
