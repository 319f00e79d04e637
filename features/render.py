"""The feature table as people read it: text matrices, JSON, markdown, and docs/features.md whole.

What is printed is what the gate and translate enforce: everything here is computed from `Tables`.
"""
from __future__ import annotations

import json
import shlex
from typing import Any, Sequence

from mmrun.backend.vocabulary import DEVICES, FRAMEWORKS
from mmrun.features.decisions import Decision
from mmrun.features.entries import TRAINER_PATHS
from mmrun.features.loader import load_tables
from mmrun.features.table import ALL_COLUMNS, LAYER_TAGS, LAYER_TITLES, LAYERS, STACK, TRAINER, Cell, Feature, Tables
from mmrun.features.tokens import check_flags

REGENERATE = "python scripts/update_docs.py --only features"

# Short marks for the matrix, one per verdict.
MARKS = {"supported": "yes", "unsupported": "NO", "fallback": "off", "unknown": "?"}
NOT_LISTED = "-"
LEGEND = ("yes = supported; NO = unsupported (the job stops); off = fallback: the job stops unless "
          "--on-unsupported warn, then runs with the feature off (translate warns, or removes it on request); "
          "->X = fallback made by itself with a notice (X is used instead); ? = unknown (no public source says); "
          "- = the layer does not judge this feature; >=V = needs framework version V")


def mark(cell: Cell | None) -> str:
    if cell is None:
        return NOT_LISTED
    if cell.status == "fallback" and cell.has_substitute:
        text = "->" + ("off" if cell.substitute in (False, None) else str(cell.substitute))
    else:
        text = MARKS[cell.status]
    return f"{text} >={cell.min_version}" if cell.min_version else text


def columns(framework: str | None, device: str | None) -> list[tuple[str, str]]:
    return [(fw, dev) for fw, dev in ALL_COLUMNS if framework in (None, fw) and device in (None, dev)]


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, ["-" * w for w in widths], *rows]]
    return "\n".join(lines)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    def esc(text: str) -> str:
        return text.replace("|", "\\|")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _flags(feature: Feature, markdown: bool) -> str:
    return ", ".join(f"`{t.describe()}`" for t in feature.triggers) if markdown else feature.describe_flags()


def _sources(cell: Cell | None, markdown: bool) -> str:
    if cell is None:
        return ""
    if markdown:
        return "; ".join(f"[{s.key}](#source-{s.key})" for s in cell.sources)
    return ", ".join(s.key for s in cell.sources)


def _matrix(tables: Tables, layer: str, framework: str | None, device: str | None,
            markdown: bool) -> tuple[list[str], list[list[str]]]:
    """One layer: a row per feature, a column per framework/device (or reasons for one column)."""
    cols = columns(framework, device)
    features = [f for f in tables.features if tables.layer(layer).lists(f.name)]
    if framework and device:
        header = ["feature", "flags", "status", "reason", "hint"] + (["source"] if layer == STACK else [])
        rows = []
        for feature in features:
            cell = tables.layer(layer).cell(feature.name, framework, device)
            row = [feature.name, _flags(feature, markdown), mark(cell), cell.reason, cell.hint or ""]
            rows.append(row + ([_sources(cell, markdown)] if layer == STACK else []))
        return header, rows
    header = ["feature", "flags", *[f"{fw} {dev}" for fw, dev in cols]]
    rows = [[f.name, _flags(f, markdown), *[mark(tables.layer(layer).cell(f.name, fw, dev)) for fw, dev in cols]]
            for f in features]
    return header, rows


def _layer_tables(framework: str | None, device: str | None, layers: Sequence[str], tables: Tables | None,
                  markdown: bool) -> str:
    tables = tables or load_tables()
    layout = md_table if markdown else _text_table
    parts = [f"{LAYER_TAGS[layer]} {LAYER_TITLES[layer]}\n\n{layout(*_matrix(tables, layer, framework, device, markdown))}"
             for layer in layers]
    return "\n\n".join(parts) + "\n\n" + LEGEND


def render_table(framework: str | None = None, device: str | None = None, layers: Sequence[str] = LAYERS,
                 tables: Tables | None = None) -> str:
    return _layer_tables(framework, device, layers, tables, markdown=False)


def render_json(framework: str | None = None, device: str | None = None, layers: Sequence[str] = LAYERS,
                tables: Tables | None = None) -> str:
    tables = tables or load_tables()
    cols = columns(framework, device)
    features: list[dict[str, Any]] = []
    for feature in tables.features:
        support: dict[str, Any] = {}
        for layer in layers:
            if not tables.layer(layer).lists(feature.name):
                continue
            cells: dict[str, dict[str, Any]] = {}
            for fw, dev in cols:
                cell = tables.layer(layer).cell(feature.name, fw, dev)
                data: dict[str, Any] = {"status": cell.status, "reason": cell.reason, "hint": cell.hint}
                if cell.min_version:
                    data["min_version"] = cell.min_version
                if cell.has_substitute:
                    data["substitute"] = cell.substitute
                if cell.sources:
                    data["sources"] = [s.key for s in cell.sources]
                cells.setdefault(fw, {})[dev] = data
            support[layer] = cells
        if not support:
            continue
        features.append({
            "name": feature.name, "title": feature.title, "group": feature.group,
            "triggers": [{"flag": t.flag, "describe": t.describe(), "takes": t.takes, "dest": t.dest} for t in feature.triggers],
            "companions": [c.flag for c in feature.companions],
            "support": support,
        })
    stack = tables.layer(STACK)
    return json.dumps({
        "frameworks": sorted({fw for fw, _ in cols}, key=FRAMEWORKS.index),
        "devices": sorted({dev for _, dev in cols}, key=DEVICES.index),
        "layers": {layer: {"title": LAYER_TITLES[layer],
                           **({"columns": {f"{fw}/{dev}": stack.columns[(fw, dev)] for fw, dev in cols}} if layer == STACK else {})}
                   for layer in layers},
        "sources": {key: {k: v for k, v in vars(s).items() if k != "key" and v is not None}
                    for key, s in tables.sources.items()} if STACK in layers else {},
        "features": features,
    }, indent=2, ensure_ascii=False)


def render_markdown(framework: str | None = None, device: str | None = None, layers: Sequence[str] = LAYERS,
                    tables: Tables | None = None) -> str:
    """A markdown table per layer (the unfiltered docs page is `docs_page`)."""
    return _layer_tables(framework, device, layers, tables, markdown=True) + "\n"


def check_lines(args_text: str, framework: str, device: str, policy: str, layers: Sequence[str] = (STACK,),
                tables: Tables | None = None, entry_features: Sequence[str] = ()) -> tuple[list[str], bool]:
    """What the table says about a flag list: lines prefixed error/warning/notice/unknown/ok, and whether it stops.

    With mmrun's trainer among `layers`, this is what its startup gate does under `policy` (error |
    warn), both layers included. For the stack alone (a user's own script, which mmrun does not
    gate) a fallback is a warning and only an unsupported verdict counts as stopping.
    Raises ValueError when `args_text` does not split as shell words (unbalanced quotes).
    """
    decisions = check_flags(shlex.split(args_text), framework, device, layers=layers, tables=tables,
                            entry_features=entry_features)
    gated = TRAINER in layers
    lines, stops = [], False
    for d in decisions:
        stop = d.stops(policy) if gated else d.status == "unsupported"
        stops |= stop
        text = d.line(policy) if gated or d.status in ("supported", "unknown") or d.automatic else d.summary()
        lines.append(f"{_prefix(d, stop)}: {text}")
    if not decisions:
        judged = " and ".join(LAYER_TAGS[layer] for layer in layers)
        lines.append(f"ok: no flag that {judged} judges is turned on ({framework} on {device})")
    return lines, stops


def _prefix(decision: Decision, stop: bool) -> str:
    if stop:
        return "error"
    if decision.status in ("supported", "unknown"):
        return "ok" if decision.status == "supported" else "unknown"
    return "notice" if decision.automatic else "warning"


# ---------------------------------------------------------------------------------- docs page

def _example(name: str) -> list[str]:
    # The block is filled by running its commands (docs/examples/features.yaml, scripts/update_docs.py), so
    # the page shows what `mmrun features` prints, not what this module computes.
    return [f"<!-- example: {name} -->", "<!-- /example -->"]


def docs_page(tables: Tables | None = None) -> str:
    """docs/features.md, whole."""
    tables = tables or load_tables()
    stack = tables.layer(STACK)
    out = [
        "# Feature support: what each framework stack and mmrun's trainer run",
        "",
        f"<!-- Generated from features/catalogue.yaml, features/stack.yaml and features/trainer.yaml by "
        f"`{REGENERATE}`, the examples by running the commands in docs/examples/features.yaml. Edit the YAML, "
        "not this page; tests/features/test_docs.py and tests/docs/test_docs_drift.py fail when it is stale. -->",
        "",
        f"Regenerate this page: `{REGENERATE}`",
        "",
        "The Ascend migration guides ask users to check, by hand, that every feature switch of a launch script "
        "works on the MindSpore backend. mmrun keeps the answer in one table with two layers, kept apart:",
        "",
        f"- **{LAYER_TAGS[STACK]} the framework stack** (`features/stack.yaml`): what a Megatron/MindSpeed-style "
        "training script can use on each framework and device, whoever wrote it. Every verdict cites a public "
        "source (documentation section, a maintainers' example script) or a measurement this repository re-runs; "
        "what no source states is `unknown`, never `unsupported`.",
        f"- **{LAYER_TAGS[TRAINER]} mmrun's own trainer** (`features/trainer.yaml`): what "
        f"`{TRAINER_PATHS[0]}` and `training/` implement.",
        "",
        "The features themselves (titles, flags, companion flags) are defined once, in `features/catalogue.yaml`.",
        "",
        "| who checks | stack | mmrun trainer |",
        "|---|---|---|",
        "| the startup gate of mmrun's trainer (`mmrun.features.gate`) | yes | yes |",
        f"| `mmrun translate` | every script | when the launch line's script is `{TRAINER_PATHS[0]}` |",
        "| `mmrun features --check` | always | with `--entry models/pretrain_gpt.py` (or `--layer`) |",
        "",
        "Every reported line starts with the layer it comes from.",
        "",
        "## The columns of the stack",
        "",
        md_table(["framework/device", "stack"], [[f"{fw}/{dev}", stack.columns[(fw, dev)]] for fw, dev in ALL_COLUMNS]),
        "",
        "## What the verdicts mean",
        "",
        "| verdict | training gate (`--on-unsupported error`, the default) | gate with `--on-unsupported warn` | `mmrun translate` |",
        "|---|---|---|---|",
        "| supported | runs | runs | keeps the flag |",
        "| unsupported | stops, exit 2, one line per flag | stops, exit 2 | refuses the script (exit 2) unless "
        "`--on-unsupported comment\\|remove` |",
        "| fallback | stops, exit 2 (running without the feature changes memory, speed or logging) "
        "| runs with the feature off, one warning per flag | warns; `comment\\|remove` take the flag out |",
        "| fallback with a substitute (`->X`) | runs with X instead and a notice: the swap cannot change what the "
        "job computes | same | a note (or lint finding MT003 for `--distributed-backend`) |",
        "| unknown (stack only) | says nothing; the trainer layer decides | same | one note listing the unknown flags |",
        "",
        "## Examples",
        "",
        "A MindSpeed-MM style fine-tune (the user's own `pretrain_vlm.py`): the stack judges it, and the MindSpore "
        "backend on Ascend runs every flag of it.",
        "",
        *_example("vlm-stack"),
        "",
        "The same kind of flags for mmrun's own trainer on a CPU: both layers judge them.",
        "",
        *_example("trainer-cpu"),
        "",
        "## In a training entry",
        "",
        "```python",
        "import sys",
        "from mmrun import backend",
        "from mmrun.features import FeatureGateError, add_gate_arguments, gate",
        "",
        "add_gate_arguments(parser)             # --on-unsupported error|warn",
        "args = parser.parse_args()",
        "info = backend.current()",
        "try:",
        "    gate(args, info.framework, info.device_kind, args.on_unsupported,",
        "         framework_version=info.version).apply(args)   # fallbacks off, substitutes in",
        "except FeatureGateError as err:",
        "    print(err, file=sys.stderr)        # one line per flag and layer",
        "    sys.exit(err.exit_code)            # 2, before any model is built",
        "```",
        "",
        "`mmrun.features.check_flags(tokens, framework, device, layers=...)` gives the same verdicts for a "
        "script's words, each with the `span` of tokens it came from (and `companion_spans` of flags that only "
        "configure it, such as `--fsdp2-config-path`), plus `replacement_tokens()` for a rewrite; a value that is "
        "a shell variable (`$TP`) is reported with `value_known=False`. "
        "`mmrun.features.layers_for_scripts(scripts)` says which layers judge a launch line.",
        "",
    ]
    for layer in LAYERS:
        header, rows = _matrix(tables, layer, None, None, markdown=True)
        out += [f"## Matrix: {LAYER_TITLES[layer]}", "", md_table(header, rows), ""]
    out += [LEGEND + ".", "", "## Reasons, hints and sources", ""]
    for group, features in tables.by_group().items():
        out += [f"### {group}", ""]
        for feature in features:
            out += [f"#### {feature.title}", "", f"`{feature.name}`: {_flags(feature, True)}"]
            if feature.companions:
                out[-1] += f"; configured by {', '.join(f'`{c.flag}`' for c in feature.companions)}"
            out += [""]
            for layer in LAYERS:
                if not tables.layer(layer).lists(feature.name):
                    continue
                # Cells repeat across a row; list each distinct verdict once with where it applies.
                distinct: dict[Cell, list[str]] = {}
                for fw, dev in ALL_COLUMNS:
                    distinct.setdefault(tables.layer(layer).cell(feature.name, fw, dev), []).append(f"{fw}/{dev}")
                header = ["where", "verdict", "reason", "hint"] + (["source"] if layer == STACK else [])
                rows = [[", ".join(where), mark(cell), cell.reason, cell.hint or ""]
                        + ([_sources(cell, True)] if layer == STACK else []) for cell, where in distinct.items()]
                out += [f"{LAYER_TAGS[layer]}", "", md_table(header, rows), ""]
    out += ["## Sources", ""]
    for key, source in tables.sources.items():
        where = f", {source.section}" if source.section else ""
        link = f" <{source.url}>" if source.url else f" (re-measured by `{source.check}`)"
        out += [f"- <a id=\"source-{key}\"></a>`{key}`: {source.title}{where}{link}"]
    out += [
        "",
        "## What was verified",
        "",
        "- Stack verdicts were read from the cited documents and example scripts (MindSpeed-LLM and MindSpeed-MM "
        "MindSpore backend pages, their msrun examples next to the PyTorch ones, MSAdapter's constraints page, "
        "MindSpore's API pages, Megatron-LM's arguments); none was run on an NPU or a GPU here. The two CPU "
        "measurements are re-run by the tests named in the sources.",
        "- Trainer CPU cells were measured here with torch 2.13.0+cpu and mindspore 2.10.0; every `supported` CPU "
        "cell of the trainer has an end-to-end training run in `tests/features/test_gate_e2e.py`. Trainer npu and "
        "cuda cells were not run on an NPU or a GPU.",
        "- `tests/features/test_layers.py` checks the layers against each other (nothing mmrun's trainer supports "
        "is unsupported or a fallback in the stack) and against the backends' own tables (communication backends, "
        "compute dtypes).",
        "",
    ]
    return "\n".join(out)
