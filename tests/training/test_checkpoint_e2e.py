"""Checkpoints in real training runs: what --load does with a missing or broken tracker, saves that fail
(a full disk, a read-only directory), a bad --metrics-file, and the demo script resuming its own run.

The file-level promises (every kill point of the save sequence) are test_checkpoint_faults.py's; here
the same promises are checked through models/pretrain_gpt.py, torchrun and the demo script.
"""
from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from mmrun.launchers.supervisor import processes_with
from mmrun.training.checkpointing import KILL_DURING_SAVE_VAR, TRACKER_FILE, read_tracker
from mmrun.training.training_log import parse_log

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory, demo_data, tk):
    """20 iterations of the tiny GPT with checkpoints at 10 and 20, and its losses."""
    base = tmp_path_factory.mktemp("trained")
    args = [*tk.tiny_gpt, *tk.data_args(demo_data)]
    run = tk.run_training(base / "run", [*args, "--save", str(base / "ckpt"), "--save-interval", "10"], nproc=None)
    assert run.returncode == 0, run.output[-3000:]
    return {"args": args, "ckpt": base / "ckpt", "losses": run.losses()}


def _entry(tk, args: list[str], cwd: Path, **popen) -> subprocess.CompletedProcess:
    """models/pretrain_gpt.py run directly (one process, no launcher)."""
    return subprocess.run([sys.executable, str(tk.entry), *args], cwd=cwd, env=tk.clean_env(), capture_output=True,
                          text=True, timeout=300, **popen)


def _error_line(proc: subprocess.CompletedProcess) -> str:
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return line


def test_a_missing_tracker_resumes_from_the_newest_complete_checkpoint_exactly(trained, tmp_path, tk):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained["ckpt"], ckpt)
    (ckpt / TRACKER_FILE).unlink()
    shutil.rmtree(ckpt / "iter_0000020")
    run = tk.run_training(tmp_path / "run", [*trained["args"], "--load", str(ckpt), "--save", str(ckpt)], nproc=None)
    assert run.returncode == 0, run.output[-3000:]
    assert (f"WARNING: {ckpt / TRACKER_FILE} is missing; resuming from the newest complete checkpoint, iter_0000010 "
            "(checksums verified)") in run.output
    after = run.losses()
    assert sorted(after) == list(range(11, 21)) and all(after[i] == trained["losses"][i] for i in after)
    assert read_tracker(ckpt) == 20


@pytest.mark.parametrize("tracker, reason", [("directory", "is a directory, not the tracker file"),
                                             (b"\xff\xfe2\x000\x00", "is not text (not UTF-8)")])
def test_a_broken_tracker_stops_before_training_with_one_line(trained, tmp_path, tk, tracker, reason):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained["ckpt"], ckpt)
    (ckpt / TRACKER_FILE).unlink()
    (ckpt / TRACKER_FILE).mkdir() if tracker == "directory" else (ckpt / TRACKER_FILE).write_bytes(tracker)
    proc = _entry(tk, [*trained["args"], "--load", str(ckpt)], tmp_path)  # with --save too, check_save_dir stops it
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _error_line(proc)
    assert reason in line and "pass --ckpt-step 20" in line and "iteration        1/" not in proc.stdout
    assert sorted(p.name for p in ckpt.iterdir()) == ["iter_0000010", "iter_0000020", TRACKER_FILE]


def test_a_read_only_save_directory_stops_before_training(trained, tmp_path, tk):
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a read-only directory cannot be simulated")
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all"] if os.geteuid() == 0 else []
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    try:
        proc = subprocess.run([*prefix, sys.executable, str(tk.entry), *trained["args"], "--save", str(locked / "ckpt")],
                              cwd=tmp_path, env=tk.clean_env(), capture_output=True, text=True, timeout=300)
    finally:
        locked.chmod(0o755)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert _error_line(proc) == f"error: --save {locked / 'ckpt'}: {locked} is not writable; make it writable or pass another --save"
    assert "building GPT model" not in proc.stdout and not os.listdir(locked)


def test_a_full_disk_at_a_save_is_one_line_exit_1_and_leaves_nothing(trained, tmp_path, tk):
    """Two torchrun workers under RLIMIT_FSIZE = 1 MiB: model.safetensors (0.8 MB) fits, the optimizer
    state (1.6 MB) does not, as on a disk that fills up in the middle of a save."""
    save = tmp_path / "ckpt"
    marker = uuid.uuid4().hex
    limit = 1 << 20
    try:
        proc = subprocess.run([sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", "pytorch",
                               "--nproc-per-node", "2", "--master-port", "0", str(tk.entry), *trained["args"],
                               "--save", str(save), "--save-interval", "10"],
                              cwd=tmp_path, env=tk.clean_env(MMRUN_TRAINING_TEST=marker), capture_output=True, text=True,
                              timeout=300, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
        left = processes_with(f"MMRUN_TRAINING_TEST={marker}")
    finally:
        for pid in processes_with(f"MMRUN_TRAINING_TEST={marker}"):
            os.kill(pid, 9)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not left, "workers left running after the failed save"
    lines = {line.split("]:", 1)[-1].strip() for line in (proc.stdout + proc.stderr).splitlines() if "error: cannot save" in line}
    assert lines == {f"error: cannot save the checkpoint of iteration 10 to {save}: File too large "
                     "(optimizer.safetensors); raise the file size limit (ulimit -f) or pass another --save. Nothing "
                     "half-written is left; no earlier checkpoint is named by the tracker"}, lines
    assert os.listdir(save) == []


def test_metrics_file_in_a_missing_directory_is_one_line(trained, tmp_path, tk):
    proc = _entry(tk, [*trained["args"], "--metrics-file", str(tmp_path / "no" / "m.jsonl")], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert _error_line(proc) == (f"error: --metrics-file {tmp_path / 'no' / 'm.jsonl'}: the directory {tmp_path / 'no'} "
                                 f"does not exist. Received: --metrics-file {tmp_path / 'no' / 'm.jsonl'}; create the "
                                 "directory or pass a file in an existing one")


def test_the_demo_script_run_again_resumes_where_the_first_run_was_killed(tmp_path, tk):
    """Run 1 is SIGKILLed while saving iteration 40 (after saving 20); the same command again resumes at 20
    (--load = --save) and prints iterations 30 and 40 exactly as run 1 did (dropout 0.1, 2 processes)."""
    out = tmp_path / "demo"
    env = tk.clean_env(OUT_DIR=str(out), MASTER_PORT="0")

    def demo(**extra: str) -> tuple[int, str]:
        proc = subprocess.run(["bash", str(tk.root / "scripts" / "pretrain_gpt.sh")], cwd=tmp_path,
                              env={**env, **extra}, capture_output=True, text=True, timeout=300)
        return proc.returncode, proc.stdout + proc.stderr

    code, first = demo(**{KILL_DURING_SAVE_VAR: "40"})
    assert code != 0 and f"{KILL_DURING_SAVE_VAR}=40: killing this process" in first, first[-3000:]
    assert read_tracker(out / "ckpt") == 20
    code, second = demo()
    assert code == 0, second[-3000:]
    assert "loading checkpoint from" in second and "at iteration 20" in second
    losses = {run: dict(parse_log(text)["train"]) for run, text in (("first", first), ("second", second))}
    assert sorted(losses["second"]) == [30, 40] and all(losses["second"][i] == losses["first"][i] for i in (30, 40))
    assert read_tracker(out / "ckpt") == 40
