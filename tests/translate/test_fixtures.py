"""Golden fixtures, TorchFix style: fixtures/<name>.sh in, <name>.msrun.sh (or .torchrun.sh) and <name>.report.txt out.

A first line `# fixture: ARGS` gives extra `mmrun translate` arguments. A fixture with no expected
script must be refused (exit 2). Regenerate after a deliberate change with
`MMRUN_REGEN_FIXTURES=1 .venv/bin/python -m pytest tests/translate/test_fixtures.py`, then read the diff.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from mmrun.launchers.translate import Options, translate_script
from mmrun.launchers.translate.cli import main
from mmrun.launchers.translate.rules import OTHER

FIXTURES = Path(__file__).parent / "fixtures"
INPUTS = sorted(p for p in FIXTURES.glob("*.sh") if p.name.count(".") == 1)
REGEN = os.environ.get("MMRUN_REGEN_FIXTURES") == "1"


def fixture_args(path: Path) -> list[str]:
    for line in path.read_text(encoding="utf-8").splitlines()[:3]:
        if line.startswith("# fixture: "):
            return shlex.split(line[len("# fixture: "):])
    return []


def expected_script(path: Path, args: list[str]) -> Path:
    target = "torchrun" if "pytorch" in args else "msrun"
    return path.with_name(f"{path.stem}.{target}.sh")


def run_cli(path: Path, args: list[str], capsysbinary, monkeypatch) -> tuple[int, bytes, str]:
    monkeypatch.chdir(FIXTURES.parent)
    code = main([f"fixtures/{path.name}", *args])
    captured = capsysbinary.readouterr()
    return code, captured.out, captured.err.decode()


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.stem)
def test_fixture(path: Path, capsysbinary, monkeypatch, tx) -> None:
    args = fixture_args(path)
    code, out, report = run_cli(path, args, capsysbinary, monkeypatch)
    script_file, report_file = expected_script(path, args), path.with_name(f"{path.stem}.report.txt")
    refused = path.stem.startswith("refuse_")
    if REGEN:
        report_file.write_text(report, encoding="utf-8")
        if not refused:
            script_file.write_bytes(out)
    assert report == report_file.read_text(encoding="utf-8"), (
        "report differs; if features/*.yaml or a message changed on purpose, regenerate with "
        "MMRUN_REGEN_FIXTURES=1 and read the diff")
    if refused:
        assert code == 2 and out == b""
        assert not script_file.exists()
        return
    assert code == 0
    assert out == script_file.read_bytes()
    assert tx.parses(out), "the translation must parse again"
    assert tx.bash_n(out).returncode == 0, tx.bash_n(out).stderr


@pytest.mark.parametrize("path", [p for p in INPUTS if not p.stem.startswith("refuse_")], ids=lambda p: p.stem)
def test_fixture_round_trip(path: Path) -> None:
    """There and back gives the original bytes (the scripts translated here are ones mmrun produced)."""
    args = fixture_args(path)
    source = path.read_bytes()
    target = "torchrun" if "pytorch" in args else "msrun"
    device = args[args.index("--device") + 1] if "--device" in args else "npu"
    policy = args[args.index("--on-unsupported") + 1] if "--on-unsupported" in args else "error"
    there = translate_script(source, Options(target=target, device=device, on_unsupported=policy), path.name)
    if not there.changed:  # nothing to translate (no launch, or already the target launcher)
        assert there.output == source and there.report.launches == 0
        return
    back = translate_script(there.output, Options(target=OTHER[there.report.target], device=device), path.name)
    assert back.output == source
    assert back.report.undo == "record"


@pytest.mark.parametrize("path", [p for p in INPUTS if not p.stem.startswith("refuse_")], ids=lambda p: p.stem)
def test_fixture_shellcheck_adds_nothing(path: Path, tx, shellcheck_available) -> None:
    args = fixture_args(path)
    translated = expected_script(path, args).read_bytes()
    new = tx.shellcheck_findings(translated) - tx.shellcheck_findings(path.read_bytes())
    if "pytorch" in args:
        # The way back stops using the product variable (--worker_num $WORLD_SIZE -> --nnodes $NNODES): WORLD_SIZE
        # is then unused, exactly as in seed 003's own torchrun form.
        new.pop(("warning", "WORLD_SIZE appears unused. Verify use (or export if used externally). [SC2034]"), None)
    assert not new, f"shellcheck findings the translation introduced: {dict(new)}"
