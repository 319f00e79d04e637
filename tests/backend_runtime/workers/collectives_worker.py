"""A training-script stand-in: run it alone or under a 2-process launcher; it writes
<out-dir>/rank<k>.json with what the backend reported and what each collective returned.

Under msrun the scheduler process also runs this file; it must stop inside init_distributed()
and never reach the body, so exactly one JSON file per worker rank proves it.
"""
import argparse
import json
import os
import random
import sys

import numpy as np

from mmrun import backend

parser = argparse.ArgumentParser()
# Megatron-style scripts declare these themselves: the backend must read --ai-framework without eating it.
parser.add_argument("--ai-framework", default=None)
parser.add_argument("--distributed-backend", default=None)
parser.add_argument("--out-dir", required=True)
args = parser.parse_args()

info = backend.init_distributed(args.distributed_backend)
dist = backend.distributed

if backend.framework() == "pytorch":
    import torch

    def tensor(values):
        return torch.tensor(values, dtype=torch.float32)

    def framework_randn(n):
        return torch.randn(n).tolist()

else:
    import mindspore

    def tensor(values):
        return mindspore.Tensor(np.array(values, dtype=np.float32))

    def framework_randn(n):
        return mindspore.ops.randn(n).asnumpy().tolist()


def values(t):
    return np.asarray(t.tolist() if hasattr(t, "tolist") else t).tolist()


rank = dist.get_rank()
mine = tensor([rank + 1.0, 10.0 * (rank + 1)])
summed = dist.all_reduce(mine, op="sum")
mean = dist.all_reduce(mine, op="mean")
from_last = dist.broadcast(tensor([100.0 + rank]), src=dist.get_world_size() - 1)
dist.barrier()
gathered = dist.all_gather_object({"rank": rank, "tag": f"r{rank}", "pid_is_int": isinstance(os.getpid(), int)})

backend.seeding.seed_everything(1234)
seeded = {"python": random.random(), "numpy": np.random.rand(2).tolist(), "framework": framework_randn(3)}

result = {
    "info": info.__dict__,
    "script_saw_ai_framework": args.ai_framework,
    "input_after": values(mine),
    "sum": values(summed),
    "mean": values(mean),
    "broadcast_from_last": values(from_last),
    "gathered": gathered,
    "seeded": seeded,
}
os.makedirs(args.out_dir, exist_ok=True)
with open(os.path.join(args.out_dir, f"rank{rank}.json"), "w") as handle:
    json.dump(result, handle)
print(f"rank {rank}: wrote result", file=sys.stderr)
dist.barrier()
dist.destroy_distributed()
