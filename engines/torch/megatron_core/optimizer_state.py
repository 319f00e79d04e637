"""megatron-core's optimizer state as whole tensors named after the parameters, and back.

Checkpoints store AdamW's moments per parameter (`<param>.exp_avg`, `<param>.exp_avg_sq`, and the fp32
`<param>.main_param` of an fp16/bf16 parameter), the same names mmrun's own optimizer writes, whatever
optimizer megatron-core built:

- FP32Optimizer: torch's AdamW state of the parameter itself;
- Float16OptimizerWithFloat16Params: the state of the parameter's fp32 main copy;
- DistributedOptimizer: each data-parallel rank holds a contiguous range of every parameter's flat
  elements (its shard of the grad buffer); the ranges are assembled with one sum-all-reduce per kind of
  state over the data-parallel group (zeros elsewhere), and on load each rank takes its range back. With
  expert parallelism megatron-core shards the experts' parameters (`allreduce` False) over their own
  expert-data-parallel group (a second DistributedOptimizer in its ChainedOptimizer): theirs are assembled over
  that group, the dense ones over the data-parallel group.

So a checkpoint's optimizer file is independent of the data-parallel size and of the distributed
optimizer: a run with --use-distributed-optimizer resumes one without it, and the other way round.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from mmrun.backend.optimizer_params import MAIN_PARAM_KEY, STATE_KEYS


@dataclass
class _Slot:
    """One parameter's place in an optimizer: its main param (or shard of it) and AdamW state dict."""

    name: str
    param: torch.nn.Parameter  # the model's parameter
    main: torch.Tensor  # fp32 main param, or the flat shard of it (distributed optimizer)
    state: dict  # torch.optim state of `main`
    start: int = 0  # the shard's range in the flat parameter (distributed optimizer)
    end: int = -1
    sharded: bool = False

    @property
    def half(self) -> bool:
        return self.param.dtype != torch.float32


def _sub_optimizers(optimizer: Any) -> list[Any]:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def slots(optimizer: Any, names: dict[torch.nn.Parameter, str]) -> Iterator[_Slot]:
    """Every (model parameter, main param, state) this rank's optimizer holds."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for opt in _sub_optimizers(optimizer):
        inner = opt.optimizer
        if isinstance(opt, DistributedOptimizer):
            for param, (group, order) in opt.model_param_group_index_map.items():
                main = inner.param_groups[group]["params"][order]
                rng = opt._get_model_param_range_map(param)["param"]
                yield _Slot(names[param], param, main, inner.state[main], rng.start, rng.end, sharded=True)
        elif hasattr(opt, "float16_groups"):  # Float16OptimizerWithFloat16Params
            for model_group, main_group in zip(opt.float16_groups, opt.fp32_from_float16_groups):
                for param, main in zip(model_group, main_group):
                    yield _Slot(names[param], param, main, inner.state[main])
            for group in opt.fp32_from_fp32_groups:
                for param in group:
                    yield _Slot(names[param], param, param, inner.state[param])
        else:  # FP32Optimizer: torch's optimizer over the model's own parameters
            for group in inner.param_groups:
                for param in group["params"]:
                    yield _Slot(names[param], param, param, inner.state[param])


def held(optimizer: Any, names: dict[torch.nn.Parameter, str]) -> str:
    """What this rank's optimizer holds of the experts' (`allreduce` False) and the other parameters' AdamW
    state: "<held> of <whole> expert elements, <held> of <whole> other" (one exp_avg's worth each)."""
    counts = {True: [0, 0], False: [0, 0]}
    for s in slots(optimizer, names):
        counts[getattr(s.param, "allreduce", True) is False][0] += s.main.numel()
    for param in names:
        counts[getattr(param, "allreduce", True) is False][1] += param.numel()
    return f"{counts[True][0]} of {counts[True][1]} expert elements, {counts[False][0]} of {counts[False][1]} other"


def _step_of(all_slots: list[_Slot]) -> int:
    steps = {int(s.state["step"]) for s in all_slots if "step" in s.state}
    return max(steps) if steps else 0


def gather(optimizer: Any, names: dict[torch.nn.Parameter, str], dp_group: Any,
           distributed: bool, expert_group: Any = None) -> tuple[int, dict[str, torch.Tensor]]:
    """(step, {"<param>.<key>": whole tensor, on the host}) for every parameter of this (tensor, pipeline) rank.
    Every data-parallel rank must call it (the distributed optimizer's shards are all-reduced: the experts' over
    `expert_group`, megatron-core's expert-data-parallel group, when given)."""
    all_slots = list(slots(optimizer, names))
    step = _step_of(all_slots)
    # The buffers are reduced where the parameters live: NCCL (and HCCL) move device tensors only, so a
    # buffer left on the host fails there ("No backend type associated with device type cpu"); gloo is CPU.
    device = next(iter(names)).device if names else torch.device("cpu")
    if distributed:
        step_t = torch.tensor([step], dtype=torch.int64, device=device)
        torch.distributed.all_reduce(step_t, op=torch.distributed.ReduceOp.MAX, group=dp_group)
        step = int(step_t.item())
    # Every parameter of the model, not only those this rank holds a shard of: the buffers must have the
    # same layout on every rank of the group for the all-reduce (an expert-parallel rank's experts are its own).
    params = sorted((name, param) for param, name in names.items())
    keys = list(STATE_KEYS) + ([MAIN_PARAM_KEY] if any(p.dtype != torch.float32 for _, p in params) else [])
    out: dict[str, torch.Tensor] = {}
    experts = [x for x in params if getattr(x[1], "allreduce", True) is False] if expert_group is not None else []
    parts = [([x for x in params if getattr(x[1], "allreduce", True) is not False], dp_group),
             (experts, expert_group)] if experts else [(params, dp_group)]
    for (part, group), key in itertools.product(parts, keys):
        _assemble(all_slots, part, group, key, distributed, device, out)
    return step, out


def _assemble(all_slots: list[_Slot], params: list, group: Any, key: str, distributed: bool, device: Any,
              out: dict[str, torch.Tensor]) -> None:
    """One kind of state of `params` as whole tensors into `out`: one flat buffer summed over `group`."""
    wanted = [(n, p) for n, p in params if key != MAIN_PARAM_KEY or p.dtype != torch.float32]
    sizes = [p.numel() for _, p in wanted]
    flat = torch.zeros(sum(sizes), dtype=torch.float32, device=device)
    offsets = dict(zip((n for n, _ in wanted), itertools.accumulate([0] + sizes)))
    for s in all_slots:
        if s.name not in offsets:
            continue
        value = s.main if key == MAIN_PARAM_KEY else s.state.get(key)
        if value is None:
            continue  # no step yet: the moments are zeros
        start = offsets[s.name] + (s.start if s.sharded else 0)
        flat[start:start + value.numel()] = value.detach().reshape(-1).to(device, torch.float32)
    if distributed:
        torch.distributed.all_reduce(flat, group=group)
    flat = flat.cpu()  # one transfer per kind of state; the checkpoint writer takes host tensors
    for (name, param), size in zip(wanted, sizes):
        offset = offsets[name]
        out[f"{name}.{key}"] = flat[offset:offset + size].view(param.shape)


@torch.no_grad()
def restore(optimizer: Any, names: dict[torch.nn.Parameter, str], step: int,
            tensors: dict[str, Any]) -> None:
    """Put whole per-parameter tensors (from `gather`, as numpy or torch) back into this rank's optimizer."""
    for s in slots(optimizer, names):
        for key in STATE_KEYS:
            whole = torch.as_tensor(tensors[f"{s.name}.{key}"]).reshape(-1)
            value = whole[s.start:s.end] if s.sharded else whole
            if key not in s.state:
                s.state[key] = torch.zeros_like(s.main)
            s.state[key].copy_(value.reshape(s.state[key].shape).to(s.state[key].dtype))
        # torch's single-tensor AdamW keeps the step as a float tensor on the host
        s.state["step"] = torch.tensor(float(step))
        saved_main = tensors.get(f"{s.name}.{MAIN_PARAM_KEY}")
        if saved_main is not None and s.main is not s.param:
            whole = torch.as_tensor(saved_main).reshape(-1)
            value = whole[s.start:s.end] if s.sharded else whole
            s.main.copy_(value.reshape(s.main.shape).to(s.main.dtype))
