"""Run the analysis over files: discovery, pre-filter, parse once, analyse, fix; in parallel.

Each file is read once and parsed once. Files that contain none of the selected rules' trigger
words are counted but not parsed: no rule can fire there (see rules.build_index), so the results
are the same as parsing them.
"""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import libcst as cst

from . import fixes
from .findings import Change, FileResult, Finding
from .rules import RuleIndex, build_index, load_rules, select_rules
from .visitor import FileAnalysis

_SKIP_DIRS = {"__pycache__", "node_modules"}
GUARDED_SUFFIX = " (guarded import: the code has a fallback without it)"


class PathError(ValueError):
    """A path given on the command line does not exist or is not Python source."""


def discover(paths: Iterable[str]) -> list[tuple[str, str]]:
    """(file to read, path to display) for every .py file under `paths`, sorted, deduplicated.

    Hidden and cache folders found while walking are skipped; a path given explicitly is always
    read, whatever its name.
    """
    found: dict[str, str] = {}
    for given in paths:
        p = Path(given)
        if p.is_file():
            found.setdefault(str(p.resolve()), str(p))
        elif p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
                for name in files:
                    if name.endswith(".py"):
                        full = Path(root, name)
                        found.setdefault(str(full.resolve()), str(full))
        else:
            raise PathError(f"path does not exist: {given}; pass Python files or folders")
    return sorted(found.items(), key=lambda item: item[1])


def analyse_source(data: bytes, display: str, index: RuleIndex, *, fix: bool = False,
                   reference: bool = False) -> FileResult:
    """Analyse one file's bytes. Never raises for bad input: the result's `error` says why."""
    result = FileResult(path=display, lines=data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1))
    if index.trigger_re is None or index.trigger_re.search(data) is None:
        return result
    try:
        module = cst.parse_module(data)
    except cst.ParserSyntaxError as exc:
        detail = exc.message.splitlines()[0].removeprefix("parser error: ")
        if len(detail) > 100:
            detail = detail[:97] + "..."
        result.error = f"{display}: cannot parse ({detail}); skipped"
        return result
    except (UnicodeDecodeError, SyntaxError, LookupError, RecursionError) as exc:
        result.error = f"{display}: cannot parse ({type(exc).__name__}: {exc}); skipped"
        return result
    result.parsed = True
    try:
        analysis = FileAnalysis(module, index, force_scope=reference)
        analysis.walk()
        analysis.resolve()
        if not analysis.hits and not analysis.import_fix_edits:
            return result
        wanted = [hit.node for hit in analysis.hits]
        anchor = -1
        if fix:
            wanted += [e.anchor or e.node for hit in analysis.hits for e in hit.edits]
            wanted += [e.anchor or e.node for e in analysis.import_fix_edits]
            anchor = fixes.import_anchor(module)
            if anchor >= 0:
                wanted.append(module.body[anchor])
        positions = analysis.positions(wanted)
        result.findings = _findings(display, analysis, positions)
        if fix:
            _apply_fixes(result, module, analysis, positions, anchor)
    except RecursionError:
        result.error = f"{display}: nesting too deep to analyse; skipped"
        result.findings = []
    return result


def _findings(display: str, analysis: FileAnalysis, positions) -> list[Finding]:
    out = []
    for hit in analysis.hits:
        rule = hit.rule
        start = positions[id(hit.node)].start
        message = rule.format_message(hit.name, hit.key)
        level = rule.level
        if hit.guarded:
            level = "info"
            message += GUARDED_SUFFIX
        out.append(Finding(path=display, line=start.line, col=start.column + 1, code=rule.code,
                           level=level, confidence=hit.confidence, message=message,
                           replacement=rule.format_replacement(hit.name, hit.key), reference=rule.reference,
                           fixable=hit.fixable, name=hit.name))
    out.sort(key=Finding.sort_key)
    return out


def _apply_fixes(result: FileResult, module: cst.Module, analysis: FileAnalysis, positions,
                 anchor: int) -> None:
    edits = [e for hit in analysis.hits for e in hit.edits] + analysis.import_fix_edits
    if not edits:
        return
    needs = sorted({e.add_import for e in edits if e.add_import and e.new is not None})
    import_name = None
    if needs and not analysis.imports_module(needs[0]):
        import_name = needs[0]
    new_module = fixes.apply_edits(module, edits, import_name)
    old_code, new_code = module.code, new_module.code
    if new_code == old_code:
        return
    changes = []
    for e in edits:
        if e.before or e.after:
            changes.append(Change(result.path, positions[id(e.anchor or e.node)].start.line, e.code,
                                  e.before, e.after))
    if import_name:
        line = positions[id(module.body[anchor])].end.line + 1 if anchor >= 0 else 1
        code = next(e.code for e in edits if e.add_import == import_name)
        changes.append(Change(result.path, line, code, "", f"import {import_name}"))
    changes.sort(key=lambda c: (c.line, c.code))
    result.changes = changes
    result.new_source = new_module.bytes
    result.diff = fixes.unified_diff(result.path, old_code, new_code)


# ---------------------------------------------------------------------- running many files
@dataclass
class RunConfig:
    target: str = "both"
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    fix: bool = False
    rules_path: str | None = None


@dataclass
class RunResult:
    files: list[FileResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def findings(self) -> list[Finding]:
        return [f for r in self.files for f in r.findings]

    @property
    def errors(self) -> list[str]:
        return [r.error for r in self.files if r.error]


_WORKER_INDEX: RuleIndex | None = None
_WORKER_FIX = False


def make_index(config: RunConfig) -> RuleIndex:
    rules = load_rules(config.rules_path)
    chosen = select_rules(rules, target=config.target, select=config.select, ignore=config.ignore)
    return build_index(rules, selected=[r.code for r in chosen],
                       fixes_enabled=config.target in ("npu", "both"))


def _init_worker(config: RunConfig) -> None:
    global _WORKER_INDEX, _WORKER_FIX
    _WORKER_INDEX = make_index(config)
    _WORKER_FIX = config.fix


def _work(item: tuple[str, str]) -> FileResult:
    path, display = item
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return FileResult(path=display, error=f"{display}: cannot read ({exc.strerror}); skipped")
    return analyse_source(data, display, _WORKER_INDEX, fix=_WORKER_FIX)


def run(items: list[tuple[str, str]], config: RunConfig, *, jobs: int = 1,
        progress: Callable[[int, int], None] | None = None) -> RunResult:
    """Analyse (file, display) pairs; results come back in input order whatever `jobs` is."""
    started = time.perf_counter()
    results: list[FileResult] = []
    if jobs <= 1 or len(items) < 2:
        _init_worker(config)
        iterator: Iterator[FileResult] = map(_work, items)
        executor = None
    else:
        executor = ProcessPoolExecutor(max_workers=jobs, initializer=_init_worker, initargs=(config,))
        # Small chunks keep both workers busy when a few files are much larger than the rest.
        iterator = executor.map(_work, items, chunksize=max(1, min(8, len(items) // (jobs * 8))))
    try:
        for n, result in enumerate(iterator, 1):
            results.append(result)
            if progress is not None:
                progress(n, len(items))
    finally:
        if executor is not None:
            executor.shutdown(cancel_futures=True)
    return RunResult(files=results, seconds=time.perf_counter() - started)


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def stderr_progress(every: int = 100) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        if total >= 2 * every and (done % every == 0 or done == total):
            print(f"mmrun analyse: {done}/{total} files", file=sys.stderr, flush=True)
    return report
