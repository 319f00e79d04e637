"""Wall time of a no-op job through `mmrun` against bare torchrun and bare msrun with the same options.

    python benchmarks/launcher_overhead.py [--repeats 5] [--markdown]

Runs are interleaved (bare, mmrun, bare, mmrun, ...) so that load from other processes hits both
alike; the figure is the median. Target: mmrun adds at most 5 % or 150 ms, whichever is larger.
The msrun no-op initialises communication, because msrun's scheduler waits for every worker to
register: a bare msrun job whose script never calls init() does not end before --cluster_time_out.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NOOP = {
    "pytorch": "pass\n",
    "mindspore": "import mindspore\nmindspore.set_device('CPU')\nfrom mindspore.communication import init\ninit()\n",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _commands(framework: str, nproc: int, script: Path, log_dir: Path) -> tuple[list[str], list[str]]:
    port = str(_free_port())
    if framework == "pytorch":
        bare = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port", port, str(script)]
    else:
        bare = [sys.executable, "-m", "mindspore.parallel.cluster.run", "--local_worker_num", str(nproc), "--worker_num", str(nproc),
                "--master_addr", "127.0.0.1", "--master_port", port, "--node_rank", "0", "--log_dir", str(log_dir), "--join", "True", str(script)]
    mmrun = [sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", framework, "--nproc-per-node", str(nproc),
             "--master-port", port, *(["--log_dir", str(log_dir)] if framework == "mindspore" else []), str(script)]
    return bare, mmrun


def _time(command: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"benchmark command failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-2000:]}")
    return elapsed


def measure(framework: str, nproc: int, repeats: int) -> dict[str, float]:
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        script = work / "noop.py"
        script.write_text(NOOP[framework])
        bare_times, mmrun_times = [], []
        for i in range(repeats):
            bare, mmrun = _commands(framework, nproc, script, work / f"log{i}")
            bare_times.append(_time(bare, env, work))
            mmrun_times.append(_time(mmrun, env, work))
    bare_median, mmrun_median = statistics.median(bare_times), statistics.median(mmrun_times)
    return {"bare_s": bare_median, "mmrun_s": mmrun_median, "ratio": mmrun_median / bare_median,
            "added_ms": (mmrun_median - bare_median) * 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--frameworks", default="pytorch,mindspore")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table for docs/launcher.md")
    args = parser.parse_args()
    rows = []
    for framework in args.frameworks.split(","):
        for nproc in (1, 2):
            print(f"measuring {framework} with {nproc} process(es), {args.repeats} interleaved repeats ...", file=sys.stderr, flush=True)
            result = measure(framework, nproc, args.repeats)
            launcher = "torchrun" if framework == "pytorch" else "msrun"
            within = result["added_ms"] <= max(150.0, 0.05 * result["bare_s"] * 1000)
            rows.append((framework, launcher, nproc, result, within))
    if args.markdown:
        print("| framework | launcher | processes | bare (s) | mmrun (s) | ratio | added (ms) | within target |")
        print("|---|---|---|---|---|---|---|---|")
    for framework, launcher, nproc, r, within in rows:
        if args.markdown:
            print(f"| {framework} | {launcher} | {nproc} | {r['bare_s']:.2f} | {r['mmrun_s']:.2f} | {r['ratio']:.3f} | {r['added_ms']:.0f} | {'yes' if within else 'NO'} |")
        else:
            print(f"{framework:9s} {launcher:8s} nproc={nproc}: bare {r['bare_s']:.2f} s, mmrun {r['mmrun_s']:.2f} s, "
                  f"ratio {r['ratio']:.3f}, added {r['added_ms']:.0f} ms ({'within' if within else 'OVER'} target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
