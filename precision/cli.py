"""`mmrun compare`: do two runs agree? Training logs / metric files per iteration, or layer-wise dumps per module.

Framework-free: reads files only, so it runs where neither torch nor mindspore is installed.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

EPILOG = """\
examples:
  mmrun compare pt.log ms.log                          loss per iteration within 1% (MindSpeed-MM's acceptance)
  mmrun compare pt.log ms.log --rtol 1e-5 --plot curves.png
  mmrun compare base.jsonl run1.log run2.log           each run against the first (the baseline)
  mmrun compare pt.log ms.log --check "lm loss" --check "grad norm"
  mmrun compare --dump dump_pt dump_ms                 layer-wise dumps (--dump-config): the first module that diverges

Logs: Megatron-LM's iteration lines (mmrun, Megatron-LM, MindSpeed print them; use --log-interval 1 for
per-iteration values) or mmrun's --metrics-file. A log that restarts (a resumed run
appended to it) keeps the later values; runs of different lengths are compared where both logged.

Dumps: statistics (max, min, mean, L2 norm) are compared with --stat-rtol/--stat-atol; where both dumps
hold the tensors, msprobe's rule: cosine >= 0.99 or max abs error <= 1e-3, and always cosine >= 0.9 and
max abs error <= 1. The first failing module in execution order is named, forward before backward.

exit status: 0 the runs agree within the tolerance, 1 they do not (the first iteration or module that
differs is named), 2 usage error or a file that cannot be read (one line says which and why).
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from mmrun.precision.run_logs import METRICS

    p = _Parser(prog="mmrun compare", description="Compare training runs per iteration (logs, metric files) or layer-wise dumps per module, with a verdict for CI.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="RUN", help="training logs or metric files (the first is the "
                   "baseline), or with --dump two dump directories")
    p.add_argument("--dump", action="store_true", help="compare two --dump-config directories (DIR_A DIR_B)")
    p.add_argument("--rtol", type=float, default=0.01, help="relative tolerance against the baseline (default 0.01)")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (default 0)")
    p.add_argument("--check", action="append", choices=list(METRICS), metavar="METRIC",
                   help=f"metric that decides the verdict, repeatable ({', '.join(METRICS)}; default lm loss)")
    p.add_argument("--max-rows", type=int, default=40, help="per-iteration rows printed (default 40; 0 = all)")
    p.add_argument("--plot", metavar="PNG", help="write the curves and their differences (needs matplotlib)")
    p.add_argument("--stat-rtol", type=float, default=1e-3,
                   help="dumps: relative tolerance of max/min/mean/norm (default 1e-3)")
    p.add_argument("--stat-atol", type=float, default=1e-5,
                   help="dumps: absolute tolerance of max/min/mean/norm (default 1e-5)")
    p.add_argument("--step", type=int, help="dumps: only this step (default every step both dumped)")
    p.add_argument("--rank", type=int, help="dumps: only this rank (default every rank both dumped)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="report format on stdout")
    return p


def _check_tolerances(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("rtol", "atol", "stat_rtol", "stat_atol"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value >= 0):
            p.error(f"--{name.replace('_', '-')} must be a finite number >= 0. Received: {value}")


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    _check_tolerances(p, args)
    if args.dump:
        if len(args.paths) != 2:
            p.error(f"--dump compares two dump directories. Received: {len(args.paths)} paths")
        from mmrun.precision.dump_compare import main_dump

        return main_dump(args)
    if len(args.paths) < 2:
        p.error(f"give at least two runs (the first is the baseline). Received: {len(args.paths)}")
    return _main_logs(args)


def _main_logs(args: argparse.Namespace) -> int:
    from mmrun.precision.log_compare import compare, report_lines
    from mmrun.precision.run_logs import LogError, read_run

    try:
        runs = [read_run(path) for path in args.paths]
    except LogError as err:
        print(f"mmrun compare: error: {err}", file=sys.stderr)
        return 2
    checked = tuple(args.check or ("lm loss",))
    comparisons = [compare(runs[0], run, args.rtol, args.atol, checked) for run in runs[1:]]
    failed = False
    payload = []
    for index, comparison in enumerate(comparisons):
        reasons = comparison.failures()
        failed |= bool(reasons)
        if args.format == "json":
            payload.append({"baseline": comparison.baseline.path, "test": comparison.test.path,
                            "metrics": [d.summary() for d in comparison.diffs.values()],
                            "notes": comparison.notes, "verdict": "FAIL" if reasons else "PASS", "reasons": reasons})
            continue
        if index:
            print()
        for line in report_lines(comparison, args.max_rows):
            print(line)
        tolerance = f"rtol {args.rtol:g}, atol {args.atol:g}"
        if reasons:
            print(f"verdict: FAIL ({tolerance}): " + "; ".join(reasons))
        else:
            print(f"verdict: PASS: {', '.join(checked)} within {tolerance} at all {len(comparison.common)} "
                  "common iterations")
    if args.format == "json":
        print(json.dumps(payload if len(payload) > 1 else payload[0], indent=1, default=_json_float))
    if args.plot:
        from mmrun.precision.plot import PlotUnavailable, plot_comparisons

        try:
            plot_comparisons(comparisons, args.plot)
        except (PlotUnavailable, OSError) as err:
            print(f"mmrun compare: error: --plot {args.plot}: {err}", file=sys.stderr)
            return 2
        if args.format == "text":
            print(f"plot: {args.plot}")
    return 1 if failed else 0


def _json_float(value):
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
