"""megatron-core's GPTModel on MindSpore, tensor- and pipeline-parallel: one pipeline stage of it per process.

The same model as megatron-core 0.16's `GPTModel` with `get_gpt_layer_local_spec()` and mmrun's default
arguments (learned absolute positions, pre-LayerNorm blocks, GELU MLP, biases, tied embeddings), computed the
way megatron-core computes it: activations sequence-first [s, b, h], fused QKV with each head's q, k, v
together, scores scaled by 1/sqrt(head_dim) and masked with -10000 before the softmax, the output projections'
biases added with the residual ("bias-dropout-add"), the loss from vocab-parallel cross entropy. Parameter
names and shapes on every rank are megatron-core's `state_dict()` names and shards for that rank
(models/mcore_layout.py), so a rank's state dict loads into megatron-core's model and back.

    state = initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=1)
    model = GPTModel(GPTConfig(...), state)              # this rank's stage and shards
    model.load_state_dict(...)                           # or init_weights(model, seed, std)
    losses = model(tokens, position_ids, labels=labels)  # [b, s] per-token loss (last stage)

A stage that is not the first takes the previous stage's output as `hidden_in`; a stage that is not the last
returns its hidden states [s, b, h] for the next one. Training (schedule, gradients, optimizer) is
`mmrun.backend.mindspore.parallel.engine`'s; `build_engine(args)` below puts it all together.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from mmrun.backend.errors import UsageError
from mmrun.backend.mindspore import nn, ops
from mmrun.backend.mindspore.parallel.cross_entropy import VocabParallelCrossEntropy
from mmrun.backend.mindspore.parallel.engine import ParallelTrainStep, ParameterRoles
from mmrun.backend.mindspore.parallel.groups import ParallelState, initialize_model_parallel
from mmrun.engines.mindspore.parallel.optimizer import optimizer_and_step
from mmrun.backend.mindspore.parallel.layers import (ColumnParallelLinear, RowParallelLinear, ShardedDropout,
                                                     VocabParallelEmbedding)
from mmrun.backend.mindspore.parallel.mappings import ScatterToSequenceParallelRegion
from mmrun.engines.mindspore.parallel.rank_state import RankState
from mmrun.models.gpt import GPTConfig
from mmrun.models.mcore_layout import OUTPUT_LAYER, WORD_EMBEDDINGS, GPTLayout, LayoutError, causal_position_ids

# megatron-core's attention_mask_func fills masked scores with -10000.0, not -inf.
MASKED_SCORE = -10000.0


def layout_of(config: GPTConfig) -> GPTLayout:
    return GPTLayout(config.num_layers, config.hidden_size, config.num_attention_heads, config.ffn_hidden_size,
                     config.vocab_size, config.max_position_embeddings, config.untie_embeddings_and_output_weights)


def _hidden_dropout(config: GPTConfig, state: ParallelState) -> nn.Module:
    """Dropout on the residual stream [s, b, h]: replicated over TP (the same masks on every rank, drawn from
    the same generator), or split on the sequence with sequence parallelism."""
    if state.sequence_parallel:
        return ShardedDropout(config.hidden_dropout, config.dropout_impl, state, dim=0)
    return nn.Dropout(config.hidden_dropout, config.dropout_impl)


class LanguageModelEmbedding(nn.Module):
    """Word (vocab-parallel) plus position embeddings, turned sequence-first, scattered over the sequence with
    sequence parallelism."""

    def __init__(self, config: GPTConfig, state: ParallelState) -> None:
        super().__init__()
        self.word_embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size, state)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.sequence_parallel = state.sequence_parallel
        if self.sequence_parallel:
            self.scatter = ScatterToSequenceParallelRegion(state.group("tp"))
        self.dropout = _hidden_dropout(config, state)

    def forward(self, tokens, position_ids):
        embeddings = self.word_embeddings(tokens) + self.position_embeddings(position_ids)  # [b, s, h]
        embeddings = ops.transpose(embeddings, 0, 1)  # [s, b, h]
        if self.sequence_parallel:
            embeddings = self.scatter(embeddings)
        return self.dropout(embeddings)


class SelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, state: ParallelState) -> None:
        super().__init__()
        tp = state.tensor_model_parallel_size
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.heads_per_partition = config.num_attention_heads // tp
        self.scale = 1.0 / math.sqrt(self.head_dim)
        # [b, heads / tp, s, s]: split on the heads
        self.attention_dropout = ShardedDropout(config.attention_dropout, config.dropout_impl, state, dim=1)
        self.linear_qkv = ColumnParallelLinear(config.hidden_size, 3 * config.hidden_size, state)
        self.linear_proj = RowParallelLinear(config.hidden_size, config.hidden_size, state, skip_bias_add=True)

    def forward(self, x):
        qkv, _ = self.linear_qkv(x)  # [s, b, heads/tp * 3 * head_dim], per head [q k v]
        s, b = qkv.shape[0], qkv.shape[1]
        qkv = ops.reshape(qkv, (s, b, self.heads_per_partition, 3 * self.head_dim))
        q, k, v = ops.split(qkv, self.head_dim, dim=3)  # each [s, b, heads/tp, head_dim]
        scores = ops.matmul(ops.permute(q, (1, 2, 0, 3)), ops.permute(k, (1, 2, 3, 0))) * self.scale  # [b, n, s, s]
        scores = ops.masked_fill(scores, ops.causal_mask(s), MASKED_SCORE)
        probs = self.attention_dropout(ops.softmax(scores, dim=-1))
        context = ops.matmul(probs, ops.permute(v, (1, 2, 0, 3)))  # [b, n, s, head_dim]
        context = ops.reshape(ops.permute(context, (2, 0, 1, 3)), (s, b, self.heads_per_partition * self.head_dim))
        return self.linear_proj(context)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig, state: ParallelState) -> None:
        super().__init__()
        self.linear_fc1 = ColumnParallelLinear(config.hidden_size, config.ffn_hidden_size, state, skip_bias_add=True)
        self.linear_fc2 = RowParallelLinear(config.ffn_hidden_size, config.hidden_size, state, skip_bias_add=True)

    def forward(self, x):
        h, bias = self.linear_fc1(x)
        return self.linear_fc2(ops.gelu(h + bias))


class TransformerLayer(nn.Module):
    def __init__(self, config: GPTConfig, state: ParallelState) -> None:
        super().__init__()
        eps = config.layernorm_epsilon
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=eps)
        self.self_attention = SelfAttention(config, state)
        self.pre_mlp_layernorm = nn.LayerNorm(config.hidden_size, eps=eps)
        self.mlp = MLP(config, state)
        self.hidden_dropout = _hidden_dropout(config, state)

    def forward(self, x):
        out, bias = self.self_attention(self.input_layernorm(x))
        x = x + self.hidden_dropout(out + bias)  # megatron's bias-dropout-add: residual + dropout(out + bias)
        out, bias = self.mlp(self.pre_mlp_layernorm(x))
        return x + self.hidden_dropout(out + bias)


class TransformerBlock(nn.Module):
    def __init__(self, config: GPTConfig, state: ParallelState, num_layers: int, post_process: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList([TransformerLayer(config, state) for _ in range(num_layers)])
        self.post_process = post_process
        if post_process:
            self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        if self.post_process:
            x = self.final_layernorm(x)
        return x


class GPTModel(RankState, nn.Module):
    """This rank's pipeline stage of megatron-core's GPTModel, its tensor-parallel shard (rank_state_dict /
    load_rank_state_dict: megatron-core's state_dict() names on this rank)."""

    layout_error = LayoutError

    def __init__(self, config: GPTConfig, state: ParallelState) -> None:
        super().__init__()
        config = _recomputable_dropout(config, state)
        self.config, self.state = config, state
        self.layout = layout_of(config)
        pp, pp_rank = state.pipeline_model_parallel_size, state.pp_rank
        self.layout.check_parallel_sizes(state.tensor_model_parallel_size, pp)
        self.pre_process, self.post_process = state.is_first_stage, state.is_last_stage
        self.share_embeddings_and_output_weights = not config.untie_embeddings_and_output_weights
        if self.pre_process:
            self.embedding = LanguageModelEmbedding(config, state)
        self.decoder = TransformerBlock(config, state, len(self.layout.stage_layers(pp, pp_rank)), self.post_process)
        if self.post_process:
            # Tied on one stage: the output layer reads embedding.word_embeddings.weight (no parameter of its own).
            self.output_layer = ColumnParallelLinear(
                config.hidden_size, config.vocab_size, state, bias=False,
                skip_weight_param_allocation=self.pre_process and self.share_embeddings_and_output_weights)
            self.cross_entropy = VocabParallelCrossEntropy(config.vocab_size, state)
        self.uses_own_output_weight = self.post_process and not (
            self.pre_process and self.share_embeddings_and_output_weights)

    def forward(self, tokens, position_ids, hidden_in=None, labels=None):
        """First stage: tokens, position_ids [b, s]; later stages: hidden_in [s, b, h] from the previous one.
        Last stage: per-token loss [b, s] with labels [b, s], else logits [s, b, vocab / tp]; other stages:
        hidden states [s, b, h] (with sequence parallelism [s / tp, b, h])."""
        x = self.embedding(tokens, position_ids) if self.pre_process else hidden_in
        x = self.decoder(x)
        if not self.post_process:
            return x
        weight = self.output_layer.weight if self.uses_own_output_weight else self.embedding.word_embeddings.weight
        logits, _ = self.output_layer(x, weight)
        if labels is None:
            return logits
        loss = self.cross_entropy(logits, ops.transpose(labels, 0, 1))  # [s, b]
        return ops.transpose(loss, 0, 1)

    # ------------------------------------------------------------------ what the engine needs to know

    def parameter_roles(self) -> ParameterRoles:
        """Which parameters are split over TP, see a part of the sequence, or are the tied embeddings' copies."""
        names = [name for name, _ in self.named_parameters()]
        tp_split = frozenset(n for n in names if self.layout.partition_dim(n) is not None)
        sequence = frozenset(n for n in names if self.state.sequence_parallel and self.layout.is_sequence_parallel(n))
        tied = None
        if self.share_embeddings_and_output_weights and self.state.pipeline_model_parallel_size > 1:
            tied = WORD_EMBEDDINGS if self.pre_process else OUTPUT_LAYER if self.post_process else None
        return ParameterRoles(tensor_parallel=tp_split, sequence_parallel=sequence, tied_embedding=tied,
                              shared_copy=OUTPUT_LAYER if tied == OUTPUT_LAYER else None)

    def dropout_draws(self) -> tuple[int, int]:
        """Dropout generator draws of one micro-batch's forward in training: (those of the stages before this
        one, those of the whole model). The engine starts each micro-batch's forward at the offset one process
        would have reached, so every TP/PP split draws the same masks (and a recomputed forward the same again)."""
        c = self.config
        embedding = int(c.hidden_dropout > 0)
        per_layer = int(c.attention_dropout > 0) + 2 * int(c.hidden_dropout > 0)
        before = 0 if self.pre_process else embedding + self.layout.stage_layers(
            self.state.pipeline_model_parallel_size, self.state.pp_rank).start * per_layer
        return before, embedding + c.num_layers * per_layer


def _recomputable_dropout(config: GPTConfig, state: ParallelState) -> GPTConfig:
    """Pipeline stages recompute their forward for the backward, which must draw the same dropout masks: only
    the hash dropout (backend/dropout_hash.py) can be replayed; "auto" picks it there, "native" is refused."""
    from mmrun.backend.dropout_hash import resolve_impl
    from mmrun.backend.mindspore import device

    dropout = config.hidden_dropout > 0 or config.attention_dropout > 0
    if state.pipeline_model_parallel_size == 1 or not dropout:
        return config
    if resolve_impl(config.dropout_impl, device.detect().kind) == "hash":
        return config
    if config.dropout_impl == "native":
        raise UsageError("--dropout-impl native cannot run with --pipeline-model-parallel-size > 1: pipeline stages "
                         "recompute their forward and native dropout cannot draw the same masks again; use "
                         "--dropout-impl hash (or auto), or dropout 0")
    return dataclasses.replace(config, dropout_impl="hash")


def init_weights(model: GPTModel, seed: int, init_method_std: float) -> None:
    """mmrun's GPT initial weights drawn with numpy from `seed` (models/gpt_names.py), this rank's shard of them:
    the same model for any TP/PP split, and the weights the PyTorch megatron-core engine starts from."""
    state = model.state
    model.load_rank_state_dict(model.layout.init_rank(seed, init_method_std, state.tensor_model_parallel_size,
                                                      state.pipeline_model_parallel_size, state.tp_rank,
                                                      state.pp_rank))


def build_engine(args: Any, jit: bool | None = None) -> ParallelTrainStep:
    """The model of this rank, its AdamW and its train step, from Megatron's arguments (as parsed by
    mmrun.training.arguments): sizes, --tensor/--pipeline-model-parallel-size, --sequence-parallel, --seed,
    --init-method-std, --lr, --adam-beta1/2, --adam-eps, --weight-decay, --clip-grad. Call after
    mmrun.backend.init_distributed()."""

    tp = int(getattr(args, "tensor_model_parallel_size", 1) or 1)
    pp = int(getattr(args, "pipeline_model_parallel_size", 1) or 1)
    state = initialize_model_parallel(tp, pp, bool(getattr(args, "sequence_parallel", False)))
    config = GPTConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=args.num_attention_heads,
        ffn_hidden_size=args.ffn_hidden_size, vocab_size=args.padded_vocab_size,
        max_position_embeddings=args.max_position_embeddings, seq_length=args.seq_length,
        hidden_dropout=args.hidden_dropout, attention_dropout=args.attention_dropout,
        layernorm_epsilon=args.norm_epsilon, init_method_std=args.init_method_std,
        untie_embeddings_and_output_weights=args.untie_embeddings_and_output_weights,
        dropout_impl=getattr(args, "dropout_impl", "auto"))
    model = GPTModel(config, state)
    init_weights(model, args.seed, args.init_method_std)
    return optimizer_and_step(args, model, state, clip_grad=args.clip_grad, jit=jit)


__all__ = ["GPTModel", "GPTConfig", "build_engine", "causal_position_ids", "init_weights", "layout_of"]
