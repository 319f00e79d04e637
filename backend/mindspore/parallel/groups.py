"""Megatron's process groups on MindSpore communication: which ranks share a tensor, a pipeline, a data shard.

Ranks are ordered as megatron-core's default `tp-cp-ep-dp-pp` (context and expert parallel sizes 1 here):
tensor-parallel ranks are adjacent, then data-parallel, then pipeline stages, so

    rank = tp_rank + tp * (dp_rank + dp * pp_rank)

`initialize_model_parallel(tp, pp)` is megatron-core's `parallel_state.initialize_model_parallel`: it creates
every group this rank belongs to (MindSpore's `create_group`, called only by the members) and returns the
`ParallelState` the layers, the schedule and the train step read. In one process every group is that process
alone and every collective is the identity.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from mmrun.backend.errors import UsageError

# Megatron's group kinds: tensor, pipeline, data, model (tensor x pipeline: the grad-norm group) and the
# embedding group (first and last pipeline stage: the tied word embeddings' gradients are summed there).
GROUP_KINDS = ("tp", "pp", "dp", "mp", "embd")


def rank_coordinates(rank: int, tp: int, dp: int) -> tuple[int, int, int]:
    """(tp_rank, dp_rank, pp_rank) of a global rank in the tp-cp-ep-dp-pp order."""
    return rank % tp, (rank // tp) % dp, rank // (tp * dp)


def global_rank(tp_rank: int, dp_rank: int, pp_rank: int, tp: int, dp: int) -> int:
    return tp_rank + tp * (dp_rank + dp * pp_rank)


def rank_groups(world_size: int, tp: int, pp: int) -> dict[str, list[list[int]]]:
    """Every group of each kind over `world_size` ranks, as megatron-core's RankGenerator lists them."""
    check_sizes(world_size, tp, pp)
    dp = world_size // (tp * pp)
    ranks = range(world_size)

    def grouped(key) -> list[list[int]]:
        groups: dict[tuple, list[int]] = {}
        for r in ranks:
            groups.setdefault(key(*rank_coordinates(r, tp, dp)), []).append(r)
        return [sorted(g) for _, g in sorted(groups.items())]

    embd = [sorted({global_rank(t, d, 0, tp, dp), global_rank(t, d, pp - 1, tp, dp)})
            for d in range(dp) for t in range(tp)]
    return {
        "tp": grouped(lambda t, d, p: (d, p)),
        "pp": grouped(lambda t, d, p: (t, d)),
        "dp": grouped(lambda t, d, p: (t, p)),
        "mp": grouped(lambda t, d, p: (d,)),
        "embd": embd,
    }


def check_sizes(world_size: int, tp: int, pp: int) -> None:
    if tp < 1 or pp < 1 or world_size % (tp * pp):
        raise UsageError(f"the world size ({world_size}) must be a multiple of --tensor-model-parallel-size ({tp}) x "
                         f"--pipeline-model-parallel-size ({pp}); start tp x pp x dp processes")


@dataclass(frozen=True)
class Group:
    """One communication group as this rank sees it. `name` is None when the group is this rank alone."""

    ranks: tuple[int, ...]
    rank: int  # this process's index within the group
    name: str | None

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True)
class ParallelState:
    """Sizes, this rank's coordinates and its groups (megatron-core's parallel_state, as one value)."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    data_parallel_size: int = 1
    rank: int = 0
    sequence_parallel: bool = False
    groups: dict[str, Group] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.data_parallel_size

    @property
    def tp_rank(self) -> int:
        return rank_coordinates(self.rank, self.tensor_model_parallel_size, self.data_parallel_size)[0]

    @property
    def dp_rank(self) -> int:
        return rank_coordinates(self.rank, self.tensor_model_parallel_size, self.data_parallel_size)[1]

    @property
    def pp_rank(self) -> int:
        return rank_coordinates(self.rank, self.tensor_model_parallel_size, self.data_parallel_size)[2]

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pipeline_model_parallel_size - 1

    @property
    def next_rank(self) -> int:
        """Global rank of the next pipeline stage (this rank's pipeline group)."""
        pp = self.groups["pp"]
        return pp.ranks[(pp.rank + 1) % pp.size]

    @property
    def prev_rank(self) -> int:
        pp = self.groups["pp"]
        return pp.ranks[(pp.rank - 1) % pp.size]

    def group(self, kind: str) -> Group:
        return self.groups[kind]


def _group_name(ranks: Sequence[int], world_size: int, world_name: str) -> str | None:
    """Named by its ranks, so kinds with the same members (pp and embd with two stages) share one communicator."""
    if len(ranks) == 1:
        return None
    if len(ranks) == world_size:
        return world_name  # MindSpore's own world group: no second communicator for the same ranks
    return "mmrun_ranks_" + "_".join(str(r) for r in ranks)


def build_state(rank: int, world_size: int, tp: int, pp: int, sequence_parallel: bool = False,
                world_name: str = "world") -> ParallelState:
    """The ParallelState of `rank` without creating communicators (the pure part of initialize_model_parallel)."""
    all_groups = rank_groups(world_size, tp, pp)
    mine = {}
    for kind in GROUP_KINDS:
        ranks = next((g for g in all_groups[kind] if rank in g), [rank])
        mine[kind] = Group(tuple(ranks), ranks.index(rank), _group_name(ranks, world_size, world_name))
    return ParallelState(tp, pp, world_size // (tp * pp), rank, bool(sequence_parallel and tp > 1), mine)


_state: ParallelState | None = None
_created: set[str] = set()  # communicators already created in this process (kinds can share one)


def initialize_model_parallel(tensor_model_parallel_size: int = 1, pipeline_model_parallel_size: int = 1,
                              sequence_parallel: bool = False) -> ParallelState:
    """Create this rank's groups (after mmrun.backend.init_distributed()) and remember the state.

    Every rank of the job must call it with the same sizes. Called again with the same sizes, it returns
    the state it made; other sizes are refused (MindSpore cannot destroy a group and rebuild it).
    """
    global _state
    from mmrun.backend.mindspore import distributed

    world_size, rank = distributed.get_world_size(), distributed.get_rank()
    if world_size > 1 and not distributed.is_initialized():
        raise UsageError(f"initialize_model_parallel on rank {rank} of {world_size} before communication was "
                         "initialised; call mmrun.backend.init_distributed() first")
    wanted = (tensor_model_parallel_size, pipeline_model_parallel_size, bool(sequence_parallel))
    if _state is not None:
        made = (_state.tensor_model_parallel_size, _state.pipeline_model_parallel_size, _state.sequence_parallel)
        if made[:2] != wanted[:2]:
            raise UsageError(f"model parallelism was already initialised with (tp, pp) = {made[:2]}; a process can "
                             f"hold one layout only. Received: {wanted[:2]}")
        return _state
    world_name = "world"
    if world_size > 1:
        from mindspore.communication import GlobalComm, create_group
        world_name = GlobalComm.WORLD_COMM_GROUP
    state = build_state(rank, world_size, *wanted, world_name=world_name)
    if world_size > 1:
        for kind in GROUP_KINDS:
            group = state.groups[kind]
            if group.name is not None and group.name != world_name and group.name not in _created:
                create_group(group.name, list(group.ranks))
                _created.add(group.name)
    _state = state
    return state



def get_parallel_state() -> ParallelState:
    """The state made by initialize_model_parallel (one process, no parallelism, before that)."""
    return _state if _state is not None else build_state(0, 1, 1, 1)
