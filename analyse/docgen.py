"""Render the tables of docs/analyse.md from the data (rules.yaml, limits.Limits), so the page cannot drift.

    python -m mmrun.analyse.docgen            print the tables
    python -m mmrun.analyse.docgen --write    update docs/analyse.md between the markers
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Callable, Iterable

from mmrun.common.atomic_write import atomic_write

from .limits import DEFAULT_LIMITS, MiB, Limits
from .report import CSV_FILES
from .rules import Rule, load_rules

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "analyse.md"
_SHOWN_NAMES = 4


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _matches(rule: Rule) -> str:
    if rule.pattern is not None:
        return f"string matching `{rule.pattern}`"
    names = list(rule.names)
    shown = ", ".join(f"`{n}`" for n in names[:_SHOWN_NAMES])
    if len(names) > _SHOWN_NAMES:
        shown += f", ... ({len(names)} names)"
    prefix = {"import": "import of ", "method": ".", "string": "string ", "string-compare": "comparison with ",
              "keyword-arg": ""}.get(rule.kind, "")
    if rule.kind == "method":
        return ", ".join(f"`.{n}{'()' if rule.call else ''}`" for n in names)
    if rule.kind == "keyword-arg":
        return f"{shown} without `{rule.keyword}={'/'.join(rule.safe_values)}`"
    return prefix + shown


def _fix(rule: Rule) -> str:
    fix = rule.fix
    if fix is None:
        return ""
    text = {"rename": "rename", "rename-method": f"`.{fix.to}`", "replace-string": f"`{fix.old}` -> `{fix.new}`",
            "todo": "TODO comment"}[fix.kind]
    if fix.add_import:
        text += f" + `import {fix.add_import}`"
    return text


def render_table(rules: Iterable[Rule]) -> str:
    rows = ["| Code | Level | Targets | Matches | Problem | Instead | `--fix` |",
            "|---|---|---|---|---|---|---|"]
    for rule in rules:
        confidence = " (possible)" if rule.confidence == "possible" else ""
        rows.append("| " + " | ".join(_cell(c) for c in (
            rule.code,
            rule.level + confidence,
            ", ".join(rule.targets),
            _matches(rule),
            rule.message.format(name="X", new="the torch_npu name"),
            rule.replacement.format(name="X", new="the torch_npu name"),
            _fix(rule),
        )) + " |")
    rows.append("")
    rows.append("CSV reports written by `--format csv --output DIR`:")
    rows.append("")
    rows += [f"- `{name}`: {what}" for name, what in CSV_FILES.items()]
    return "\n".join(rows) + "\n"


def render_limits(limits: Limits = DEFAULT_LIMITS) -> str:
    rows = ["| Limit | Default | What |", "|---|---|---|"]
    for f in dataclasses.fields(limits):
        value = getattr(limits, f.name)
        shown = f"{value // MiB} MiB" if f.name.endswith("_bytes") else f"{value:g}"
        rows.append(f"| `{f.name}` | {shown} | {_cell(f.metadata['doc'])} |")
    return "\n".join(rows) + "\n"


# name -> what renders it; the page holds each between its BEGIN and END markers.
BLOCKS: dict[str, Callable[[], str]] = {
    "rules table": lambda: render_table(load_rules()),
    "limits table": render_limits,
}


def markers(name: str) -> tuple[str, str]:
    return (f"<!-- BEGIN generated {name}: python -m mmrun.analyse.docgen --write -->",
            f"<!-- END generated {name} -->")


def splice(doc: str, name: str, text: str) -> str:
    """`doc` with the text between the markers of block `name` replaced by `text`."""
    begin, end = markers(name)
    if begin not in doc or end not in doc:
        raise ValueError(f"the page lacks the markers {begin!r} ... {end!r}")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{text}{end}{tail}"


def render_page(doc: str) -> str:
    for name, render in BLOCKS.items():
        doc = splice(doc, name, render())
    return doc


def is_current(doc_path: Path = DOC_PATH) -> bool:
    doc = doc_path.read_text(encoding="utf-8")
    return render_page(doc) == doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmrun.analyse.docgen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"update {DOC_PATH} in place")
    args = parser.parse_args(argv)
    if not args.write:
        sys.stdout.write("\n".join(render() for render in BLOCKS.values()))
        return 0
    atomic_write(DOC_PATH, render_page(DOC_PATH.read_text(encoding="utf-8")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
