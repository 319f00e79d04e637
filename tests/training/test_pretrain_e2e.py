"""The tiny GPT trained end to end through `mmrun` on both frameworks, one and two processes.

Every run is a real job: mmrun -> torchrun or msrun -> models/pretrain_gpt.py -> the shared loop, on the
demo corpus tokenized by `mmrun preprocess-data`. Runs are made once per session and shared:

    pt1 / pt2     PyTorch, 1 process (2 accumulation steps) / 2 processes (data parallel), same global batch
    ms1 / ms2     the same on MindSpore (compiled with mindspore.jit: the default)
    ms1_pynative  ms1 with --no-ms-jit
    pt_resume     PyTorch, resumed from pt1's iteration-10 checkpoint
    pt_killed     PyTorch, SIGKILLed in the middle of saving iteration 10 (the test hook), then resumed
    pt_drop / ms_drop                  dropout 0.1 with --dropout-impl hash (the same masks on both
                                       frameworks), checkpoint at iteration 10
    pt_drop_resume / ms_drop_resume    the same, resumed from that checkpoint on the same framework
    ms_drop_from_pt                    MindSpore resumed from pt_drop's checkpoint (the one cross-framework resume
                                       here: dropout off would prove nothing more)
    ms2_zero      ms2 with --use-distributed-optimizer (backend/mindspore/parallel/zero.py), checkpoint at iteration 10
    ms1_from_zero resumed from it on 1 MindSpore process (sharded over 1)

Losses are compared from --metrics-file (full float precision); the Megatron-format log is checked too.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmrun.training.checkpointing import KILL_DURING_SAVE_VAR, read_tracker
from mmrun.training.training_log import parse_log


pytestmark = pytest.mark.slow

ITERS = 20  # tk.tiny_gpt's --train-iters
# tk.tiny_gpt (tests/training/conftest.py) has dropout off for the runs most tests share; the dropout runs
# (DROPOUT below) are compared across frameworks too.

# The one setting that draws random numbers every step: a resumed run matches only if the framework RNG resumes.
DROPOUT = ["--hidden-dropout", "0.1", "--attention-dropout", "0.1"]
# The cross-framework runs choose the hash dropout explicitly: "auto" is the framework's own off CPU.
HASH_DROPOUT = ["--dropout-impl", "hash"]


def _with(args: list[str], overrides: list[str]) -> list[str]:
    """args with the values of the flags in overrides (flag, value pairs) replaced."""
    values = dict(zip(overrides[::2], overrides[1::2]))
    return [values.get(args[i - 1], a) if i else a for i, a in enumerate(args)]


@pytest.fixture(scope="session")
def runs(tmp_path_factory, demo_data, tk):
    run_training = tk.run_training
    base = tmp_path_factory.mktemp("runs")
    args = list(tk.tiny_gpt) + tk.data_args(demo_data)
    ckpt, killed = base / "ckpt_pt", base / "ckpt_killed"
    drop_args = _with(list(tk.tiny_gpt), DROPOUT) + HASH_DROPOUT + tk.data_args(demo_data)
    drop_ckpt = {fw: base / f"ckpt_{fw}_drop" for fw in ("pt", "ms")}
    framework = {"pt": "pytorch", "ms": "mindspore"}
    specs = {
        "pt1": lambda: run_training(base / "pt1", args + ["--save", str(ckpt), "--save-interval", "10"]),
        "pt2": lambda: run_training(base / "pt2", args, nproc=2),
        "ms1": lambda: run_training(base / "ms1", args, "mindspore"),
        "ms2": lambda: run_training(base / "ms2", args, "mindspore", nproc=2),
        "ms1_pynative": lambda: run_training(base / "ms1_pynative", args + ["--no-ms-jit"], "mindspore"),
        "pt_resume": lambda: (get("pt1"), run_training(base / "pt_resume", args + ["--load", str(ckpt),
                                                                                   "--ckpt-step", "10"]))[1],
        "pt_killed": lambda: run_training(base / "pt_killed", args + ["--save", str(killed), "--save-interval", "5"],
                                          env_extra={KILL_DURING_SAVE_VAR: "10"}),
        "pt_after_kill": lambda: (get("pt_killed"), run_training(base / "pt_after_kill",
                                                                 args + ["--load", str(killed), "--save", str(killed),
                                                                         "--save-interval", "5"]))[1],
    }
    for fw in ("pt", "ms"):
        specs[f"{fw}_drop"] = lambda fw=fw: run_training(
            base / f"{fw}_drop", drop_args + ["--save", str(drop_ckpt[fw]), "--save-interval", "10"], framework[fw])
        specs[f"{fw}_drop_resume"] = lambda fw=fw: (get(f"{fw}_drop"), run_training(
            base / f"{fw}_drop_resume", drop_args + ["--load", str(drop_ckpt[fw]), "--ckpt-step", "10"],
            framework[fw]))[1]
    specs["ms_drop_from_pt"] = lambda: (get("pt_drop"), run_training(
        base / "ms_drop_from_pt", drop_args + ["--load", str(drop_ckpt["pt"]), "--ckpt-step", "10"], "mindspore"))[1]
    zero = base / "ckpt_ms_zero"
    specs["ms2_zero"] = lambda: run_training(base / "ms2_zero", args + ["--use-distributed-optimizer", "--save",
                                                                        str(zero), "--save-interval", "10"],
                                             "mindspore", nproc=2)
    specs["ms1_from_zero"] = lambda: (get("ms2_zero"), run_training(
        base / "ms1_from_zero", args + ["--use-distributed-optimizer", "--load", str(zero), "--ckpt-step", "10"],
        "mindspore"))[1]
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = specs[name]()
            if name != "pt_killed":
                assert cache[name].returncode == 0, f"{name} failed:\n{cache[name].output[-3000:]}"
        return cache[name]

    get.ckpt, get.killed, get.base, get.drop_ckpt = ckpt, killed, base, drop_ckpt
    return get


def _max_diff(a: dict[int, float], b: dict[int, float], iterations) -> float:
    return max(abs(a[i] - b[i]) for i in iterations)


@pytest.mark.parametrize("name", ["pt1", "pt2", "ms1", "ms2"])
def test_tiny_gpt_trains_20_iterations_with_decreasing_loss(runs, name):
    run = runs(name)
    losses = run.losses()
    assert sorted(losses) == list(range(1, ITERS + 1))
    first, last = [losses[i] for i in range(1, 6)], [losses[i] for i in range(ITERS - 4, ITERS + 1)]
    assert sum(last) / 5 < sum(first) / 5 - 0.5, losses  # ln(1536) = 7.3 at the start
    assert losses[ITERS] < losses[1]
    # Megatron's log on rank 0 only, validation every --eval-interval, final validation and test loss.
    log = parse_log(run.output)
    assert [i for i, _ in log["train"]] == [5, 10, 15, 20]
    assert [p for p, _ in log["validation"]] == ["iteration 10", "iteration 20", "iteration 20 on validation set",
                                                 "iteration 20 on test set"]
    assert "tokens per second:" in run.output and "consumed samples:          160 |" in run.output
    assert abs(log["train"][-1][1] - sum(last) / 5) < 1e-5  # the log line averages its interval
    # each step's wall and CPU time (the process's threads together; benchmarks/ms_speed.py reports both)
    assert all(m["elapsed_ms"] > 0 and m["cpu_ms"] > 0 for m in run.metrics if m["kind"] == "train")


@pytest.mark.parametrize("framework", ["pt", "ms"])
def test_two_process_data_parallel_equals_one_process_with_the_same_global_batch(runs, framework):
    one, two = runs(f"{framework}1").losses(), runs(f"{framework}2").losses()
    diff = _max_diff(one, two, range(1, ITERS + 1))
    print(f"max |DP=2 - DP=1| ({framework}): {diff:.2e}")
    assert diff <= 1e-5


def _assert_frameworks_agree(pt, ms, what: str = "") -> float:
    """Every iteration's loss and the validation/test losses within 1e-4; returns the largest loss difference."""
    diff = _max_diff(pt.losses(), ms.losses(), range(1, ITERS + 1))
    print(f"max |mindspore - pytorch|{what} over {ITERS} iterations: {diff:.2e}")
    assert diff <= 1e-4
    for kind in ("valid", "test"):
        assert max(abs(a - b) for a, b in zip(pt.evals(kind), ms.evals(kind))) <= 1e-4
    return diff


def test_pytorch_and_mindspore_agree_from_the_same_seed(runs):
    _assert_frameworks_agree(runs("pt1"), runs("ms1"))


def test_mindspore_compiles_the_step_by_default_with_the_losses_of_pynative(runs):
    jit, pynative = runs("ms1"), runs("ms1_pynative")
    assert "> MindSpore train step: mindspore.jit (graph)" in jit.output
    assert "> MindSpore train step: PyNative" in pynative.output
    diff = _max_diff(jit.losses(), pynative.losses(), range(1, ITERS + 1))
    print(f"max |jit - PyNative| loss over {ITERS} iterations: {diff:.2e}")
    assert diff <= 1e-5


def test_checkpoint_layout_and_same_framework_resume_is_bit_exact(runs):
    full, resumed = runs("pt1"), runs("pt_resume")
    assert read_tracker(runs.ckpt) == ITERS
    for iteration in (10, 20):
        files = sorted(p.name for p in (runs.ckpt / f"iter_{iteration:07d}" / "mp_rank_00").iterdir())
        assert files == ["meta.json", "model.safetensors", "optimizer.safetensors"]
    assert "loading checkpoint from" in resumed.output and "at iteration 10" in resumed.output
    after = resumed.losses()
    assert sorted(after) == list(range(11, ITERS + 1))
    assert all(after[i] == full.losses()[i] for i in after), (after, full.losses())
    # the validation data resumes where it stopped: the later evaluations are identical too
    assert resumed.evals("valid") == full.evals("valid")[1:] and resumed.evals("test") == full.evals("test")


def test_pytorch_and_mindspore_agree_with_dropout(runs):
    """Both frameworks draw the same dropout masks from the same --seed (backend/dropout_hash.py)."""
    pt = runs("pt_drop")
    diff = _assert_frameworks_agree(pt, runs("ms_drop"), " with dropout 0.1")
    # and dropout was on: far from the dropout-0 run of the same seed
    effect = _max_diff(pt.losses(), runs("pt1").losses(), range(1, ITERS + 1))
    print(f"max |dropout 0.1 - dropout 0| (pytorch): {effect:.2e}")
    assert effect > 100 * max(diff, 1e-6)


@pytest.mark.parametrize("framework", ["pt", "ms"])
def test_same_framework_resume_with_dropout_is_bit_exact(runs, framework):
    full, resumed = runs(f"{framework}_drop"), runs(f"{framework}_drop_resume")
    meta = json.loads((runs.drop_ckpt[framework] / "iter_0000010" / "mp_rank_00" / "meta.json").read_text())
    assert meta["args"]["hidden_dropout"] == meta["args"]["attention_dropout"] == 0.1
    assert meta["rng_state"][0]["framework"]["name"] == meta["framework"]
    assert "at iteration 10" in resumed.output
    # none of _restore_rng's notices: Python, numpy and the framework RNG were all restored
    assert not [n for n in ("RNG state", "RNGs keep", "masks after resume differ") if n in resumed.output]
    after = resumed.losses()
    assert sorted(after) == list(range(11, ITERS + 1))
    assert all(after[i] == full.losses()[i] for i in after), (after, full.losses())
    # the Megatron log lines, as printed, for the intervals after the checkpoint
    assert parse_log(resumed.output)["train"] == parse_log(full.output)["train"][2:]


BYTES_LINE = r"> distributed optimizer: AdamW state sharded over (\d) data-parallel ranks, (\d+) bytes of optimizer state"


def test_the_mindspore_distributed_optimizer_equals_the_unsharded_one_with_half_the_state_per_rank(runs):
    """ZeRO-1 on MindSpore (2 ranks): every loss within 1e-5 of the replicated optimizer's, the flag kept (no
    notice), and each rank holds half the optimizer state bytes of one rank alone (measured from its tensors)."""
    import re

    plain, zero, alone = runs("ms2"), runs("ms2_zero"), runs("ms1_from_zero")
    diff = _max_diff(plain.losses(), zero.losses(), range(1, ITERS + 1))
    print(f"max |distributed optimizer - replicated| over {ITERS} iterations (MindSpore, 2 ranks): {diff:.2e}")
    assert diff <= 1e-5
    for kind in ("valid", "test"):
        assert max(abs(a - b) for a, b in zip(plain.evals(kind), zero.evals(kind))) <= 1e-5
    assert "not available with the mindspore backend" not in zero.output
    (dp2, sharded), = re.findall(BYTES_LINE, zero.output)  # rank 0 logs
    (dp1, whole), = re.findall(BYTES_LINE, alone.output)
    print(f"optimizer state bytes per rank: {sharded} over 2 ranks, {whole} on one")
    assert (dp2, dp1) == ("2", "1") and abs(int(sharded) - int(whole) / 2) <= 8  # the padding: one float x 2 moments


def test_a_distributed_optimizer_checkpoint_resumes_on_another_world_size(runs):
    """The shards are saved as whole per-parameter tensors: one MindSpore process (sharding over 1) continues
    the 2-rank run (on PyTorch: tests/training/test_mindspore_parallel_e2e.py's dp2-distopt)."""
    full, resumed = runs("ms2_zero"), runs("ms1_from_zero")
    after = resumed.losses()
    assert sorted(after) == list(range(11, ITERS + 1))
    diff = _max_diff(after, full.losses(), after)
    print(f"max |ms1_from_zero - the uninterrupted 2-rank run|: {diff:.2e}")
    assert diff <= 1e-5


def test_mindspore_resumes_a_pytorch_checkpoint_with_dropout_on_the_same_masks(runs):
    full, resumed = runs("pt_drop"), runs("ms_drop_from_pt")
    after = resumed.losses()
    assert sorted(after) == list(range(11, ITERS + 1))
    assert "the checkpoint was saved by pytorch; resuming on mindspore" in resumed.output
    # the dropout stream (one format, one hash on both) carries over; the framework's other generators do not
    assert "masks after resume differ" not in resumed.output
    diff = _max_diff(after, full.losses(), after)
    print(f"max |mindspore resumed - pytorch uninterrupted| with dropout 0.1: {diff:.2e}")
    assert diff <= 1e-4


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_and_resume_continues_exactly(runs):
    killed = runs("pt_killed")
    assert killed.returncode != 0
    assert f"{KILL_DURING_SAVE_VAR}=10: killing this process" in killed.output
    assert sorted(killed.losses()) == list(range(1, 11))
    assert read_tracker(runs.killed) == 5 and not (runs.killed / "iter_0000010").exists()
    resumed = runs("pt_after_kill")  # --load picks the tracker's iteration 5
    after = resumed.losses()
    assert sorted(after) == list(range(6, ITERS + 1))
    assert all(after[i] == runs("pt1").losses()[i] for i in after)
    assert read_tracker(runs.killed) == ITERS and not list(runs.killed.glob(".iter_*"))


def _entry(tk, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The entry run directly (one process, no launcher): for runs that must stop with a usage error."""
    return subprocess.run([sys.executable, str(tk.entry), *args], cwd=cwd, env=tk.clean_env(),
                          capture_output=True, text=True, timeout=300)


def _error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def test_checkpoint_of_another_shape_is_refused_before_loading_anything(runs, demo_data, tmp_path, tk):
    runs("pt1")
    args = [a if a != "64" else "32" for a in tk.tiny_gpt] + tk.data_args(demo_data) + ["--load", str(runs.ckpt)]
    proc = _entry(tk, args, tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = _error_lines(proc)
    assert "does not fit this model (shape mismatch: " in line and "(checkpoint (1536, 64), model (1536, 32))" in line
    assert "it was saved with --num-layers 2, --hidden-size 64" in line
    assert "iteration        1/" not in proc.stdout  # nothing trained
    assert "successfully loaded" not in proc.stdout


def test_corrupt_checkpoint_file_is_refused(runs, demo_data, tmp_path, tk):
    runs("pt1")
    copy = tmp_path / "ckpt"
    shutil.copytree(runs.ckpt, copy)
    model_file = copy / "iter_0000020" / "mp_rank_00" / "model.safetensors"
    model_file.write_bytes(model_file.read_bytes()[: model_file.stat().st_size // 2])
    proc = _entry(tk, [*tk.tiny_gpt, *tk.data_args(demo_data), "--load", str(copy), "--train-iters", "25"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = _error_lines(proc)
    assert "is corrupt or truncated" in line and "iter_0000020/mp_rank_00" in line and "--ckpt-step N" in line


@pytest.mark.parametrize("extra, expected", [
    (["--tensor-model-parallel-size", "2"], "the world size (1) must be a multiple of --tensor-model-parallel-size"),
    (["--fp16", "--bf16"], "--fp16 and --bf16 cannot both be given"),
    (["--hidden_sise", "64"], "unrecognized argument '--hidden_sise'"),
])
def test_usage_errors_stop_before_any_model_is_built(demo_data, tmp_path, tk, extra, expected):
    proc = _entry(tk, list(tk.tiny_gpt) + tk.data_args(demo_data) + extra, tmp_path)
    assert proc.returncode == 2
    assert any(expected in line for line in _error_lines(proc)), proc.stderr[-2000:]
    assert "building GPT model" not in proc.stdout


def test_demo_script_runs_through_mmrun_with_decreasing_losses(tmp_path, tk):
    # The script calls `mmrun` from PATH: clean_env puts the venv's bin directory first.
    env = tk.clean_env(OUT_DIR=str(tmp_path / "demo"), MASTER_PORT="0")
    start = time.time()
    proc = subprocess.run(["bash", str(tk.root / "scripts" / "pretrain_gpt.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    elapsed = time.time() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = [loss for _, loss in parse_log(proc.stdout + proc.stderr)["train"]]
    assert len(losses) == 4 and losses[-1] < losses[0] - 1.0 and losses == sorted(losses, reverse=True), losses
    assert read_tracker(tmp_path / "demo" / "ckpt") == 40
    print(f"demo script: {elapsed:.1f} s")


def test_demo_script_passes_shellcheck(tk):
    shellcheck = Path(sys.executable).parent / "shellcheck"
    proc = subprocess.run([str(shellcheck), str(tk.root / "scripts" / "pretrain_gpt.sh")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
