"""Qwen3-VL MoE (Qwen3-VL-30B-A3B / 235B-A22B): the text decoder's sparse blocks, on the portable API.

The MoE variant is dense Qwen3-VL (models/qwen3_vl/modeling.py: the same ViT, DeepStack, attention and M-RoPE)
with `config.text.moe` set (configuration.MoeConfig); decoder layer i has `mlp = SparseMoeBlock` when
`moe.is_sparse(i)` (decoder_sparse_step, mlp_only_layers), else the dense SwiGLU MLP. Parameter names and shapes
are transformers' Qwen3VLMoeForConditionalGeneration checkpoint keys:

    model.language_model.layers.N.mlp.gate.weight                (num_experts, hidden)            the router
    model.language_model.layers.N.mlp.experts.gate_up_proj       (num_experts, 2 * moe_intermediate, hidden)
    model.language_model.layers.N.mlp.experts.down_proj          (num_experts, hidden, moe_intermediate)

gate_up_proj holds each expert's gate rows then its up rows (transformers' `.chunk(2, dim=-1)`).

Routing, as transformers' Qwen3VLMoeTextTopKRouter: logits = x @ gate.T (in fp32 when router_gating_in_fp32),
softmax in fp32, the top-k experts per token, their probabilities renormalised to sum 1 (norm_topk_prob) and
cast to the hidden dtype. The choice of experts carries no gradient, so it is made on the host (numpy, stable
order: the same experts on both frameworks, one device-to-host copy of the probabilities per layer, as
transformers' own loop syncs on `nonzero`); the chosen probabilities are gathered on the device, so the router
gets its gradient through them. The experts: tokens gathered in expert order (one gather), the SwiGLU of every
expert on its rows by `ops.grouped_linear` (torch's grouped GEMM where it serves, else one linear per expert),
the rows back to (token, k) order (one gather), summed with their weights.

The load-balancing loss (`load_balancing_loss`) is transformers' load_balancing_loss_func: over all sparse
layers together, num_experts x sum_e (share of top-k assignments to e) x (mean router probability of e), padding
rows left out by the attention mask; the model adds router_aux_loss_coef x it to the loss when
output_router_logits is set.

Expert parallelism (`--expert-model-parallel-size`, models/pretrain_vlm.py): `shard_experts` keeps each rank's
num_experts / EP experts (megatron-core's numbering) and `dispatch_allgather` moves the tokens as megatron-core's
allgather token dispatcher (see SparseMoeBlock); `ExpertShards` joins / splits the experts of a checkpoint.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from mmrun.backend import nn, ops, tensors
from mmrun.models.qwen3_vl.configuration import MoeConfig, TextConfig
from mmrun.models.transformer_blocks import activation


def _fp32(x):
    return x if x.dtype == tensors.float32 else tensors.cast(x, "float32")


def top_k(probs: np.ndarray, k: int) -> np.ndarray:
    """(tokens, k) int64: each row's k largest entries, largest first (ties: the lower index first)."""
    return np.argsort(-probs, axis=-1, kind="stable")[:, :k].astype(np.int64)


def gather_columns(values, columns: np.ndarray):
    """values (T, E) -> (T, K): values[t, columns[t, k]], by one gather (differentiable in values)."""
    rows, width = values.shape
    flat = (np.arange(rows, dtype=np.int64)[:, None] * width + columns).reshape(-1)
    picked = ops.embedding(tensors.from_numpy(flat), ops.reshape(values, (rows * width, 1)))
    return ops.reshape(picked, columns.shape)


class TopKRouter(nn.Module):
    """forward(x (T, H)) -> (router logits (T, E), top-k weights (T, K) in x's dtype, top-k experts (T, K) numpy)."""

    def __init__(self, hidden_size: int, moe: MoeConfig) -> None:
        super().__init__()
        self.moe = moe
        self.weight = nn.Parameter(ops.zeros((moe.num_experts, hidden_size)))

    def forward(self, x):
        if self.moe.router_gating_in_fp32:
            logits = ops.linear(_fp32(x), _fp32(self.weight))
        else:
            logits = ops.linear(x, self.weight)
        probs = ops.softmax(_fp32(logits), dim=-1)
        experts = top_k(tensors.to_numpy(probs), self.moe.num_experts_per_tok)
        weights = gather_columns(probs, experts)
        if self.moe.norm_topk_prob:
            weights = weights / ops.reshape(ops.sum(weights, dim=-1), (-1, 1))
        return logits, tensors.cast(weights, x.dtype) if weights.dtype != x.dtype else weights, experts


class Experts(nn.Module):
    """num_experts SwiGLU MLPs in two fused tensors (transformers' layout, see the module docstring).
    forward(x (T, H), experts (T, K) numpy, weights (T, K)) -> (T, H): sum_k weights[t, k] * expert_{experts[t, k]}(x[t])."""

    def __init__(self, hidden_size: int, moe: MoeConfig, hidden_act: str) -> None:
        super().__init__()
        self.num_experts, self.intermediate = moe.num_experts, moe.moe_intermediate_size  # experts held here
        self.first = 0  # the global number of local expert 0 (keep_local)
        self.gate_up_proj = nn.Parameter(ops.zeros((moe.num_experts, 2 * moe.moe_intermediate_size, hidden_size)))
        self.down_proj = nn.Parameter(ops.zeros((moe.num_experts, hidden_size, moe.moe_intermediate_size)))
        self.act = activation(hidden_act)

    def forward(self, x, experts: np.ndarray, weights):
        tokens, k = experts.shape
        flat = experts.reshape(-1) - self.first  # this rank's local expert numbers (megatron-core's numbering)
        mine = np.flatnonzero((flat >= 0) & (flat < self.num_experts))
        order = mine[np.argsort(flat[mine], kind="stable")]  # this rank's assignments grouped by expert
        if order.size == 0:  # no token chose one of this rank's experts (expert parallelism)
            return ops.zeros((tokens, x.shape[-1]), dtype=x.dtype, like=x)
        counts = np.bincount(flat[order], minlength=self.num_experts)
        rows = ops.embedding(tensors.from_numpy((order // k).astype(np.int64)), x)  # (N, H), expert order
        gate, up = ops.split(ops.grouped_linear(rows, self.gate_up_proj, counts), [self.intermediate] * 2, dim=-1)
        done = ops.grouped_linear(self.act(gate) * up, self.down_proj, counts)
        position = np.full(flat.size, order.size, np.int64)  # (token, k) -> its row of done; other ranks' experts:
        position[order] = np.arange(order.size)  # the zero row appended below
        if order.size < flat.size:
            done = ops.cat([done, ops.zeros((1, done.shape[-1]), dtype=done.dtype, like=done)])
        back = ops.embedding(tensors.from_numpy(position), done)  # (token, k) order
        weighted = ops.reshape(back, (tokens, k, -1)) * ops.reshape(weights, (tokens, k, 1))
        return ops.sum(weighted, dim=1)

    def keep_local(self, size: int, rank: int) -> None:
        """Expert parallelism: keep experts [rank * E / size, (rank + 1) * E / size) of the fused tensors (megatron-
        core's split: local expert j of EP rank r is global expert r * E / size + j); the others live on the other
        ranks of the expert-parallel group."""
        local = self.num_experts // size
        self.first = rank * local
        for name in ("gate_up_proj", "down_proj"):
            whole = tensors.to_numpy(getattr(self, name))
            setattr(self, name, nn.Parameter(tensors.from_numpy(np.ascontiguousarray(whole[self.first:self.first + local]))))
        self.num_experts = local


class SparseMoeBlock(nn.Module):
    """`mlp` of a sparse decoder layer: forward(x (B, S, H), router_logits=None) -> (B, S, H); the layer's router
    logits (B*S, E) are appended to `router_logits` when a list is given (for the load-balancing loss).

    With expert parallelism (`shard_experts`) the experts are those of this rank, and the tokens are dispatched as
    megatron-core's `allgather` token dispatcher does: the router runs on this rank's tokens; the tokens, their
    top-k weights and experts are gathered over the expert-parallel group (padded to the group's longest); each
    rank runs its experts on every gathered token that chose one (others: zero rows); the weighted outputs are
    summed over the group and each rank keeps its own rows (a reduce-scatter). The backward of the gather sums
    the gradients over the group, that of the reduce-scatter gathers them (backend distributed.gather_rows /
    reduce_scatter_rows): the same numbers as one process holding every expert."""

    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.experts = Experts(config.hidden_size, config.moe, config.hidden_act)
        self.gate = TopKRouter(config.hidden_size, config.moe)
        self.group: Any = None  # the expert-parallel group (backend distributed.subgroup), None: every expert here

    def forward(self, x, router_logits: list | None = None):
        batch, seq, hidden = x.shape
        flat = ops.reshape(x, (batch * seq, hidden))
        logits, weights, experts = self.gate(flat)
        if router_logits is not None:
            router_logits.append(logits)
        if self.group is None or self.group.size == 1:
            return ops.reshape(self.experts(flat, experts, weights), (batch, seq, hidden))
        return ops.reshape(dispatch_allgather(self.experts, self.group, flat, experts, weights), (batch, seq, hidden))


def dispatch_allgather(experts_module: Any, group: Any, x, experts: np.ndarray, weights):
    """megatron-core's allgather token dispatch over `group` (see SparseMoeBlock): x (T, H) this rank's tokens,
    experts (T, K) numpy, weights (T, K) -> (T, H), this rank's tokens after every expert of the group."""
    from mmrun.backend import distributed

    tokens = experts.shape[0]
    counts = group_counts(group, tokens)
    longest = max(counts)
    pad = longest - tokens
    if pad:
        x = ops.pad(x, (0, 0, 0, pad))
        weights = ops.pad(weights, (0, 0, 0, pad))
    padded = np.full((longest, experts.shape[1]), -1, np.int64)  # padding rows choose no expert
    padded[:tokens] = experts
    every = tensors.to_numpy(distributed.group_all_reduce(tensors.from_numpy(
        _own_slot(padded, group).astype(np.float32)), group)).astype(np.int64)  # exact: small integers
    out = experts_module(distributed.gather_rows(x, group), every.reshape(-1, experts.shape[1]),
                         distributed.gather_rows(weights, group))
    mine = distributed.reduce_scatter_rows(out, group)
    return ops.split(mine, [tokens, pad], dim=0)[0] if pad else mine


def _own_slot(values: np.ndarray, group: Any) -> np.ndarray:
    """(size * rows, ...) zeros with `values` in this rank's slot: summed over the group, every rank's values."""
    out = np.zeros((group.size * values.shape[0], *values.shape[1:]), values.dtype)
    out[group.rank * values.shape[0]:(group.rank + 1) * values.shape[0]] = values
    return out


def group_counts(group: Any, tokens: int) -> list[int]:
    """Every group member's token count, in group order (one small all-reduce)."""
    from mmrun.backend import distributed

    mine = np.zeros(group.size, np.float32)
    mine[group.rank] = tokens
    return [int(n) for n in tensors.to_numpy(distributed.group_all_reduce(tensors.from_numpy(mine), group))]


def shard_experts(model: Any, group: Any) -> int:
    """Expert parallelism over `group` (backend distributed.subgroup): every sparse block of `model` keeps its
    share of the experts (Experts.keep_local) and dispatches over the group. Returns the experts kept per layer."""
    kept = 0
    for layer in model.model.language_model.layers:
        if isinstance(layer.mlp, SparseMoeBlock):
            layer.mlp.experts.keep_local(group.size, group.rank)
            layer.mlp.group = group
            kept = layer.mlp.experts.num_experts
    nn.refresh_parameter_names(model)  # MindSpore names a Parameter once: the new local ones get their paths
    return kept


class ExpertShards:
    """A checkpoint of an expert-parallel run holds every expert (transformers' fused layout, global numbering: the
    one-process checkpoint's tensors): `gather` joins the EP group's local experts of a state (model or optimizer
    tensors, numpy) before a save, `take` keeps this rank's experts of a whole state on load. So a checkpoint
    resumes with any --expert-model-parallel-size that divides the experts (EP=1 included)."""

    def __init__(self, group: Any, names: Sequence[str]) -> None:
        self.group, self.names = group, tuple(sorted(names))

    def _held(self, key: str) -> bool:
        return any(key == name or key.startswith(name + ".") for name in self.names)

    def gather(self, state: dict) -> dict:
        """Every rank of the group calls it with the same keys (a collective per expert tensor)."""
        from mmrun.backend import distributed

        return {key: tensors.to_numpy(distributed.gather_rows(tensors.from_numpy(np.ascontiguousarray(value)),
                                                              self.group)) if self._held(key) else value
                for key, value in sorted(state.items())}

    def take(self, state: dict) -> dict:
        out = {}
        for key, value in state.items():
            if self._held(key):
                local = value.shape[0] // self.group.size
                value = value[self.group.rank * local:(self.group.rank + 1) * local]
            out[key] = value
        return out

    def whole_shape(self, key: str, shape: tuple) -> tuple:
        return (shape[0] * self.group.size, *shape[1:]) if self._held(key) else shape


def load_balancing_loss(router_logits: Sequence[Any], moe: MoeConfig, attention_mask: Any = None):
    """transformers' load_balancing_loss_func over every sparse layer's logits (B*S, E): a scalar fp32 tensor.
    attention_mask (B, S) (tensor or numpy, 1 = token) leaves padding rows out."""
    from mmrun.models.vlm.blocks import host_array

    experts, k = moe.num_experts, moe.num_experts_per_tok
    mask = host_array(attention_mask)
    mask = None if mask is None else mask.reshape(-1).astype(np.float32)
    assigned = np.zeros(experts, np.float64)
    prob_sum, rows = None, 0.0
    for logits in router_logits:
        probs = _fp32(ops.softmax(logits, dim=-1))  # in the logits' dtype, then fp32, as transformers
        chosen = top_k(tensors.to_numpy(probs), k)
        if mask is None:
            assigned += np.bincount(chosen.reshape(-1), minlength=experts)
            layer_sum, rows = ops.sum(probs, dim=0), rows + probs.shape[0]
        else:
            assigned += np.bincount(chosen.reshape(-1), weights=np.repeat(mask, k), minlength=experts)
            layer_sum = ops.sum(probs * ops.reshape(tensors.from_numpy(mask), (-1, 1)), dim=0)
            rows += float(mask.sum())
        prob_sum = layer_sum if prob_sum is None else prob_sum + layer_sum
    share = tensors.from_numpy((assigned / rows).astype(np.float32))
    return ops.sum(share * (prob_sum / rows)) * experts


def add_aux_loss(loss_dict: dict, router_logits: Sequence[Any], moe: MoeConfig, attention_mask: Any = None) -> dict:
    """loss_dict (causal_lm_loss's) with router_aux_loss_coef x the load-balancing loss added to "loss" (times
    num_tokens for a per-token sum, so the mean the trainer takes is transformers' loss) and kept as "aux_loss"."""
    aux = load_balancing_loss(router_logits, moe, attention_mask)
    scale = moe.router_aux_loss_coef
    if "num_tokens" in loss_dict:
        added = aux * tensors.cast(loss_dict["num_tokens"], "float32") * scale
    else:
        added = aux * scale
    return {**loss_dict, "loss": loss_dict["loss"] + added, "aux_loss": aux}
