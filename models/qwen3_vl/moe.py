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
        self.num_experts, self.intermediate = moe.num_experts, moe.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(ops.zeros((moe.num_experts, 2 * moe.moe_intermediate_size, hidden_size)))
        self.down_proj = nn.Parameter(ops.zeros((moe.num_experts, hidden_size, moe.moe_intermediate_size)))
        self.act = activation(hidden_act)

    def forward(self, x, experts: np.ndarray, weights):
        tokens, k = experts.shape
        flat = experts.reshape(-1)
        order = np.argsort(flat, kind="stable")  # assignments grouped by expert
        counts = np.bincount(flat, minlength=self.num_experts)
        rows = ops.embedding(tensors.from_numpy((order // k).astype(np.int64)), x)  # (T*K, H), expert order
        gate, up = ops.split(ops.grouped_linear(rows, self.gate_up_proj, counts), [self.intermediate] * 2, dim=-1)
        done = ops.grouped_linear(self.act(gate) * up, self.down_proj, counts)
        back = ops.embedding(tensors.from_numpy(np.argsort(order).astype(np.int64)), done)  # (token, k) order
        weighted = ops.reshape(back, (tokens, k, -1)) * ops.reshape(weights, (tokens, k, 1))
        return ops.sum(weighted, dim=1)


class SparseMoeBlock(nn.Module):
    """`mlp` of a sparse decoder layer: forward(x (B, S, H), router_logits=None) -> (B, S, H); the layer's router
    logits (B*S, E) are appended to `router_logits` when a list is given (for the load-balancing loss)."""

    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.experts = Experts(config.hidden_size, config.moe, config.hidden_act)
        self.gate = TopKRouter(config.hidden_size, config.moe)

    def forward(self, x, router_logits: list | None = None):
        batch, seq, hidden = x.shape
        flat = ops.reshape(x, (batch * seq, hidden))
        logits, weights, experts = self.gate(flat)
        if router_logits is not None:
            router_logits.append(logits)
        return ops.reshape(self.experts(flat, experts, weights), (batch, seq, hidden))


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
