"""The marker that makes there-and-back exact for scripts mmrun produced.

A translated script starts (after its shebang) with one header line:

    # mmrun translate: torchrun -> msrun (--device npu); undo: mmrun translate --to pytorch

The reverse rules already give the original text back for the usual shapes (the MindSpeed migration guides' scripts). Where
they cannot (a dashed `--nproc-per-node`, `python -m torch.distributed.run`, options msrun drops,
training flags removed as unsupported), a second line records the few original lines as JSON:

    # mmrun translate undo: [[12,1,["python -m torch.distributed.run --nproc-per-node=2 \\\\\\n"]]]

Translating back applies the rules, then the record, and keeps the result only if translating it
forward again gives the script exactly as it is: a script edited since falls back to the rules,
which keep the meaning.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

from mmrun.launchers.options import MSRUN, TORCHRUN
from mmrun.launchers.translate.line_diff import changed_blocks
from mmrun.launchers.translate.parse import ScriptSyntaxError, decode, encode
from mmrun.launchers.translate.rewrite import Options, Result, TranslationRefused, line_ending, translate_rules
from mmrun.launchers.translate.rules import FRAMEWORK_OF, MARKER_PREFIX, MMRUN

_LAUNCHERS = f"({TORCHRUN}|{MSRUN}|{MMRUN})"
HEADER = re.compile(rf"^{MARKER_PREFIX}: {_LAUNCHERS} -> {_LAUNCHERS} \(([^)\n]*)\)[^\n]*$".encode(), re.M)
UNDO = re.compile(rf"^{MARKER_PREFIX} undo: ([^\n]*)$".encode(), re.M)
_HEADER_LINES = 12  # the header sits at the top; a marker further down is not ours
_MAX_NESTING = 4  # a record is a list of [line, count, [text, ...]]: deeper JSON is not ours (and would exhaust the stack)


@dataclass(frozen=True)
class Header:
    source: str
    target: str
    device: str
    on_unsupported: str
    hunks: list | None
    line: int


def read_header(data: bytes) -> Header | None:
    top = b"".join(_lines(data, _HEADER_LINES))
    match = HEADER.search(top)
    if match is None:
        return None
    settings = decode(match.group(3))
    device = re.search(r"--device (\w+)", settings)
    policy = re.search(r"--on-unsupported (\w+)", settings)
    undo = UNDO.search(top)
    hunks = None
    if undo is not None:
        hunks = _parse_record(decode(undo.group(1)))
    source = match.group(1).decode()
    return Header(TORCHRUN if source == MMRUN else source, match.group(2).decode(), device.group(1) if device else "npu",
                  policy.group(1) if policy else "error", hunks, top[:match.start()].count(b"\n") + 1)


def translate_with_marker(source: bytes, options: Options, path: str, restore: bool = True) -> Result:
    """The rules plus the marker; `restore=False` never gives back a recorded original (the forward check of a
    restore, which must not restore again: a forged record could otherwise send it round for ever)."""
    header = read_header(source)
    stale = None
    if restore and header is not None and (header.source, header.target) == (options.target, options.source):
        restored = _restore(source, header, path)
        if restored is not None:
            output, report = restored
            report.undo = "record"
            restored_lines = sum(len(hunk[2]) for hunk in header.hunks or [])
            detail = f"the changes above, then {restored_lines} line(s) restored from the undo record" if header.hunks else "the changes above"
            report.add_note(header.line, f"gave back the script mmrun translated from ({detail}), "
                                         "verified by translating it forward again")
            return Result(source, output, report)
        stale = header.line
    output, report = translate_rules(source, options, path)
    if stale is not None:
        report.add_note(stale, "the mmrun translate marker no longer matches the script (edited since?): translated by the rules alone, "
                               "which keep the meaning but not necessarily the original text")
    if report.launches:
        output = _with_marker(output, source, options, path, report.source)
    return Result(source, output, report)


def _restore(source: bytes, header: Header, path: str):
    try:
        output, report = translate_rules(source, replace(Options(target=header.source, device=header.device), gate=False), path)
        candidate = apply_hunks(output, header.hunks or [])
        forward = Options(target=header.target, device=header.device, on_unsupported=header.on_unsupported)
        again = translate_with_marker(candidate, forward, path, restore=False).output
    except (ScriptSyntaxError, TranslationRefused, ValueError):
        return None
    return (candidate, report) if again == source else None


def _with_marker(output: bytes, source: bytes, options: Options, path: str, label: str) -> bytes:
    """The rewritten script with the header (and, where the rules alone would not undo it, the undo record)."""
    settings = f"--device {options.device}" + (f" --on-unsupported {options.on_unsupported}" if options.on_unsupported != "error" else "")
    back = Options(target=options.source, device=options.device, gate=False)
    try:
        reverse, _ = translate_rules(output, back, path)
        hunks = line_hunks(reverse, source)
        undo = f"undo: mmrun translate --to {FRAMEWORK_OF[options.source]}"
    except (ScriptSyntaxError, TranslationRefused):
        hunks, undo = [], "no automatic undo"
    eol = line_ending(source)
    lines = [f"{MARKER_PREFIX}: {label} -> {options.target} ({settings}); {undo}{eol}"]  # label: mmrun for mmrun lines
    if hunks:
        text = json.dumps(hunks, ensure_ascii=not _is_utf8(source), separators=(",", ":"))
        lines.append(f"{MARKER_PREFIX} undo: {text}{eol}")
    marker = encode("".join(lines))
    if output.startswith(b"#!"):
        first = _lines(output, 1)[0]
        return first + (b"" if first.endswith(b"\n") else b"\n") + marker + output[len(first):]
    return marker + output


def line_hunks(have: bytes, want: bytes) -> list:
    """[[first line, lines replaced, [new lines]], ...] turning `have` into `want` (linear time: line_diff)."""
    a, b = _lines(have), _lines(want)
    return [[i1, i2 - i1, [decode(line) for line in b[j1:j2]]] for i1, i2, j1, j2 in changed_blocks(a, b)]


def apply_hunks(data: bytes, hunks: list) -> bytes:
    lines = _lines(data)
    for first, count, new in sorted(hunks, key=lambda h: h[0], reverse=True):
        if first + count > len(lines):
            raise ValueError("undo record does not fit the script")
        lines[first:first + count] = [encode(line) for line in new]
    return b"".join(lines)


def _parse_record(text: str) -> list | None:
    """The undo record's hunks, or None for anything else (a record edited by hand, or forged)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:  # JSON nesting, counted before json.loads recurses into it
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char == "[" or char == "{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > _MAX_NESTING:
                return None
        elif char == "]" or char == "}":
            depth -= 1
    try:
        return _valid_hunks(json.loads(text))
    except ValueError:
        return None


def _valid_hunks(value) -> list | None:
    if not isinstance(value, list):
        return None
    for hunk in value:
        if not (isinstance(hunk, list) and len(hunk) == 3 and isinstance(hunk[0], int) and isinstance(hunk[1], int)
                and hunk[0] >= 0 and hunk[1] >= 0 and isinstance(hunk[2], list) and all(isinstance(x, str) for x in hunk[2])):
            return None
    return value


def _lines(data: bytes, limit: int = -1) -> list[bytes]:
    """Lines split at \\n only (a \\r or U+2028 inside a line stays in it), each with its newline; the first
    `limit` lines only, when given."""
    parts = data.split(b"\n", limit)
    if limit >= 0 and len(parts) > limit:
        return [part + b"\n" for part in parts[:limit]]
    lines = [part + b"\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
