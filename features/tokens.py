"""Scan a script's training arguments (shell words) for the table's flags: `mmrun translate` and `mmrun features --check`.

Unlike the gate, which sees parsed arguments, this sees words as the shell passes them: `--opt value`,
`--opt=value`, underscores for dashes, values that are shell expansions (`$TP`), and companion flags
that only configure a feature. Each decision carries the token span it came from, so a rewrite can
remove or replace exactly those words.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Sequence

from mmrun.backend.vocabulary import device_kind as normalise_device
from mmrun.backend.vocabulary import framework_name as normalise_framework
from mmrun.features.decisions import Decision, decide, judged_for_entry
from mmrun.features.loader import load_tables
from mmrun.features.table import STACK, Tables


def _is_option(token: str) -> bool:
    return token.startswith("-") and not re.fullmatch(r"-\d+(\.\d*)?([eE][-+]?\d+)?", token)


def _value_unknown(token: str) -> bool:
    return "$" in token or "`" in token


def _split_option(token: str) -> tuple[str, str | None]:
    """`--foo_bar=1` -> (`--foo-bar`, `1`); Megatron spells flags with dashes, users sometimes not."""
    name, eq, value = token.partition("=")
    return "--" + name[2:].replace("_", "-"), (value if eq else None)


def _take_values(tokens: Sequence[str], start: int, takes: int | str, inline: str | None) -> tuple[list[str], int]:
    """Values of the option at tokens[start] and the index after them."""
    if takes == 0:
        return [], start + 1
    if inline is not None:
        return [inline], start + 1
    stop = start + 1
    limit = start + 2 if takes == 1 else len(tokens)
    while stop < min(limit, len(tokens)) and not _is_option(tokens[stop]):
        stop += 1
    return list(tokens[start + 1:stop]), stop


def check_flags(tokens: Sequence[str], framework: str, device: str, *, layers: Sequence[str] = (STACK,),
                framework_version: str | None = None, tables: Tables | None = None,
                entry_features: Sequence[str] = ()) -> list[Decision]:
    """Decisions for the training flags in a token list, one per flag and listed layer, with token spans.

    `tokens` are the arguments as the shell passes them (quotes removed), e.g.
    `["--bf16", "--tensor-model-parallel-size", "2"]`. Both `--opt value` and `--opt=value` count.
    `layers` defaults to the stack alone: a script is the user's own unless its entry is mmrun's
    trainer (`mmrun.features.entries.layers_for_script`). A value that is a shell expansion (`$TP`)
    cannot be judged: for a threshold or any-value trigger the decision comes with
    `value_known=False`; for a choice among values (`--ckpt-format $FMT`) there is no decision.
    Companion flags (`--fsdp2-config-path` of `--use-torch-fsdp2`) are listed in `companion_spans`
    of their feature's decisions so a script rewrite removes them together. `entry_features`: what the
    script's entry implements itself (`mmrun.features.entries.entry_features`), not asked of the trainer layer.
    """
    tables = tables or load_tables()
    framework, device = normalise_framework(framework), normalise_device(device)
    companions = tables.companion_flags()
    decisions: list[Decision] = []
    companion_hits: dict[str, list[tuple[int, int]]] = {}
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if not token.startswith("--"):
            index += 1
            continue
        flag, inline = _split_option(token)
        triggers = tables.triggers_for(flag)
        if triggers:
            takes = triggers[0][1].takes
            values, stop = _take_values(tokens, index, takes, inline)
            value: Any = values if takes == "+" else (values[0] if values else (True if takes == 0 else None))
            unknown = any(_value_unknown(v) for v in values)
            received = " ".join(tokens[index:stop])
            for feature, trig in triggers:
                if unknown and trig.when is not None and trig.when[0] in ("in", "matches"):
                    continue
                if not (unknown or trig.fires(value)):
                    continue
                for layer in layers:
                    cell = tables.layer(layer).cell(feature.name, framework, device)
                    if cell is not None:
                        decisions.append(decide(layer, cell, feature, trig, received, value, framework, device,
                                                framework_version, span=(index, stop), value_known=not unknown))
            index = stop
            continue
        if flag in companions:
            _, stop = _take_values(tokens, index, companions[flag][0][1].takes, inline)
            for owner, _ in companions[flag]:
                companion_hits.setdefault(owner.name, []).append((index, stop))
            index = stop
            continue
        index += 1
    return [_with_companions(d, companion_hits) for d in judged_for_entry(decisions, entry_features)]


def _with_companions(decision: Decision, hits: Mapping[str, list[tuple[int, int]]]) -> Decision:
    spans = tuple(hits.get(decision.feature, ()))
    if not spans:
        return decision
    return dataclasses.replace(decision, companion_spans=spans)
