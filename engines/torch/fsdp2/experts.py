"""FSDP2 expert parallelism (`expert_parallel_size` > 1 in MindSpeed-MM's fsdp2_config.yaml) for transformers' own
mixture-of-experts models, with transformers' own expert-parallel pieces (transformers.distributed.expert_parallel).

As MindSpeed-MM's FSDP2 form does (mindspeed_mm/models/transformers/base_model.py, create_ep_device_mesh and
_init_ep_model: Ascend/MindSpeed-MM, commit 57069cd5): the ranks form a (world / EP, EP) mesh ("ep_replicate",
"ep"); each expert module that `moe_modules` names keeps its dim-0 share of the fused expert tensors on the "ep" mesh
dimension (Shard(0): EP rank r holds experts [r E / EP, (r + 1) E / EP), as a DTensor, so a full-state checkpoint
gathers them), and its forward becomes transformers' `all_to_all` dispatch (AllToAllEP: every (token, expert) pair to
the rank owning the expert, the results back, weighted and summed on the sender). The dense rest of the model is
sharded by fully_shard as usual; the expert tensors stay out of it (ignored by FSDP: they compute in the file's
param_dtype by a differentiable cast, as FSDP2's mixed precision would give them) and their gradients are finished
by `finish_expert_grads`: each EP rank's expert gradient is already the sum over the tokens of its whole EP group
(the all-to-all's backward), so it is summed over the "ep_replicate" replicas and divided by the world size, as
MindSpeed-MM's gradient divide factor (world size) does: the mean over the ranks that the dense parameters get.

`reshard_local_experts` true with world > EP (MindSpeed-MM's _init_ep_model: fully_shard of each expert module on
the "EP_Replicate" mesh, Shard(1) for [experts, in, out] tensors, gradient divide factor the world size): each expert
module gets torch's own `fully_shard` on the "ep_replicate" sub-mesh, Shard(1) of its (already EP-split) tensors, so
a rank stores 1 / world of every expert tensor, and FSDP gathers the local experts before their forward; the
parameters become 2-D DTensors on (ep_replicate, ep), which DCP saves and loads across layouts. FSDP's
reduce-scatter sums the gradients over the replicas and divides by the world size (set_gradient_divide_factor, as a
plain sum then the divide: gloo has no PREMUL_SUM), what `finish_expert_grads` does for the experts kept whole
(reshard_local_experts false, or world == EP), so the numbers are the same either way.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from mmrun.backend.errors import UsageError


class ExpertParallel:
    """The expert-parallel mesh and the expert parameters of one model (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, modules: Sequence[str], device_type: str, world: int, size: int,
                 source: str = "fsdp2_config.yaml", compute_dtype: torch.dtype | None = None,
                 reshard: dict[str, Any] | None = None) -> None:
        """`reshard`: fully_shard's keyword arguments (mp_policy, offload_policy, reshard_after_forward) to shard
        the local experts over the replicas with (reshard_local_experts), None to keep them whole."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        from transformers.distributed.expert_parallel import EpDispatchExpertsParallel

        if world % size:
            raise UsageError(f"{source}: expert_parallel_size {size} does not divide the world size {world}; use a "
                             "divisor of the number of processes")
        self.size, self.world, self.modules = size, world, list(modules)
        for name in self.modules:  # every check before the first collective
            module = model.get_submodule(name)
            experts = getattr(module, "num_experts", None)
            if not isinstance(experts, int) or experts % size:
                raise UsageError(f"{source}: expert_parallel_size {size} does not divide the {experts} experts of "
                                 f"{name}; use a divisor of the experts (each EP rank holds experts / EP of them)")
            for key, param in module.named_parameters(recurse=False):
                if param.shape[0] != experts:
                    raise UsageError(f"{source}: moe_modules names {name}, whose {key} {tuple(param.shape)} is not "
                                     f"one row per expert ({experts}); name the fused experts module")
        # a third, size-1 dimension: transformers' dispatch takes the group of ranks sharing one batch (none here)
        mesh = init_device_mesh(device_type, (world // size, size, 1),
                                mesh_dim_names=("ep_replicate", "ep", "ep_batch"))
        self.resharded = reshard is not None and world > size
        self.replicate_group = mesh["ep_replicate"].get_group() if world > size and not self.resharded else None
        self.params: list[torch.nn.Parameter] = []
        for name in self.modules:
            module = model.get_submodule(name)
            experts = module.num_experts
            for key, param in list(module.named_parameters(recurse=False)):
                shard = distribute_tensor(param.detach(), mesh["ep"], [Shard(0)], src_data_rank=None)
                module._parameters[key] = torch.nn.Parameter(shard, requires_grad=param.requires_grad)
                self.params.append(module._parameters[key])
            module.num_experts = experts // size  # the experts forward then runs local expert numbers
            module._is_expert_parallel = True
            if compute_dtype is not None and not self.resharded:  # FSDP2's param_dtype, as fully_shard gives
                _compute_in(module, compute_dtype)                   # the experts at EP 1
            EpDispatchExpertsParallel().install_forward(module, mesh["ep"], tp_mesh=mesh["ep_batch"],
                                                        ep_implementation="all_to_all")
            if self.resharded:
                _reshard(module, mesh["ep_replicate"], reshard, world)
        if self.resharded:  # fully_shard swapped in the 2-D parameters; FSDP finishes their gradients
            self.params = []

    def finish_expert_grads(self) -> None:
        """Sum over the replicas, divide by the world: the mean over ranks, as the dense parameters' gradients."""
        for param in self.params:
            if param.grad is None:
                continue
            local = param.grad.to_local() if hasattr(param.grad, "to_local") else param.grad
            if self.replicate_group is not None:
                dist.all_reduce(local, group=self.replicate_group)
            local.div_(self.world)

    def summary(self) -> str:
        kept = (f"sharded over the {self.world // self.size} replicas (reshard_local_experts)" if self.resharded
                else "kept whole per replica" if self.world > self.size else "held whole")
        return (f"{len(self.modules)} expert module(s) (moe_modules) split over expert_parallel_size {self.size} "
                f"(all-to-all token dispatch), the local experts {kept}")


def _reshard(module: torch.nn.Module, mesh: Any, kwargs: dict[str, Any], world: int) -> None:
    """torch's fully_shard of one expert module over the replicas (see the module docstring)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    three_d = any(p.ndim == 3 for p in module.parameters(recurse=False))  # [experts, in, out]: the in dimension
    fully_shard(module, mesh=mesh, shard_placement_fn=(lambda _: Shard(1)) if three_d else None, **kwargs)
    module.set_gradient_divide_factor(float(world))
    module.set_force_sum_reduction_for_comms(True)  # a sum, then the divide: no PREMUL_SUM (gloo, HCCL lack it)


def _compute_in(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """The experts' forward on their parameters cast to `dtype` (a differentiable cast: the gradients stay in the
    parameters' dtype, as FSDP2's mixed precision reduces them); the dispatch calls it with the local tensors."""
    forward = module.forward

    def cast_forward(*args: Any, **kwargs: Any) -> Any:
        kept = dict(module._parameters)
        module._parameters.update({k: v.to(dtype) for k, v in kept.items() if v is not None and v.dtype != dtype})
        try:
            return forward(*args, **kwargs)
        finally:
            module._parameters.update(kept)

    module.forward = cast_forward


def expert_parallel(model: torch.nn.Module, config: Any, plan: Any, device_type: str, world: int,
                    compute_dtype: torch.dtype | None = None, reshard: dict[str, Any] | None = None) -> Any:
    """An ExpertParallel when the file asks for expert_parallel_size > 1 and names expert modules, else None;
    `reshard` (fully_shard's keyword arguments) is used when the file's reshard_local_experts is true."""
    size = getattr(config, "expert_parallel_size", 1)
    if size <= 1 or not plan.moe:
        return None
    return ExpertParallel(model, plan.moe, device_type, world, size, config.source, compute_dtype,
                          reshard if getattr(config, "reshard_local_experts", True) else None)
