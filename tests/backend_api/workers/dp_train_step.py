"""Worker for test_data_parallel.py: 3 TrainStep calls on this rank's share of a global batch of 4.

Writes <out-dir>/rank<r>.json with the losses, grad norms and final parameters (as lists). Every
rank starts from the same numpy-drawn weights, so ranks must end identical, and equal to one process
that sees the whole global batch.
"""
import argparse
import json
from pathlib import Path

import numpy as np

from mmrun import backend

parser = argparse.ArgumentParser()
parser.add_argument("--out-dir", required=True)
parser.add_argument("--jit", choices=["on", "off"], default="off")
parser.add_argument("--micro-batches", type=int, default=1, help="this rank's share split into this many")
parser.add_argument("--bucket-elements", type=int, default=None, help="MindSpore: gradient bucket size")
args, _ = parser.parse_known_args()  # mmrun passes --ai-framework on to the script too

info = backend.init_distributed()  # under msrun, the scheduler process stops here
from mmrun.backend import optim, tensors, train_step  # noqa: E402
from mmrun.models.gpt import GPT, GPTConfig, gpt_loss  # noqa: E402

model = GPT(GPTConfig(num_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=64, max_position_embeddings=16,
                      seq_length=16, hidden_dropout=0.0, attention_dropout=0.0))
rng = np.random.default_rng(0)
model.load_state_dict(tensors.state_dict_from_numpy(
    {k: (0.02 * rng.standard_normal(v.shape)).astype(np.float32)
     for k, v in tensors.state_dict_to_numpy(model.state_dict()).items()}))
optimizer = optim.AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1, no_decay=optim.megatron_no_decay)
extra = {"jit": args.jit == "on"} if backend.framework() == "mindspore" else {}
step = train_step.TrainStep(model, optimizer, loss_fn=gpt_loss, clip_grad=0.02, **extra)
if args.bucket_elements:  # several flat buckets, hence several collectives, in the compiled update
    step._buckets = train_step._bucket_ranges([int(np.prod(p.shape)) for p in optimizer.params], args.bucket_elements)

data = np.random.default_rng(1)
share = 4 // info.world_size
rows = slice(info.rank * share, (info.rank + 1) * share)
losses, norms = [], []
for _ in range(3):
    tokens, labels = data.integers(0, 64, (4, 16)), data.integers(0, 64, (4, 16))
    per = share // args.micro_batches
    result = step([(tensors.from_numpy(tokens[rows][i:i + per]), tensors.from_numpy(labels[rows][i:i + per]),
                    tensors.from_numpy(np.ones((per, 16), np.float32))) for i in range(0, share, per)])
    losses.append(result.loss)
    norms.append(result.grad_norm)
out = {"world_size": info.world_size, "buckets": len(getattr(step, "_buckets", ())), "losses": losses, "grad_norms": norms,
       "params": {k: v.tolist() for k, v in tensors.state_dict_to_numpy(model.state_dict()).items()}}
Path(args.out_dir).mkdir(parents=True, exist_ok=True)
(Path(args.out_dir) / f"rank{info.rank}.json").write_text(json.dumps(out))
backend.distributed.destroy_distributed()
