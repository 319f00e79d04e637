"""LoRA adapters written once against mmrun.backend: PEFT's layer, PEFT's files, on PyTorch and MindSpore.

    y = x @ W.T + b + (x @ A.T @ B.T) * alpha / r        A (r, in): PEFT's kaiming-uniform init; B (out, r): zeros

`apply_lora(model, targets, r, alpha)` puts an adapter on every Linear whose dotted name is a target or ends in
"." + a target (PEFT's rule), freezes everything else, and returns the adapted names. The base weight keeps its
name (`blocks.0.attn1.to_q.weight`: checkpoints of the base model still load); the adapter adds
`<module>.lora_A.weight` and `<module>.lora_B.weight`. `save_adapter` writes PEFT's layout, which
`peft.PeftModel.from_pretrained` and diffusers' `load_lora_adapter` read:

    adapter_config.json          {"peft_type": "LORA", "r", "lora_alpha", "target_modules", ...}
    adapter_model.safetensors    base_model.model.<module>.lora_A.weight / .lora_B.weight
    pytorch_lora_weights.safetensors   (diffusers_component "transformer") transformer.<module>.lora_A.weight ...:
                                 diffusers' own layout, which WanPipeline.load_lora_weights(directory) takes

`merge_lora` folds the adapters into the base weights (W += B @ A * alpha / r) and gives plain Linears back.
`expand_targets` maps a model family's MindSpeed-MM target names onto its module names through a table (the Wan
DiT's: models/wan/mindspeed_names.py LORA_TARGETS).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from mmrun.backend import nn, ops, tensors
from mmrun.backend.errors import UsageError
from mmrun.common.atomic_write import atomic_write

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
# diffusers' own LoRA file (LoraBaseMixin.save_lora_weights / load_lora_weights): keys `<component>.<module>.lora_A
# .weight`, the LoraConfig as JSON under this metadata key, each of its keys prefixed by the component too
DIFFUSERS_LORA_WEIGHTS, DIFFUSERS_LORA_METADATA = "pytorch_lora_weights.safetensors", "lora_adapter_metadata"
PEFT_PREFIX = "base_model.model."  # PEFT's key prefix in adapter_model.safetensors
LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight")

class LoRALinear(nn.Module):
    """A Linear with a low-rank update; `weight` and `bias` are the base layer's own parameters (frozen)."""

    def __init__(self, base: Any, r: int, alpha: float, seed: int) -> None:
        super().__init__()
        out_features, in_features = base.weight.shape
        self.weight = base.weight
        self.bias = base.bias
        self.r, self.alpha, self.scaling = r, alpha, alpha / r
        self.lora_A = nn.Linear(in_features, r, bias=False)
        self.lora_B = nn.Linear(r, out_features, bias=False)
        # PEFT's init_lora_weights=True: A kaiming_uniform_(a=sqrt(5)) = U(+-1/sqrt(in)), B zeros: the adapted
        # model starts equal to the base. Drawn with numpy so both frameworks start from the same A.
        self.lora_A.load_state_dict(tensors.state_dict_from_numpy({"weight": initial_a(in_features, r, seed)}))
        self.lora_B.load_state_dict(tensors.state_dict_from_numpy({"weight": np.zeros((out_features, r), np.float32)}))

    def forward(self, x):
        update = self.lora_B(self.lora_A(tensors.cast(x, self.lora_A.weight.dtype)))
        return ops.linear(x, self.weight, self.bias) + tensors.cast(update * self.scaling, x.dtype)


def initial_a(in_features: int, r: int, seed: int) -> np.ndarray:
    """PEFT's kaiming_uniform_(a=sqrt(5)) for lora_A, U(+-1/sqrt(in)), drawn with numpy from `seed`."""
    bound = 1.0 / math.sqrt(in_features)
    return np.random.default_rng(seed).uniform(-bound, bound, (r, in_features)).astype(np.float32)


def _named_modules(module: Any, prefix: str = "") -> Iterable[tuple[str, Any, Any, str]]:
    """(dotted name, module, parent, attribute) of every sub-module, depth first (torch's and MindSpore's)."""
    children = module.named_children() if hasattr(module, "named_children") else module.name_cells().items()
    for name, child in children:
        if child is None:
            continue
        dotted = f"{prefix}{name}"
        yield dotted, child, module, name
        yield from _named_modules(child, dotted + ".")


def _is_linear(module: Any) -> bool:
    return isinstance(module, nn.Linear) and not isinstance(module, LoRALinear)


def expand_targets(targets: Sequence[str], table: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """--lora-target-modules as given (one list, or comma-separated as MindSpeed-MM also accepts), each name
    mapped through `table` (MindSpeed-MM's names -> the model's) where it has an entry."""
    names = [part for item in targets for part in str(item).split(",") if part]
    return [mapped for name in names for mapped in (table or {}).get(name, (name,))]


def _matches(name: str, targets: Sequence[str]) -> bool:
    return any(name == t or name.endswith("." + t) for t in targets)


def _replace(parent: Any, attribute: str, new: Any) -> None:
    if attribute.isdigit():
        parent[int(attribute)] = new  # ModuleList / CellList entries (to_out.0)
    else:
        setattr(parent, attribute, new)


def apply_lora(model: Any, targets: Sequence[str], r: int, alpha: float, seed: int = 1234) -> list[str]:
    """Adapters on the Linears named by `targets` (PEFT's suffix rule), everything else frozen; the adapted
    module names, in model order. None matching is a UsageError naming the targets and some Linears."""
    if r <= 0:
        raise UsageError(f"--lora-r must be positive. Received: {r}")
    found = [(name, child, parent, attr) for name, child, parent, attr in _named_modules(model)
             if _is_linear(child) and _matches(name, targets)]
    if not found:
        linears = sorted({name.split(".")[-1] if not name.split(".")[-1].isdigit() else ".".join(name.split(".")[-2:])
                          for name, child, _, _ in _named_modules(model) if _is_linear(child)})
        raise UsageError(f"--lora-target-modules {' '.join(targets)} match no Linear layer of the model; its Linear "
                         f"layers end in: {', '.join(linears[:12])}{' ...' if len(linears) > 12 else ''}")
    nn.freeze(model)
    for i, (name, child, parent, attr) in enumerate(found):
        adapter = LoRALinear(child, r, alpha, seed=seed + i)
        nn.freeze([adapter.weight] + ([adapter.bias] if adapter.bias is not None else []))
        _replace(parent, attr, adapter)
    nn.refresh_parameter_names(model)
    return [name for name, *_ in found]


def apply_from_args(model: Any, args: Any, table: Mapping[str, Sequence[str]] | None, log: Any) -> list[str]:
    """An entry's --lora-r / --lora-alpha / --lora-target-modules (names mapped through `table`) on `model`;
    --lora-dropout other than 0 is refused (no dropout here). One line to `log`: what trains."""
    r, alpha = int(args.lora_r or 8), float(args.lora_alpha or 16)
    if float(getattr(args, "lora_dropout", None) or 0.0) != 0.0:
        raise UsageError(f"--lora-dropout {args.lora_dropout}: mmrun's LoRA has no dropout; drop the flag "
                         "(MindSpeed-MM's LoRA scripts run without it)")
    targets = expand_targets(args.lora_target_modules, table)
    adapted = apply_lora(model, targets, r, alpha, seed=args.seed)
    trainable = sum(int(np.prod(p.shape)) for p in model.parameters() if p.requires_grad)
    log(f" > LoRA r {r}, alpha {alpha:g} on {len(adapted)} layers ({', '.join(sorted(set(targets)))}); "
        f"{trainable} trainable parameters, the rest frozen")
    return adapted


def lora_modules(model: Any) -> list[tuple[str, LoRALinear]]:
    return [(name, child) for name, child, _, _ in _named_modules(model) if isinstance(child, LoRALinear)]


def adapter_state(model: Any) -> dict[str, np.ndarray]:
    """`<module>.lora_A.weight` / `.lora_B.weight` -> float32 arrays (the model's own names)."""
    state = {}
    for name, layer in lora_modules(model):
        state[f"{name}.lora_A.weight"] = tensors.to_numpy(layer.lora_A.weight).astype(np.float32)
        state[f"{name}.lora_B.weight"] = tensors.to_numpy(layer.lora_B.weight).astype(np.float32)
    return state


def peft_config(r: int, lora_alpha: float, target_modules: Sequence[str], base_model: str | None = None
                ) -> dict[str, Any]:
    """PEFT's LoraConfig as adapter_config.json holds it (the keys PEFT needs to rebuild the same adapters)."""
    return {"peft_type": "LORA", "task_type": None, "base_model_name_or_path": base_model, "r": int(r),
            "lora_alpha": lora_alpha, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
            "target_modules": sorted(target_modules), "init_lora_weights": True, "use_rslora": False,
            "use_dora": False, "inference_mode": True, "modules_to_save": None}


def write_adapter(directory: str | Path, config: Mapping[str, Any], adapter: Mapping[str, np.ndarray],
                  base_model: str | None = None, diffusers_component: str | None = None) -> Path:
    """adapter_config.json + adapter_model.safetensors (PEFT's key prefix) in `directory`, each written atomically;
    `config` gives r, lora_alpha and target_modules, `adapter` the `<module>.lora_A.weight` arrays. With
    `diffusers_component` ("transformer"), also diffusers' own file, pytorch_lora_weights.safetensors, which a
    pipeline's load_lora_weights(directory) takes (it picks that file name)."""
    from safetensors.numpy import save

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    settings = peft_config(config["r"], config["lora_alpha"], config["target_modules"], base_model)
    atomic_write(directory / ADAPTER_CONFIG, json.dumps(settings, indent=2) + "\n")
    arrays = {key: np.ascontiguousarray(value, dtype=np.float32) for key, value in adapter.items()}
    atomic_write(directory / ADAPTER_WEIGHTS, save({PEFT_PREFIX + k: v for k, v in arrays.items()},
                                                   metadata={"format": "pt"}))
    if diffusers_component:
        prefix = diffusers_component + "."
        metadata = json.dumps({prefix + k: v for k, v in settings.items()}, indent=2, sort_keys=True)
        atomic_write(directory / DIFFUSERS_LORA_WEIGHTS, save({prefix + k: v for k, v in arrays.items()},
                                                              metadata={"format": "pt",
                                                                        DIFFUSERS_LORA_METADATA: metadata}))
    return directory


def save_adapter(model: Any, directory: str | Path, base_model: str | None = None,
                 diffusers_component: str | None = None) -> Path:
    """The model's adapters in PEFT's layout, and diffusers' with `diffusers_component` (see write_adapter)."""
    layers = lora_modules(model)
    if not layers:
        raise ValueError("the model has no LoRA adapters to save")
    config = {"r": layers[0][1].r, "lora_alpha": layers[0][1].alpha, "target_modules": [n for n, _ in layers]}
    return write_adapter(directory, config, adapter_state(model), base_model, diffusers_component)


def read_adapter(directory: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(adapter_config.json, {module name: (A, B)} flattened as `<module>.lora_A.weight` arrays) of a PEFT
    adapter directory, PEFT's prefix removed."""
    from safetensors.numpy import load_file

    directory = Path(directory)
    for file in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (directory / file).is_file():
            raise UsageError(f"{directory}: no {file}; pass a LoRA adapter directory (PEFT's layout)")
    config = json.loads((directory / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    weights = {key[len(PEFT_PREFIX):] if key.startswith(PEFT_PREFIX) else key: value
               for key, value in load_file(str(directory / ADAPTER_WEIGHTS)).items()}
    return config, weights


def split_adapter(model: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A trained checkpoint's tensors -> (base weights, adapter weights)."""
    base = {k: v for k, v in model.items() if not k.endswith(LORA_SUFFIXES)}
    adapter = {k: v for k, v in model.items() if k.endswith(LORA_SUFFIXES)}
    return base, adapter


def checkpoint_adapter_config(meta: Mapping[str, Any], adapter: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """r (from lora_A's shape), lora_alpha (the run's --lora-alpha, saved in the checkpoint's args) and the adapted
    modules of a checkpoint's adapter."""
    args = meta.get("args") or {}
    modules = sorted({k[: -len(LORA_SUFFIXES[0])] for k in adapter if k.endswith(LORA_SUFFIXES[0])})
    r = int(adapter[modules[0] + LORA_SUFFIXES[0]].shape[0])
    return {"r": r, "lora_alpha": float(args.get("lora_alpha") or 16), "target_modules": modules}


def merged_weights(base: Mapping[str, np.ndarray], config: Mapping[str, Any],
                   adapter: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The base state dict with every adapter folded in: W + B @ A * lora_alpha / r (float32)."""
    scaling = float(config["lora_alpha"]) / float(config["r"])
    out = dict(base)
    modules = sorted({key[: -len(".lora_A.weight")] for key in adapter if key.endswith(".lora_A.weight")})
    for module in modules:
        weight = f"{module}.weight"
        if weight not in out:
            raise UsageError(f"the adapter's module {module} has no weight {weight} in the base model; pass the base "
                             "model the adapter was trained on")
        a, b = adapter[f"{module}.lora_A.weight"], adapter[f"{module}.lora_B.weight"]
        out[weight] = (out[weight].astype(np.float32) + (b.astype(np.float32) @ a.astype(np.float32)) * scaling)
    return out


def merge_lora(model: Any) -> int:
    """Fold every adapter into its base weight and put a plain Linear back in its place; returns how many."""
    count = 0
    for name, child, parent, attr in list(_named_modules(model)):
        if not isinstance(child, LoRALinear):
            continue
        weight = tensors.to_numpy(child.weight).astype(np.float32)
        delta = tensors.to_numpy(child.lora_B.weight).astype(np.float32) @ tensors.to_numpy(child.lora_A.weight)
        out_features, in_features = weight.shape
        plain = nn.Linear(in_features, out_features, bias=child.bias is not None)
        state = {"weight": weight + delta.astype(np.float32) * child.scaling}
        if child.bias is not None:
            state["bias"] = tensors.to_numpy(child.bias)
        plain.load_state_dict(tensors.state_dict_from_numpy(state))
        _replace(parent, attr, plain)
        count += 1
    nn.refresh_parameter_names(model)
    return count
