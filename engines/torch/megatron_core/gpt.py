"""megatron-core's GPTModel from Megatron's arguments, starting from mmrun's GPT weights.

`gpt_model(args, pre_process, post_process, vp_stage)` is what Megatron-LM's pretrain_gpt.py
model_provider builds for an mcore model: TransformerConfig from the arguments
(`transformer_config`), the layer spec (`layer_spec`: Transformer Engine's on CUDA when it is installed
and asked for with --transformer-impl transformer_engine, megatron-core's local spec otherwise), and
`GPTModel(config, spec, vocab_size=args.padded_vocab_size, max_sequence_length=..., pre_process,
post_process, share_embeddings_and_output_weights=not --untie-embeddings-and-output-weights,
position_embedding_type="learned_absolute", vp_stage)`.

Initial weights: mmrun's GPT init for --seed (models/gpt_names.py: drawn with numpy, converted to
megatron-core's names and fused QKV layout, this rank's TP/PP shard), so one seed gives the same network
with either model and any TP/PP/VPP layout. megatron-core's own initialisation still runs first: it also
marks each parameter's tensor-parallel partitioning, which the gradient norm and the optimizers read.

Two pieces megatron-core has only in Apex or Transformer Engine are added to the local spec where they
are needed, following megatron-core's design:
- with --sequence-parallel, `SequenceParallelLayerNorm`: torch's LayerNorm whose parameters carry
  `sequence_parallel=True`, so finalize_model_grads sums their gradients over the tensor-parallel group
  (what Apex's FusedLayerNorm does; megatron-core's WrappedTorchNorm refuses sequence parallelism);
- with --context-parallel-size > 1, context_parallel.py's all-gather attention (megatron-core's local
  DotProductAttention refuses context parallelism; only Transformer Engine's implements it).
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import numpy as np
import torch

from mmrun.backend.torch.megatron_core import runtime
from mmrun.models import recompute


class SequenceParallelLayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm with megatron-core's norm constructor, parameters marked for sequence parallelism."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = False, normalization: str = "LayerNorm") -> None:
        if normalization != "LayerNorm" or zero_centered_gamma:
            raise ValueError("SequenceParallelLayerNorm is a plain LayerNorm (mmrun's GPT): "
                             f"received normalization={normalization!r}, zero_centered_gamma={zero_centered_gamma}")
        super().__init__(hidden_size, eps=eps)
        self.config = config
        for param in (self.weight, self.bias):
            setattr(param, "sequence_parallel", bool(config.sequence_parallel))


def transformer_config(args: Any) -> Any:
    """Megatron's core_transformer_config_from_args for mmrun's GPT arguments."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = torch.float16 if args.fp16 else torch.bfloat16 if args.bf16 else torch.float32
    with warnings.catch_warnings():
        # 0.16 warns on every config that its default cuda_graph_scope "full" is deprecated (graphs are off)
        warnings.filterwarnings("ignore", message=".*cuda_graph_scope.*")
        return _config(TransformerConfig, args, dtype)


def _config(TransformerConfig: type, args: Any, dtype: torch.dtype) -> Any:
    return TransformerConfig(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        ffn_hidden_size=args.ffn_hidden_size,
        kv_channels=args.hidden_size // args.num_attention_heads,
        hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout,
        layernorm_epsilon=args.norm_epsilon,
        init_method_std=args.init_method_std,
        add_bias_linear=True,
        normalization="LayerNorm",
        activation_func=torch.nn.functional.gelu,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
        context_parallel_size=args.context_parallel_size,
        sequence_parallel=args.sequence_parallel,
        fp16=args.fp16,
        bf16=args.bf16,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        attention_softmax_in_fp32=True,
        use_cpu_initialization=runtime.device_kind() == "cpu",
        # megatron-core's init runs (it also marks the tensor-parallel parameters, which the gradient norm and
        # the optimizers rely on) and mmrun's initial weights replace its values right after.
        # Fused kernels where they run here (runtime.fusions probes the compiled softmax); unfused is the same math.
        **runtime.fusions(),
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,  # needs Apex's fused_weight_gradient_mlp_cuda
        persist_layer_norm=False,
        **recompute.megatron_fields(recompute.from_args(args)),  # --recompute-*: megatron-core's own recompute
    )


def layer_spec(args: Any, config: Any, vp_stage: int | None) -> Any:
    """The layer spec GPTModel is built with (see the module docstring)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    if args.transformer_impl == "transformer_engine":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        runtime.require_transformer_engine()
        return get_gpt_layer_with_transformer_engine_spec()
    spec = get_gpt_layer_local_spec()
    if config.context_parallel_size > 1:
        from mmrun.engines.torch.megatron_core.context_parallel import ContextParallelAttention

        attention = spec.submodules.self_attention
        attention = dataclasses.replace(attention, submodules=dataclasses.replace(
            attention.submodules, core_attention=ContextParallelAttention))
        spec = dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, self_attention=attention))
    if not config.sequence_parallel:
        return spec
    spec = dataclasses.replace(spec, submodules=dataclasses.replace(
        spec.submodules, input_layernorm=SequenceParallelLayerNorm, pre_mlp_layernorm=SequenceParallelLayerNorm))
    return TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(config, vp_stage=vp_stage),
                                      layer_norm=SequenceParallelLayerNorm)


@functools.lru_cache(maxsize=1)
def _rank_initial_weights(key: tuple) -> dict[str, np.ndarray]:
    """mmrun's initial GPT weights as this (tp, pp) rank's megatron-core state (all its model chunks)."""
    from mmrun.models.gpt_names import GPTShape, Layout, initial_shard

    (layers, hidden, heads, tied, tp, pp, vpp, tp_rank, pp_rank, vocab, positions, ffn, seed, std) = key
    return initial_shard(GPTShape(layers, hidden, heads, tied), Layout(tp, pp, vpp), tp_rank, pp_rank,
                         vocab_size=vocab, max_position_embeddings=positions, ffn_hidden_size=ffn, seed=seed, std=std)


def initial_weights(args: Any, vp_stage: int | None) -> dict[str, np.ndarray]:
    """This model chunk's share of mmrun's initial weights, by GPTModel's own names."""
    from megatron.core import parallel_state as ps

    vpp = args.virtual_pipeline_model_parallel_size or 1
    key = (args.num_layers, args.hidden_size, args.num_attention_heads, not args.untie_embeddings_and_output_weights,
           args.tensor_model_parallel_size, args.pipeline_model_parallel_size, vpp,
           ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank(), args.padded_vocab_size,
           args.max_position_embeddings, args.ffn_hidden_size, args.seed, args.init_method_std)
    state = _rank_initial_weights(key)
    if vpp == 1:
        return dict(state)
    prefix = f"model{vp_stage or 0}."
    return {name[len(prefix):]: a for name, a in state.items() if name.startswith(prefix)}


def load_numpy_state(model: torch.nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Copy numpy arrays into a GPTModel by its state_dict names; every tensor must be there, no other."""
    own = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    missing, unexpected = sorted(set(own) - set(arrays)), sorted(set(arrays) - set(own))
    wrong = sorted(k for k in set(own) & set(arrays) if tuple(own[k].shape) != tuple(arrays[k].shape))
    if missing or unexpected or wrong:
        raise ValueError(f"the weights do not fit this GPTModel chunk: missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}, shapes differ {wrong[:3]}")
    with torch.no_grad():
        for name, tensor in own.items():
            tensor.copy_(torch.from_numpy(np.ascontiguousarray(arrays[name])).to(tensor.dtype))


def gpt_model(args: Any, pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None) -> Any:
    """megatron-core's GPTModel for this pipeline stage, with mmrun's initial weights (see the module docstring)."""
    from megatron.core.models.gpt import GPTModel

    runtime.require_parallel_state()
    config = transformer_config(args)
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(args, config, vp_stage),
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type="learned_absolute",
        vp_stage=vp_stage,
    )
    load_numpy_state(model, initial_weights(args, vp_stage))
    return model
