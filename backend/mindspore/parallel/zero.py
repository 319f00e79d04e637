"""The distributed optimizer (ZeRO-1) on MindSpore: AdamW's state sharded over the data-parallel ranks.

megatron-core's DistributedOptimizer, in mmrun's compiled step (`ShardedTrainStep`, a `TrainStep`): the
gradients of all trained parameters make one flat fp32 buffer, padded to a multiple of the data-parallel size
(backend/optimizer_shards.py); it is reduce-scattered, so each rank holds the mean gradient of its own shard;
the global norm is the all-reduced sum of every shard's squares (clipping sees all of them); each rank updates
its shard (AdamW's exp_avg / exp_avg_sq, and an fp32 main copy for fp16/bf16 parameters, for that shard only;
fp32 parameters are their own main copy, as in megatron-core); the updated shards are all-gathered into the
parameters. With one micro-batch and no loss scaler all of it is one `mindspore.jit` graph with forward and
backward; otherwise the update graph (`TrainStep` decides, as without the distributed optimizer).
`ShardedParallelTrainStep` is the same update in the tensor/pipeline-parallel step (backend/mindspore/parallel/
engine.py's ParallelTrainStep), over its data-parallel group: its gradients are all-reduced (eagerly, as without
the distributed optimizer) and its norm taken over the model-parallel group first; its update graph then takes the
rank's shard, updates it and all-gathers the parameters.

Collectives: `reduce_scatter` and `all_gather` below. MindSpore 2.10's CPU collectives (mccl) have neither
ReduceScatter nor an AllGather off the world group, so on CPU a reduce-scatter is an all-reduce of which the
rank keeps its shard, and an all-gather an all-reduce of a buffer holding only this rank's shard (adding zeros
is exact); on Ascend/GPU they are HCCL's / NCCL's ReduceScatter and AllGather
(backend/mindspore/parallel/mappings.py, which the tensor-parallel regions share).

AdamW is torch's update op for op (optim.py's `fused=False` order): MindSpore's fused kernel updates its
parameter in place, and a rank's fp32 shard is a slice of the replicated parameter, not a tensor of its own.
Against the unsharded optimizer's fused kernel the updates differ by float32 rounding only.

Checkpoints hold whole per-parameter tensors (`state_dict` gathers the shards; every rank must call it), the
layout of the unsharded optimizer and of the PyTorch engines (megatron-core's distributed optimizer saves
whole moments too), so a run resumes at any data-parallel size, with or without the distributed optimizer, and
on PyTorch.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint
from mindspore import ops as _ops
from mindspore.ops import composite as C
from mindspore.ops import functional as F

from mmrun.backend.mindspore import optim
from mmrun.backend.mindspore.parallel.mappings import EMULATED_COLLECTIVES, _gather_all, _reduce_scatter_all
from mmrun.backend.mindspore.parallel.engine import ParallelTrainStep
from mmrun.backend.mindspore.train_step import TrainStep, _split_flat
from mmrun.backend.train_step_shared import world_size
from mmrun.backend.optimizer_params import MAIN_PARAM_KEY, STATE_KEYS, NoDecay, check_optimizer_state, named_params
from mmrun.backend.optimizer_shards import ShardLayout

_shard_adamw = C.MultitypeFuncGraph("mmrun_shard_adamw")


@_shard_adamw.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor",
                       "Tensor", "Tensor", "Tensor", "Tensor", "Bool")
def _shard_update(beta1, beta2, step_size, bc2_sqrt, eps, decay_factor, param, m, v, grad, decays):
    # the new parameter values are returned, not assigned: the shard is all-gathered into the parameters after
    new_param, new_m, new_v = optim._adamw_values(beta1, beta2, step_size, bc2_sqrt, eps, decay_factor, param, m,
                                                  v, grad, decays)
    out = F.depend(new_param, F.assign(m, new_m))
    return F.depend(out, F.assign(v, new_v))


def reduce_scatter(all_reduce: Any, reduce_scatter_op: Any, flat: Tensor, dp: int, rank: int) -> Tensor:
    """The sum over the data-parallel ranks of `flat`, this rank's 1/dp of it (HCCL's ReduceScatter, or on CPU an
    all-reduce and the own slice)."""
    return _reduce_scatter_all(all_reduce, reduce_scatter_op, flat, dp, rank)


def all_gather(all_reduce: Any, all_gather_op: Any, shard: Tensor, dp: int, rank: int) -> Tensor:
    """Every rank's `shard`, concatenated in rank order (AllGather, or on CPU an all-reduce of zeros and the own
    shard)."""
    return _gather_all(all_reduce, all_gather_op, shard, 0, dp, rank)


def state_bytes(optimizer: Any) -> int:
    """Bytes of optimizer state this process holds: every tensor the optimizer keeps beside the model's own
    parameters (Adam's moments, fp32 main copies), read from the tensors themselves."""
    params = {id(p) for p in optimizer.params}
    held = [*optimizer.exp_avg, *optimizer.exp_avg_sq, *(m for m in optimizer.main_params if id(m) not in params)]
    return int(sum(t.nbytes for t in held))


class ShardedAdamW(optim.AdamW):
    """optim.AdamW's contract (names, params, the per-step scalars, state_dict) with its state for one
    data-parallel rank's shard of the flat buffer: `exp_avg` / `exp_avg_sq` hold one tensor per segment
    (a parameter's piece in the shard), `main_params` the fp32 copies of the fp16/bf16 segments only."""

    sharded = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, no_decay: NoDecay | None = None,
                 dp: int = 1, rank: int = 0, group: str | None = None, prefix: str = "") -> None:
        ms.nn.Cell.__init__(self, auto_prefix=False)  # not AdamW's: it would allocate the whole state
        pairs = named_params(params)
        self.names = [name for name, _ in pairs]
        self.params = ms.ParameterTuple([param for _, param in pairs])
        self.shapes = tuple(tuple(int(d) for d in p.shape) for p in self.params)
        self.layout = ShardLayout.build([math.prod(s) for s in self.shapes], dp)
        self.rank = int(rank)
        self.group = group  # the data-parallel communicator's name (None: the world, or a group of one)
        self.segments = self.layout.segments(self.rank)
        self.half = tuple(self.params[s.param].dtype != ms.float32 for s in self.segments)
        # plain ints for the graph: (parameter index, first element, elements) per segment
        self.pieces = tuple((s.param, s.start, s.size) for s in self.segments)
        mains = [ms.Parameter(Tensor(self._param_piece(s)), name=f"{prefix}{MAIN_PARAM_KEY}.shard.{k}", requires_grad=False)
                 for k, s in enumerate(self.segments) if self.half[k]]
        self.main_params = ms.ParameterTuple(mains)
        self.exp_avg = ms.ParameterTuple([ms.Parameter(Tensor(np.zeros(s.size, np.float32)), name=f"{prefix}exp_avg.shard.{k}",
                                                       requires_grad=False) for k, s in enumerate(self.segments)])
        self.exp_avg_sq = ms.ParameterTuple([ms.Parameter(Tensor(np.zeros(s.size, np.float32)),
                                                          name=f"{prefix}exp_avg_sq.shard.{k}", requires_grad=False)
                                             for k, s in enumerate(self.segments)])
        flags = [weight_decay > 0 and not (no_decay is not None and no_decay(n, p)) for n, p in pairs]
        self.decay_flags = tuple(flags[s.param] for s in self.segments)
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay
        self.fused = False  # the per-step scalars of torch's op order (_shard_update)
        self._beta1, self._beta2, self._eps = optim._f32(betas[0]), optim._f32(betas[1]), optim._f32(eps)
        self._hyper_map = C.HyperMap()
        self._lr = float(lr)
        self.step_count = 0

    def _param_piece(self, segment) -> np.ndarray:
        flat = self.params[segment.param].asnumpy().astype(np.float32).reshape(-1)
        return flat[segment.start:segment.stop].copy()

    # ------------------------------------------------------------------------------ the update (in the graph)
    def shard_values(self):
        """The current fp32 values of this rank's segments: the main copy (fp16/bf16) or a slice of the parameter."""
        values, k = [], 0
        for i, (index, start, size) in enumerate(self.pieces):
            if self.half[i]:
                values.append(self.main_params[k])
                k += 1
            else:
                values.append(mint.narrow(_ops.reshape(self.params[index], (-1,)), 0, start, size))
        return values

    def construct(self, grads, scalars):
        """AdamW on this rank's segments (`grads`: one per segment); returns the new fp32 values (the main copies
        assigned)."""
        s0, s1, s2 = scalars
        new = self._hyper_map(F.partial(_shard_adamw, self._beta1, self._beta2, s0, s1, self._eps, s2),
                              tuple(self.shard_values()), self.exp_avg, self.exp_avg_sq, grads, self.decay_flags)
        k = 0
        for i in range(len(self.pieces)):
            if self.half[i]:
                new = F.depend(new, F.assign(self.main_params[k], new[i]))
                k += 1
        return new

    def step(self, grads: Sequence[Tensor]) -> None:
        raise NotImplementedError("ShardedAdamW updates inside ShardedTrainStep (it needs the reduce-scatter)")

    # ------------------------------------------------------------------------------ state
    def reload_model_params(self) -> None:
        """The fp32 main copies of this rank's fp16/bf16 segments from the model's (just loaded) parameters."""
        k = 0
        for i, seg in enumerate(self.segments):
            if self.half[i]:
                self.main_params[k].set_data(Tensor(self._param_piece(seg)))
                k += 1

    def _gathered(self, pieces: Sequence[np.ndarray], keep: Sequence[bool]) -> list[np.ndarray | None]:
        """Whole per-parameter arrays from every rank's segments (`keep`: which parameters to return); an
        all-reduce of a zero buffer holding this rank's shard (every rank calls it)."""
        from mmrun.backend.mindspore import distributed

        layout = self.layout
        flat = np.zeros(layout.padded, np.float32)
        begin, _ = layout.owned(self.rank)
        for seg, piece in zip(self.segments, pieces):
            flat[begin + seg.offset:begin + seg.offset + seg.size] = piece
        if layout.dp > 1 and self.group is None:
            flat = distributed.all_reduce(Tensor(flat), op="sum").asnumpy()
        elif layout.dp > 1:
            import mindspore.mint.distributed as mdist

            summed = Tensor(flat)
            mdist.all_reduce(summed, group=self.group)
            flat = summed.asnumpy()
        return [flat[o:o + n].reshape(shape).copy() if want else None
                for o, n, shape, want in zip(layout.offsets, layout.sizes, self.shapes, keep)]

    def state_dict(self) -> dict[str, Any]:
        """optim.AdamW's layout: whole tensors per parameter, gathered from every rank (a collective)."""
        tensors: dict[str, Any] = {}
        everything = [True] * len(self.params)
        for key, slots in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
            for name, value in zip(self.names, self._gathered([s.asnumpy() for s in slots], everything)):
                tensors[f"{name}.{key}"] = value
        half_params = [p.dtype != ms.float32 for p in self.params]
        if any(half_params):
            # every rank's main copies; fp32 segments are their parameter (not saved, as without sharding)
            mains, k = [], 0
            for i, seg in enumerate(self.segments):
                if self.half[i]:
                    mains.append(self.main_params[k].asnumpy())
                    k += 1
                else:
                    mains.append(self._param_piece(seg))
            for name, value in zip(self.names, self._gathered(mains, half_params)):
                if value is not None:
                    tensors[f"{name}.{MAIN_PARAM_KEY}"] = value
        return {"step": self.step_count, "lr": self._lr, "tensors": tensors}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Whole per-parameter tensors (any data-parallel size saved them): this rank keeps its segments."""
        check_optimizer_state(state, self.names, list(self.shapes))
        saved = state["tensors"]

        def piece(name: str, key: str, seg) -> np.ndarray | None:
            value = saved.get(f"{name}.{key}")
            if value is None:
                return None
            array = value.asnumpy() if isinstance(value, Tensor) else np.asarray(value)
            return array.astype(np.float32).reshape(-1)[seg.start:seg.stop]

        k = 0
        for i, seg in enumerate(self.segments):
            name = self.names[seg.param]
            for slot, key in ((self.exp_avg[i], STATE_KEYS[0]), (self.exp_avg_sq[i], STATE_KEYS[1])):
                slot.set_data(Tensor(piece(name, key, seg)))
            if self.half[i]:
                main = piece(name, MAIN_PARAM_KEY, seg)
                if main is not None:  # a saved main param (exact fp32 weights) wins over the rounded model copy
                    self.main_params[k].set_data(Tensor(main.copy()))
                k += 1
        self.step_count = int(state["step"])
        if "lr" in state:
            self._lr = float(state["lr"])


class _ShardedUpdate:
    """What both sharded steps share: the flat buffer, this rank's shard of it, the shard's AdamW and the
    all-gather into the parameters. `_zero_reduce` / `_zero_gather` are the data-parallel group's AllReduce
    (None with one rank) and AllGather (None on CPU: emulated with the all-reduce)."""

    def _setup_shards(self, optimizer: ShardedAdamW) -> None:
        layout = optimizer.layout
        self._dp, self._rank = layout.dp, optimizer.rank
        self._total, self._sizes = layout.total, tuple(layout.sizes)
        self._seg_sizes = tuple(s.size for s in optimizer.segments)
        self._shard_pad = layout.shard - sum(self._seg_sizes)  # padding at the end of this rank's shard
        self._flat_pad = Tensor(np.zeros(layout.padded - layout.total, np.float32)) if layout.padded > layout.total \
            else None
        self._own_pad = Tensor(np.zeros(self._shard_pad, np.float32)) if self._shard_pad else None
        self._zero_reduce = self._zero_scatter = self._zero_gather = None

    def _collectives(self, group: str | None) -> None:
        """The data-parallel group's collectives (`group`: its name; None is the world group)."""
        if self._dp > 1:
            self._zero_reduce = _ops.AllReduce(_ops.ReduceOp.SUM, group) if group else _ops.AllReduce()
            if not EMULATED_COLLECTIVES:
                self._zero_scatter = (_ops.ReduceScatter(_ops.ReduceOp.SUM, group) if group
                                      else _ops.ReduceScatter(_ops.ReduceOp.SUM))
                self._zero_gather = _ops.AllGather(group) if group else _ops.AllGather()

    def _flat(self, grads):
        pieces = [_ops.reshape(g, (-1,)) for g in grads]
        if self._flat_pad is not None:
            pieces.append(self._flat_pad)
        return mint.cat(pieces)

    def _own_shard(self, flat):
        """This rank's slice of a flat buffer that is already the same on every rank (already reduced)."""
        size = flat.shape[0] // self._dp
        return mint.narrow(flat, 0, self._rank * size, size)

    def _shard_apply(self, shard, norm, scalars):
        if self.clip_grad > 0:  # torch's clip_grad_norm_: scale by max_norm / (norm + 1e-6), never up
            shard = shard * mint.clamp(self.clip_grad / (norm + 1e-6), max=1.0)
        sizes = list(self._seg_sizes) + ([self._shard_pad] if self._shard_pad else [])
        pieces = _split_flat(shard, sizes)
        new = self.optimizer(tuple(pieces[:len(self._seg_sizes)]), scalars)
        own = list(new) + ([self._own_pad] if self._own_pad is not None else [])
        own = mint.cat(own)
        full = all_gather(self._zero_reduce, self._zero_gather, own, self._dp, self._rank) \
            if self._zero_reduce is not None else own
        values = _split_flat(mint.narrow(full, 0, 0, self._total), list(self._sizes))
        done = full
        for param, value, shape in zip(self.optimizer.params, values, self.optimizer.shapes):
            done = F.depend(done, F.assign(param, F.cast(_ops.reshape(value, shape), F.dtype(param))))
        return done


class ShardedTrainStep(_ShardedUpdate, TrainStep):
    """TrainStep with ShardedAdamW: reduce-scatter, global norm over every shard, the shard's update, all-gather."""

    def __init__(self, model: ms.nn.Cell, optimizer: ShardedAdamW, **kwargs: Any) -> None:
        TrainStep.__init__(self, model, optimizer, **kwargs)
        self._setup_shards(optimizer)

    def __call__(self, micro_batches):
        if self.world_size is None:
            self.world_size = world_size("mmrun.backend.mindspore")
            if self.world_size != self._dp:
                raise ValueError(f"the distributed optimizer was built for {self._dp} data-parallel ranks; this job "
                                 f"has {self.world_size}")
            if self.world_size > 1:
                self._all_reduce = _ops.AllReduce()
                self._collectives(None)
        return TrainStep.__call__(self, micro_batches)

    def _update(self, grads, loss, scalars):
        """Reduce-scatter (mean), the global norm from every shard's squares (the loss rides in that all-reduce),
        clipping, this shard's AdamW, the all-gather into the parameters; returns [loss, norm]."""
        flat = self._flat(grads)
        if self._all_reduce is not None:
            shard = reduce_scatter(self._all_reduce, self._zero_scatter, flat, self._dp, self._rank) / self.world_size
            pair = self._all_reduce(mint.cat([_ops.reshape(mint.sum(shard * shard), (1,)),
                                              _ops.reshape(loss, (1,))]))
            squares, loss = pair[0], pair[1:] / self.world_size
        else:
            shard = flat
            squares = mint.sum(shard * shard)
        norm = mint.sqrt(squares)
        done = self._shard_apply(shard, norm, scalars)
        return F.depend(mint.cat([_ops.reshape(loss, (1,)), _ops.reshape(norm, (1,))]), done)

    def _apply(self, grads, norm, scalars):
        """The loss-scaling path: `grads` are already averaged over the ranks and unscaled, `norm` is theirs."""
        return F.depend(norm, self._shard_apply(self._own_shard(self._flat(grads)), norm, scalars))


class ShardedParallelTrainStep(_ShardedUpdate, ParallelTrainStep):
    """The MindSpore tensor/pipeline-parallel step with ShardedAdamW over its data-parallel group: the gradients are
    finalized as without it (the data-parallel all-reduce, eager: the reduce-scatter's CPU form), the norm is over
    the model-parallel group as without it, and the update graph takes this rank's shard, updates it and
    all-gathers the parameters over the data-parallel group."""

    def __init__(self, model: ms.nn.Cell, optimizer: ShardedAdamW, state: Any, **kwargs: Any) -> None:
        ParallelTrainStep.__init__(self, model, optimizer, state, **kwargs)
        self._setup_shards(optimizer)
        if self._dp != state.data_parallel_size:
            raise ValueError(f"the distributed optimizer was built for {self._dp} data-parallel ranks; this layout "
                             f"has {state.data_parallel_size}")
        self._collectives(state.groups["dp"].name)

    def _apply(self, grads, norm, scalars):
        return F.depend(norm, self._shard_apply(self._own_shard(self._flat(grads)), norm, scalars))


def world_group() -> Any:
    """The world as a parallel.groups.Group (name None: ShardedAdamW's collectives over the world)."""
    from mmrun.backend.mindspore import distributed
    from mmrun.backend.mindspore.parallel.groups import Group

    size = distributed.get_world_size()
    return Group(tuple(range(size)), distributed.get_rank(), None)


class ExpertShardedAdamW(ms.nn.Cell):
    """ShardedAdamW's contract for a stage with expert parallelism, as megatron-core's ChainedOptimizer of two
    DistributedOptimizers: the dense parameters' state sharded over the data-parallel group, the experts' over
    their expert-data-parallel group (the ranks holding the same experts: DP / EP of them). `names` / `params` keep
    the model's order; the per-step scalars are this optimizer's (one step count and learning rate for both)."""

    sharded = True

    def __init__(self, params: Iterable[Any], experts: frozenset[str], dense_group: Any, expert_group: Any,
                 lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, no_decay: NoDecay | None = None) -> None:
        ms.nn.Cell.__init__(self, auto_prefix=False)
        pairs = named_params(params)
        self.names = [name for name, _ in pairs]
        self.params = ms.ParameterTuple([param for _, param in pairs])
        self.shapes = tuple(tuple(int(d) for d in p.shape) for p in self.params)
        self.dense_index = tuple(i for i, name in enumerate(self.names) if name not in experts)
        self.expert_index = tuple(i for i, name in enumerate(self.names) if name in experts)
        hyper = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, no_decay=no_decay)
        self.dense = ShardedAdamW([pairs[i] for i in self.dense_index], dp=dense_group.size, rank=dense_group.rank,
                                  group=dense_group.name, **hyper)
        self.experts = ShardedAdamW([pairs[i] for i in self.expert_index], dp=expert_group.size,
                                    rank=expert_group.rank, group=expert_group.name, prefix="experts.", **hyper)
        self.betas, self.eps, self.weight_decay, self.fused = tuple(betas), eps, weight_decay, False
        self._lr = float(lr)
        self.step_count = 0

    lr = optim.AdamW.lr
    set_lr = optim.AdamW.set_lr
    _next_scalars = optim.AdamW._next_scalars

    @property
    def exp_avg(self) -> tuple:  # state_bytes reads the held state through these
        return (*self.dense.exp_avg, *self.experts.exp_avg)

    @property
    def exp_avg_sq(self) -> tuple:
        return (*self.dense.exp_avg_sq, *self.experts.exp_avg_sq)

    @property
    def main_params(self) -> tuple:
        return (*self.dense.main_params, *self.experts.main_params)

    def reload_model_params(self) -> None:
        self.dense.reload_model_params()
        self.experts.reload_model_params()

    def state_dict(self) -> dict[str, Any]:
        """Whole tensors per parameter (a collective over both groups: every rank calls it)."""
        tensors = {**self.dense.state_dict()["tensors"], **self.experts.state_dict()["tensors"]}
        return {"step": self.step_count, "lr": self._lr, "tensors": tensors}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_optimizer_state(state, self.names, list(self.shapes))
        for part in (self.dense, self.experts):  # each part takes its own parameters' tensors
            names = set(part.names)
            mine = {key: value for key, value in state["tensors"].items() if key.rsplit(".", 1)[0] in names}
            part.load_state_dict({**state, "tensors": mine})
        self.step_count = int(state["step"])
        if "lr" in state:
            self._lr = float(state["lr"])


class _ShardPart(_ShardedUpdate, ms.nn.Cell):
    """One ShardedAdamW's update inside a step: its shard of the (already reduced) gradients, AdamW, the
    all-gather over its group."""

    def __init__(self, optimizer: ShardedAdamW, clip_grad: float) -> None:
        ms.nn.Cell.__init__(self, auto_prefix=False)
        self.optimizer, self.clip_grad = optimizer, clip_grad
        self._setup_shards(optimizer)
        self._collectives(optimizer.group)

    def construct(self, grads, norm, scalars):
        return self._shard_apply(self._own_shard(self._flat(grads)), norm, scalars)


def _apply_parts(step: Any, grads, norm, scalars):
    """The dense parameters' shard updated and all-gathered over their group, then the experts' over theirs."""
    done = step._dense_part(tuple([grads[i] for i in step._dense_pick]), norm, scalars)
    done = F.depend(done, step._expert_part(tuple([grads[i] for i in step._expert_pick]), norm, scalars))
    return F.depend(norm, done)


def _setup_parts(step: Any, optimizer: ExpertShardedAdamW) -> None:
    step._dense_part = _ShardPart(optimizer.dense, step.clip_grad)
    step._expert_part = _ShardPart(optimizer.experts, step.clip_grad)
    step._dense_pick, step._expert_pick = optimizer.dense_index, optimizer.expert_index


class ExpertShardedTrainStep(TrainStep):
    """The data-parallel engine's step with ExpertShardedAdamW (expert parallelism's experts are local gradients,
    train_step_shared.LocalGradients): TrainStep reduces the gradients (the experts' over their expert-data-parallel
    group) and takes the norm, then each part's shard is updated and all-gathered over its group."""

    def __init__(self, model: ms.nn.Cell, optimizer: ExpertShardedAdamW, **kwargs: Any) -> None:
        TrainStep.__init__(self, model, optimizer, **kwargs)
        _setup_parts(self, optimizer)

    def _apply(self, grads, norm, scalars):
        return _apply_parts(self, grads, norm, scalars)


class ExpertShardedParallelTrainStep(ParallelTrainStep):
    """ShardedParallelTrainStep for ExpertShardedAdamW: the gradients finalized as without it (the experts' over
    their expert-data-parallel group), then the dense parameters' shard updated and all-gathered over the
    data-parallel group, the experts' over the expert-data-parallel group."""

    def __init__(self, model: ms.nn.Cell, optimizer: ExpertShardedAdamW, state: Any, **kwargs: Any) -> None:
        ParallelTrainStep.__init__(self, model, optimizer, state, **kwargs)
        _setup_parts(self, optimizer)

    def _apply(self, grads, norm, scalars):
        return _apply_parts(self, grads, norm, scalars)
