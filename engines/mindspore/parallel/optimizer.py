"""The MindSpore parallel engine's optimizer and train step for one rank (the GPT's and the VLM's stages alike)."""
from __future__ import annotations

from typing import Any


def optimizer_and_step(args: Any, model: Any, state: Any, **step: Any) -> Any:
    """This rank's AdamW (Megatron's no-decay rule) and its ParallelTrainStep; with --use-distributed-optimizer the
    AdamW state sharded over the data-parallel group (backend/mindspore/parallel/zero.py), a MoE stage's experts'
    over their expert-data-parallel group."""
    from mmrun.backend.mindspore import optim
    from mmrun.backend.mindspore.parallel.engine import ParallelTrainStep

    hyper = dict(lr=args.lr, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps,
                 weight_decay=args.weight_decay, no_decay=optim.megatron_no_decay)
    if getattr(args, "use_distributed_optimizer", False):
        from mmrun.backend.mindspore.parallel import zero

        roles = model.parameter_roles()
        if roles.experts and roles.expert_data_parallel is not None:  # the experts' over their own DP group
            optimizer = zero.ExpertShardedAdamW(model.named_parameters(), roles.experts, state.groups["dp"],
                                                roles.expert_data_parallel, **hyper)
            return zero.ExpertShardedParallelTrainStep(model, optimizer, state, **step)
        optimizer = zero.ShardedAdamW(model.named_parameters(), dp=state.data_parallel_size, rank=state.dp_rank,
                                      group=state.groups["dp"].name, **hyper)
        return zero.ShardedParallelTrainStep(model, optimizer, state, **step)
    return ParallelTrainStep(model, optim.AdamW(model.named_parameters(), **hyper), state, **step)
