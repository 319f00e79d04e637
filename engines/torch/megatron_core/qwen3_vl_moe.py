"""Qwen3-VL MoE's sparse decoder layers on megatron-core: its own MoELayer, router and token dispatcher.

A sparse layer's `mlp` is megatron-core 0.16's MoELayer from the local spec (get_gpt_layer_local_spec(num_experts)):
TopKRouter (`mlp.router.weight`, (experts, hidden)) and SequentialMLP (`mlp.experts.local_experts.k.linear_fc1 /
linear_fc2.weight`, gated SiLU, fc1 column- / fc2 row-parallel over the expert tensor-parallel group = the tensor-
parallel group, as the converter splits them), k numbered per expert-parallel rank from 0: models/qwen3_vl/
mm_layout.py's names. Dense layers (mlp_only_layers, decoder_sparse_step) keep the dense MLP.

Routing equal to transformers' Qwen3VLMoeTextTopKRouter (softmax in fp32, top-k, the top-k weights renormalised when
norm_topk_prob): megatron-core's `moe_router_score_function="softmax"` with `moe_router_pre_softmax=False` takes the
top-k logits and softmaxes them, which is the renormalised top-k of the full softmax; norm_topk_prob false is
`moe_router_pre_softmax=True` (softmax over every expert, then top-k, not renormalised). router_gating_in_fp32 is
`moe_router_dtype="fp32"`. Megatron's load-balancing loss is off (`moe_router_load_balancing_type="none"`), as
MindSpeed-MM's Qwen3-VL json leaves it; transformers' (output_router_logits) is refused on this engine (check).

Token dispatch: `--moe-token-dispatcher-type alltoall|allgather` as megatron-core implements them. On gloo (CPU)
alltoall's all_to_all_single runs as it is (its host copies through backend/torch/megatron_core/cpu_shims.py); with
TP > 1 its all-gather and reduce-scatter of uneven token counts over the tensor-parallel ranks run padded to the
longest part (engines/torch/megatron_core/gloo_uneven.py), said in one notice line (`dispatcher`). The allgather
dispatcher gathers equal counts only (on any backend): with EP > 1 and ranks of unequal sequence lengths
(--variable-seq-lengths) it needs alltoall.

Checkpoints hold every expert in global numbers, as the data-parallel engine's do (models/qwen3_vl/moe.py
ExpertShards): `global_name` renames this rank's local experts, `gather` collects the expert-parallel group's
before a save, so a checkpoint is one per (TP, PP) rank in the layout's names and loads on any EP, on the data-
parallel engine too; `mmrun convert`'s EP-split output (mp_rank_TT[_PPP]_EEE) reads back joined
(training/checkpoint_vlm.py) the same way.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np
import torch

from mmrun.backend.errors import UsageError
from mmrun.models.vlm.mm_layout import expert_global_name, expert_place, keep_expert_rank

DISPATCHERS = ("alltoall", "allgather")


def moe_of(layout: Any) -> Any:
    return getattr(layout.config.text, "moe", None)


def check(args: Any, layout: Any) -> None:
    """One line for what this engine does not build for Qwen3-VL MoE."""
    moe = moe_of(layout)
    if moe is None:
        return
    ep = args.expert_model_parallel_size or 1
    dispatcher = getattr(args, "moe_token_dispatcher_type", None) or "alltoall"
    refused = {
        "output_router_logits": (moe.output_router_logits, "true", "transformers' load-balancing loss is built on the "
                                 "data-parallel engine only (megatron-core's per-layer aux loss is another sum)",
                                 "false (the released models' config), or train unsplit"),
        "--moe-token-dispatcher-type": (dispatcher not in DISPATCHERS, dispatcher, "megatron-core's dispatchers "
                                        "built here are alltoall and allgather", "alltoall or allgather"),
        "--sequence-parallel": (layout.tp > 1 and not args.sequence_parallel, "off", "megatron-core's MoELayer "
                                "trains with tensor parallelism only on a sequence split over the tensor ranks",
                                "on (pass --sequence-parallel, as finetune_qwen3vl_30B.sh does)"),
        "--expert-tensor-parallel-size": ((getattr(args, "expert_tensor_parallel_size", None) or layout.tp)
                                          != layout.tp, str(getattr(args, "expert_tensor_parallel_size", None)),
                                          "the experts split over the tensor-parallel ranks as mmrun convert writes "
                                          "them", f"{layout.tp} (= --tensor-model-parallel-size) or leave it out"),
    }
    for what, (bad, value, why, fix) in refused.items():
        if bad:
            raise UsageError(f"Qwen3-VL MoE on megatron-core: {what} {value} is not built ({why}). Received: {what} "
                             f"{value}; set it to {fix}")
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if world % (ep * layout.tp * layout.pp):
        raise UsageError(f"--expert-model-parallel-size {ep} x --tensor-model-parallel-size {layout.tp} x "
                         f"--pipeline-model-parallel-size {layout.pp} does not divide the world size {world} (megatron-"
                         "core splits the experts over EP x TP ranks of each stage); start a multiple of that many "
                         "processes")


def config_fields(args: Any, layout: Any) -> dict[str, Any]:
    """The text decoder's TransformerConfig fields for the experts (empty for the dense model)."""
    moe = moe_of(layout)
    if moe is None:
        return {}
    text = layout.config.text
    return dict(
        num_moe_experts=moe.num_experts, moe_router_topk=moe.num_experts_per_tok,
        moe_ffn_hidden_size=moe.moe_intermediate_size, moe_router_score_function="softmax",
        moe_router_pre_softmax=not moe.norm_topk_prob, moe_router_dtype="fp32" if moe.router_gating_in_fp32 else None,
        moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, moe_z_loss_coeff=None,
        moe_token_dispatcher_type=dispatcher(args, layout),
        moe_grouped_gemm=False, moe_permute_fusion=False,
        moe_layer_freq=[int(moe.is_sparse(n)) for n in range(text.num_hidden_layers)],
        expert_model_parallel_size=args.expert_model_parallel_size or 1,
        expert_tensor_parallel_size=layout.tp)


_said: set[str] = set()


def _notice_once(key: str, message: str) -> None:
    if key not in _said and (not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0):
        print(f"notice: {message}", flush=True)
    _said.add(key)


def dispatcher(args: Any, layout: Any) -> str:
    """--moe-token-dispatcher-type (alltoall when left out, MindSpeed-MM's choice). With the experts split over 2+
    tensor-parallel ranks, megatron-core's alltoall dispatcher all-gathers and reduce-scatters uneven token counts
    over them; on gloo, which takes equal sizes only, those run padded to the longest part
    (engines/torch/megatron_core/gloo_uneven.py, installed by the engine on gloo), said once."""
    asked = getattr(args, "moe_token_dispatcher_type", None) or "alltoall"
    if asked == "alltoall" and layout.tp > 1 and torch.distributed.is_initialized() \
            and torch.distributed.get_backend() == "gloo":
        _notice_once("gloo", f"--moe-token-dispatcher-type alltoall with --tensor-model-parallel-size {layout.tp} on "
                     "gloo: megatron-core's all-gather / reduce-scatter of uneven token counts over the experts' "
                     "tensor-parallel ranks run padded to the longest part (engines/torch/megatron_core/"
                     "gloo_uneven.py; the same numbers)")
    return asked


def layer_specs(layout: Any, layers: range, spec: Any) -> list[Any]:
    """Per decoder layer of a stage: `spec(num_experts)` (the layer spec with MoELayer or the dense MLP)."""
    moe = moe_of(layout)
    if moe is None:
        return [spec(None)] * len(layers)
    return [spec(moe.num_experts if moe.is_sparse(n) else None) for n in layers]


def _ep() -> tuple[int, int, Any]:
    from megatron.core import parallel_state as ps

    return (ps.get_expert_model_parallel_world_size(), ps.get_expert_model_parallel_rank(),
            ps.get_expert_model_parallel_group())


def local_state(layout: Any, state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A rank's tensors with every expert (global numbers) -> this expert-parallel rank's experts, numbered from 0."""
    moe = moe_of(layout)
    ep, rank, _ = _ep()
    if moe is None or ep == 1:
        return dict(state)
    return keep_expert_rank(state, moe.num_experts, ep, rank)


class ExpertNames:
    """This expert-parallel rank's experts in checkpoint names (global numbers) and back, and the group's experts
    joined for a save (module docstring). One per engine; inert without experts or with EP 1."""

    def __init__(self, model: torch.nn.Module) -> None:
        layout = getattr(model, "layout", None)
        moe = moe_of(layout) if layout is not None else None
        self.ep, self.rank, self.group = _ep() if moe is not None else (1, 0, None)
        self.experts = moe.num_experts if moe is not None else 0

    @property
    def active(self) -> bool:
        return self.ep > 1

    def global_name(self, name: str) -> str:
        return expert_global_name(name, self.experts, self.ep, self.rank) if self.active else name

    def every_rank(self, name: str) -> list[str]:
        """The names of a (global) expert tensor of this rank on every rank of the group, in rank order."""
        if not self.active:
            return [name]
        local = expert_place(name, self.experts, self.ep)
        if local is None:
            return [name]
        return [expert_global_name(local[1], self.experts, self.ep, r) for r in range(self.ep)]

    def gather(self, arrays: Mapping[str, Any]) -> dict[str, Any]:
        """Every rank's expert entries (numpy or torch) added to this rank's: one all-gather per local expert tensor,
        in local-name order (the same on every rank of the group; every rank calls it)."""
        if not self.active:
            return dict(arrays)
        out = dict(arrays)
        mine = sorted((expert_place(k, self.experts, self.ep)[1], k) for k in arrays
                      if expert_place(k, self.experts, self.ep) is not None)
        for _, key in mine:
            value = torch.as_tensor(np.ascontiguousarray(arrays[key]) if isinstance(arrays[key], np.ndarray)
                                    else arrays[key]).contiguous()
            parts = [torch.empty_like(value) for _ in range(self.ep)]
            torch.distributed.all_gather(parts, value, group=self.group)
            for name, part in zip(self.every_rank(key), parts):
                out[name] = part.numpy() if isinstance(arrays[key], np.ndarray) else part
        return out

