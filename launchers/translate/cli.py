"""`mmrun translate SCRIPT`: print, write or check the msrun (or torchrun) form of a launch script."""
from __future__ import annotations

import argparse
import difflib
import errno
import os
import sys
from pathlib import Path

from mmrun.backend.errors import UsageError
from mmrun.common.atomic_write import atomic_write
from mmrun.launchers.translate.entry import translate_script
from mmrun.launchers.translate.parse import ScriptSyntaxError, decode, encode
from mmrun.launchers.translate.report import Report
from mmrun.launchers.translate.rewrite import Options, TranslationRefused
from mmrun.launchers.translate.rules import DEVICES, LAUNCHER_OF, ON_UNSUPPORTED
from mmrun.launchers.translate.script_file import read_script

EPILOG = """\
examples:
  mmrun translate pretrain_gpt.sh                      print the msrun form (report on stderr)
  mmrun translate pretrain_gpt.sh -o pretrain_gpt_ms.sh
  mmrun translate pretrain_gpt.sh --diff               show what would change
  mmrun translate pretrain_gpt.sh --in-place           rewrite it, keeping pretrain_gpt.sh.bak
  mmrun translate pretrain_gpt_ms.sh --to pytorch      back to torchrun (exact text for scripts mmrun wrote)
  mmrun translate scripts/*.sh --check                 exit 1 if any script would change (CI)
  mmrun translate pretrain_gpt.sh --on-unsupported comment --report json 2> report.json

exit status: 0 translated (or nothing to do), 1 --check found a script that would change (or a launch
line hidden in eval, a variable or a heredoc, which is reported and left alone), or a file could not be
written; 2 usage error, a SCRIPT that is no regular text file, or a script that cannot be translated
(the report says why, line by line). The script is parsed (tree-sitter-bash), never executed or sourced.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmrun translate",
        description="Rewrite a torchrun (or mmrun) training launch script into an msrun one (or back), changing only the bytes that must change.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scripts", nargs="+", metavar="SCRIPT", help="launch script(s) to translate")
    parser.add_argument("--to", choices=sorted(LAUNCHER_OF), default="mindspore",
                        help="framework to translate to: mindspore (torchrun -> msrun, default) or pytorch (msrun -> torchrun)")
    parser.add_argument("-o", "--output", metavar="OUT", help="write the translated script to OUT (never the input itself)")
    parser.add_argument("--in-place", "--in_place", dest="in_place", action="store_true",
                        help="rewrite SCRIPT, keeping the original as SCRIPT.bak")
    parser.add_argument("--diff", action="store_true", help="print a unified diff instead of the script")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a script would change")
    parser.add_argument("--report", choices=("text", "json"), default="text", help="report format on stderr (default text)")
    parser.add_argument("--on-unsupported", "--on_unsupported", dest="on_unsupported", choices=ON_UNSUPPORTED, default="error",
                        help="training flags the target framework/device does not support (feature gate): error (default) "
                             "stops on unsupported ones and warns about fallbacks; comment removes both and says why in a "
                             "comment; remove removes both")
    parser.add_argument("--device", choices=DEVICES, default="npu",
                        help="device the job will run on, for the feature gate and msrun's --bind_core (default npu)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.output and args.in_place:
        parser.error("-o/--output and --in-place exclude each other; pick one")
    if args.output and len(args.scripts) > 1:
        parser.error(f"-o/--output takes one SCRIPT. Received: {len(args.scripts)} scripts; use --in-place or one call per script")
    if len(args.scripts) > 1 and not (args.check or args.diff or args.in_place):
        parser.error(f"several scripts ({len(args.scripts)}) go with --check, --diff or --in-place; translate one at a time to print it")
    if args.check and (args.output or args.in_place):
        parser.error("--check writes nothing; drop -o/--output and --in-place")
    options = Options(target=LAUNCHER_OF[args.to], device=args.device, on_unsupported=args.on_unsupported)
    status = 0
    for script in args.scripts:
        try:
            status = max(status, _one(parser, script, args, options))
        except Exception as error:  # noqa: BLE001 - a bug must still end in one line, not a traceback
            print(f"mmrun translate: error: internal error while translating {script}: {type(error).__name__}: "
                  f"{str(error).splitlines()[0] if str(error) else ''}; please report it with the script", file=sys.stderr)
            status = max(status, 1)
    return status


def _one(parser: argparse.ArgumentParser, script: str, args: argparse.Namespace, options: Options) -> int:
    path = Path(script)
    try:
        source = read_script(script)
    except UsageError as error:
        return _usage(str(error))
    try:
        result = translate_script(source, options, script)
    except ScriptSyntaxError as error:
        report = Report(script, options.source, options.target)
        report.refuse(error.line, error.reason)
        _print_report(report, args.report)
        return 2
    except TranslationRefused as refused:
        _print_report(refused.report, args.report)
        return 2
    _print_report(result.report, args.report)
    if args.diff:
        _stdout(_diff(script, source, result.output, options.target))
    if args.check:
        return 1 if result.changed or result.report.hidden_launches else 0
    if args.output:
        out = Path(args.output)
        if _same_file(out, path):
            return _usage(f"-o {args.output} is the input script itself; use --in-place (it keeps {script}.bak) or another path")
        return _write(out, result.output, mode_from=path, what="-o")
    if args.in_place:
        if result.changed:
            backup = Path(script + ".bak")
            if os.path.lexists(backup):
                return _usage(f"{backup} already exists; move it away first (it may hold the original script)")
            return _write(backup, source, mode_from=path, what="the backup") or _write(path, result.output, mode_from=path, what="--in-place")
        return 0
    if not args.diff:
        _stdout(result.output)
    return 0


def _usage(message: str) -> int:
    print(f"mmrun translate: error: {message}", file=sys.stderr)
    return 2


def _stdout(data: bytes) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


def _print_report(report: Report, kind: str) -> None:
    # The text report quotes the script's own bytes (surrogateescape gives a GBK comment back as it was); JSON
    # must be UTF-8, so such bytes stay escaped there (\udcXX).
    text = report.json() + "\n" if kind == "json" else report.text()
    sys.stderr.flush()
    if hasattr(sys.stderr, "buffer"):
        sys.stderr.buffer.write(text.encode("utf-8", errors="backslashreplace" if kind == "json" else "surrogateescape"))
    else:  # a stream without bytes underneath (an embedding program's StringIO)
        sys.stderr.write(text.encode("utf-8", errors="backslashreplace").decode("utf-8"))
    sys.stderr.flush()


def _diff(name: str, before: bytes, after: bytes, target: str) -> bytes:
    """A unified diff of the script's own bytes (lines that are not UTF-8 shown as they are)."""
    return encode("".join(difflib.unified_diff(
        decode(before).splitlines(keepends=True), decode(after).splitlines(keepends=True),
        fromfile=name, tofile=f"{name} ({target})",
    )))


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


# A place the user named wrongly: exit 2 (fix the argument); anything else (a full disk) is a runtime error, exit 1.
_USAGE_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.ELOOP})


def _write(target: Path, data: bytes, mode_from: Path, what: str) -> int:
    """Write through the one atomic writer (all or nothing; a device or FIFO is written through, a symlink
    followed); a new file gets the input script's permissions (+x). Returns the exit status."""
    try:
        atomic_write(target, data, new_file_mode=os.stat(mode_from).st_mode & 0o7777)
    except OSError as error:
        where = error.filename if error.filename is not None else target
        print(f"mmrun translate: error: cannot write {what} {target}: {error.strerror or error} ({where}); nothing was "
              f"written. Received: {str(target)!r}; name a file in an existing directory", file=sys.stderr)
        return 2 if error.errno in _USAGE_ERRNOS else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
