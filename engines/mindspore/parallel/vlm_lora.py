"""LoRA on the mindspore-parallel VLM stage (Qwen2-VL / Qwen2.5-VL split over pipeline stages and TP ranks): the
run's adapters (models/lora.py, PEFT's: one per Hugging Face projection, named through models/qwen2_vl/mm_layout.py's
LORA_TARGETS) on the stage's own fused Megatron layers.

A fused layer (linear_qkv = [q, k, v] interleaved per query group, linear_fc1 = [gate; up]) gets one adapter per
Hugging Face projection it is made of (models/vlm/mm_layout.hf_sources), each A drawn with the seed the unsplit
run gives that projection (its index among the model's adapted Linears), B zeros; the updates are concatenated
in the sources' order and put in the fused row order (the index map mm_layout's own fuse gives for row numbers).
So every stage trains exactly the adapters the one-process run trains on its layers; the base weights are frozen
and only the adapters reach the optimizer.

Tensor parallelism as MindSpeed's LoRA (PEFT's LoraParallelLinear): on a column-parallel layer A is replicated and
B split on its rows with the layer's outputs (A(x) copied to / gathered over the TP group as the layer's input);
on a row-parallel layer A is split on its inputs as the layer's weight and A_r(x_r) summed over TP (reduced, or
reduce-scattered with sequence parallelism) before the replicated B, added to the layer's reduced output.
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

TEXT_DECODER = "text_decoder."


def _adapters(layer: Any, a_arrays: Sequence[np.ndarray], b_rows: Sequence[int], r: int, alpha: float) -> None:
    """lora_A.j = this rank's part of the unsplit A (`a_arrays`), lora_B.j = zeros of this rank's rows."""
    layer.r, layer.alpha, layer.scaling = r, alpha, alpha / r
    layer.lora_A = nn.ModuleList([nn.Linear(a.shape[1], r, bias=False) for a in a_arrays])
    layer.lora_B = nn.ModuleList([nn.Linear(r, rows, bias=False) for rows in b_rows])
    for a, b, a_array, rows in zip(layer.lora_A, layer.lora_B, a_arrays, b_rows):
        a.load_state_dict(tensors.state_dict_from_numpy({"weight": a_array}))
        b.load_state_dict(tensors.state_dict_from_numpy({"weight": np.zeros((rows, r), np.float32)}))


def _update(layer: Any, x: Any, lora_in: Callable[[Any], Any]) -> Any:
    x = tensors.cast(x, layer.lora_A[0].weight.dtype)
    parts = [b(lora_in(a(x))) for a, b in zip(layer.lora_A, layer.lora_B)]
    update = parts[0] if len(parts) == 1 else ops.cat(parts, dim=-1)
    if layer.lora_order is not None:
        update = ms.ops.gather(update, layer.lora_order, -1)
    return update * layer.scaling


class LoRAColumnParallelLinear(ColumnParallelLinear):
    """A column-parallel layer (TP 1) plus its projections' adapters, in the fused row order."""

    def forward(self, x, weight=None):
        y, bias = super().forward(x, weight)
        return y + tensors.cast(_update(self, x, self._lora_in), y.dtype), bias

    def _lora_in(self, u):
        """A(x) (A replicated, x this rank's input) to every TP rank: gathered over the sequence with sequence
        parallelism, else copied (its gradient summed over TP: B is split)."""
        if not self.parallel:
            return u
        return self.gather_sequence(u) if self.sequence_parallel else self.copy_to(u)


class LoRARowParallelLinear(RowParallelLinear):
    """A row-parallel layer (TP 1) plus its projection's adapter."""

    def forward(self, x):
        y, bias = super().forward(x)
        return y + tensors.cast(_update(self, x, self._lora_in), y.dtype), bias

    def _lora_in(self, u):
        """A_r(x_r) (A split on its input as x is) summed over TP (reduce-scattered over the sequence with
        sequence parallelism), as the base layer's output, then B (replicated)."""
        if not self.parallel:
            return u
        return self.reduce_scatter(u) if self.sequence_parallel else self.reduce(u)


def _column_rows(layout: Any, local: str, recipe: Any, shapes: dict[str, tuple[int, ...]], tp_rank: int
                 ) -> tuple[list[int], np.ndarray | None]:
    """A column-parallel layer's adapters on this TP rank: how many rows of each source's B it holds, and for
    each row of its fused shard, that row's place in the concatenation of those B rows (None: the same order)."""
    offsets = np.cumsum([0] + [shapes[s][0] for s in recipe.sources])
    rows = mm_layout._fuse(recipe, [np.arange(offsets[i], offsets[i + 1]) for i in range(len(recipe.sources))])
    held = layout.shard(local, rows, tp_rank)  # this rank's fused rows, as rows of the sources' concatenation
    ordered = np.sort(held)
    counts = [int(((ordered >= offsets[i]) & (ordered < offsets[i + 1])).sum()) for i in range(len(recipe.sources))]
    order = np.searchsorted(ordered, held)
    return counts, None if np.array_equal(order, np.arange(len(order))) else order.astype(np.int32)


def _set_roles(model: Any, split: frozenset[str], summed: frozenset[str]) -> None:
    """The stage's parameter roles (for the gradient finalization and the norm) with the adapters': the layout's
    rule knows no adapter (by its name one is replicated, and under SP every decoder one would be summed)."""
    import dataclasses

    own = model.parameter_roles
    adapters = {n for n, _ in model.named_parameters() if ".lora_A." in n or ".lora_B." in n}

    def roles() -> Any:
        base = own()
        return dataclasses.replace(base, tensor_parallel=(base.tensor_parallel - adapters) | split,
                                   sequence_parallel=(base.sequence_parallel - adapters) | summed)

    model.parameter_roles = roles


def hf_lora_modules(config: Any, targets: Sequence[str]) -> list[str]:
    """The Hugging Face Linears the unsplit run adapts, in its order (the seed of adapter i is seed + i)."""
    return [name[: -len(".weight")] for name, shape in mm_layout.hf_shapes(config).items()
            if name.endswith(".weight") and len(shape) == 2 and lora._matches(name[: -len(".weight")], targets)]


def apply(model: Any, layout: Any, state: Any, args: Any, log: Callable[[str], None]) -> list[str]:
    """Adapters on this stage's layers the targets name (the unsplit run's, see the module doc), everything
    else frozen. Returns the adapted Hugging Face modules."""
    from mmrun.models.qwen2_vl.mm_layout import LORA_TARGETS

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
    adapted: list[str] = []
    split: set[str] = set()  # adapters split over TP (column: B; row: A)
    summed: set[str] = set()  # replicated adapters that see part of the sequence (SP): gradients summed over TP
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
        full_a = [lora.initial_a(shapes[s][1], r, seeds[m]) for s, m in zip(recipe.sources, modules)]
        if isinstance(layer, ColumnParallelLinear):  # A replicated, B split on its rows (the outputs)
            layer.__class__ = LoRAColumnParallelLinear
            rows, order = _column_rows(layout, local + ".weight", recipe, shapes, state.tp_rank)
            _adapters(layer, full_a, rows, r, alpha)
            split.update(f"{local}.lora_B.{j}.weight" for j in range(len(modules)))
            if state.sequence_parallel and local.startswith(TEXT_DECODER):
                summed.update(f"{local}.lora_A.{j}.weight" for j in range(len(modules)))
        else:  # A split on its inputs (as the layer's), B replicated
            layer.__class__ = LoRARowParallelLinear
            tp = state.tensor_model_parallel_size
            _adapters(layer, [np.ascontiguousarray(np.split(a, tp, axis=1)[state.tp_rank]) for a in full_a],
                      [shapes[s][0] for s in recipe.sources], r, alpha)
            order = None
            if tp > 1:
                split.update(f"{local}.lora_A.{j}.weight" for j in range(len(modules)))
            if state.sequence_parallel and local.startswith(TEXT_DECODER):
                summed.update(f"{local}.lora_B.{j}.weight" for j in range(len(modules)))
        layer.lora_order = None if order is None else ms.Tensor(order)
        layer.lora_modules = modules
        adapted.extend(modules)
    nn.refresh_parameter_names(model)
    _set_roles(model, frozenset(split) if state.tensor_model_parallel_size > 1 else frozenset(), frozenset(summed))
    trainable = sum(int(np.prod(p.shape)) for p in model.parameters() if p.requires_grad)
    log(f" > LoRA r {r}, alpha {alpha:g} on {len(adapted)} layers of this stage "
        f"({', '.join(sorted(set(targets)))}); {trainable} trainable parameters, the rest frozen")
    return adapted
