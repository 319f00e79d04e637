"""The feature table in memory: features (catalogue.yaml) and what each layer says about them.

Built by `mmrun.features.loader` and read by the gate, the token scanner and the renderers; nothing
here reads a file or imports a framework.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mmrun.backend.vocabulary import DEVICES, FRAMEWORKS
from mmrun.backend.vocabulary import device_kind as normalise_device
from mmrun.backend.vocabulary import framework_name as normalise_framework

STACK = "stack"
TRAINER = "trainer"
LAYERS: tuple[str, ...] = (STACK, TRAINER)
# How a reported line names its layer.
LAYER_TAGS: dict[str, str] = {STACK: "[stack]", TRAINER: "[mmrun trainer]"}
LAYER_TITLES: dict[str, str] = {
    STACK: "the framework stack (Megatron-LM / MindSpeed on PyTorch, MindSpore + MSAdapter + MindSpeed)",
    TRAINER: "mmrun's own trainer (models/pretrain_gpt.py)",
}

STATUSES: tuple[str, ...] = ("supported", "fallback", "unsupported", "unknown")


@dataclass(frozen=True)
class Trigger:
    flag: str
    when: tuple[str, Any] | None  # None: a switch; else (kind, argument), kind in gt/in/matches/set
    takes: int | str
    off: Any
    dest: str

    def describe(self) -> str:
        """How the flag reads in docs: `--bf16`, `--tensor-model-parallel-size > 1`, `--x a|b`."""
        if self.when is None:
            return self.flag
        kind, arg = self.when
        if kind == "gt":
            return f"{self.flag} > {arg}"
        if kind == "in":
            return f"{self.flag} {'|'.join(arg)}"
        if kind == "matches":
            return f"{self.flag} DEV:BACKEND,..." if ":" in arg.pattern else f"{self.flag} /{arg.pattern}/"
        return f"{self.flag} {'VALUE...' if self.takes == '+' else 'VALUE'}"

    def example_tokens(self) -> list[str]:
        """One argv that turns this trigger on (tests and docs use it)."""
        if self.when is None:
            return [self.flag]
        kind, arg = self.when
        if kind == "gt":
            return [self.flag, str(arg + 1)]
        if kind == "in":
            return [self.flag, arg[0]]
        if kind == "matches":
            return [self.flag, "npu:hccl,cpu:gloo"]
        return [self.flag, "2"] if self.takes == 1 else [self.flag, "linear_qkv", "linear_proj"]

    def fires(self, value: Any) -> bool:
        """Whether an argument value turns the feature on."""
        if self.when is None:
            return bool(value)
        if value is None or value is False:
            return False
        kind, arg = self.when
        if kind == "set":
            return value != "" and value != [] and value != ()
        if kind == "gt":
            try:
                return float(value) > arg
            except (TypeError, ValueError):
                return False
        if kind == "in":
            return str(value) in arg
        return arg.fullmatch(str(value)) is not None


@dataclass(frozen=True)
class Companion:
    flag: str
    takes: int | str


@dataclass(frozen=True)
class Feature:
    name: str
    title: str
    group: str
    triggers: tuple[Trigger, ...]
    companions: tuple[Companion, ...]

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.flag for t in self.triggers))

    def describe_flags(self) -> str:
        return ", ".join(t.describe() for t in self.triggers)


@dataclass(frozen=True)
class Source:
    """Where a stack verdict comes from: a public document (url, section) or a measurement re-run here."""

    key: str
    title: str
    url: str | None = None
    section: str | None = None
    check: str | None = None  # the test in this repository that re-measures it

    def cite(self) -> str:
        where = f", {self.section}" if self.section else ""
        if self.url:
            return f"{self.title}{where} <{self.url}>"
        return f"{self.title}{where} (re-measured by {self.check})"


@dataclass(frozen=True)
class Cell:
    status: str
    reason: str
    hint: str | None = None
    min_version: str | None = None
    substitute: Any = None
    has_substitute: bool = False  # substitute may legitimately be False or None
    sources: tuple[Source, ...] = ()


@dataclass(frozen=True)
class Layer:
    """One layer's verdicts: feature name -> (framework, device) -> cell, complete for each listed feature."""

    name: str
    path: Path
    cells: Mapping[str, Mapping[tuple[str, str], Cell]]
    columns: Mapping[tuple[str, str], str]  # what each framework/device column stands for (may be empty)

    def cell(self, feature: str, framework: str, device: str) -> Cell | None:
        """The verdict, or None where this layer does not list the feature."""
        cells = self.cells.get(feature)
        if cells is None:
            return None
        return cells[(normalise_framework(framework), normalise_device(device))]

    def lists(self, feature: str) -> bool:
        return feature in self.cells


@dataclass(frozen=True)
class Tables:
    features: tuple[Feature, ...]
    layers: Mapping[str, Layer]
    sources: Mapping[str, Source]

    def feature(self, name: str) -> Feature:
        for feature in self.features:
            if feature.name == name:
                return feature
        raise KeyError(f"no feature named {name!r} in the feature catalogue")

    def layer(self, name: str) -> Layer:
        return self.layers[name]

    def triggers_for(self, flag: str) -> list[tuple[Feature, Trigger]]:
        return [(f, t) for f in self.features for t in f.triggers if t.flag == flag]

    def companion_flags(self) -> dict[str, list[tuple[Feature, Companion]]]:
        found: dict[str, list[tuple[Feature, Companion]]] = {}
        for feature in self.features:
            for comp in feature.companions:
                found.setdefault(comp.flag, []).append((feature, comp))
        return found

    def view(self, layer: str) -> "LayerView":
        return LayerView(self, self.layers[layer])

    def by_group(self) -> dict[str, list[Feature]]:
        """Features in catalogue order, grouped by their `group` (for docs and `mmrun features`)."""
        grouped: dict[str, list[Feature]] = {}
        for feature in self.features:
            grouped.setdefault(feature.group, []).append(feature)
        return grouped


@dataclass(frozen=True)
class LayerView:
    """The features one layer lists, with their flags: what a training parser must declare for that layer."""

    tables: Tables
    layer: Layer

    @property
    def entries(self) -> tuple[Feature, ...]:
        return tuple(f for f in self.tables.features if self.layer.lists(f.name))

    def companion_flags(self) -> dict[str, list[tuple[Feature, Companion]]]:
        return {flag: owners for flag, owners in self.tables.companion_flags().items()
                if any(self.layer.lists(f.name) for f, _ in owners)}


def version_tuple(version: str) -> tuple[int, ...] | None:
    match = re.match(r"\d+(\.\d+)*", str(version))
    return tuple(int(p) for p in match.group(0).split(".")) if match else None


def version_at_least(found: str, needed: str) -> bool:
    have, need = version_tuple(found), version_tuple(needed)
    if have is None or need is None:
        return True  # an unparseable version is not a reason to refuse
    width = max(len(have), len(need))
    return have + (0,) * (width - len(have)) >= need + (0,) * (width - len(need))


ALL_COLUMNS: tuple[tuple[str, str], ...] = tuple((fw, dev) for fw in FRAMEWORKS for dev in DEVICES)
