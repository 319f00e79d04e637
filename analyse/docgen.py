"""Render the rule table of docs/analyse.md from rules.yaml, so the page cannot drift from the data.

    python -m mmrun.analyse.docgen            print the table
    python -m mmrun.analyse.docgen --write    update docs/analyse.md between the markers
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterable

from mmrun.common.atomic_write import atomic_write

from .report import CSV_FILES
from .rules import Rule, load_rules

BEGIN = "<!-- BEGIN generated rules table: python -m mmrun.analyse.docgen --write -->"
END = "<!-- END generated rules table -->"
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


def splice(doc: str, table: str) -> str:
    """`doc` with the text between the markers replaced by `table`."""
    if BEGIN not in doc or END not in doc:
        raise ValueError(f"the page lacks the markers {BEGIN!r} ... {END!r}")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def is_current(doc_path: Path = DOC_PATH) -> bool:
    doc = doc_path.read_text(encoding="utf-8")
    return splice(doc, render_table(load_rules())) == doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmrun.analyse.docgen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"update {DOC_PATH} in place")
    args = parser.parse_args(argv)
    table = render_table(load_rules())
    if not args.write:
        sys.stdout.write(table)
        return 0
    doc = DOC_PATH.read_text(encoding="utf-8")
    atomic_write(DOC_PATH, splice(doc, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
