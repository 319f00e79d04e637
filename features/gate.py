"""The startup gate of a training entry: parsed arguments in, a verdict from both layers out.

mmrun's trainer calls `gate(args, framework, device, on_unsupported)` right after parsing, before a
model is built. It raises `FeatureGateError` (exit 2) with one line per flag that stops the job, or
returns the decisions and the argument values to switch features off / substitute. Both layers are
checked: what the framework stack can do, and what mmrun's trainer implements; either can stop it.
"""
from __future__ import annotations

import argparse
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, TextIO

from mmrun.backend.vocabulary import device_kind as normalise_device
from mmrun.backend.vocabulary import framework_name as normalise_framework
from mmrun.features.decisions import Decision, decide, judged_for_entry
from mmrun.features.loader import load_tables
from mmrun.features.table import LAYERS, Tables

POLICIES: tuple[str, ...] = ("error", "warn")


class FeatureGateError(Exception):
    """The training arguments ask for something this framework/device cannot do.

    `lines` holds one line per flag and layer (flag as received, framework, device, reason, hint); the
    training entry prints them and exits with `exit_code`.
    """

    exit_code = 2

    def __init__(self, lines: Sequence[str], decisions: Sequence[Decision]):
        self.lines = list(lines)
        self.decisions = list(decisions)
        super().__init__("\n".join(self.lines))


def received_text(trig: Any, value: Any) -> str:
    """The flag as a command line would have spelled it."""
    if trig.when is None:
        return trig.flag
    if isinstance(value, (list, tuple)):
        return " ".join([trig.flag, *map(str, value)])
    return f"{trig.flag} {value}"


def decide_args(args: argparse.Namespace | Mapping[str, Any], framework: str, device: str,
                framework_version: str | None = None, tables: Tables | None = None,
                layers: Sequence[str] = LAYERS) -> list[Decision]:
    """Every feature the parsed arguments turn on, with each listed layer's verdict (no policy applied)."""
    tables = tables or load_tables()
    framework, device = normalise_framework(framework), normalise_device(device)
    values = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    decisions = []
    for feature in tables.features:
        for trig in feature.triggers:
            if trig.dest not in values or not trig.fires(values[trig.dest]):
                continue
            value = values[trig.dest]
            for layer in layers:
                cell = tables.layer(layer).cell(feature.name, framework, device)
                if cell is not None:
                    decisions.append(decide(layer, cell, feature, trig, received_text(trig, value), value,
                                            framework, device, framework_version))
    return decisions


@dataclass
class GateResult:
    """The gate's outcome when the job may go on."""

    framework: str
    device: str
    policy: str
    decisions: list[Decision]
    notices: list[str] = field(default_factory=list)  # substitutions, under every policy
    warnings: list[str] = field(default_factory=list)  # fallbacks switched off under --on-unsupported warn

    @property
    def supported(self) -> list[Decision]:
        return [d for d in self.decisions if d.status == "supported"]

    @property
    def changed(self) -> list[Decision]:
        """Decisions whose argument the job must run with a different value."""
        return [d for d in self.decisions if d.status == "fallback"]

    @property
    def overrides(self) -> dict[str, Any]:
        """argparse dest -> value to run with (features switched off, substitutes).

        Decisions come stack first, trainer second, so where both layers change one argument the
        trainer's value (the one the code that runs needs) wins.
        """
        return {d.dest: d.replacement for d in self.changed}

    def apply(self, args: argparse.Namespace | dict) -> argparse.Namespace | dict:
        """Write `overrides` into the parsed arguments (in place) and return them."""
        for dest, value in self.overrides.items():
            if isinstance(args, dict):
                args[dest] = value
            else:
                setattr(args, dest, value)
        return args


# stream -> lines already printed on it: a warning is said once per process, however often gate runs.
_ALREADY_SAID: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()


def gate(args: argparse.Namespace | Mapping[str, Any], framework: str, device: str,
         on_unsupported: str = "error", *, framework_version: str | None = None,
         stream: TextIO | None = sys.stderr, tables: Tables | None = None,
         layers: Sequence[str] = LAYERS, entry_features: Sequence[str] = ()) -> GateResult:
    """Check parsed training arguments against the table's layers before a model is built.

    policy "error" (default): any `unsupported` verdict, and any `fallback` that would switch a
    feature off, raises FeatureGateError with one line per flag and layer. policy "warn": such
    fallbacks are switched off with a warning (printed once per process), `unsupported` still raises.
    Substitutions that cannot change what the job computes (communication backend, checkpoint file
    format, switches of the other framework) are made under both policies with a notice. `unknown`
    stack verdicts say nothing: the trainer layer decides. The caller applies the result with
    `result.apply(args)`. `entry_features`: features the running entry implements itself (models/pretrain_sora.py's
    LoRA); the trainer layer, which speaks for the models mmrun's entries train (GPT, Qwen2-VL family,
    Qwen3-VL, Wan, transformers models) where they share the training code, is not asked about them.
    """
    if on_unsupported not in POLICIES:
        raise ValueError(f"on_unsupported must be one of {', '.join(POLICIES)}. Received: {on_unsupported!r}")
    decisions = [d for d in judged_for_entry(decide_args(args, framework, device, framework_version, tables, layers),
                                             entry_features) if d.status != "unknown"]
    stops = [d for d in decisions if d.stops(on_unsupported)]
    if stops:
        raise FeatureGateError([d.line(on_unsupported) for d in stops], stops)
    result = GateResult(framework=normalise_framework(framework), device=normalise_device(device),
                        policy=on_unsupported, decisions=decisions)
    # One change, one line: where both layers make the same change to one argument (nccl -> gloo on the
    # CPU), the stack's line (first, with its source) says it for both.
    said_changes: set[tuple[bool, str, str]] = set()
    for d in result.changed:
        change = (d.automatic, d.dest, repr(d.replacement))
        if change not in said_changes:
            said_changes.add(change)
            (result.notices if d.automatic else result.warnings).append(d.line(on_unsupported))
    if stream is not None:
        said = _ALREADY_SAID.setdefault(stream, set())
        for prefix, lines in (("notice", result.notices), ("warning", result.warnings)):
            for text in lines:
                if text not in said:
                    said.add(text)
                    print(f"{prefix}: {text}", file=stream, flush=True)
    return result


def add_gate_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--on-unsupported error|warn` (both spellings) to a training entry's parser."""
    parser.add_argument("--on-unsupported", "--on_unsupported", dest="on_unsupported", choices=POLICIES,
                        default="error", help="what to do with a feature this framework/device lacks: "
                        "error stops (exit 2); warn runs with a fallback feature off (unsupported still stops)")
