"""The save sequence under faults: a real SIGKILL at every step, a full disk, a read-only directory.

After every kill the promise is checked as --load sees it: the tracker names a complete checkpoint that
verifies (after the recovery every load and save starts with), and the next save leaves no leftovers.
Kills come two ways: the product's own hook (MMRUN_TEST_KILL_DURING_SAVE=ITER:STEP, a fresh process
per step) and, to cover the file operations between the named steps (inside replace_directory too), a
forked child that SIGKILLs itself at the k-th file operation it is about to make, for every k.
"""
from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mmrun.common import atomic_write
from mmrun.training import checkpointing as ck

TRACKER = "latest_checkpointed_iteration.txt"


def _state(seed: int, hidden: int) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    model = {"wte.weight": rng.standard_normal((64, hidden), dtype=np.float32),
             "ln_f.bias": rng.standard_normal(hidden, dtype=np.float32)}
    optimizer = {"step": seed, "lr": 0.1, "tensors": {f"{k}.exp_avg": v * 2 for k, v in model.items()}}
    return model, optimizer


def _save(root: Path, iteration: int, hidden: int = 8) -> Path:
    model, optimizer = _state(iteration, hidden)
    return ck.write_checkpoint(root, iteration, model, optimizer, {"iteration": iteration, "hidden": hidden})


def _resumed(root: Path) -> ck.LoadedCheckpoint:
    """What `--load root` resumes from: recovery first (as load_checkpoint does on rank 0), then the find."""
    ck.recover_interrupted_saves(root)
    found = ck.find_checkpoint(root, log=lambda line: None)
    assert found is not None and found.iteration == ck.read_tracker(root), "the tracker names no complete checkpoint"
    return found


def _assert_clean_after_next_save(root: Path, iteration: int) -> None:
    _save(root, iteration, hidden=2)
    assert ck.read_tracker(root) == iteration and _resumed(root).meta["hidden"] == 2
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")], "leftovers after the next save"


KILL_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from mmrun.training import checkpointing as ck
    rng = np.random.default_rng(0)
    model = {"wte.weight": rng.standard_normal((64, 4), dtype=np.float32), "ln_f.bias": np.ones(4, np.float32)}
    optimizer = {"step": 1, "lr": 0.1, "tensors": {k + ".exp_avg": v * 2 for k, v in model.items()}}
    ck.write_checkpoint(sys.argv[1], int(sys.argv[2]), model, optimizer, {"iteration": int(sys.argv[2]), "hidden": 4})
    print("not reached")
""")

# After a kill at each named step: (what the tracker names, whether iteration 10 is there, its "hidden")
# for a first save of iteration 10 over a tracker on 5, and for a re-save of iteration 10 (hidden 8 -> 4).
AFTER_KILL = {
    "first": {"begin": (5, None), "model": (5, None), "files": (5, None),
              "written": (5, 4),  # complete but not renamed: the next start puts it in place, the tracker stays
              "swapped": (5, 4), "tracker": (10, 4)},
    "again": {"begin": (10, 8), "model": (10, 8), "files": (10, 8), "written": (10, 8),
              "swapped": (10, 4), "tracker": (10, 4)},
}


@pytest.mark.parametrize("case", ["first", "again"])
@pytest.mark.parametrize("step", ck.SAVE_STEPS)
def test_sigkill_at_each_named_step_keeps_the_tracker_on_a_complete_checkpoint(tmp_path, step, case):
    _save(tmp_path, 5)
    if case == "again":
        _save(tmp_path, 10, hidden=8)
    env = {**os.environ, ck.KILL_DURING_SAVE_VAR: f"10:{step}"}
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(tmp_path), "10"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert f"at step {step!r} of the save" in proc.stdout and "not reached" not in proc.stdout
    tracker, hidden = AFTER_KILL[case][step]
    assert ck.read_tracker(tmp_path) == tracker
    assert _resumed(tmp_path).iteration == tracker
    if hidden is None:
        assert not (tmp_path / "iter_0000010").exists()
    else:
        assert ck.read_checkpoint(tmp_path, 10).meta["hidden"] == hidden
    assert ck.read_checkpoint(tmp_path, 5).iteration == 5  # the other checkpoint is never touched
    _assert_clean_after_next_save(tmp_path, 15)


def test_the_hook_names_its_steps():
    os.environ[ck.KILL_DURING_SAVE_VAR] = "10:later"
    try:
        with pytest.raises(ValueError, match="the step must be one of begin, model, files, written, swapped, tracker"):
            ck.write_checkpoint("/nonexistent", 10, {}, None, {})
    finally:
        del os.environ[ck.KILL_DURING_SAVE_VAR]


# Audit events (sys.addaudithook) raised just before a file operation: every one is a kill point.
FILE_EVENTS = {"open", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.chmod", "shutil.rmtree",
               "tempfile.mkdtemp", "tempfile.mkstemp"}


def _save_killed_at(root: Path, k: int, exchange: bool) -> bool:
    """Re-save iteration 10 in a forked child that SIGKILLs itself before its k-th file operation.
    Returns False when the save finished with fewer operations than k."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            if not exchange:
                atomic_write._exchange = lambda a, b: False  # a file system without RENAME_EXCHANGE
            count = 0

            def hook(event: str, args: tuple) -> None:
                nonlocal count
                if event in FILE_EVENTS:
                    count += 1
                    if count == k:
                        os.kill(os.getpid(), signal.SIGKILL)
            sys.addaudithook(hook)
            _save(root, 10, hidden=4)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0
    return False


@pytest.mark.parametrize("exchange", [True, False], ids=["rename-exchange", "no-exchange"])
def test_sigkill_before_every_file_operation_of_a_resave(tmp_path, exchange):
    template = tmp_path / "template"
    _save(template, 5)
    _save(template, 10, hidden=8)
    root = tmp_path / "ckpt"
    kills, restored = 0, 0
    for k in range(1, 500):
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(template, root)
        if not _save_killed_at(root, k, exchange):
            break
        kills += 1
        assert ck.read_tracker(root) == 10
        restored += bool(ck.recover_interrupted_saves(root))
        assert _resumed(root).meta["hidden"] in (8, 4)  # the old copy or the new one, complete either way
        _assert_clean_after_next_save(root, 15)
    else:
        pytest.fail("the save never finished")
    print(f"{'exchange' if exchange else 'no exchange'}: killed at {kills} file operations, "
          f"{restored} times iter_0000010 had to be put back")
    assert kills > 20
    # Without the exchange there is a moment between two renames with no iter_0000010: it must be put back.
    assert (restored > 0) != exchange


# ------------------------------------------------------------------ errors: one line, nothing left

SAVE_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from mmrun.training import checkpointing as ck
    model = {"w": np.ones((512, 512), np.float32)}  # 1 MiB
    try:
        ck.write_checkpoint(sys.argv[1], 10, model, {"step": 1, "lr": 0.1, "tensors": {"w.exp_avg": model["w"]}},
                            {"iteration": 10})
    except ck.CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
""")


def _limit_file_size(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_full_disk_is_one_line_exit_1_and_leaves_nothing(tmp_path):
    """RLIMIT_FSIZE stands in for a full disk: a write past it fails with EFBIG, as ENOSPC would
    (Python ignores SIGXFSZ, so the write returns the error)."""
    _save(tmp_path, 5)
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = subprocess.run([sys.executable, "-c", SAVE_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, preexec_fn=_limit_file_size(256 * 1024))
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: cannot save the checkpoint of iteration 10 to {tmp_path}: File too large")
    assert "raise the file size limit (ulimit -f) or pass another --save" in line
    assert "Nothing half-written is left; the tracker still names iteration 5" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no empty .tmp directory either
    assert _resumed(tmp_path).iteration == 5


def _as_unprivileged() -> list[str]:
    """A command prefix under which chmod is obeyed: as root, drop the capabilities that override it."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a read-only directory cannot be simulated")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all"]


def test_a_read_only_directory_is_one_line_exit_2_and_leaves_nothing(tmp_path):
    _save(tmp_path, 5)
    tmp_path.chmod(0o555)
    try:
        proc = subprocess.run([*_as_unprivileged(), sys.executable, "-c", SAVE_SCRIPT, str(tmp_path)],
                              capture_output=True, text=True, timeout=120)
    finally:
        tmp_path.chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "cannot save the checkpoint of iteration 10" in line and "Permission denied" in line
    assert "make it writable or pass another --save" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000005", TRACKER]
