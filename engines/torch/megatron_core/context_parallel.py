"""Context-parallel attention for megatron-core's local layer spec (all-gather of keys and values).

megatron-core splits each sequence over the context-parallel ranks before the model (Megatron's
get_batch_on_this_cp_rank: 2 x cp chunks, rank r keeps chunks r and 2 x cp - 1 - r so causal work is
balanced) and reduces gradients over data x context ranks; only attention needs the other ranks' tokens.
Its local DotProductAttention refuses context parallelism ("only supported by TEDotProductAttention"),
and Transformer Engine runs only on NVIDIA GPUs. This module is the missing piece, following Transformer
Engine's `cp_comm_type="all_gather"` algorithm: every rank gathers the keys and values of the whole
sequence (megatron-core's own gather_from_sequence_parallel_region over the context-parallel group:
all-gather forward, reduce-scatter backward) and attends its queries to them under the causal mask of
their true positions. Softmax in fp32, dropout in the tensor-parallel RNG stream, as DotProductAttention.

Memory: keys and values of the whole sequence on every rank (TE's ring variant avoids that; this one is
for correctness on CPU and where TE is absent). Multi-head attention only (mmrun's GPT).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.transformer.module import MegatronModule


def chunk_positions(seq_per_rank: int, cp: int, rank: int) -> torch.Tensor:
    """The true positions of one context-parallel rank's tokens (its two chunks of Megatron's split)."""
    chunk = seq_per_rank // 2
    first, second = rank, 2 * cp - 1 - rank
    return torch.cat([torch.arange(first * chunk, (first + 1) * chunk),
                      torch.arange(second * chunk, (second + 1) * chunk)])


class ContextParallelAttention(MegatronModule):
    """Drop-in core_attention for SelfAttention (DotProductAttention's constructor and forward)."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection: Any = None) -> None:
        super().__init__(config=config)
        tp = parallel_state.get_tensor_model_parallel_world_size()
        if config.num_query_groups not in (None, config.num_attention_heads):
            raise ValueError("ContextParallelAttention computes multi-head attention (mmrun's GPT); grouped-query "
                             f"attention was asked for. Received: {config.num_query_groups} query groups")
        self.heads = config.num_attention_heads // tp
        self.head_dim = config.kv_channels
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.dropout = torch.nn.Dropout(config.attention_dropout if attention_dropout is None else attention_dropout)
        self.cp_group = parallel_state.get_context_parallel_group()
        self.cp = parallel_state.get_context_parallel_world_size()
        self.cp_rank = parallel_state.get_context_parallel_rank()

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                attn_mask_type: Any = None, attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
        """query/key/value [s/cp, b, heads, head_dim] (this rank's tokens) -> context [s/cp, b, heads x head_dim]."""
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("ContextParallelAttention takes neither packed sequences nor an attention bias")
        local = query.size(0)
        # [s, b, h, d] in rank order: rank 0's two chunks, rank 1's, ...
        key = tensor_parallel.gather_from_sequence_parallel_region(key, True, group=self.cp_group)
        value = tensor_parallel.gather_from_sequence_parallel_region(value, True, group=self.cp_group)
        q_pos = chunk_positions(local, self.cp, self.cp_rank).to(query.device)
        kv_pos = torch.cat([chunk_positions(local, self.cp, r) for r in range(self.cp)]).to(query.device)
        masked = kv_pos.unsqueeze(0) > q_pos.unsqueeze(1)  # [sq, sk]: keys after the query
        q = query.permute(1, 2, 0, 3)  # [b, h, sq, d]
        k = key.permute(1, 2, 3, 0)  # [b, h, d, sk]
        scores = torch.matmul(q, k).float() * self.softmax_scale
        scores = scores.masked_fill(masked, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(query.dtype)
        if not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                probs = self.dropout(probs)
        else:
            probs = self.dropout(probs)
        context = torch.matmul(probs, value.permute(1, 2, 0, 3))  # [b, h, sq, d]
        return context.permute(2, 0, 1, 3).reshape(local, query.size(1), self.heads * self.head_dim)
