"""The FSDP2 file's plan applied to one model with torch's own API (nothing re-implemented):

    mesh = build_mesh("cpu", world_size=2, shard_size=2)     # 1-D (full shard) or 2-D (replicas x shards)
    units = apply_fsdp2(model, config, plan, mesh)           # recompute, fully_shard per unit, root, prefetch

Order matters to torch: activation recompute is set up before `fully_shard` (so FSDP's hooks surround the
recomputed forward and the parameters are gathered when backward recomputes), and the units are
sharded innermost first, the root last (a parent's `fully_shard` takes the parameters its wrapped
children have not taken).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from mmrun.engines.fsdp2_config import FSDP2Config, ModulePlan

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def build_mesh(device_type: str, world_size: int, shard_size: int) -> DeviceMesh:
    """Full shard: a 1-D mesh over every rank. Hybrid: (replicas, shards), consecutive ranks share a
    replica's shards (on one node, where the all-gathers are cheapest), replicas all-reduce."""
    if shard_size == world_size:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (world_size // shard_size, shard_size), mesh_dim_names=("replicate", "shard"))


def _recompute(module: torch.nn.Module, use_reentrant: bool) -> None:
    """Recompute this module's activations in backward: the backend's one primitive (backend/torch/nn.py's
    `recompute`: the instance's forward replaced, so the patterns and checkpoints keep the model's own paths;
    the reentrant form passes tensor keyword arguments positionally, as transformers passes `hidden_states=`)."""
    from mmrun.backend.torch.nn import recompute

    recompute(module, use_reentrant=use_reentrant)


def mixed_precision(config: FSDP2Config, default_param_dtype: str | None = None) -> MixedPrecisionPolicy:
    def dtype(name: str | None) -> torch.dtype | None:
        return TORCH_DTYPES[name] if name else None

    return MixedPrecisionPolicy(param_dtype=dtype(config.param_dtype or default_param_dtype),
                                reduce_dtype=dtype(config.reduce_dtype), output_dtype=dtype(config.output_dtype),
                                cast_forward_inputs=config.cast_forward_inputs)


def apply_fsdp2(model: torch.nn.Module, config: FSDP2Config, plan: ModulePlan, mesh: DeviceMesh,
                default_param_dtype: str | None = None) -> list[torch.nn.Module]:
    """Shard `model` in place; returns the wrapped units in model order (the root last)."""
    for name in plan.recompute:
        _recompute(model.get_submodule(name), config.use_reentrant)
    ignored = {p for name in plan.ignore for p in model.get_submodule(name).parameters()}
    common = dict(mesh=mesh, **unit_kwargs(config, default_param_dtype))
    units = [model.get_submodule(name) for name in plan.wrap]
    # Innermost first: a unit nested in another is sharded before its parent.
    for name in sorted(plan.wrap, key=lambda n: -n.count(".")):
        module = model.get_submodule(name)
        mine = {p for p in module.parameters() if p in ignored}
        fully_shard(module, ignored_params=mine or None, **common)
    # The root: torch keeps its parameters gathered after forward unless told otherwise (None).
    fully_shard(model, ignored_params=ignored or None, **common)
    _prefetch(units, config.num_to_forward_prefetch, config.num_to_backward_prefetch)
    return [*units, model]


def unit_kwargs(config: FSDP2Config, default_param_dtype: str | None = None) -> dict[str, Any]:
    """fully_shard's keyword arguments from the file, but the mesh (every unit takes the same)."""
    return dict(mp_policy=mixed_precision(config, default_param_dtype),
                reshard_after_forward=config.reshard_after_forward,
                offload_policy=CPUOffloadPolicy(pin_memory=config.pin_memory) if config.offload_to_cpu else OffloadPolicy())


def _prefetch(units: Sequence[torch.nn.Module], forward: int, backward: int) -> None:
    """Explicit prefetching over the units in model order: in forward the next `forward` units start
    gathering, in backward the previous `backward` ones (torch's implicit default is one in backward)."""
    if forward > 0:
        for i, unit in enumerate(units[:-1]):
            unit.set_modules_to_forward_prefetch(list(units[i + 1:i + 1 + forward]))
    if backward > 1:
        for i in range(1, len(units)):
            unit = units[i]
            unit.set_modules_to_backward_prefetch(list(reversed(units[max(0, i - backward):i])))


def ignored_parameters(model: torch.nn.Module, plan: ModulePlan) -> list[torch.nn.Parameter]:
    """The parameters FSDP leaves whole on every rank (their gradients are averaged by the engine)."""
    seen: list[torch.nn.Parameter] = []
    for name in plan.ignore:
        for p in model.get_submodule(name).parameters():
            if p.requires_grad and all(p is not q for q in seen):
                seen.append(p)
    return seen
