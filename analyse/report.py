"""Report writers: text (path:line:col: CODE message), JSON, CSV (Ascend-style file set), SARIF."""
from __future__ import annotations

import csv
import io
import json
from collections import Counter
from pathlib import Path
from typing import Iterable, Mapping

from mmrun.common.atomic_write import atomic_write

from .findings import LEVEL_ORDER, Change, FileResult, Finding
from .rules import Rule

FORMATS = ("text", "json", "csv", "sarif")
CSV_FIELDS = ("path", "line", "col", "code", "level", "confidence", "name", "message",
              "replacement", "reference", "fixable")
CHANGE_FIELDS = ("path", "line", "code", "before", "after")
# The CSV set written with --output DIR, after Ascend's analysis reports: which findings each holds.
CSV_FILES: dict[str, str] = {
    "findings.csv": "every finding",
    "unsupported_api.csv": "error-level findings: code that will not run as written",
    "cuda_op_list.csv": "MM1xx: CUDA-specific APIs",
    "third_party_api.csv": "MM2xx: third-party libraries",
    "affinity_api.csv": "MM6xx: NPU-affine replacements",
}
_CSV_FILTERS = {
    "findings.csv": lambda f: True,
    "unsupported_api.csv": lambda f: f.level == "error",
    "cuda_op_list.csv": lambda f: f.code.startswith("MM1"),
    "third_party_api.csv": lambda f: f.code.startswith("MM2"),
    "affinity_api.csv": lambda f: f.code.startswith("MM6"),
}
REPORT_NAMES = {"text": "analyse.txt", "json": "analyse.json", "sarif": "analyse.sarif"}


def format_finding(f: Finding) -> str:
    text = f"{f.path}:{f.line}:{f.col}: {f.code} {f.message}"
    if f.confidence == "possible":
        text += " (possible)"
    if f.fixable:
        text += " [*]"
    return text


def summary_lines(findings: list[Finding], rules: Mapping[str, Rule], *, files: int, skipped: int = 0,
                  fix_hint: bool = True) -> list[str]:
    """One line per code (count, level, title), then a totals line."""
    counts = Counter(f.code for f in findings)
    lines = []
    for code in sorted(counts):
        rule = rules.get(code)
        level = rule.level if rule else "?"
        title = rule.title if rule else ""
        lines.append(f"{code}  {level:<7}  {counts[code]:>5}  {title}")
    levels = Counter(f.level for f in findings)
    possible = sum(1 for f in findings if f.confidence == "possible")
    fixable = sum(1 for f in findings if f.fixable)
    with_findings = len({f.path for f in findings})
    total = (f"{len(findings)} finding{'s' if len(findings) != 1 else ''} in {with_findings} of {files} "
             f"file{'s' if files != 1 else ''} ({levels['error']} error, {levels['warning']} warning, "
             f"{levels['info']} info; {possible} possible)")
    if fix_hint and fixable:
        total += f"; [*] {fixable} fixable with --fix"
    if skipped:
        total += f"; {skipped} file{'s' if skipped != 1 else ''} skipped (see stderr)"
    lines.append(total)
    return lines


def render_text(findings: list[Finding], rules: Mapping[str, Rule], *, files: int, skipped: int = 0) -> str:
    body = [format_finding(f) for f in findings]
    if body:
        body.append("")
    body += summary_lines(findings, rules, files=files, skipped=skipped)
    return "\n".join(body) + "\n"


def render_json(findings: list[Finding], rules: Mapping[str, Rule], *, files: int, lines: int,
                target: str, skipped: Iterable[FileResult] = ()) -> str:
    counts = Counter(f.code for f in findings)
    data = {
        "tool": "mmrun analyse",
        "format_version": 2,   # 2: "skipped" (path, reason) replaced "parse_errors" (lines)
        "target": target,
        "files": files,
        "lines": lines,
        "findings": [f.as_dict() for f in findings],
        "skipped": [{"path": r.path, "reason": r.skipped} for r in skipped],
        "summary": {code: {"count": counts[code], "level": rules[code].level, "title": rules[code].title}
                    for code in sorted(counts) if code in rules},
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def render_csv(findings: Iterable[Finding]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for f in findings:
        writer.writerow([getattr(f, name) for name in CSV_FIELDS])
    return out.getvalue()


def render_change_list(changes: Iterable[Change]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CHANGE_FIELDS)
    for c in changes:
        writer.writerow([c.path, c.line, c.code, c.before, c.after])
    return out.getvalue()


_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def render_sarif(findings: list[Finding], rules: Mapping[str, Rule], skipped: Iterable[FileResult] = ()) -> str:
    used = sorted({f.code for f in findings})
    driver_rules = []
    for code in used:
        rule = rules[code]
        driver_rules.append({
            "id": code,
            "name": rule.title,
            "shortDescription": {"text": rule.title},
            "help": {"text": f"Instead: {rule.replacement}. Reference: {rule.reference}"},
            "defaultConfiguration": {"level": _SARIF_LEVEL[rule.level]},
        })
    index = {code: i for i, code in enumerate(used)}
    results = []
    for f in findings:
        text = f"{f.message}. Instead: {f.replacement}"
        if f.confidence == "possible":
            text += " (possible: the receiver could not be resolved)"
        results.append({
            "ruleId": f.code,
            "ruleIndex": index[f.code],
            "level": _SARIF_LEVEL[f.level],
            "message": {"text": text},
            "locations": [{"physicalLocation": {
                "artifactLocation": {"uri": Path(f.path).as_posix()},
                "region": {"startLine": f.line, "startColumn": f.col},
            }}],
            "properties": {"confidence": f.confidence, "fixable": f.fixable},
        })
    # Files that could not be analysed are tool execution notifications: the run is incomplete.
    notifications = [{
        "level": "error",
        "message": {"text": f"skipped: {r.skipped}"},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": Path(r.path).as_posix()}}}],
    } for r in skipped]
    sarif = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "mmrun analyse", "rules": driver_rules}},
            "invocations": [{"executionSuccessful": not notifications,
                             "toolExecutionNotifications": notifications}],
            "results": results,
        }],
    }
    return json.dumps(sarif, indent=2, ensure_ascii=False) + "\n"


def write_csv_set(directory: Path, findings: list[Finding]) -> list[Path]:
    """The CSV files of CSV_FILES in `directory` (header only when a file has no rows)."""
    written = []
    for name, keep in _CSV_FILTERS.items():
        path = directory / name
        atomic_write(path, render_csv(f for f in findings if keep(f)))
        written.append(path)
    return written


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=Finding.sort_key)


def error_count(findings: Iterable[Finding]) -> int:
    return sum(1 for f in findings if LEVEL_ORDER[f.level] == 0)
