"""Wall time of a no-op job through `mmrun` against bare torchrun and bare msrun with the same options.

    python benchmarks/launcher_overhead.py [--repeats 5] [--markdown] [--compare DIR]

Runs are interleaved (bare, mmrun, bare, mmrun, ...) so that load from other processes hits both
alike; the figure is the median. Target: mmrun adds at most 5 % or 150 ms, whichever is larger.
CPU time (user + system of every process of the job) is reported beside wall time: a loaded
machine disturbs it far less.
`--compare DIR` also times the mmrun found in DIR (a folder holding another version as `mmrun/`,
put first on PYTHONPATH), interleaved with the others: the cost of a change, measured in one run.
The msrun no-op initialises communication, because msrun's scheduler waits for every worker to
register: a bare msrun job whose script never calls init() does not end before --cluster_time_out.
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

from mmrun.common import ports

NOOP = {
    "pytorch": "pass\n",
    "mindspore": "import mindspore\nmindspore.set_device('CPU')\nfrom mindspore.communication import init\ninit()\n",
}


def _commands(framework: str, nproc: int, script: Path, log_dir: Path) -> tuple[list[str], list[str]]:
    """The bare launcher command and the mmrun command for the same job."""
    port = str(ports.free_port())
    if framework == "pytorch":
        bare = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port", port, str(script)]
    else:
        bare = [sys.executable, "-m", "mindspore.parallel.cluster.run", "--local_worker_num", str(nproc), "--worker_num", str(nproc),
                "--master_addr", "127.0.0.1", "--master_port", port, "--node_rank", "0", "--log_dir", str(log_dir), "--join", "True", str(script)]
    mmrun = [sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", framework, "--nproc-per-node", str(nproc),
             "--master-port", port, *(["--log_dir", str(log_dir)] if framework == "mindspore" else []), str(script)]
    return bare, mmrun


def _time(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one job: the CPU of every process of it that was waited for (all of them)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"benchmark command failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-2000:]}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(framework: str, nproc: int, repeats: int, compare: str | None = None) -> dict[str, float]:
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    other_env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [compare, env.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        script = work / "noop.py"
        script.write_text(NOOP[framework])
        bare_times, mmrun_times, other_times = [], [], []
        for i in range(repeats):
            bare, mmrun = _commands(framework, nproc, script, work / f"log{i}")
            bare_times.append(_time(bare, env, work))
            mmrun_times.append(_time(mmrun, env, work))
            if compare:
                other_times.append(_time(_commands(framework, nproc, script, work / f"other{i}")[1], other_env, work))
    wall = {name: statistics.median(w for w, _ in runs) for name, runs in (("bare", bare_times), ("mmrun", mmrun_times), ("other", other_times)) if runs}
    cpu = {name: statistics.median(c for _, c in runs) for name, runs in (("bare", bare_times), ("mmrun", mmrun_times), ("other", other_times)) if runs}
    result = {"bare_s": wall["bare"], "mmrun_s": wall["mmrun"], "ratio": wall["mmrun"] / wall["bare"],
              "added_ms": (wall["mmrun"] - wall["bare"]) * 1000, "cpu_added_ms": (cpu["mmrun"] - cpu["bare"]) * 1000}
    if compare:
        result.update(other_s=wall["other"], change_ms=(wall["mmrun"] - wall["other"]) * 1000,
                      cpu_change_ms=(cpu["mmrun"] - cpu["other"]) * 1000)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--frameworks", default="pytorch,mindspore")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table for docs/launcher.md")
    parser.add_argument("--nprocs", default="1,2", help="process counts to measure, comma-separated")
    parser.add_argument("--compare", default=None, metavar="DIR",
                        help="also time the mmrun package found in DIR (DIR/mmrun), e.g. an export of the previous commit")
    args = parser.parse_args()
    rows = []
    for framework in args.frameworks.split(","):
        for nproc in map(int, args.nprocs.split(",")):
            print(f"measuring {framework} with {nproc} process(es), {args.repeats} interleaved repeats ...", file=sys.stderr, flush=True)
            result = measure(framework, nproc, args.repeats, args.compare)
            launcher = "torchrun" if framework == "pytorch" else "msrun"
            within = result["added_ms"] <= max(150.0, 0.05 * result["bare_s"] * 1000)
            rows.append((framework, launcher, nproc, result, within))
    compared = " compared (s) | change (ms) | CPU change (ms) |" if args.compare else ""
    if args.markdown:
        print(f"| framework | launcher | processes | bare (s) | mmrun (s) | ratio | added (ms) | within target | CPU added (ms) |{compared}")
        print("|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if args.compare else ""))
    for framework, launcher, nproc, r, within in rows:
        other = f" {r['other_s']:.2f} | {r['change_ms']:+.0f} | {r['cpu_change_ms']:+.0f} |" if args.compare else ""
        if args.markdown:
            print(f"| {framework} | {launcher} | {nproc} | {r['bare_s']:.2f} | {r['mmrun_s']:.2f} | {r['ratio']:.3f} | "
                  f"{r['added_ms']:.0f} | {'yes' if within else 'NO'} | {r['cpu_added_ms']:.0f} |{other}")
        else:
            change = (f"; against {args.compare}: {r['other_s']:.2f} s, change {r['change_ms']:+.0f} ms, "
                      f"CPU {r['cpu_change_ms']:+.0f} ms") if args.compare else ""
            print(f"{framework:9s} {launcher:8s} nproc={nproc}: bare {r['bare_s']:.2f} s, mmrun {r['mmrun_s']:.2f} s, "
                  f"ratio {r['ratio']:.3f}, added {r['added_ms']:.0f} ms ({'within' if within else 'OVER'} target), "
                  f"CPU added {r['cpu_added_ms']:.0f} ms{change}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
