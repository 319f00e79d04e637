"""What an analysis produces: findings, applied changes, and the per-file result that carries them.

Plain picklable data: results cross process boundaries when `--jobs` is above 1.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

LEVEL_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    col: int          # 1-based, as editors and flake8 count
    code: str
    level: str        # error | warning | info
    confidence: str   # certain | possible (receiver not resolvable statically)
    message: str
    replacement: str
    reference: str
    fixable: bool = False
    name: str = ""    # what matched: a qualified name, module, method or string literal

    def sort_key(self) -> tuple:
        return (self.path, self.line, self.col, self.code)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Change:
    """One rewrite applied (or proposed) by --fix, for the change list."""
    path: str
    line: int
    code: str
    before: str
    after: str


@dataclass
class FileResult:
    path: str                       # as displayed
    lines: int = 0
    parsed: bool = False            # False when the pre-filter showed no rule can fire, or when skipped
    skipped: str | None = None      # why the file could not be analysed: one line, without the path
    findings: list[Finding] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    new_source: bytes | None = None  # the rewritten file (fix mode, when something changed)
    old_digest: str = ""            # with new_source: a digest of the bytes it was made from
    diff: str = ""

    @property
    def skip_line(self) -> str:
        """`path: skipped: reason`, as printed on stderr."""
        return f"{self.path}: skipped: {self.skipped}"
