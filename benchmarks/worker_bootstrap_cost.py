"""What mmrun's worker bootstrap costs each rank: `python -u worker_bootstrap.py noop.py` against `python -u noop.py`.

    python benchmarks/worker_bootstrap_cost.py [--repeats 30] [--compare DIR] [--markdown]

The bootstrap is what torchrun and msrun start for every rank under mmrun (with the rank variables
torchrun would set); the bare run is what they start without mmrun. Runs are interleaved; the figures
are the minimum and the median wall time and the median CPU time (user + system, this process's
children), which a loaded machine disturbs far less than wall time. `--compare DIR` also times the
bootstrap of the mmrun package in DIR (DIR/mmrun, e.g. an export of the previous commit).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mmrun.launchers import worker_bootstrap

BOOTSTRAP = worker_bootstrap.__file__


def _run(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one command and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(repeats: int, compare: str | None) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        (work / "noop.py").write_text("pass\n")
        (work / "status").mkdir()
        env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "MMRUN_STATUS_DIR": str(work / "status")}
        variants = {"bare": ([sys.executable, "-u", "noop.py"], env),
                    "bootstrap": ([sys.executable, "-u", BOOTSTRAP, "noop.py"], env)}
        if compare:
            old = str(Path(compare) / "mmrun" / "launchers" / "worker_bootstrap.py")
            variants["compared"] = ([sys.executable, "-u", old, "noop.py"],
                                    {**env, "PYTHONPATH": os.pathsep.join(filter(None, [compare, env.get("PYTHONPATH")]))})
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        for _ in range(repeats):
            for name, (command, variant_env) in variants.items():
                samples[name].append(_run(command, variant_env, work))
    return {name: {"wall_min_ms": 1000 * min(w for w, _ in runs), "wall_median_ms": 1000 * statistics.median(w for w, _ in runs),
                   "cpu_median_ms": 1000 * statistics.median(c for _, c in runs)} for name, runs in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--compare", default=None, metavar="DIR", help="also time the bootstrap of the mmrun package in DIR/mmrun")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table for docs/launcher.md")
    args = parser.parse_args()
    print(f"timing {args.repeats} interleaved runs of each variant ...", file=sys.stderr, flush=True)
    results = measure(args.repeats, args.compare)
    bare = results["bare"]
    if args.markdown:
        print("| per rank | wall min (ms) | wall median (ms) | CPU median (ms) | CPU added to bare (ms) |")
        print("|---|---|---|---|---|")
    for name, r in results.items():
        added = r["cpu_median_ms"] - bare["cpu_median_ms"]
        if args.markdown:
            print(f"| {name} | {r['wall_min_ms']:.0f} | {r['wall_median_ms']:.0f} | {r['cpu_median_ms']:.0f} | {added:+.0f} |")
        else:
            print(f"{name:10s} wall min {r['wall_min_ms']:.0f} ms, median {r['wall_median_ms']:.0f} ms; "
                  f"CPU median {r['cpu_median_ms']:.0f} ms ({added:+.0f} ms against bare)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
