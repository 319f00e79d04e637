"""`mmrun translate` as users call it: stdout, -o, --in-place, --diff, --check, --report json, errors."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mmrun.launchers.translate.cli import main

SCRIPT = """#!/bin/bash
GPUS=2
torchrun --nproc_per_node $GPUS --nnodes 1 pretrain_gpt.py --fp16
"""
MMRUN = [sys.executable, "-m", "mmrun.launchers.cli", "translate"]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.sh"
    path.write_text(SCRIPT)
    path.chmod(0o755)
    return path


def test_default_prints_the_translation_and_leaves_the_input(script: Path, capsysbinary) -> None:
    assert main([str(script)]) == 0
    captured = capsysbinary.readouterr()
    assert b"msrun --local_worker_num $GPUS --worker_num \"$GPUS\"" in captured.out
    assert b"torchrun -> msrun: 1 launch line(s)" in captured.err
    assert script.read_text() == SCRIPT


def test_output_file_keeps_the_mode_and_refuses_the_input_path(script: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "train_ms.sh"
    assert main([str(script), "-o", str(out)]) == 0
    assert "msrun " in out.read_text() and stat.S_IMODE(out.stat().st_mode) == 0o755
    assert main([str(script), "-o", str(script)]) == 2
    assert "is the input script itself" in capsys.readouterr().err
    assert main([str(script), "--output", str(tmp_path / "." / "train.sh")]) == 2
    assert script.read_text() == SCRIPT


def test_in_place_keeps_a_backup_and_never_overwrites_one(script: Path, capsys) -> None:
    assert main([str(script), "--in-place"]) == 0
    backup = Path(str(script) + ".bak")
    assert backup.read_text() == SCRIPT
    translated = script.read_text()
    assert "msrun " in translated and stat.S_IMODE(script.stat().st_mode) == 0o755
    # Already msrun: nothing changes, nothing is written.
    assert main([str(script), "--in_place"]) == 0
    assert script.read_text() == translated
    # Back to torchrun while the .bak holds the original: refused, nothing lost.
    assert main([str(script), "--in-place", "--to", "pytorch"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert backup.read_text() == SCRIPT and script.read_text() == translated


def test_check_exits_1_when_the_script_would_change(script: Path, tmp_path: Path, capsysbinary) -> None:
    assert main([str(script), "--check"]) == 1
    assert capsysbinary.readouterr().out == b""
    done = tmp_path / "done.sh"
    assert main([str(script), "-o", str(done)]) == 0
    assert main([str(done), "--check"]) == 0
    assert main([str(done), str(script), "--check"]) == 1


def test_diff_shows_only_the_changed_lines(script: Path, capsys) -> None:
    assert main([str(script), "--diff"]) == 0
    out = capsys.readouterr().out
    assert "-torchrun --nproc_per_node $GPUS --nnodes 1 pretrain_gpt.py --fp16" in out
    assert "+export LOCAL_WORLD_SIZE=$GPUS" in out
    assert " GPUS=2" in out  # context, unchanged


def test_json_report(script: Path, capsys) -> None:
    assert main([str(script), "--report", "json", "--device", "cpu"]) == 0
    report = json.loads(capsys.readouterr().err)
    assert report["from"] == "torchrun" and report["to"] == "msrun" and report["translated"]
    kinds = {(c["kind"], c["before"], c["after"]) for c in report["changes"]}
    assert ("change", "--nnodes 1", '--worker_num "$GPUS"') in kinds
    assert ("add", "", "--join True") in kinds
    assert not any("bind_core" in c["after"] for c in report["changes"])  # --device cpu: no core binding
    assert all({"line", "before", "after", "why"} <= set(c) for c in report["changes"])


def test_refusal_exits_2_with_one_line_per_reason(tmp_path: Path, capsys) -> None:
    path = tmp_path / "elastic.sh"
    path.write_text("torchrun --nnodes 1:2 -m pkg.train\n")
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 2
    assert any(e.startswith(f"{path}:1: error: --nnodes 1:2 cannot run under msrun: ") for e in errors)
    assert any(e.startswith(f"{path}:1: error: -m cannot run under msrun: ") for e in errors)


@pytest.mark.parametrize("argv, message", [
    (["/nonexistent/x.sh"], "cannot read /nonexistent/x.sh"),
    (["{tmp}"], "is a directory"),
    (["{script}", "-o", "x", "--in-place"], "exclude each other"),
    (["{script}", "--check", "--in-place"], "--check writes nothing"),
    (["{script}", "{script}"], "several scripts"),
    (["{script}", "--to", "tensorflow"], "invalid choice"),
])
def test_usage_errors_exit_2(argv, message, script: Path, tmp_path: Path, capsys) -> None:
    argv = [a.format(script=script, tmp=tmp_path) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_the_script_is_never_executed(tmp_path: Path) -> None:
    """A script whose commands would leave traces: translating it (through the real `mmrun` entry) leaves none."""
    trace = tmp_path / "executed"
    path = tmp_path / "evil.sh"
    path.write_text(f"touch {trace}\nDISTRIBUTED_ARGS=\"--nproc_per_node $(touch {trace}2; echo 2)\"\n"
                    f"torchrun $DISTRIBUTED_ARGS train.py `touch {trace}3`\n")
    result = subprocess.run([*MMRUN, str(path)], capture_output=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert b"msrun $DISTRIBUTED_ARGS train.py" in result.stdout
    assert not list(tmp_path.glob("executed*"))


def test_help_lists_examples_and_both_spellings() -> None:
    result = subprocess.run([*MMRUN, "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    assert "examples:" in result.stdout and "--in-place" in result.stdout and "--on-unsupported" in result.stdout
    assert "--on_unsupported" in result.stdout and "--in_place" in result.stdout


def test_works_without_a_framework_imported(script: Path) -> None:
    """`mmrun translate` imports neither torch nor mindspore."""
    code = ("import sys\nfrom mmrun.launchers.translate.cli import main\nmain([sys.argv[1]])\n"
            "assert 'torch' not in sys.modules and 'mindspore' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n")
    result = subprocess.run([sys.executable, "-c", code, str(script)], capture_output=True, text=True, env={**os.environ})
    assert result.returncode == 0, result.stderr
