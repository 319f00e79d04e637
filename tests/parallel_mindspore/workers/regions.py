"""Megatron's regions on 2 ranks under msrun: forward and backward of each, in PyNative and under jit, against
the values numpy computes from both ranks' inputs. Writes <out-dir>/rank<r>.json: region -> largest error."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from mmrun import backend

parser = argparse.ArgumentParser()
parser.add_argument("--out-dir", type=Path, required=True)
args, _ = parser.parse_known_args()  # mmrun passes --ai-framework on to the script
backend.init_distributed()

import mindspore as ms  # noqa: E402
from mindspore import mint, ops  # noqa: E402

from mmrun.backend.mindspore.parallel import mappings  # noqa: E402
from mmrun.backend.mindspore.parallel.groups import initialize_model_parallel  # noqa: E402

state = initialize_model_parallel(2, 1)
group, rank = state.group("tp"), state.tp_rank
x = [np.random.default_rng([1, r]).standard_normal((4, 2, 6)).astype(np.float32) for r in range(2)]
w_full = [np.random.default_rng([2, r]).standard_normal((8, 2, 12)).astype(np.float32) for r in range(2)]


def half(a, dim, r):
    return np.split(a, 2, axis=dim)[r]


# region -> (its cell, this rank's input, upstream gradient shape slice, expected output, expected input grad)
xr = x[rank]
cases = {
    "copy_to_tensor_parallel": (mappings.CopyToTensorParallelRegion(group), xr, lambda w: w[:4, :, :6],
                                xr, lambda ws: ws[0][:4, :, :6] + ws[1][:4, :, :6]),
    "reduce_from_tensor_parallel": (mappings.ReduceFromTensorParallelRegion(group), xr, lambda w: w[:4, :, :6],
                                    x[0] + x[1], lambda ws: ws[rank][:4, :, :6]),
    "scatter_to_tensor_parallel": (mappings.ScatterToTensorParallelRegion(group), x[0], lambda w: w[:4, :, :3],
                                   half(x[0], 2, rank),
                                   lambda ws: np.concatenate([ws[0][:4, :, :3], ws[1][:4, :, :3]], 2)),
    "gather_from_tensor_parallel": (mappings.GatherFromTensorParallelRegion(group), xr, lambda w: w[:4],
                                    np.concatenate(x, 2), lambda ws: half(ws[rank][:4], 2, rank)),
    "scatter_to_sequence_parallel": (mappings.ScatterToSequenceParallelRegion(group), x[0], lambda w: w[:2, :, :6],
                                     half(x[0], 0, rank),
                                     lambda ws: np.concatenate([ws[0][:2, :, :6], ws[1][:2, :, :6]], 0)),
    "gather_from_sequence_parallel": (mappings.GatherFromSequenceParallelRegion(group), xr, lambda w: w[:, :, :6],
                                      np.concatenate(x, 0), lambda ws: half(ws[0][:, :, :6] + ws[1][:, :, :6], 0, rank)),
    "reduce_scatter_to_sequence_parallel": (mappings.ReduceScatterToSequenceParallelRegion(group), xr,
                                            lambda w: w[:2, :, :6], half(x[0] + x[1], 0, rank),
                                            lambda ws: np.concatenate([ws[0][:2, :, :6], ws[1][:2, :, :6]], 0)),
}



class Loss(ms.nn.Cell):
    """sum(region(x) * upstream): its gradient in x is the region's backward applied to `upstream`."""

    def __init__(self, region, upstream):
        super().__init__()
        self.region, self.upstream = region, upstream

    def construct(self, t):
        return mint.sum(self.region(t) * self.upstream)


errors = {}
for name, (cell, inp, upstream, out_expected, grad_expected) in cases.items():
    loss = Loss(cell, ms.Tensor(upstream(w_full[rank])))
    for mode in ("pynative", "jit"):
        forward = ms.jit(cell.construct) if mode == "jit" else cell
        grad = ms.jit(ms.grad(loss)) if mode == "jit" else ms.grad(loss)
        out = forward(ms.Tensor(inp)).asnumpy()
        g = grad(ms.Tensor(inp)).asnumpy()
        errors[f"{name}/{mode}"] = [float(np.abs(out - out_expected).max()),
                                    float(np.abs(g - grad_expected(w_full)).max())]

# The reason for the regions: a raw all-reduce in the forward sums the gradient over ranks again.
raw = ops.AllReduce(ops.ReduceOp.SUM, group.name)
upstream = ms.Tensor(w_full[0][:4, :, :6])  # the same upstream gradient on both ranks
raw_grad = ms.grad(Loss(raw, upstream))(ms.Tensor(xr)).asnumpy()
errors["raw_all_reduce_grad_over_upstream"] = float(np.abs(raw_grad / w_full[0][:4, :, :6]).mean())

args.out_dir.mkdir(parents=True, exist_ok=True)
(args.out_dir / f"rank{rank}.json").write_text(json.dumps(errors))
