"""`mmrun compare` on logs written by mmrun's own log formatter and metrics file (real formats, small runs)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from mmrun.precision.cli import main
from mmrun.training.training_log import IntervalStats, iteration_line

MMRUN = [sys.executable, "-m", "mmrun.launchers.cli"]


def megatron_log(losses: dict[int, float], grad_norm: float = 1.5, prefix: str = "", train_iters: int = 20) -> str:
    """A log as mmrun's trainer prints it (--log-interval 1), with launcher noise around the iteration lines."""
    lines = ["> building train, validation, and test datasets ...", "training ..."]
    for it, loss in losses.items():
        stats = IntervalStats()
        stats.add({"lm loss": loss}, 0.05)
        lines.append(prefix + iteration_line(it, train_iters, it * 8, stats, 2e-3, 8, grad_norm, 32, None))
    lines.append("[after training is done] datetime: 2026-01-01 00:00:00")
    return "\n".join(lines) + "\n"


def curve(n: int = 10, lr_bump_from: int | None = None) -> dict[int, float]:
    return {it: 7.0 - 0.05 * it + (0.2 if lr_bump_from and it >= lr_bump_from else 0.0) for it in range(1, n + 1)}


def test_identical_logs_pass(tmp_path, capsys):
    (tmp_path / "a.log").write_text(megatron_log(curve()))
    (tmp_path / "b.log").write_text(megatron_log(curve(), prefix="[rank0]: "))  # a launcher's prefix is fine
    assert main([str(tmp_path / "a.log"), str(tmp_path / "b.log"), "--rtol", "1e-5"]) == 0
    out = capsys.readouterr().out
    assert "verdict: PASS: lm loss within rtol 1e-05, atol 0 at all 10 common iterations" in out
    assert "10 iterations 1..10" in out


def test_first_iteration_outside_the_tolerance_fails(tmp_path, capsys):
    (tmp_path / "a.log").write_text(megatron_log(curve()))
    (tmp_path / "b.log").write_text(megatron_log(curve(lr_bump_from=4)))
    assert main([str(tmp_path / "a.log"), str(tmp_path / "b.log")]) == 1
    out = capsys.readouterr().out
    verdict = [line for line in out.splitlines() if line.startswith("verdict:")]
    assert verdict == ["verdict: FAIL (rtol 0.01, atol 0): lm loss first outside the tolerance at iteration 4: "
                       "6.8 vs 7 (|diff| 0.2 > atol 0 + rtol 0.01 x |baseline|)"]
    summary = next(line for line in out.splitlines() if line.startswith("lm loss "))
    assert summary.split()[-2:] == ["7", "4"]  # 7 iterations outside, the first is 4
    # a looser tolerance passes the same pair
    assert main([str(tmp_path / "a.log"), str(tmp_path / "b.log"), "--atol", "0.25"]) == 0


def test_metrics_file_against_log_different_lengths_and_restart(tmp_path, capsys):
    base = curve(10)
    records = [{"kind": "train", "iteration": it, "lm_loss": v, "grad_norm": 1.5, "loss_scale": None, "skipped": False}
               for it, v in base.items()]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"kind": "summary"}\n')
    # a run that crashed after 7 and was resumed from iteration 5, appended to the same log, then stopped at 8
    first = megatron_log({it: base[it] + 1.0 for it in range(1, 8)})  # the crashed run's values are replaced
    resumed = megatron_log({it: base[it] for it in range(6, 9)})
    (tmp_path / "r.log").write_text(first + resumed)
    assert main([str(tmp_path / "m.jsonl"), str(tmp_path / "r.log"), "--rtol", "1e-6"]) == 1
    out = capsys.readouterr().out
    assert "note: A restarts" not in out
    assert "note: B restarts at line 13: iteration 7 -> 6 (a resumed run): its later values are used" in out
    assert ("note: different lengths: compared the 8 iterations both logged (1..8); only in A: 2 (9..10); "
            "only in B: none") in out
    assert "first outside the tolerance at iteration 1" in out  # 1..5 come from the crashed run (+1.0)


def test_grad_norm_is_reported_and_checked_on_request(tmp_path, capsys):
    (tmp_path / "a.log").write_text(megatron_log(curve(), grad_norm=1.5))
    (tmp_path / "b.log").write_text(megatron_log(curve(), grad_norm=1.6))
    assert main([str(tmp_path / "a.log"), str(tmp_path / "b.log")]) == 0
    assert main([str(tmp_path / "a.log"), str(tmp_path / "b.log"), "--check", "lm loss", "--check", "grad norm"]) == 1
    out = capsys.readouterr().out
    assert "grad norm first outside the tolerance at iteration 1: 1.5 vs 1.6" in out


def test_nan_against_number_fails_and_nan_against_nan_passes(tmp_path, capsys):
    bad = curve()
    bad[3] = math.nan
    (tmp_path / "a.log").write_text(megatron_log(curve()))
    (tmp_path / "b.log").write_text(megatron_log(bad))
    (tmp_path / "c.log").write_text(megatron_log(bad))
    assert main([str(tmp_path / "a.log"), str(tmp_path / "b.log")]) == 1
    assert "at iteration 3: 6.85 vs nan" in capsys.readouterr().out
    assert main([str(tmp_path / "b.log"), str(tmp_path / "c.log")]) == 0


@pytest.mark.parametrize("content, message", [
    (b"hello\nworld\n", "no training iterations found (2 lines; expected Megatron's"),
    (bytes(range(256)) * 40, "not text (binary or garbled"),
    (megatron_log(curve(3)).replace("lm loss: 6.95", "lm loss: 6.9x5").encode(),
     ":3: 'lm loss: 6.9x50000E+00' is not a number in the iteration line; the log is garbled there"),
    (b'{"kind": "train", "iteration": 1, "lm_loss": 7.0}\n{"kind": "tra\n{"kind": "train"}\n',
     ":2: not a JSON object; the metrics file is garbled there"),
], ids=["text", "binary", "garbled-number", "garbled-json"])  # the log's lines carry the time: no ids from them (xdist)
def test_garbage_is_a_one_line_error(tmp_path, content, message):
    (tmp_path / "a.log").write_text(megatron_log(curve()))
    (tmp_path / "bad.log").write_bytes(content)
    result = subprocess.run([*MMRUN, "compare", str(tmp_path / "a.log"), str(tmp_path / "bad.log")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and message in result.stderr, result.stderr


def test_truncated_last_line_is_ignored_with_a_note(tmp_path, capsys):
    text = megatron_log(curve(6))
    cut = text[:text.index("lm loss", text.index("iteration        6/"))]  # the log ends inside iteration 6's line
    (tmp_path / "a.log").write_text(megatron_log(curve(6)))
    (tmp_path / "cut.log").write_text(cut)
    assert main([str(tmp_path / "a.log"), str(tmp_path / "cut.log")]) == 0
    out = capsys.readouterr().out
    assert "B: line 8 (the last, cut off) ignored" in out and "compared the 5 iterations both logged" in out


def test_usage_errors_and_plot(tmp_path, capsys):
    (tmp_path / "a.log").write_text(megatron_log(curve()))
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "a.log")])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        main([str(tmp_path / "a.log"), str(tmp_path / "a.log"), "--rtol", "-1"])
    assert "--rtol must be a finite number >= 0. Received: -1.0" in capsys.readouterr().err
    assert main([str(tmp_path / "a.log"), str(tmp_path / "missing.log")]) == 2
    assert "missing.log: cannot be read (No such file or directory)" in capsys.readouterr().err
    (tmp_path / "b.log").write_text(megatron_log(curve(lr_bump_from=5)))
    png = tmp_path / "curves.png"
    assert main([str(tmp_path / "a.log"), str(tmp_path / "b.log"), "--plot", str(png)]) == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_json_report(tmp_path, capsys):
    (tmp_path / "a.log").write_text(megatron_log(curve()))
    (tmp_path / "b.log").write_text(megatron_log(curve(lr_bump_from=9)))
    assert main([str(tmp_path / "a.log"), str(tmp_path / "b.log"), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    loss = next(m for m in report["metrics"] if m["metric"] == "lm loss")
    assert report["verdict"] == "FAIL" and loss["first_outside"] == 9 and loss["outside"] == 2
    assert loss["max_abs"] == pytest.approx(0.2)
