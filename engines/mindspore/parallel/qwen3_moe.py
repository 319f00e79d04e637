"""Qwen3-VL MoE's sparse layers on MindSpore's parallel engine: experts split over tensor and expert-parallel ranks.

megatron-core's MoE layer as MindSpeed-MM's Qwen3-VL-30B-A3B runs it (finetune_qwen3vl_30B.sh: TP2 x PP4 x EP2),
with megatron-core 0.16.1's default `expert_tensor_parallel_size` = the tensor-parallel size (ETP = TP): every
expert is split over the TP ranks as the dense MLP is (linear_fc1 [gate_r; up_r] per rank, linear_fc2 row-
parallel) and the experts are shared out over EP ranks. Names per rank are megatron-core's (models/qwen3_vl/
mm_layout.py, what `mmrun convert` writes):

    text_decoder.decoder.layers.N.mlp.router.weight                          (E, h), replicated
    text_decoder.decoder.layers.N.mlp.experts.local_experts.k.linear_fc1.weight  (2 * moe_inter / TP, h)
    text_decoder.decoder.layers.N.mlp.experts.local_experts.k.linear_fc2.weight  (h, moe_inter / TP)

k numbered from 0 on each EP rank (EP rank r holds global experts r * E / EP + k).

Ranks (megatron-core's RankGenerator for the experts, order tp-ep-dp-pp, ETP = TP): inside a pipeline stage's
TP x DP ranks, rank = tp_rank + TP * (ep_rank + EP * edp_rank), so EP spans data-parallel ranks. The tokens travel
as megatron-core's allgather dispatcher sends them, over the expert-tensor-and-expert-parallel group (TP x EP ranks
of one stage and expert-data-parallel rank): models/qwen3_vl/moe.dispatch_allgather (the one dispatch; the router
on this rank's tokens, all-gather, this rank's experts on every token, reduce-scatter: the TP ranks' partial
linear_fc2 sums and the EP ranks' experts summed at once). megatron-core trains MoE under TP only with
--sequence-parallel (its MoELayer raises otherwise): each TP rank routes its own part of the sequence, and the
router's gradient is summed over TP like the norms'. Expert gradients are summed over the expert-data-parallel
group (ranks holding the same experts) with megatron-core's 1/DP scale; the gradient norm counts each expert once
(summed over the EP group before the model-parallel sum).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mmrun.backend.errors import UsageError
from mmrun.backend.mindspore import nn, ops
from mmrun.backend.mindspore.parallel.groups import Group, ParallelState
from mmrun.engines.base import ParallelLayout, rank_dir_name
from mmrun.engines.mindspore.parallel.vlm import _Weight
from mmrun.models.qwen3_vl import moe
from mmrun.models.transformer_blocks import activation
from mmrun.models.vlm import mm_layout


def expert_partitions(world_size: int, tp: int, pp: int, ep: int) -> dict[str, list[list[int]]]:
    """megatron-core's expert groups (ETP = TP, order tp-ep-dp-pp): "dispatch" (TP x EP ranks sharing a stage and
    an expert-data-parallel rank), "ep" (the EP ranks of one TP rank there), "edp" (the ranks holding the same
    experts)."""
    dp = world_size // (tp * pp)
    coords = {}
    for rank in range(world_size):
        inside, stage = rank % (tp * dp), rank // (tp * dp)
        coords[rank] = (inside % tp, (inside // tp) % ep, inside // (tp * ep), stage)  # tp, ep, edp, pp ranks
    keys = {"dispatch": lambda t, e, d, p: (d, p), "ep": lambda t, e, d, p: (t, d, p),
            "edp": lambda t, e, d, p: (t, e, p)}
    out = {}
    for kind, key in keys.items():
        groups: dict[tuple, list[int]] = {}
        for rank, c in coords.items():
            groups.setdefault(key(*c), []).append(rank)
        out[kind] = [g for _, g in sorted(groups.items())]
    return out


@dataclass(frozen=True)
class ExpertParallel:
    """This rank's place among the experts: EP size and rank, and its groups (backend distributed.subgroup)."""

    ep: int = 1
    ep_rank: int = 0
    dispatch: Any = None  # tokens: TP x EP ranks
    ep_group: Any = None  # the gradient norm's expert sum
    edp_group: Any = None  # expert gradients: ranks holding the same experts

    @classmethod
    def build(cls, ep: int, state: ParallelState) -> "ExpertParallel":
        """Every rank calls it (the groups are created by their members)."""
        tp, pp = state.tensor_model_parallel_size, state.pipeline_model_parallel_size
        if state.data_parallel_size % ep:
            raise UsageError(f"--expert-model-parallel-size {ep} does not divide the data-parallel size "
                             f"{state.data_parallel_size} (world {state.world_size} / (TP {tp} x PP {pp})): megatron-"
                             "core shares the experts out over data-parallel ranks; start TP x PP x EP x n processes")
        if tp > 1 and not state.sequence_parallel:
            raise UsageError(f"Qwen3-VL MoE with --tensor-model-parallel-size {tp} needs --sequence-parallel, as "
                             "megatron-core's MoE layer does (each TP rank routes its part of the sequence); add it")
        parts = expert_partitions(state.world_size, tp, pp, ep)
        if state.world_size == 1:
            one = Group((0,), 0, None)
            return cls(ep, 0, one, one, one)
        from mmrun.backend.mindspore import distributed

        made = {kind: distributed.subgroup(parts[kind]) for kind in ("dispatch", "ep", "edp")}
        return cls(ep, made["ep"].rank, made["dispatch"], made["ep"], made["edp"])


class _Expert(nn.Module):
    """One expert's linear_fc1 ([gate_r; up_r], this TP rank's rows) and linear_fc2 (its columns)."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.linear_fc1 = _Weight(2 * intermediate, hidden)
        self.linear_fc2 = _Weight(hidden, intermediate)


def _stacked(weights: list) -> Any:
    return ops.cat([ops.reshape(w, (1, *w.shape)) for w in weights], dim=0)


class SequentialExperts(moe.Experts):
    """megatron-core's SequentialMLP names (local_experts.k.linear_fc1 / fc2) around moe.Experts' computation: the
    fused (experts, rows, cols) tensors it reads are this rank's experts stacked."""

    def __init__(self, hidden: int, moe_config: Any, hidden_act: str, tp: int, ep: int, ep_rank: int) -> None:
        nn.Module.__init__(self)  # moe.Experts' own fused parameters are not made: these are per expert
        self.num_experts, self.intermediate = moe_config.num_experts // ep, moe_config.moe_intermediate_size // tp
        self.first = ep_rank * self.num_experts
        self.local_experts = nn.ModuleList([_Expert(hidden, self.intermediate) for _ in range(self.num_experts)])
        self.act = activation(hidden_act)

    @property
    def gate_up_proj(self):
        return _stacked([e.linear_fc1.weight for e in self.local_experts])

    @property
    def down_proj(self):
        return _stacked([e.linear_fc2.weight for e in self.local_experts])


class MoEMLP(nn.Module):
    """`mlp` of a sparse decoder layer on the parallel engine: x [s (/ TP with SP), b, h] -> the same shape."""

    def __init__(self, config: Any, state: ParallelState, experts: ExpertParallel) -> None:
        super().__init__()
        text = config.text
        self.router = moe.TopKRouter(text.hidden_size, text.moe)
        self.experts = SequentialExperts(text.hidden_size, text.moe, text.hidden_act,
                                         state.tensor_model_parallel_size, experts.ep, experts.ep_rank)
        self.group = experts.dispatch

    def forward(self, x):
        seq, batch, hidden = x.shape
        flat = ops.reshape(x, (seq * batch, hidden))
        _, weights, chosen = self.router(flat)
        if self.group.size == 1:
            out = self.experts(flat, chosen, weights)
        else:
            out = moe.dispatch_allgather(self.experts, self.group, flat, chosen, weights)
        return ops.reshape(out, (seq, batch, hidden))


def place_sparse_layers(stage: Any, experts: ExpertParallel) -> int:
    """Put MoEMLP in the stage's sparse decoder layers (global numbers stage.layers). Returns how many."""
    moe_config = stage.config.text.moe
    placed = 0
    for layer, index in zip(stage.text_decoder.decoder.layers, stage.layers):
        if moe_config is not None and moe_config.is_sparse(index):
            layer.mlp = MoEMLP(stage.config, stage.state, experts)
            placed += 1
    if placed:
        nn.refresh_parameter_names(stage)
    return placed


def own_experts(stage: Any, whole_rank_state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A (tp, pp) rank's state holding every expert (mm_layout's rank_state: global expert numbers) -> this EP
    rank's experts, numbered from 0 (the other EP ranks' are dropped)."""
    moe_config, experts = stage.config.text.moe, stage.experts
    if moe_config is None or experts.ep == 1:
        return whole_rank_state
    return mm_layout.keep_expert_rank(whole_rank_state, moe_config.num_experts, experts.ep, experts.ep_rank)


def expert_roles(stage: Any, names: set[str]) -> dict[str, Any]:
    """ParameterRoles' expert fields for the stage's trained parameters `names` (none with EP = 1)."""
    mine = frozenset(n for n in names if ".mlp.experts.local_experts." in n)
    if not mine or stage.experts.ep == 1:  # the experts' groups are the dense ones: nothing apart
        return {}
    return {"experts": mine, "expert_data_parallel": stage.experts.edp_group, "expert_parallel": stage.experts.ep_group}


@dataclass(frozen=True)
class ExpertLayout(ParallelLayout):
    """The trainer's view of a rank with expert parallelism: megatron-core's checkpoint directory per (TP, PP, EP)
    rank (`mp_rank_TT[_PPP]_EEE`, each holding its experts numbered from 0: what `mmrun convert` writes with
    --cfg.parallel_config.ep_size), written by the first rank of each expert-data-parallel group. EP rank =
    data-parallel rank mod EP (megatron-core's tp-ep-dp-pp order with ETP = TP)."""

    ep: int = 1
    ep_rank: int = 0

    @classmethod
    def of(cls, layout: ParallelLayout, ep: int) -> "ExpertLayout":
        return cls(**asdict(layout), ep=ep, ep_rank=layout.dp_rank % ep)

    @property
    def rank_dir(self) -> str:
        return rank_dir_name(self.tp_rank, self.pp_rank, self.pp, self.ep_rank if self.ep > 1 else None)

    @property
    def writes_checkpoint(self) -> bool:
        return self.dp_rank < self.ep and self.cp_rank == 0

    def describe(self) -> str:
        return super().describe() + (f", expert-parallel {self.ep}" if self.ep > 1 else "")

    def to_json(self) -> dict[str, int]:
        return {**super().to_json(), **({"ep": self.ep, "ep_rank": self.ep_rank} if self.ep > 1 else {})}
