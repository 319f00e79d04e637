"""`mmrun analyse PATH...`: find code that will not run on Ascend NPUs or MindSpore; fix what is safe."""
from __future__ import annotations

import argparse
import errno
import io
import os
import sys
from pathlib import Path

from mmrun.backend.errors import UsageError  # a bad command line: one line, exit status 2
from mmrun.common.atomic_write import atomic_write

from . import report
from .findings import Change, FileResult, Finding
from .limits import DEFAULT_LIMITS
from .rules import RuleError, TARGETS, expand_prefixes, load_rules
from .runner import RunConfig, digest
from .sources import PathError, SkipFile, discover, printable, read_source
from .workers import RunResult, WorkerStartError, default_jobs, run, stderr_progress

EPILOG = """\
examples:
  mmrun analyse train.py                          findings as path:line:col: CODE message, then a summary
  mmrun analyse src/ --target mindspore           only what blocks the MindSpore backend
  mmrun analyse src/ --select MM1,MM302 -j 2      CUDA APIs and the NCCL backend, two processes
  mmrun analyse src/ --format csv --output report/  unsupported_api.csv, cuda_op_list.csv, ... in report/
  mmrun analyse src/ --format sarif > analyse.sarif
  mmrun analyse train.py --fix                    print the safe NPU rewrites as a unified diff
  mmrun analyse src/ --fix --write                apply them; change_list.csv lists every change

Findings marked (possible) are method calls on a receiver that cannot be resolved statically
(x.cuda() on an unknown x); [*] marks findings --fix rewrites. Fixes are NPU migrations: .cuda()
-> .npu(), torch.cuda.X -> torch.npu.X where torch_npu has X, "cuda" -> "npu", "nccl" -> "hccl",
a TODO comment above torch.nn.DataParallel, and `import torch_npu` where an NPU API is introduced.

exit status: 0 no error-level findings (left) and every file analysed; 1 error-level findings
remain, or a file was skipped (it could not be read, parsed or analysed within the limits: one
line each on stderr, "PATH: skipped: REASON"), or a --write failed; 2 usage error.
The analysed code is parsed (LibCST), never imported or executed; each file is analysed in a
worker process with a CPU-time and memory limit, so no input can crash or hang the run.
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print the whole usage block first
        raise UsageError(f"{message} (see mmrun analyse --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mmrun analyse",
        description="Find code that will not run on Ascend NPUs (torch_npu) or on MindSpore (MSAdapter), "
                    "and rewrite what is safe to rewrite.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="Python files or folders (searched for *.py)")
    parser.add_argument("--target", choices=TARGETS + ("both",), default="both",
                        help="what the code should run on: npu (torch + torch_npu), mindspore, or both (default)")
    parser.add_argument("--select", action="append", default=[], metavar="CODES",
                        help="only these code prefixes, comma-separated (MM1,MM302); repeatable")
    parser.add_argument("--ignore", action="append", default=[], metavar="CODES",
                        help="skip these code prefixes, comma-separated; repeatable")
    parser.add_argument("--format", choices=report.FORMATS, default="text", help="report format (default text)")
    parser.add_argument("--output", metavar="DIR",
                        help="write the report into DIR (csv: one file per report, as Ascend's analysis tool "
                             "does; text/json/sarif: analyse.txt/.json/.sarif) and the change list with --fix")
    parser.add_argument("--fix", action="store_true", help="print the safe rewrites as a unified diff")
    parser.add_argument("--write", action="store_true",
                        help="with --fix: apply the rewrites to the files and write change_list.csv")
    parser.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                        help="worker processes (default 1; 0 = one per CPU); output order does not depend on it")
    return parser


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _codes(values: list[str]) -> list[str]:
    return [c for value in values for c in value.split(",") if c.strip()]


def _usage(message: str) -> int:
    print(f"mmrun analyse: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            # Paths and source text the terminal's encoding cannot show must not end the run.
            stream.reconfigure(errors="backslashreplace")
    try:
        status = _main(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()   # a closed pipe shows here, not as a message at interpreter exit
        return status
    except UsageError as exc:
        return _usage(str(exc))
    except RuleError as exc:
        print(f"mmrun analyse: the rule table is broken: {exc}", file=sys.stderr)
        return 2
    except WorkerStartError as exc:
        print(f"mmrun analyse: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`mmrun analyse src | head`): stop quietly, as other tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:   # writing a report: a full disk, a read-only folder
        where = f": {exc.filename}" if exc.filename else ""
        print(f"mmrun analyse: error: cannot write the report ({exc.strerror or exc}{where})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mmrun analyse: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.write and not args.fix:
        raise UsageError("--write applies fixes: use it with --fix")
    if args.jobs < 0:
        raise UsageError(f"--jobs must be 0 (one per CPU) or more. Received: {args.jobs}")
    rules = load_rules()
    select, ignore = _codes(args.select), _codes(args.ignore)
    try:
        expand_prefixes(select + ignore, rules)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    output = Path(args.output) if args.output else None
    if output is not None and output.exists() and not output.is_dir():
        raise UsageError(f"--output must be a folder. Received: {args.output} (a file)")
    try:
        sources = discover(args.paths)
    except PathError as exc:
        raise UsageError(str(exc)) from None
    if output is not None:
        try:
            output.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create the --output folder {args.output} ({exc.strerror})") from None
    for note in sources.notes:
        print(note, file=sys.stderr)

    config = RunConfig(target=args.target, select=tuple(select), ignore=tuple(ignore), fix=args.fix)
    jobs = args.jobs or default_jobs()
    result = run(sources.files, config, jobs=jobs, progress=stderr_progress())
    skipped = sorted(result.skipped + [FileResult(path=display, skipped=reason)
                                       for display, reason in sources.skipped], key=lambda r: r.path)
    for r in skipped:
        print(r.skip_line, file=sys.stderr)
    by_code = {rule.code: rule for rule in rules}
    findings = report.sort_findings(result.findings)
    files = len(result.files) + len(sources.skipped)

    if args.fix:
        return _fix(result, findings, sources.files, skipped, args, output)

    lines = sum(r.lines for r in result.files)
    if args.format == "text":
        text = report.render_text(findings, by_code, files=files, skipped=len(skipped))
    elif args.format == "json":
        text = report.render_json(findings, by_code, files=files, lines=lines, target=args.target,
                                  skipped=skipped)
    elif args.format == "sarif":
        text = report.render_sarif(findings, by_code, skipped=skipped)
    else:
        text = report.render_csv(findings)
    if output is None:
        sys.stdout.write(text)
    else:
        if args.format == "csv":
            written = report.write_csv_set(output, findings)
        else:
            path = output / report.REPORT_NAMES[args.format]
            atomic_write(path, text)
            written = [path]
        for line in report.summary_lines(findings, by_code, files=files, skipped=len(skipped)):
            print(line)
        print(f"report: {', '.join(str(p) for p in written)}")
    print(f"mmrun analyse: {_n(files, 'file')}, {_n(lines, 'line')} in {result.seconds:.1f} s", file=sys.stderr)
    return 1 if report.error_count(findings) or skipped else 0


def _write_fix(path: str, r: FileResult, max_bytes: int) -> str | None:
    """Rewrite one file; None when done, else why it was left as it was (one line)."""
    try:
        current = read_source(path, max_bytes)
    except SkipFile as exc:
        return str(exc)
    if digest(current) != r.old_digest:
        return "it changed on disk while being analysed; run again"
    if not os.access(path, os.W_OK):
        return "the file is read-only"
    try:
        atomic_write(path, r.new_source)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            folder = printable(os.path.dirname(os.path.realpath(path)))
            return (f"cannot write ({exc.strerror}): --write replaces the file with a new one made in its "
                    f"folder {folder}, which must be writable")
        return f"cannot write ({exc.strerror or exc})"
    return None


def _fix(result: RunResult, findings: list[Finding], items: list[tuple[str, str]], skipped: list[FileResult],
         args: argparse.Namespace, output: Path | None) -> int:
    if args.target == "mindspore":
        print("mmrun analyse: --fix rewrites for NPUs (torch_npu); with --target mindspore there is "
              "nothing it can rewrite safely", file=sys.stderr)
    changed = [(path, r) for (path, _), r in zip(items, result.files) if r.new_source is not None]
    failed = 0
    if args.write:
        done = []
        for path, r in changed:
            why_not = _write_fix(path, r, DEFAULT_LIMITS.max_bytes)
            if why_not is None:
                done.append((path, r))
                print(f"rewrote {r.path} ({_n(len(r.changes), 'change')})")
            else:
                failed += 1
                print(f"{r.path}: not rewritten: {why_not}", file=sys.stderr)
        changed = done
    else:
        for _, r in changed:
            sys.stdout.write(r.diff)
    changes: list[Change] = [c for _, r in changed for c in r.changes]
    if changes and (args.write or output is not None):
        where = (output or Path.cwd()) / "change_list.csv"
        atomic_write(where, report.render_change_list(changes))
        print(f"mmrun analyse: change list: {where}", file=sys.stderr)
    # What remains after the rewrites: findings no fix removes.
    rewritten = {r.path for _, r in changed}
    remaining = [f for f in findings if not (f.fixable and f.path in rewritten)]
    errors = report.error_count(remaining)
    verb = "applied" if args.write else "proposed"
    tail = f"; {_n(len(skipped), 'file')} skipped" if skipped else ""
    tail += f"; {_n(failed, 'file')} not rewritten" if failed else ""
    print(f"mmrun analyse: {_n(len(changes), 'change')} {verb} in {_n(len(changed), 'file')}; "
          f"{_n(len(remaining), 'finding')} left ({_n(errors, 'error')}){tail}; run without --fix to list them",
          file=sys.stderr)
    return 1 if errors or skipped or failed else 0
