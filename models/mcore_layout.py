"""megatron-core GPTModel's parameters, framework-free: names, shapes, tensor-parallel shards, pipeline stages.

The tiny GPT of mmrun's default arguments, as megatron-core 0.16's `GPTModel` with `get_gpt_layer_local_spec()`
builds it (learned absolute positions, LayerNorm, GELU MLP, biases), names exactly as its `state_dict()`:

    embedding.word_embeddings.weight              (vocab, hidden)        split on dim 0 over TP
    embedding.position_embeddings.weight          (max_positions, hidden)
    decoder.layers.N.input_layernorm.{weight,bias}
    decoder.layers.N.self_attention.linear_qkv.{weight,bias}   (3 * hidden, hidden): per head [q_h k_h v_h], dim 0
    decoder.layers.N.self_attention.linear_proj.weight         (hidden, hidden): dim 1 (bias replicated)
    decoder.layers.N.pre_mlp_layernorm.{weight,bias}
    decoder.layers.N.mlp.linear_fc1.{weight,bias}              (ffn, hidden): dim 0
    decoder.layers.N.mlp.linear_fc2.weight                     (hidden, ffn): dim 1 (bias replicated)
    decoder.final_layernorm.{weight,bias}
    output_layer.weight                           (vocab, hidden), dim 0: untied, or the last stage's copy of the
                                                  word embeddings when they are tied and the pipeline has 2+ stages

megatron-core's fused QKV keeps each head's q, k and v rows together, so an even split of dim 0 over TP ranks
gives each rank whole heads, as megatron-core's ColumnParallelLinear does. Pipeline stages hold
`num_layers / pp` consecutive layers, numbered from 0 on every stage (megatron-core's `state_dict()` names on a
stage are local; `global_layer_name` maps back). The `_extra_state` entries megatron-core also puts in its
state dict are None for this spec and are not parameters: they are left out.

Used by the MindSpore tensor/pipeline-parallel engine to build its layers and by its parity tests on both
frameworks. Shards, joins and initial weights are models/gpt_names.py's (the checkpoint converter's), so the
MindSpore engine starts from the weights the PyTorch megatron-core engine starts from. numpy only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np

from mmrun.models import gpt_names as cg

WORD_EMBEDDINGS = "embedding.word_embeddings.weight"
POSITION_EMBEDDINGS = "embedding.position_embeddings.weight"
OUTPUT_LAYER = "output_layer.weight"
FINAL_LAYERNORM = "decoder.final_layernorm"
LAYER_PREFIX = "decoder.layers."

# Per-layer parameters in megatron-core's state_dict order: suffix -> shape in terms of hidden h and ffn f (the
# dim tensor parallelism splits is gpt_names' table).
_LAYER_PARAMS: dict[str, str] = {
    "input_layernorm.weight": "h",
    "input_layernorm.bias": "h",
    "self_attention.linear_proj.weight": "h,h",
    "self_attention.linear_proj.bias": "h",
    "self_attention.linear_qkv.weight": "3h,h",
    "self_attention.linear_qkv.bias": "3h",
    "pre_mlp_layernorm.weight": "h",
    "pre_mlp_layernorm.bias": "h",
    "mlp.linear_fc1.weight": "f,h",
    "mlp.linear_fc1.bias": "f",
    "mlp.linear_fc2.weight": "h,f",
    "mlp.linear_fc2.bias": "h",
}
_LAYER_NAME = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


class LayoutError(ValueError):
    """Sizes that megatron-core's partitioning cannot split, or a state that does not fit the layout."""

    exit_code = 2


@dataclass(frozen=True)
class GPTLayout:
    """The parameter layout of one megatron-core GPTModel (sizes as in Megatron's arguments)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int  # padded (Megatron's padded_vocab_size)
    max_position_embeddings: int
    untie_embeddings_and_output_weights: bool = False

    # ---------------------------------------------------------------- names and shapes of the full model

    def _dims(self) -> dict[str, int]:
        return {"h": self.hidden_size, "3h": 3 * self.hidden_size, "f": self.ffn_hidden_size}

    def full_shapes(self) -> dict[str, tuple[int, ...]]:
        """name -> shape of the whole model (TP=1, PP=1), in megatron-core's state_dict order."""
        dims = self._dims()
        shapes = {WORD_EMBEDDINGS: (self.vocab_size, self.hidden_size),
                  POSITION_EMBEDDINGS: (self.max_position_embeddings, self.hidden_size)}
        for layer in range(self.num_layers):
            for suffix, shape in _LAYER_PARAMS.items():
                shapes[f"{LAYER_PREFIX}{layer}.{suffix}"] = tuple(dims[d] for d in shape.split(","))
        shapes[f"{FINAL_LAYERNORM}.weight"] = (self.hidden_size,)
        shapes[f"{FINAL_LAYERNORM}.bias"] = (self.hidden_size,)
        if self.untie_embeddings_and_output_weights:
            shapes[OUTPUT_LAYER] = (self.vocab_size, self.hidden_size)
        return shapes

    # ---------------------------------------------------------------- tensor parallelism

    @staticmethod
    def partition_dim(name: str) -> int | None:
        """The dim megatron-core splits `name` on over tensor-parallel ranks; None when every rank holds it whole."""
        return cg.tp_partition_dim(name)

    @staticmethod
    def is_sequence_parallel(name: str) -> bool:
        """With --sequence-parallel these replicated parameters see only this rank's part of the sequence, so
        megatron-core sums their gradients over the TP group (its `sequence_parallel` parameter attribute):
        the LayerNorms and the biases of the row-parallel layers."""
        return ("layernorm" in name) or name.endswith(("linear_proj.bias", "linear_fc2.bias"))

    def check_parallel_sizes(self, tp: int, pp: int) -> None:
        """One-line LayoutError unless megatron-core can split this model over `tp` x `pp` ranks."""
        needs = {"--num-attention-heads": (self.num_attention_heads, tp, "tensor"),
                 "--ffn-hidden-size": (self.ffn_hidden_size, tp, "tensor"),
                 "the padded vocabulary size": (self.vocab_size, tp, "tensor"),
                 "--num-layers": (self.num_layers, pp, "pipeline")}
        for what, (value, size, kind) in needs.items():
            if size < 1 or value % size:
                raise LayoutError(f"{what} ({value}) must be divisible by the {kind}-model-parallel size ({size}); "
                                  f"change one of them")

    # ---------------------------------------------------------------- pipeline stages

    def stage_layers(self, pp: int, pp_rank: int) -> range:
        """Global numbers of the layers stage `pp_rank` holds: an even split, as megatron-core's default."""
        per_stage = self.num_layers // pp
        return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)

    def stage_holds_output_layer(self, pp: int, pp_rank: int) -> bool:
        """The last stage holds output_layer.weight: untied, or a tied copy of the word embeddings when pp > 1."""
        return pp_rank == pp - 1 and (self.untie_embeddings_and_output_weights or pp > 1)

    def global_layer_name(self, local_name: str, pp: int, pp_rank: int) -> str:
        """A stage's local name (decoder.layers.0...) -> the whole model's name (decoder.layers.<offset>...)."""
        match = _LAYER_NAME.match(local_name)
        if not match:
            return local_name
        return f"{LAYER_PREFIX}{int(match.group(1)) + self.stage_layers(pp, pp_rank).start}.{match.group(2)}"

    def _rank_sources(self, pp: int, pp_rank: int) -> Iterator[tuple[str, str]]:
        """(name on the rank, name in the full model) for every parameter stage `pp_rank` holds."""
        first, last = pp_rank == 0, pp_rank == pp - 1
        if first:
            yield WORD_EMBEDDINGS, WORD_EMBEDDINGS
            yield POSITION_EMBEDDINGS, POSITION_EMBEDDINGS
        layers = self.stage_layers(pp, pp_rank)
        for local, layer in enumerate(layers):
            for suffix in _LAYER_PARAMS:
                yield f"{LAYER_PREFIX}{local}.{suffix}", f"{LAYER_PREFIX}{layer}.{suffix}"
        if last:
            yield f"{FINAL_LAYERNORM}.weight", f"{FINAL_LAYERNORM}.weight"
            yield f"{FINAL_LAYERNORM}.bias", f"{FINAL_LAYERNORM}.bias"
            if self.stage_holds_output_layer(pp, pp_rank):
                # Tied: megatron-core's last stage starts its copy from the first stage's word embeddings.
                yield OUTPUT_LAYER, OUTPUT_LAYER if self.untie_embeddings_and_output_weights else WORD_EMBEDDINGS

    def rank_shapes(self, tp: int, pp: int, pp_rank: int) -> dict[str, tuple[int, ...]]:
        """name -> shape of the parameters one (tensor, pipeline) rank holds, as megatron-core names them there."""
        self.check_parallel_sizes(tp, pp)
        full = self.full_shapes()
        full.setdefault(OUTPUT_LAYER, full[WORD_EMBEDDINGS])
        shapes = {}
        for name, source in self._rank_sources(pp, pp_rank):
            shape = list(full[source])
            dim = self.partition_dim(name)
            if dim is not None:
                shape[dim] //= tp
            shapes[name] = tuple(shape)
        return shapes

    # Shards, joins and initial weights are models/gpt_names.py's (the checkpoint converter's): one copy.

    def _shape(self) -> "cg.GPTShape":
        return cg.GPTShape(self.num_layers, self.hidden_size, self.num_attention_heads,
                           not self.untie_embeddings_and_output_weights)

    def _in_rank_order(self, state: Mapping[str, np.ndarray], pp: int, pp_rank: int) -> dict[str, np.ndarray]:
        return {name: state[name] for name, _ in self._rank_sources(pp, pp_rank)}

    def shard(self, full: Mapping[str, np.ndarray], tp: int, pp: int, tp_rank: int,
              pp_rank: int) -> dict[str, np.ndarray]:
        """This rank's parameters cut from the whole model's state (gpt_names.shard, in state_dict order)."""
        self.check_parallel_sizes(tp, pp)
        self._check_full(full)
        cut = cg.shard(full, self._shape(), cg.Layout(tp, pp), tp_rank, pp_rank)
        return {name: np.array(value) for name, value in self._in_rank_order(cut, pp, pp_rank).items()}

    def join(self, shards: Mapping[tuple[int, int], Mapping[str, np.ndarray]], tp: int,
             pp: int) -> dict[str, np.ndarray]:
        """The whole model's state from every rank's shard, keyed by (tp_rank, pp_rank); the inverse of `shard`
        (gpt_names.join). The last stage's tied copy of the word embeddings is not part of the whole model."""
        self.check_parallel_sizes(tp, pp)
        missing = sorted({(t, p) for t in range(tp) for p in range(pp)} - set(shards))
        if missing:
            raise LayoutError(f"join needs the shard of every (tp_rank, pp_rank); missing {missing}")
        full = cg.join(shards, self._shape(), cg.Layout(tp, pp))
        return {name: np.asarray(full[name]) for name in self.full_shapes()}

    def _check_full(self, full: Mapping[str, np.ndarray]) -> None:
        expected = self.full_shapes()
        missing = sorted(set(expected) - set(full))
        wrong = sorted(f"{n} {tuple(np.shape(full[n]))} (expected {expected[n]})"
                       for n in set(expected) & set(full) if tuple(np.shape(full[n])) != expected[n])
        if missing or wrong:
            raise LayoutError(f"the state does not fit this GPT layout: missing {missing[:4]}, wrong shapes "
                              f"{wrong[:4]}; build it with GPTLayout.full_shapes() of the same sizes")

    # ---------------------------------------------------------------- initial weights

    def init_full(self, seed: int, init_method_std: float = 0.02) -> dict[str, np.ndarray]:
        """The whole model's initial state from one seed: mmrun's GPT init (gpt_names.mmrun_initial_weights:
        Megatron's N(0, std), N(0, std / sqrt(2L)) for linear_proj and linear_fc2, zero biases, LayerNorm 1 and 0,
        drawn with numpy in mmrun's name order), in megatron-core's names and QKV layout."""
        shape = self._shape()
        shapes = cg.mmrun_parameter_shapes(shape, self.vocab_size, self.max_position_embeddings, self.ffn_hidden_size)
        full = cg.mmrun_to_mcore(dict(cg.mmrun_initial_weights(shapes, seed, init_method_std, self.num_layers)), shape)
        return {name: full[name] for name in self.full_shapes()}

    def init_rank(self, seed: int, init_method_std: float, tp: int, pp: int, tp_rank: int,
                  pp_rank: int) -> dict[str, np.ndarray]:
        """This rank's shard of `init_full(seed)` (gpt_names.initial_shard: one whole parameter in memory at a
        time), the weights the PyTorch megatron-core engine starts from (engines/torch/megatron_core/gpt.py)."""
        self.check_parallel_sizes(tp, pp)
        drawn = cg.initial_shard(self._shape(), cg.Layout(tp, pp), tp_rank, pp_rank, vocab_size=self.vocab_size,
                                 max_position_embeddings=self.max_position_embeddings,
                                 ffn_hidden_size=self.ffn_hidden_size, seed=seed, std=init_method_std)
        return self._in_rank_order(drawn, pp, pp_rank)


def causal_position_ids(batch: int, seq: int) -> np.ndarray:
    """Position ids 0..seq-1 for each of `batch` causal sequences (a GPT batch without packing)."""
    return np.broadcast_to(np.arange(seq, dtype=np.int64), (batch, seq)).copy()
