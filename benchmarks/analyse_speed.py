"""Speed of `mmrun analyse` against TorchFix (also LibCST-based) on the same tree, in the same run.

    .venv/bin/python benchmarks/analyse_speed.py                  # installed megatron-core
    .venv/bin/python benchmarks/analyse_speed.py --path SRC --jobs 1 2 --repeat 2

Each tool runs as its own command (`python -m mmrun.launchers.cli analyse`, `python -m torchfix`),
report-only (no --fix), runs interleaved so that machine load hits both alike. Reported: wall time,
CPU time of the child process tree (user + system: fairer on a shared machine), files/s and
lines/s over the whole tree (every .py file, whether or not a tool's pre-filter skips it), and the
ratio TorchFix time / mmrun time (above 1: mmrun is faster).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

# The installed megatron-core, found on sys.path without importing it (a worktree's venv reaches
# the main venv's packages through a .pth file, so it is not under sys.prefix).
DEFAULT_TREE = next((Path(entry, "megatron", "core") for entry in sys.path
                     if Path(entry, "megatron", "core", "__init__.py").is_file()),
                    Path(sys.prefix, "lib", "megatron", "core"))


def tree_size(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*.py") if not any(part.startswith(".") for part in p.relative_to(root).parts)]
    return len(files), sum(p.read_bytes().count(b"\n") for p in files)


def timed(cmd: list[str]) -> tuple[float, float, int, str]:
    """(wall s, child CPU s, exit status, first stderr line) for one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode, (proc.stderr.strip().splitlines() or [""])[-1]


def commands(tree: Path, jobs: int) -> dict[str, list[str]]:
    return {
        "mmrun analyse": [sys.executable, "-m", "mmrun.launchers.cli", "analyse", str(tree), "--jobs", str(jobs)],
        "torchfix": [sys.executable, "-m", "torchfix", "--jobs", str(jobs), str(tree)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", type=Path, default=DEFAULT_TREE, help=f"tree to analyse (default {DEFAULT_TREE})")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2], help="worker counts to try (default 1 2)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per tool and job count; the best is kept")
    parser.add_argument("--json", dest="json_out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if not args.path.is_dir():
        print(f"analyse_speed: --path must be a folder. Received: {args.path}", file=sys.stderr)
        return 2
    files, lines = tree_size(args.path)
    print(f"tree: {args.path} ({files} .py files, {lines} lines); python {sys.version.split()[0]}; "
          f"{os.cpu_count()} CPUs; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    for jobs in args.jobs:
        best: dict[str, tuple[float, float]] = {}
        for _ in range(args.repeat):
            for tool, cmd in commands(args.path, jobs).items():
                wall, cpu, status, last = timed(cmd)
                if status not in (0, 1):   # 1 = findings for both tools
                    print(f"analyse_speed: {tool} failed (exit {status}): {last}", file=sys.stderr)
                    return 1
                print(f"  {tool:<14} --jobs {jobs}: wall {wall:6.1f} s, cpu {cpu:6.1f} s", flush=True)
                old = best.get(tool)
                best[tool] = (min(wall, old[0]), min(cpu, old[1])) if old else (wall, cpu)
        for tool, (wall, cpu) in best.items():
            rows.append({"tool": tool, "jobs": jobs, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                         "files_per_s": round(files / wall, 1), "lines_per_s": round(lines / wall),
                         "lines_per_cpu_s": round(lines / cpu)})
    print(f"load average at end {os.getloadavg()[0]:.1f}\n")
    print("| tool | --jobs | wall s | CPU s | files/s | lines/s | lines per CPU s | TorchFix / mmrun (wall, CPU) |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        ref = next(r for r in rows if r["jobs"] == row["jobs"] and r["tool"] == "torchfix")
        ratio = "" if row["tool"] == "torchfix" else \
            f"{ref['wall_s'] / row['wall_s']:.2f}x, {ref['cpu_s'] / row['cpu_s']:.2f}x"
        print(f"| {row['tool']} | {row['jobs']} | {row['wall_s']} | {row['cpu_s']} | {row['files_per_s']} | "
              f"{row['lines_per_s']} | {row['lines_per_cpu_s']} | {ratio} |")
    if args.json_out:
        args.json_out.write_text(json.dumps({"tree": str(args.path), "files": files, "lines": lines, "rows": rows},
                                            indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
