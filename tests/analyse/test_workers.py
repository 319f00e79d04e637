"""The worker processes contain what goes wrong inside LibCST: a crash, minutes of CPU, GiBs of memory.

The nesting check refuses the known shapes first, so these tests switch it off (or shrink the
budgets) to reach LibCST's real failures: a real segfault, a real CPU-time overrun, a real failed
allocation. Each takes its file only; the file beside it is analysed as usual.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmrun.analyse import workers
from mmrun.analyse.limits import Limits
from mmrun.analyse.runner import RunConfig
from mmrun.analyse.workers import WorkerStartError, run

CUDA = "import torch\ntorch.cuda.synchronize()\n"
NO_CHECK = dict(max_depth=10**9, max_brackets=10**9)
# Valid Python that LibCST needs seconds and hundreds of MB for (nested 30 deep, 60 lines).
HEAVY = CUDA + ("x = " + 'f(a.b[1], {"k": ' * 30 + "1" + "})" * 30 + "\n") * 60


def _files(tmp_path: Path, **texts: str) -> list[tuple[str, str]]:
    items = []
    for name, text in texts.items():
        (tmp_path / f"{name}.py").write_text(text)
        items.append((str(tmp_path / f"{name}.py"), f"{name}.py"))
    return items


def _outcome(result) -> list[tuple[str, str | None, int]]:
    return [(r.path, r.skipped, len(r.findings)) for r in result.files]


def test_a_segfault_takes_only_its_file(tmp_path: Path):
    items = _files(tmp_path, a_deep=CUDA + "x = " + "(" * 3000 + "1" + ")" * 3000 + "\n", b_ok=CUDA)
    # A 1 MiB stack and no nesting check: LibCST's native parser overflows it (SIGSEGV).
    config = RunConfig(limits=Limits(stack_bytes=1 << 20, **NO_CHECK))
    result = run(items, config, jobs=1)
    assert _outcome(result) == [("a_deep.py", "the analysis process crashed (killed by SIGSEGV)", 0),
                                ("b_ok.py", None, 1)]


def test_the_cpu_budget_stops_a_slow_parse(tmp_path: Path):
    items = _files(tmp_path, a_heavy=HEAVY, b_ok=CUDA)
    started = time.monotonic()
    result = run(items, RunConfig(limits=Limits(cpu_seconds=0.3, cpu_seconds_per_mib=0)), jobs=1)
    assert _outcome(result) == [
        ("a_heavy.py", "took more than 0.3 s of CPU time (LibCST's parser is slow on deeply nested or very "
                       "long expressions)", 0),
        ("b_ok.py", None, 1)]
    assert time.monotonic() - started < 60


def test_the_memory_budget_stops_a_greedy_parse(tmp_path: Path):
    items = _files(tmp_path, a_heavy=HEAVY, b_ok=CUDA)
    result = run(items, RunConfig(limits=Limits(memory_bytes=150 << 20)), jobs=1)
    assert _outcome(result) == [("a_heavy.py", "needed more than 150 MiB of memory (LibCST's parser)", 0),
                                ("b_ok.py", None, 1)]


def test_two_jobs_keep_the_order_and_survive_crashes(tmp_path: Path):
    deep = CUDA + "x = " + "(" * 3000 + "1" + ")" * 3000 + "\n"
    texts = {f"f{i:02d}": (deep if i % 3 == 0 else CUDA) for i in range(12)}
    items = _files(tmp_path, **texts)
    config = RunConfig(limits=Limits(stack_bytes=1 << 20, **NO_CHECK))
    one, two = run(items, config, jobs=1), run(items, config, jobs=2)
    assert _outcome(one) == _outcome(two)
    assert [skipped is None for _, skipped, _ in _outcome(two)] == [i % 3 != 0 for i in range(12)]


def test_a_silent_worker_is_given_up(tmp_path: Path, monkeypatch):
    # A read that never returns (a hung network file system) stands in here: the worker sleeps.
    def hang(path, display, *args, **kwargs):
        time.sleep(3600)

    monkeypatch.setattr(workers, "analyse_file", hang)
    if workers._context().get_start_method() != "fork":
        pytest.skip("the stand-in reaches the worker only through fork")
    items = _files(tmp_path, a=CUDA)
    started = time.monotonic()
    result = run(items, RunConfig(limits=Limits(cpu_seconds=0.2, cpu_seconds_per_mib=0, wall_seconds=1)), jobs=1)
    assert _outcome(result) == [("a.py", "no answer after 1.8 s; stopped", 0)]
    assert time.monotonic() - started < 30


def test_a_worker_that_cannot_start_is_one_error(tmp_path: Path, monkeypatch):
    def broken(config):
        raise RuntimeError("the rules cannot be loaded here")

    monkeypatch.setattr(workers, "make_index", broken)
    if workers._context().get_start_method() != "fork":
        pytest.skip("the stand-in reaches the worker only through fork")
    with pytest.raises(WorkerStartError, match="^an analysis worker process failed to start: "
                                               "RuntimeError: the rules cannot be loaded here$"):
        run(_files(tmp_path, a=CUDA), RunConfig(), jobs=1)


def test_workers_leave_nothing_behind(tmp_path: Path):
    before = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    run(_files(tmp_path, a=CUDA, b=CUDA), RunConfig(), jobs=2)
    leftovers = {name for name in set(os.listdir(os.environ.get("TMPDIR", "/tmp"))) - before
                 if name.startswith("mmrun-analyse-")}
    assert leftovers == set()


def test_a_caller_with_threads_gets_forkserver_workers(tmp_path: Path):
    # fork is unsafe once another thread runs; the workers then come from a fork server.
    items = _files(tmp_path, a_deep=CUDA + "x = " + "(" * 3000 + "1" + ")" * 3000 + "\n", b_ok=CUDA)
    script = tmp_path / "caller.py"
    script.write_text(f"""
import threading
from mmrun.analyse import workers
from mmrun.analyse.limits import Limits
from mmrun.analyse.runner import RunConfig

if __name__ == "__main__":
    done = threading.Event()
    threading.Thread(target=done.wait).start()
    try:
        print(workers._context().get_start_method())
        config = RunConfig(limits=Limits(stack_bytes=1 << 20, max_depth=10**9, max_brackets=10**9))
        for r in workers.run({items!r}, config, jobs=2).files:
            print(r.path, r.skipped, len(r.findings))
    finally:
        done.set()
""")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines() == ["forkserver", "a_deep.py the analysis process crashed (killed by SIGSEGV) 0",
                                        "b_ok.py None 1"], proc.stderr
