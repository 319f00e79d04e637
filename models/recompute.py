"""Activation recomputation on mmrun's models: Megatron's flags and MindSpeed-MM's model-json keys, applied to
each model's layer loops through the backend's one primitive (`backend.nn.recompute`: torch.utils.checkpoint,
non-reentrant, on PyTorch; Cell.recompute() on MindSpore, in the compiled step and in PyNative).

Each model class names its layer loops in `recompute_layers` (MindSpeed-MM's module name -> attribute path):
GPT {"text_decoder": "h"}, Qwen2-VL family {"vision_encoder": "visual.blocks", "text_decoder": "model.layers"}, ...

    plans = recompute.plans(args, model_json_sections)   # --recompute-* for every loop, model.json per module
    said = recompute.apply(model, plans)                 # ["text_decoder: 4 of 4 layers (full, uniform)", ...]

What each setting recomputes (Megatron's meaning, per layer loop of L layers):
- full + uniform (N): every layer is recomputed in backward, one layer at a time. Megatron recomputes chunks
  of N layers and keeps one input per chunk; here each layer keeps its input (N = 1's memory, same results).
- full + block (N): the first N layers are recomputed, the others keep their activations.
- selective (or --recompute-activations): the attention of every layer is recomputed (Megatron's core
  attention; here the whole attention block: projections, rotary, softmax and product).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from mmrun.backend.errors import UsageError

GRANULARITIES = ("full", "selective")
METHODS = ("uniform", "block")
# The attention submodule of a layer, by the names mmrun's models give it (selective recomputation).
ATTENTION_NAMES = ("self_attn", "attn", "attn1", "attn2")


@dataclass(frozen=True)
class RecomputePlan:
    granularity: str  # full | selective
    method: str | None = None  # uniform | block (full only)
    num_layers: int | None = None
    source: str = "--recompute-granularity"

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise UsageError(f"{self.source}: recompute_granularity must be one of {', '.join(GRANULARITIES)}. "
                             f"Received: {self.granularity!r}")
        if self.granularity == "full" and self.method not in METHODS:
            raise UsageError(f"{self.source}: full recomputation needs recompute_method uniform or block (as "
                             f"Megatron). Received: {self.method!r}")
        if self.granularity == "full" and (self.num_layers is None or int(self.num_layers) < 1):
            raise UsageError(f"{self.source}: full recomputation needs recompute_num_layers >= 1 (as Megatron). "
                             f"Received: {self.num_layers!r}")

    def layers(self, count: int) -> list[int]:
        """Indices of the layers (of `count`) recomputed whole; none for selective."""
        if self.granularity != "full":
            return []
        return list(range(min(int(self.num_layers), count))) if self.method == "block" else list(range(count))

    def describe(self, count: int) -> str:
        if self.granularity == "selective":
            return f"the attention of {count} layers (selective)"
        return f"{len(self.layers(count))} of {count} layers (full, {self.method} {self.num_layers})"


def from_args(args: Any) -> RecomputePlan | None:
    """Megatron's flags: --recompute-granularity full|selective with --recompute-method / --recompute-num-layers;
    --recompute-activations is selective (as Megatron)."""
    granularity = getattr(args, "recompute_granularity", None)
    if not granularity and getattr(args, "recompute_activations", False):
        granularity = "selective"
    if not granularity:
        return None
    num = getattr(args, "recompute_num_layers", None)
    return RecomputePlan(granularity, getattr(args, "recompute_method", None),
                         None if num is None else int(num), "--recompute-granularity")


def from_section(section: Mapping[str, Any], where: str) -> RecomputePlan | None:
    """MindSpeed-MM's per-module model-json keys (recompute_granularity, recompute_method, recompute_num_layers);
    None when the section does not ask (absent or null granularity)."""
    granularity = section.get("recompute_granularity")
    if not granularity:
        return None
    return RecomputePlan(granularity, section.get("recompute_method"), section.get("recompute_num_layers"), where)


def plans(args: Any, sections: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, RecomputePlan | None]:
    """module name -> plan: a model-json section's own keys win for its module; the flags apply to every other
    layer loop ("*")."""
    out: dict[str, RecomputePlan | None] = {"*": from_args(args)}
    for name, section in (sections or {}).items():
        plan = from_section(section or {}, f"model json {name}")
        if plan is not None:
            out[name] = plan
    return out


def _walk(model: Any, path: str) -> Any:
    for part in path.split("."):
        model = getattr(model, part)
    return model


def apply(model: Any, plans_by_module: Mapping[str, RecomputePlan | None]) -> list[str]:
    """Mark the layers each plan names for recomputation on `model` (its class's `recompute_layers`); returns one
    line per recomputed loop. A model without layer loops is left alone."""
    from mmrun.backend import nn

    said = []
    for module, path in getattr(model, "recompute_layers", {}).items():
        plan = plans_by_module.get(module, plans_by_module.get("*"))
        if plan is None:
            continue
        layers = list(_walk(model, path))
        if plan.granularity == "full":
            for i in plan.layers(len(layers)):
                nn.recompute(layers[i])
        else:
            for layer in layers:
                for name in ATTENTION_NAMES:
                    if getattr(layer, name, None) is not None:
                        nn.recompute(getattr(layer, name))
        said.append(f"{module} ({path}): {plan.describe(len(layers))}")
    return said


def megatron_fields(plan: RecomputePlan | None) -> dict[str, Any]:
    """The plan as megatron-core's TransformerConfig fields (the megatron-core engines recompute through them)."""
    if plan is None:
        return {}
    if plan.granularity == "selective":
        return {"recompute_granularity": "selective"}
    return {"recompute_granularity": "full", "recompute_method": plan.method, "recompute_num_layers": int(plan.num_layers)}
