"""Monitoring, profiling and determinism pieces without a training run: TensorBoard event files written by
tensorboardX and read back by mmrun's own reader (and `mmrun compare`), Megatron's timer block, the FLOPs
count, the top-operators table from a Chrome trace, and the flags' parsing."""
from __future__ import annotations

import json

import pytest

from mmrun.precision import profiling, tb_events, timers
from mmrun.precision.cli import main
from mmrun.precision.monitor import train_flops_per_iteration
from mmrun.precision.run_logs import LogError, read_run
from mmrun.training.arguments import parse_args

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "4", "--train-iters", "4", "--mock-data", "--lr", "1e-3"]


def write_run(folder, losses, start=1):
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    for it, loss in enumerate(losses, start):
        writer.add_scalar("lm loss", loss, it)
        writer.add_scalar("grad-norm", 1.0 + it / 10, it)
        writer.add_scalar("loss-scale", 1.0, it)
    writer.close()


def test_tensorboardx_scalars_read_back_and_compared(tmp_path, capsys):
    write_run(tmp_path / "a", [7.0, 6.5, 6.25])
    write_run(tmp_path / "b", [7.0, 6.5, 6.0])
    scalars, notes = tb_events.read_scalars(tmp_path / "a")
    assert scalars["lm_loss"] == {1: 7.0, 2: 6.5, 3: 6.25} and notes == []  # tensorboardX writes spaces as _
    run = read_run(tmp_path / "a")
    assert run.source == "tensorboard" and run.series("grad norm") == pytest.approx({1: 1.1, 2: 1.2, 3: 1.3})
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--rtol", "1e-3"]) == 1
    assert "lm loss first outside the tolerance at iteration 3: 6.25 vs 6" in capsys.readouterr().out


def test_a_cut_off_event_file_is_noted_and_garbage_is_one_line(tmp_path):
    write_run(tmp_path / "a", [7.0, 6.5])
    event = next((tmp_path / "a").glob("events.out.tfevents*"))
    event.write_bytes(event.read_bytes()[:-7])
    run = read_run(event)
    # the last record (step 2's loss scale) is cut: the rest is read, and the note says so
    assert run.series("loss scale") == {1: 1.0} and run.series("lm loss") == {1: 7.0, 2: 6.5}
    assert "a cut-off record" in run.notes[0]
    junk = tmp_path / "events.out.tfevents.junk"
    junk.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(LogError, match="is not a TensorBoard event"):
        read_run(junk)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LogError, match="no TensorBoard event files"):
        read_run(tmp_path / "empty")


def test_timer_levels_and_megatrons_block():
    t = timers.Timers(level=1)
    with t.phase("forward-backward"):
        pass
    with t.phase("forward-compute"):  # level 2: not timed at level 1
        pass
    t.iterations = 1
    assert list(t.per_iteration_ms()) == ["forward-backward"]
    assert timers.NO_TIMERS.phase("optimizer") is timers.NO_TIMERS.phase("batch-generator")  # a shared null context
    text = timers.block({"forward-backward": [12.0, 14.5], "optimizer": [1.0, 1.25]})
    assert text.splitlines() == ["(min, max) time across ranks (ms):",
                                 "    forward-backward ...............................: (12.00, 14.50)",
                                 "    optimizer ......................................: (1.00, 1.25)"]
    assert timers.block({"optimizer": [1.0, 2.0]}, "max").splitlines()[1].endswith(": 2.00")


def test_flops_are_megatrons_gpt_count():
    args = parse_args(TINY, world_size=1)
    args.padded_vocab_size = 512
    h, s, layers, batch, vocab = 64, 32, 2, 4, 512
    expected = 72 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (12 * layers * h))
    assert train_flops_per_iteration(args) == pytest.approx(expected)


def test_top_operators_from_a_chrome_trace(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([
        {"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "Scope Layer"}},
        {"ph": "X", "name": "MatMul", "pid": 2, "dur": "3000.0"}, {"ph": "X", "name": "MatMul", "pid": 2, "dur": 1000},
        {"ph": "X", "name": "ReLU", "pid": 2, "dur": 1000}, {"ph": "X", "name": "model-GPT", "pid": 3, "dur": 9e6}]))
    rows = profiling.rows_from_chrome_trace(str(trace), skip_processes=("Scope Layer",))
    assert {(r.name, r.calls, r.total_ms) for r in rows} == {("MatMul", 2, 4.0), ("ReLU", 1, 1.0)}
    table = profiling.top_table(rows, steps=2).splitlines()
    assert table[1].split() == ["MatMul", "2", "4.00", "2.00", "80.0%"]


def test_monitoring_flags_parse_in_both_spellings_and_are_not_ignored(capsys):
    args = parse_args(TINY + ["--tensorboard_dir", "tb", "--log-throughput", "--timing_log_level", "2",
                              "--profile", "--profile-ranks", "0", "1", "--deterministic"], world_size=1)
    assert (args.tensorboard_dir, args.log_throughput, args.timing_log_level) == ("tb", True, 2)
    assert args.profile and args.profile_ranks == [0, 1] and args.deterministic_mode
    assert "ignoring" not in capsys.readouterr().err
