"""Analyse one file: size and nesting checks, pre-filter, parse once, analyse, fix.

Each file is read once and parsed once. Files that contain none of the selected rules' trigger
words are counted but not parsed: no rule can fire there (see rules.build_index), so the results
are the same as parsing them. Nothing here raises for bad input: a file that cannot be analysed
comes back with `skipped` set to the reason. Running many files, each in a worker process that a
crash inside LibCST cannot take down, is workers.py's job.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import libcst as cst

from . import fixes
from .findings import Change, FileResult, Finding
from .limits import DEFAULT_LIMITS, Limits
from .nesting import nesting_too_deep
from .rules import RuleIndex, build_index, load_rules, select_rules
from .sources import SkipFile, read_source
from .visitor import FileAnalysis

GUARDED_SUFFIX = " (guarded import: the code has a fallback without it)"


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _count_lines(data: bytes) -> int:
    return data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


def analyse_source(data: bytes, display: str, index: RuleIndex, *, fix: bool = False,
                   reference: bool = False, limits: Limits = DEFAULT_LIMITS) -> FileResult:
    """Analyse one file's bytes. Never raises for bad input: the result's `skipped` says why.

    In-process callers are protected from what the checks catch (size, nesting); what only
    shows inside LibCST's native code (a crash, minutes of work) is contained by workers.run.
    """
    result = FileResult(path=display, lines=_count_lines(data))
    if len(data) > limits.max_bytes:
        result.skipped = f"larger than {limits.max_bytes / 2**20:g} MiB ({len(data) / 2**20:.1f} MiB)"
        return result
    if index.trigger_re is None or index.trigger_re.search(data) is None:
        return result
    result.skipped = nesting_too_deep(data, limits)
    if result.skipped is not None:
        return result
    try:
        return _analyse_parsed(data, result, index, fix=fix, reference=reference)
    except RecursionError:
        result.skipped = "nesting too deep to analyse (Python's recursion limit)"
    except MemoryError:
        result.skipped = "out of memory while analysing"
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - LibCST's native panics are BaseExceptions (pyo3)
        text = " ".join(str(exc).split())[:200]
        result.skipped = f"internal error ({type(exc).__name__}: {text}); please report it with the file"
    result.findings, result.changes, result.new_source, result.diff = [], [], None, ""
    result.parsed = False
    return result


def analyse_file(path: str, display: str, index: RuleIndex, *, fix: bool = False,
                 limits: Limits = DEFAULT_LIMITS) -> FileResult:
    """Read and analyse the file at `path`; never raises for bad input."""
    try:
        data = read_source(path, limits.max_bytes)
    except SkipFile as exc:
        return FileResult(path=display, skipped=str(exc))
    return analyse_source(data, display, index, fix=fix, limits=limits)


def _analyse_parsed(data: bytes, result: FileResult, index: RuleIndex, *, fix: bool,
                    reference: bool) -> FileResult:
    display = result.path
    try:
        module = cst.parse_module(data)
    except cst.ParserSyntaxError as exc:
        detail = " ".join(exc.message.splitlines()[0].removeprefix("parser error: ").split())
        if len(detail) > 100:
            detail = detail[:97] + "..."
        result.skipped = f"cannot parse ({detail})"
        return result
    except (UnicodeDecodeError, SyntaxError, LookupError) as exc:
        result.skipped = f"cannot parse ({type(exc).__name__}: {' '.join(str(exc).split())[:150]})"
        return result
    result.parsed = True
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
        if result.new_source is not None:
            result.old_digest = digest(data)
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


# ---------------------------------------------------------------------- configuration
@dataclass
class RunConfig:
    target: str = "both"
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    fix: bool = False
    rules_path: str | None = None
    limits: Limits = field(default_factory=Limits)


def make_index(config: RunConfig) -> RuleIndex:
    rules = load_rules(config.rules_path)
    chosen = select_rules(rules, target=config.target, select=config.select, ignore=config.ignore)
    return build_index(rules, selected=[r.code for r in chosen],
                       fixes_enabled=config.target in ("npu", "both"))
