"""Monitoring, profiling and determinism on real runs of the tiny GPT through mmrun, one per framework with
every switch on: TensorBoard scalars read back equal to the metrics file, a Chrome trace parsed, the top
operators and the timer block printed, the end-of-run summary; the two frameworks' TensorBoard scalars
compared by `mmrun compare`; a resumed run with nothing left to train says so."""
from __future__ import annotations

import json
import re

import pytest

from mmrun.precision.cli import main
from mmrun.precision.tb_events import read_scalars

pytestmark = pytest.mark.slow

FLAGS = ["--train-iters", "3", "--log-interval", "1", "--eval-interval", "100", "--log-throughput",
         "--timing-log-level", "2", "--log-timers-to-tensorboard", "--log-validation-ppl-to-tensorboard",
         "--profile", "--profile-step-start", "1", "--profile-step-end", "2", "--deterministic-mode"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demo_data, tk):
    root = tmp_path_factory.mktemp("monitoring")
    out = {}
    for framework, nproc in (("pytorch", 2), ("mindspore", 1)):
        args = [*tk.tiny_gpt, *tk.data_args(demo_data), *FLAGS, "--tensorboard-dir", str(root / f"tb_{framework}"),
                "--save", str(root / f"ckpt_{framework}")]
        run = tk.run_training(root / framework, args, framework=framework, nproc=nproc)
        assert run.returncode == 0, run.output[-3000:]
        out[framework] = run
    again = tk.run_training(root / "again", [*tk.tiny_gpt, *tk.data_args(demo_data), "--train-iters", "3",
                                             "--save", str(root / "ckpt_pytorch"), "--load", str(root / "ckpt_pytorch")],
                           nproc=None)  # one process, no launcher: the cheapest way to see the message
    assert again.returncode == 0, again.output[-3000:]
    return root, out, again


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_tensorboard_profile_timers_and_summary(runs, framework):
    root, out, _ = runs
    run = out[framework]
    scalars, _ = read_scalars(root / f"tb_{framework}")
    assert scalars["lm_loss"] == pytest.approx(run.losses(), rel=1e-6)  # float32 in the event file
    assert set(scalars["forward-backward-time"]) == {1, 2, 3} and scalars["iteration-time"][3] > 0
    assert scalars["lm_loss_validation_ppl"][3] == pytest.approx(2.718281828 ** scalars["lm_loss_validation"][3], rel=1e-5)
    assert "throughput" in scalars and "learning-rate" in scalars
    text = run.output
    assert re.search(r"\| throughput per GPU \(TFLOP/s/GPU\): [0-9.e-]+ \|", text)
    assert "(min, max) time across ranks (ms):\n    batch-generator ...." in text
    assert "> --deterministic-mode: seed 1234, " in text and "HCCL_DETERMINISTIC=true" in text
    assert "> --deterministic-mode does not cover: a different process count" in text
    trace = re.search(r"> profile of rank 0, 1 iteration\(s\): trace (\S+) \(open in", text).group(1)
    events = json.load(open(trace if trace.startswith("/") else root / framework / trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert sum(e.get("ph") == "X" for e in events) > 50
    table = text.split("top operators by self time:\n", 1)[1].splitlines()
    assert table[0].split() == ["operator", "calls", "total", "ms", "ms/step", "share"] and len(table) > 5
    summary = re.search(r"> summary: (\w+), iterations 1\.\.3 \(3 trained\) in [0-9.]+ s, ([0-9.]+) tokens/s, "
                        r"final lm loss (\S+), checkpoint (\S+) \(iteration 3\)", text)
    assert summary and summary.group(1) == framework and float(summary.group(2)) > 0
    assert float(summary.group(3)) == pytest.approx(run.losses()[3], rel=1e-6)


def test_the_frameworks_tensorboard_scalars_agree(runs, capsys):
    root, _, _ = runs
    assert main([str(root / "tb_pytorch"), str(root / "tb_mindspore"), "--rtol", "1e-5"]) == 0
    out = capsys.readouterr().out
    assert "(tensorboard, 3 iterations 1..3)" in out and "verdict: PASS" in out


def test_a_resumed_run_with_nothing_left_to_train_says_so(runs):
    root, _, again = runs
    assert f"> nothing to train: the checkpoint loaded from {root / 'ckpt_pytorch'} is at iteration 3, --train-iters " \
           "is 3" in again.output
    assert "> summary: nothing trained: the run started at iteration 3 of --train-iters 3" in again.output
    assert not again.losses()
