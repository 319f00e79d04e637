"""The translation report: every change (line, before, after, why), every refusal, lint finding, warning and note.

Text lines read `path:line: kind: message`, TorchFix style, so editors jump to them; `--report json`
gives the same content as one JSON object.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from mmrun.launchers.translate.lint import Finding


@dataclass(frozen=True)
class Change:
    line: int
    before: str
    after: str
    why: str

    @property
    def kind(self) -> str:
        if not self.before:
            return "add"
        return "remove" if not self.after else "change"

    def as_dict(self) -> dict:
        return {"line": self.line, "kind": self.kind, "before": self.before, "after": self.after, "why": self.why}


@dataclass(frozen=True)
class Message:
    line: int
    message: str

    def as_dict(self) -> dict:
        return {"line": self.line, "message": self.message}


@dataclass
class Report:
    path: str
    source: str  # the launcher translated from
    target: str  # the launcher translated to
    launches: int = 0  # launch lines translated
    hidden_launches: int = 0  # launch lines inside eval, a variable or a heredoc: left alone, warned about, fail --check
    changes: list[Change] = field(default_factory=list)
    refusals: list[Message] = field(default_factory=list)
    lint: list[Finding] = field(default_factory=list)
    warnings: list[Message] = field(default_factory=list)  # the job may not run as written; the translation went on
    notes: list[Message] = field(default_factory=list)
    undo: str | None = None  # how the reverse was done: "record" (exact text restored) or None
    _seen: set = field(default_factory=set, repr=False, compare=False)  # each entry once, found in constant time

    def add_change(self, change: Change) -> None:
        self._add("changes", change)

    def add_note(self, line: int, message: str) -> None:
        self._add("notes", Message(line, message))

    def warn(self, line: int, message: str) -> None:
        self._add("warnings", Message(line, message))

    def refuse(self, line: int, message: str) -> None:
        self._add("refusals", Message(line, message))

    def _add(self, kind: str, entry: Change | Message) -> None:
        if (kind, entry) not in self._seen:
            self._seen.add((kind, entry))
            getattr(self, kind).append(entry)

    def as_dict(self) -> dict:
        return {
            "script": self.path,
            "from": self.source,
            "to": self.target,
            "launches": self.launches,
            "hidden_launches": self.hidden_launches,
            "translated": not self.refusals,
            "changes": [] if self.refusals else [c.as_dict() for c in sorted(self.changes, key=lambda c: c.line)],
            "refusals": [r.as_dict() for r in self.refusals],
            "lint": [f.as_dict() for f in self.lint],
            "warnings": [w.as_dict() for w in self.warnings],
            "notes": [n.as_dict() for n in self.notes],
        }

    def json(self) -> str:
        return json.dumps(self.as_dict(), ensure_ascii=False, indent=2)

    def text(self) -> str:
        lines = []
        if self.refusals:
            lines.append(f"{self.path}: not translated ({self.source} -> {self.target}): {len(self.refusals)} refusal(s)")
        else:
            lines.append(f"{self.path}: {self.source} -> {self.target}: {self.launches} launch line(s), {len(self.changes)} change(s)")
        for refusal in self.refusals:
            lines.append(f"{self.path}:{refusal.line}: error: {refusal.message}")
        for change in [] if self.refusals else sorted(self.changes, key=lambda c: c.line):
            if change.kind == "add":
                what = _show(change.after)
            elif change.kind == "remove":
                what = _show(change.before)
            else:
                what = f"{_show(change.before)} -> {_show(change.after)}"
            lines.append(f"{self.path}:{change.line}: {change.kind}: {what}: {change.why}")
        for finding in self.lint:
            lines.append(f"{self.path}:{finding.line}:{finding.column}: {finding.code} {finding.message}")
        for warning in self.warnings:
            lines.append(f"{self.path}:{warning.line}: warning: {warning.message}")
        for note in self.notes:
            lines.append(f"{self.path}:{note.line}: note: {note.message}")
        # A message may quote a value with a newline in it (`--nnodes "1:<newline>4"`): each entry stays one line.
        return "".join(line.replace("\r", "\\r").replace("\n", "\\n") + "\n" for line in lines)


def _show(text: str) -> str:
    """One line of shell text, newlines and continuations shown compactly."""
    return "`" + " ".join(text.replace("\\\n", " ").split()) + "`"
