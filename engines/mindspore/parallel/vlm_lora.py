"""LoRA on the mindspore-parallel VLM stage (Qwen2-VL / Qwen2.5-VL split over pipeline stages): the unsplit
run's adapters (models/lora.py, PEFT's: one per Hugging Face projection, named through checkpoint/peft.py's
LORA_TARGETS) on the stage's own fused Megatron layers.

A fused layer (linear_qkv = [q, k, v] interleaved per query group, linear_fc1 = [gate; up]) gets one adapter per
Hugging Face projection it is made of (models/vlm/mm_layout.hf_sources), each A drawn with the seed the unsplit
run gives that projection (its index among the model's adapted Linears), B zeros; the updates are concatenated
in the sources' order and put in the fused row order (the index map mm_layout's own fuse gives for row numbers).
So every stage trains exactly the adapters the one-process run trains on its layers; the base weights are frozen
and only the adapters reach the optimizer. Tensor parallelism is not built here (refused in one line).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import mindspore as ms
import numpy as np

from mmrun.backend.errors import UsageError
from mmrun.backend.mindspore import nn, ops, tensors
from mmrun.backend.mindspore.parallel.layers import ColumnParallelLinear, RowParallelLinear
from mmrun.models import lora
from mmrun.models.vlm import mm_layout


def _adapters(layer: Any, shapes: Sequence[tuple[int, int]], r: int, alpha: float, seeds: Sequence[int]) -> None:
    layer.r, layer.alpha, layer.scaling = r, alpha, alpha / r
    layer.lora_A = nn.ModuleList([nn.Linear(shape[1], r, bias=False) for shape in shapes])
    layer.lora_B = nn.ModuleList([nn.Linear(r, shape[0], bias=False) for shape in shapes])
    for a, b, shape, seed in zip(layer.lora_A, layer.lora_B, shapes, seeds):
        a.load_state_dict(tensors.state_dict_from_numpy({"weight": lora.initial_a(shape[1], r, seed)}))
        b.load_state_dict(tensors.state_dict_from_numpy({"weight": np.zeros((shape[0], r), np.float32)}))


def _update(layer: Any, x: Any) -> Any:
    x = tensors.cast(x, layer.lora_A[0].weight.dtype)
    parts = [b(a(x)) for a, b in zip(layer.lora_A, layer.lora_B)]
    update = parts[0] if len(parts) == 1 else ops.cat(parts, dim=-1)
    if layer.lora_order is not None:
        update = ms.ops.gather(update, layer.lora_order, -1)
    return update * layer.scaling


class LoRAColumnParallelLinear(ColumnParallelLinear):
    """A column-parallel layer (TP 1) plus its projections' adapters, in the fused row order."""

    def forward(self, x, weight=None):
        y, bias = super().forward(x, weight)
        return y + tensors.cast(_update(self, x), y.dtype), bias


class LoRARowParallelLinear(RowParallelLinear):
    """A row-parallel layer (TP 1) plus its projection's adapter."""

    def forward(self, x):
        y, bias = super().forward(x)
        return y + tensors.cast(_update(self, x), y.dtype), bias


def _fused_order(recipe_sources: Sequence[str], fuse: Callable[[Sequence[np.ndarray]], np.ndarray],
                 shapes: dict[str, tuple[int, ...]]) -> np.ndarray | None:
    """For each row of the fused tensor, its row in the sources' concatenation (None: the same order)."""
    offsets = np.cumsum([0] + [shapes[s][0] for s in recipe_sources])
    rows = fuse([np.arange(offsets[i], offsets[i + 1]) for i in range(len(recipe_sources))])
    return None if np.array_equal(rows, np.arange(len(rows))) else rows.astype(np.int32)


def hf_lora_modules(config: Any, targets: Sequence[str]) -> list[str]:
    """The Hugging Face Linears the unsplit run adapts, in its order (the seed of adapter i is seed + i)."""
    return [name[: -len(".weight")] for name, shape in mm_layout.hf_shapes(config).items()
            if name.endswith(".weight") and len(shape) == 2 and lora._matches(name[: -len(".weight")], targets)]


def apply(model: Any, layout: Any, state: Any, args: Any, log: Callable[[str], None]) -> list[str]:
    """Adapters on this stage's layers the targets name (the unsplit run's, see the module doc), everything
    else frozen. Returns the adapted Hugging Face modules."""
    from mmrun.checkpoint.peft import LORA_TARGETS

    if state.tensor_model_parallel_size > 1:
        raise UsageError(f"--lora-target-modules with --tensor-model-parallel-size "
                         f"{state.tensor_model_parallel_size}: LoRA on MindSpore's parallel engine splits over "
                         "pipeline stages only; use --tensor-model-parallel-size 1 (PP and DP as you like)")
    r, alpha = int(args.lora_r or 8), float(args.lora_alpha or 16)
    if float(getattr(args, "lora_dropout", None) or 0.0) != 0.0:
        raise UsageError(f"--lora-dropout {args.lora_dropout}: mmrun's LoRA has no dropout; drop the flag "
                         "(MindSpeed-MM's LoRA scripts run without it)")
    config = layout.config
    targets = lora.expand_targets(args.lora_target_modules, LORA_TARGETS)
    seeds = {name: args.seed + i for i, name in enumerate(hf_lora_modules(config, targets))}
    shapes = mm_layout.hf_shapes(config)
    recipes = mm_layout._recipes(config)
    nn.freeze(model)
    adapted = []
    for local, layer in list(model.cells_and_names()):
        if not isinstance(layer, (ColumnParallelLinear, RowParallelLinear)) or not local:
            continue
        name = layout.global_name(state.pp_rank, local + ".weight")
        recipe = recipes.get(name)
        if recipe is None:
            continue
        modules = [s[: -len(".weight")] for s in recipe.sources]
        if not any(m in seeds for m in modules):
            continue
        if not all(m in seeds for m in modules):
            raise UsageError(f"--lora-target-modules {' '.join(args.lora_target_modules)}: {name} fuses "
                             f"{', '.join(modules)}; target all of them or none on a split run")
        layer.__class__ = (LoRAColumnParallelLinear if isinstance(layer, ColumnParallelLinear)
                           else LoRARowParallelLinear)
        _adapters(layer, [shapes[s] for s in recipe.sources], r, alpha, [seeds[m] for m in modules])
        order = _fused_order(recipe.sources, lambda parts: mm_layout._fuse(recipe, parts), shapes)
        layer.lora_order = None if order is None else ms.Tensor(order)
        layer.lora_modules = modules
        adapted.extend(modules)
    nn.refresh_parameter_names(model)
    trainable = sum(int(np.prod(p.shape)) for p in model.parameters() if p.requires_grad)
    log(f" > LoRA r {r}, alpha {alpha:g} on {len(adapted)} layers of this stage "
        f"({', '.join(sorted(set(targets)))}); {trainable} trainable parameters, the rest frozen")
    return adapted
