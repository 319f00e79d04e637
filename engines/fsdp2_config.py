"""MindSpeed-MM's FSDP2 configuration file (`--fsdp2-config-path fsdp2_config.yaml`): keys, defaults, checks.

Framework-free on purpose: the launcher checks the file before any worker starts, `translate` and the
trainer read it with the same rules, and only backend/torch/fsdp2/ turns it into torch calls.

    config = load_fsdp2_config("fsdp2_config.yaml")       # unknown keys, bad values: FSDP2ConfigError
    check_with_training_args(config, args)                 # --recompute-*, --distributed-backend
    plan = plan_modules(config, module_names, classes)     # patterns -> module paths; overlap checks

The keys and their meaning are the user guide's table ("FSDP2配置文件驱动训练", MindSpeed-MM); KEYS below
holds them as data (type, default, meaning), and docs/fsdp2.md is generated from it.

Module entries (sub_modules_to_wrap, ignored_modules, recompute_modules) are either paths in the model's
own module tree with an optional `{...}` per segment (`model.layers.{*}`, `model.layers.{0-23}`,
`model.layers.{1,3,5}`), or a class's dotted name (`transformers.models.qwen2.modeling_qwen2.Qwen2DecoderLayer`,
as MindSpeed-MM's own qwen3vl fsdp2_config.yaml lists them): every module of that class. A path that
matches nothing is an error naming the children that exist where the match stopped; a class entry may
match nothing (MindSpeed-MM lists the dense and the MoE classes of a family in one file), but a whole
list that matches nothing is an error.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from mmrun.common.yaml_tables import TableError, load_yaml
from mmrun.engines.base import ArgumentsError
from mmrun.features.mindspeed_keys import check_values, load_key_table


class FSDP2ConfigError(ArgumentsError):
    """One line naming the key or pattern of the FSDP2 file, what was received and what to do (exit 2)."""


DTYPES = ("bf16", "fp16", "fp32")
# Spellings MindSpeed-MM's configs use for the same three dtypes.
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}


@dataclass(frozen=True)
class Key:
    kind: str  # "sharding" | "dtype" | "bool" | "int" | "modules"
    default: Any
    meaning: str


# The user guide's table, in its order. Defaults: the guide's where it gives one; "-" there means unset
# (None: torch's own default applies, e.g. no mixed precision, reshard_after_forward True).
KEYS: dict[str, Key] = {
    "sharding_size": Key("sharding", 1, "ranks one parameter is sharded over: `auto` = world size; smaller = "
                         "hybrid sharding (2-D mesh: replicas x shards); 1 = no sharding, every rank a replica"),
    "param_dtype": Key("dtype", None, "dtype of the gathered parameters in forward/backward (bf16, fp16, fp32); "
                       "unset: the model's dtype"),
    "reduce_dtype": Key("dtype", None, "dtype of the gradient reduce-scatter; unset: param_dtype"),
    "output_dtype": Key("dtype", None, "dtype the wrapped modules' floating outputs are cast to; unset: no cast"),
    "cast_forward_inputs": Key("bool", True, "cast the floating inputs of each wrapped module to param_dtype"),
    "sub_modules_to_wrap": Key("modules", (), "modules sharded as one unit each (their own all-gather); "
                               "the root model is always wrapped last"),
    "ignored_modules": Key("modules", (), "modules FSDP leaves alone: their parameters stay whole on every rank"),
    "recompute_modules": Key("modules", (), "modules whose activations are recomputed in backward "
                             "(conflicts with Megatron's --recompute-*)"),
    "use_reentrant": Key("bool", True, "torch.utils.checkpoint's reentrant implementation for recompute_modules"),
    "reshard_after_forward": Key("bool", None, "true: free gathered parameters after forward (ZeRO-3, less memory); "
                                 "false: keep them until backward (ZeRO-2, less communication); unset: true"),
    "offload_to_cpu": Key("bool", False, "keep sharded parameters, gradients and optimizer state in host memory "
                          "(needs a CPU backend in --distributed-backend, e.g. npu:hccl,cpu:gloo)"),
    "pin_memory": Key("bool", False, "pin the offloaded host memory (only with offload_to_cpu; needs an accelerator)"),
    "num_to_forward_prefetch": Key("int", 0, "wrapped modules whose all-gather starts ahead in forward"),
    "num_to_backward_prefetch": Key("int", 1, "wrapped modules whose all-gather starts ahead in backward"),
}

_BOOLS = {True: True, False: False, "true": True, "false": False, "True": True, "False": False}


@dataclass(frozen=True)
class FSDP2Config:
    """A checked FSDP2 file; `source` is where it came from (for messages)."""

    sharding_size: int | str = 1
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    output_dtype: str | None = None
    cast_forward_inputs: bool = True
    sub_modules_to_wrap: tuple[str, ...] = ()
    ignored_modules: tuple[str, ...] = ()
    recompute_modules: tuple[str, ...] = ()
    use_reentrant: bool = True
    reshard_after_forward: bool | None = None
    offload_to_cpu: bool = False
    pin_memory: bool = False
    num_to_forward_prefetch: int = 0
    num_to_backward_prefetch: int = 1
    # MindSpeed-MM's MoE keys (features/mindspeed_mm_keys.yaml): patterns of a MoE model's expert modules. With
    # expert_parallel_size 1 (the only value taken) MindSpeed-MM shards them inside their FSDP unit like every
    # other module (its _init_ep_model returns before reading moe_modules / reshard_local_experts); so does mmrun
    moe_modules: tuple[str, ...] = ()
    # expert_parallel_size > 1: the moe_modules' experts split over their own mesh dimension, tokens dispatched to
    # them (engines/torch/fsdp2/experts.py, as MindSpeed-MM's _init_ep_model)
    expert_parallel_size: int = 1
    reshard_local_experts: bool = True
    source: str = "<fsdp2 config>"

    def shard_size(self, world_size: int) -> int:
        """The shard dimension of the mesh for this world size (`auto` = all ranks)."""
        size = world_size if self.sharding_size == "auto" else int(self.sharding_size)
        if size < 1 or world_size % size:
            raise FSDP2ConfigError(f"{self.source}: sharding_size {self.sharding_size} must divide the world size "
                                   f"{world_size}; use auto or one of {_divisors(world_size)}")
        return size

    def summary(self, world_size: int) -> str:
        shard = self.shard_size(world_size)
        replicas = world_size // shard
        mode = ("full shard" if replicas == 1 else f"hybrid shard ({replicas} replicas x {shard} shards)"
                if shard > 1 else f"no sharding ({replicas} replicas)")
        zero = "ZeRO-2" if self.reshard_after_forward is False else "ZeRO-3"
        extras = [f"param {self.param_dtype}" if self.param_dtype else "",
                  f"reduce {self.reduce_dtype}" if self.reduce_dtype else "",
                  "CPU offload" if self.offload_to_cpu else "",
                  f"prefetch fwd {self.num_to_forward_prefetch} bwd {self.num_to_backward_prefetch}"]
        return ", ".join([mode, zero, *[e for e in extras if e]])


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _value(where: str, key: str, spec: Key, value: Any) -> Any:
    """One key's value, checked and normalised; errors name the key, the value and what is allowed."""
    bad = f"{where}: {key}: {value!r} is not valid"
    if value is None:
        return spec.default
    if spec.kind == "sharding":
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise FSDP2ConfigError(f"{bad}; use auto or a positive integer")
    if spec.kind == "dtype":
        name = DTYPE_ALIASES.get(str(value), str(value))
        if name in DTYPES:
            return name
        raise FSDP2ConfigError(f"{bad}; use one of {', '.join(DTYPES)}")
    if spec.kind == "bool":
        if isinstance(value, (bool, str)) and value in _BOOLS:
            return _BOOLS[value]
        raise FSDP2ConfigError(f"{bad}; use true or false")
    if spec.kind == "int":
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise FSDP2ConfigError(f"{bad}; use an integer >= 0")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise FSDP2ConfigError(f"{bad}; use a list of module paths such as model.layers.{{*}}")
    for pattern in value:
        parse_pattern(pattern, f"{where}: {key}")
    return tuple(v.strip() for v in value)


def config_from_mapping(data: Any, source: str = "<fsdp2 config>") -> FSDP2Config:
    """A parsed YAML mapping -> FSDP2Config; the first problem raises FSDP2ConfigError."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise FSDP2ConfigError(f"{source}: must be a mapping of the FSDP2 keys. Received: {type(data).__name__}")
    table = load_key_table()
    for key in data:
        if str(key) not in KEYS and table.entry("fsdp2", str(key)) is None:
            close = difflib.get_close_matches(str(key), KEYS, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]}?" if close else f"the keys are {', '.join(KEYS)}"
            raise FSDP2ConfigError(f"{source}: unknown key {key!r}; {hint}")
    refused = check_values("fsdp2", data, source, table)  # MindSpeed-MM's MoE keys at values that need MoE
    if refused:
        raise FSDP2ConfigError(refused[0])
    values = {key: _value(source, key, spec, data.get(key)) for key, spec in KEYS.items()}
    moe = _value(source, "moe_modules", Key("modules", (), ""), data.get("moe_modules"))
    ep = data.get("expert_parallel_size", 1)
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise FSDP2ConfigError(f"{source}: expert_parallel_size: {ep!r} is not valid; use a positive integer (1: no "
                               "expert parallelism)")
    reshard = _value(source, "reshard_local_experts", Key("bool", True, ""), data.get("reshard_local_experts"))
    config = FSDP2Config(**values, moe_modules=moe, expert_parallel_size=ep, reshard_local_experts=reshard,
                         source=source)
    if config.pin_memory and not config.offload_to_cpu:
        raise FSDP2ConfigError(f"{source}: pin_memory: true applies only with offload_to_cpu: true; "
                               "set offload_to_cpu: true or drop pin_memory")
    _check_static_overlap(config)
    return config


def load_fsdp2_config(path: str | Path) -> FSDP2Config:
    """Read and check the file (the one YAML loader: duplicate keys are errors too)."""
    path = Path(path)
    if not path.is_file():
        raise FSDP2ConfigError(f"--fsdp2-config-path {path}: no such file; pass the path of the FSDP2 YAML file")
    try:
        data = load_yaml(path)
    except TableError as err:
        raise FSDP2ConfigError(str(err).splitlines()[0]) from None
    return config_from_mapping(data, str(path))


# ------------------------------------------------------------------------------ training arguments

RECOMPUTE_FLAGS = (("--recompute-granularity", "recompute_granularity"), ("--recompute-method", "recompute_method"),
                   ("--recompute-num-layers", "recompute_num_layers"), ("--recompute-activations", "recompute_activations"))


def cpu_backend_in(distributed_backend: str | None) -> bool:
    """Whether a --distributed-backend value has a CPU backend: `npu:hccl,cpu:gloo`, `cpu:gloo,cuda:nccl`,
    or plain `gloo` (a CPU-only job communicates through gloo already)."""
    if not distributed_backend:
        return False
    parts = [p.strip() for p in str(distributed_backend).split(",")]
    return any(p.startswith("cpu:") or p == "gloo" for p in parts)


def check_with_training_args(config: FSDP2Config, given: Mapping[str, Any]) -> None:
    """The file against Megatron's arguments (`given`: dest -> value, None/False when not given)."""
    if config.recompute_modules:
        flags = [flag for flag, dest in RECOMPUTE_FLAGS if given.get(dest) not in (None, False, 0)]
        if flags:
            raise FSDP2ConfigError(f"{config.source}: recompute_modules conflicts with Megatron's {', '.join(flags)} "
                                   "(the user guide: turn Megatron's recompute off); drop one of them")
    if config.offload_to_cpu and not cpu_backend_in(given.get("distributed_backend")):
        raise FSDP2ConfigError(f"{config.source}: offload_to_cpu: true needs a CPU backend in --distributed-backend. "
                               f"Received: --distributed-backend {given.get('distributed_backend') or '(not given)'}; pass e.g. "
                               "--distributed-backend npu:hccl,cpu:gloo (cpu:gloo,cuda:nccl on GPUs, gloo on CPU)")


def given_from_argv(argv: Sequence[str]) -> dict[str, Any]:
    """The few training arguments the checks need, read from a raw argv (the launcher has no parser)."""
    wanted = {"fsdp2_config_path": 1, "distributed_backend": 1, "use_torch_fsdp2": 0,
              **{dest: (0 if dest == "recompute_activations" else 1) for _, dest in RECOMPUTE_FLAGS}}
    given: dict[str, Any] = {}
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        name, eq, inline = token[2:].partition("=")
        dest = name.replace("-", "_")
        if dest in wanted:
            if wanted[dest] == 0:
                given[dest] = True
            else:
                given[dest] = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return given


# ----------------------------------------------------------------------------------- module patterns

_BRACE = re.compile(r"^\{([^{}]*)\}$")
_CLASS_SEGMENT = re.compile(r"^[A-Z][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Pattern:
    text: str
    segments: tuple[Any, ...]  # str (exact) | frozenset[int] | "*"
    is_class: bool = False


def _segment(text: str, where: str, pattern: str) -> Any:
    match = _BRACE.match(text)
    if not match:
        if "{" in text or "}" in text or not text:
            raise FSDP2ConfigError(f"{where}: pattern {pattern!r}: bad segment {text!r}; use name, {{*}}, "
                                   "{0-23} or {1,3,5}")
        return text
    body = match.group(1).replace(" ", "")
    if body == "*":
        return "*"
    numbers: set[int] = set()
    try:
        for part in body.split(","):
            lo, dash, hi = part.partition("-")
            numbers.update(range(int(lo), int(hi) + 1) if dash else [int(lo)])
    except ValueError:
        raise FSDP2ConfigError(f"{where}: pattern {pattern!r}: bad index set {{{body}}}; use {{*}}, {{0-23}} "
                               "or {1,3,5}") from None
    if not numbers:
        raise FSDP2ConfigError(f"{where}: pattern {pattern!r}: the range {{{body}}} is empty")
    return frozenset(numbers)


def parse_pattern(pattern: str, where: str = "fsdp2 config") -> Pattern:
    parts = pattern.strip().split(".")
    is_class = len(parts) > 1 and bool(_CLASS_SEGMENT.match(parts[-1])) and "{" not in pattern
    return Pattern(pattern.strip(), tuple(_segment(p, where, pattern) for p in parts), is_class)


def _segment_matches(segment: Any, name: str) -> bool:
    if segment == "*":
        return True
    if isinstance(segment, frozenset):
        return name.isdigit() and int(name) in segment
    return segment == name


def match_pattern(pattern: Pattern, module_names: Iterable[str], classes: Mapping[str, str] | None = None) -> list[str]:
    """Module paths (from `named_modules()`, "" = root) that the pattern names, in model order."""
    if pattern.is_class:
        return [n for n in module_names if classes and classes.get(n) == pattern.text]
    out = []
    for name in module_names:
        parts = name.split(".") if name else []
        if len(parts) == len(pattern.segments) and all(_segment_matches(s, p) for s, p in zip(pattern.segments, parts)):
            out.append(name)
    return out


def _where_it_stops(pattern: Pattern, module_names: Sequence[str]) -> str:
    """'at <prefix>: <children>' for the longest matched prefix of a path that matches nothing."""
    prefixes = [""]
    for depth, segment in enumerate(pattern.segments):
        nxt = []
        for prefix in prefixes:
            children = _children(prefix, module_names)
            hits = [c for c in children if _segment_matches(segment, c)]
            nxt += [f"{prefix}.{c}" if prefix else c for c in hits]
        if not nxt:
            children = sorted({c for p in prefixes for c in _children(p, module_names)}, key=_natural)
            at = prefixes[0] or "the model's top level"
            shown = _abbreviate(children)
            return f"at {at} the modules are: {shown}" if children else f"{at} has no submodules"
        prefixes = nxt
    return "no module there"


def _children(prefix: str, module_names: Sequence[str]) -> list[str]:
    depth = len(prefix.split(".")) if prefix else 0
    out = []
    for name in module_names:
        parts = name.split(".") if name else []
        if len(parts) == depth + 1 and (not prefix or name.startswith(prefix + ".")):
            out.append(parts[-1])
    return out


def _natural(name: str) -> tuple:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _abbreviate(children: list[str]) -> str:
    digits = [int(c) for c in children if c.isdigit()]
    words = [c for c in children if not c.isdigit()]
    parts = words[:12] + (["..."] if len(words) > 12 else [])
    if digits:
        parts.append(f"{{{min(digits)}-{max(digits)}}}" if len(digits) > 1 else str(digits[0]))
    return ", ".join(parts)


@dataclass
class ModulePlan:
    """Module paths of one model for each list of the file (model order; "" is never among them)."""

    wrap: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    recompute: list[str] = field(default_factory=list)
    moe: list[str] = field(default_factory=list)  # the expert modules moe_modules names (sharded in their unit)


def _inside(name: str, parent: str) -> bool:
    return name == parent or name.startswith(parent + ".")


def _check_static_overlap(config: FSDP2Config) -> None:
    """The same pattern written in both sub_modules_to_wrap and ignored_modules: caught without a model."""
    both = set(config.sub_modules_to_wrap) & set(config.ignored_modules)
    if both:
        raise FSDP2ConfigError(f"{config.source}: {sorted(both)[0]!r} is in both sub_modules_to_wrap and ignored_modules; "
                               "a module is either sharded or ignored, remove it from one list")


def _own_name(pattern: str, aliases: Mapping[str, str | None]) -> str | None:
    """A MindSpeed-MM module path of the pattern (text_decoder.decoder.layers.{*}) in the model's own names
    (model.layers.{*}), by its longest aliased prefix; None: a module without parameters in this model."""
    for prefix in sorted(aliases, key=len, reverse=True):
        if pattern == prefix or pattern.startswith(prefix + "."):
            own = aliases[prefix]
            return None if own is None else own + pattern[len(prefix):]
    return pattern


def plan_modules(config: FSDP2Config, module_names: Sequence[str], classes: Mapping[str, str] | None = None,
                 aliases: Mapping[str, str | None] | None = None) -> ModulePlan:
    """Resolve the three lists against one model's module tree; errors name the pattern and what exists.
    `aliases`: the model's table of MindSpeed-MM's module paths (its `mindspeed_mm_modules`), so that MindSpeed-MM's
    own FSDP2 files (text_decoder.decoder.layers.{*}) name the same modules as the model's paths do."""
    names = [n for n in module_names if n]
    if aliases:
        config = dataclasses.replace(config, **{key: tuple(own for own in (_own_name(p, aliases) for p in
                                                                          getattr(config, key)) if own is not None)
                                                for key in ("sub_modules_to_wrap", "ignored_modules",
                                                            "recompute_modules")})
    plan = ModulePlan()
    for pattern in config.moe_modules:  # no match: a dense model (MindSpeed-MM ships one file for 8B and 30B)
        hits = match_pattern(parse_pattern(pattern, f"{config.source}: moe_modules"), names, classes)
        plan.moe.extend(h for h in hits if h not in plan.moe)
    for key, target in (("sub_modules_to_wrap", plan.wrap), ("ignored_modules", plan.ignore),
                        ("recompute_modules", plan.recompute)):
        patterns = [parse_pattern(p, f"{config.source}: {key}") for p in getattr(config, key)]
        for pattern in patterns:
            hits = match_pattern(pattern, names, classes)
            if not hits and not pattern.is_class:
                raise FSDP2ConfigError(f"{config.source}: {key}: {pattern.text!r} matches no module of the model "
                                       f"({_where_it_stops(pattern, names)})")
            target.extend(h for h in hits if h not in target)
        if patterns and not target:
            raise FSDP2ConfigError(f"{config.source}: {key}: none of {', '.join(p.text for p in patterns)} matches a "
                                   "module class of the model; list module paths such as model.layers.{*}")
        order = {n: i for i, n in enumerate(names)}
        target.sort(key=order.__getitem__)
    for wrapped in plan.wrap:
        for ignored in plan.ignore:
            # An ignored module inside a wrapped one is fine (its parameters are left out of that unit); a
            # wrapped module that is, or lies inside, an ignored one asks for two contrary things.
            if _inside(wrapped, ignored):
                raise FSDP2ConfigError(f"{config.source}: sub_modules_to_wrap and ignored_modules overlap at {wrapped!r} "
                                       f"(ignored: {ignored!r}); a module is either sharded or ignored, remove it "
                                       "from one list")
    return plan
