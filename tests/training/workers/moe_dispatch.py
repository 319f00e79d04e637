"""Expert parallelism's dispatch on 2 ranks with UNEVEN token counts (5 and 9: the padding of
models/qwen3_vl/moe.py dispatch_allgather), against every expert in one module on the same rank.

Every rank builds the same seeded SparseMoeBlock (4 experts, top 2) twice: `whole` holds every expert, `split` its
EP rank's 2 (keep_local) and dispatches over the world (EP=2). Rank r's loss is sum(block(x_r) * t_r) plus 0.1 x the
load-balancing loss of its router logits (transformers' aux loss, per rank as per micro-batch). Written to
<out>/rank<r>.json: the largest differences of the output (split vs whole on x_r), of the router's gradient (rank
r's loss only: the router runs on its own tokens) and of the local experts' gradients (the dispatch's backward sums
both ranks' losses: whole's gradient of L_0 + L_1, this rank's experts)."""
import json
import sys

import numpy as np

from mmrun import backend

backend.init_distributed()
from mmrun.backend import autograd, tensors  # noqa: E402
from mmrun.models.qwen3_vl.configuration import MoeConfig, TextConfig  # noqa: E402
from mmrun.models.qwen3_vl.moe import SparseMoeBlock, load_balancing_loss  # noqa: E402

out_dir = sys.argv[sys.argv.index("--out-dir") + 1]
dist = backend.distributed
rank = dist.get_rank()
text = TextConfig(hidden_size=32, moe=MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16))
rng = np.random.default_rng(0)
state = {name: rng.normal(0, 0.3, tuple(p.shape)).astype(np.float32)
         for name, p in SparseMoeBlock(text).named_parameters()}
xs = [rng.normal(size=(1, n, 32)).astype(np.float32) for n in (5, 9)]
ts = [rng.normal(size=(1, n, 32)).astype(np.float32) for n in (5, 9)]


def build(split: bool) -> SparseMoeBlock:
    block = SparseMoeBlock(text)
    block.load_state_dict(tensors.state_dict_from_numpy(state))
    if split:
        block.experts.keep_local(2, rank)
        block.group = dist.subgroup([[0, 1]])
    return block


def grads(block, which):
    named = list(block.named_parameters())

    def loss():
        total = None
        for i in which:
            logits = []
            out = tensors.cast(block(tensors.from_numpy(xs[i]), logits) * tensors.from_numpy(ts[i]), "float32").sum()
            out = out + 0.1 * load_balancing_loss(logits, text.moe)
            total = out if total is None else total + out
        return total

    _, found = autograd.value_and_grad(loss, [p for _, p in named])()
    return {name: tensors.to_numpy(g) for (name, _), g in zip(named, found)}


whole, split = build(False), build(True)
logits_ours, logits_theirs = [], []
ours = tensors.to_numpy(split(tensors.from_numpy(xs[rank]), logits_ours))
theirs = tensors.to_numpy(whole(tensors.from_numpy(xs[rank]), logits_theirs))
aux = [float(tensors.to_numpy(load_balancing_loss(found, text.moe))) for found in (logits_ours, logits_theirs)]
split_grads = grads(split, [rank])
router = grads(whole, [rank])["gate.weight"]
every = grads(whole, [0, 1])
local = slice(2 * rank, 2 * rank + 2)
result = {
    "tokens": int(xs[rank].shape[1]),
    "output": float(np.abs(ours - theirs).max()),
    "aux_loss": aux,
    "router_grad": float(np.abs(split_grads["gate.weight"] - router).max()),
    "expert_grads": max(float(np.abs(split_grads[f"experts.{n}"] - every[f"experts.{n}"][local]).max())
                        for n in ("gate_up_proj", "down_proj")),
    "expert_grad_size": float(np.abs(split_grads["experts.down_proj"]).max()),
}
with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump(result, f)
