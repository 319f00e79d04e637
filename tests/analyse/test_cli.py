"""`mmrun analyse` as a command: formats, exit codes, bad input, --fix/--write, --jobs."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mmrun.analyse.cli import main
from mmrun.launchers.cli import main as mmrun_main

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A small user project: CUDA code, a file that does not parse, a clean file."""
    root = tmp_path / "proj"
    root.mkdir()
    shutil.copy(FIXTURES / "fix_cuda_calls.in.py", root / "train.py")
    shutil.copy(FIXTURES / "fix_dataparallel.in.py", root / "wrap.py")
    (root / "broken.py").write_text("def f(:\n    return torch.cuda.synchronize()\n")
    (root / "clean.py").write_text("import os\nprint(os.getcwd())\n")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "skip.py").write_text("import torch\ntorch.cuda.synchronize()\n")
    return root


def test_text_report_and_exit_status(project: Path, capsys):
    status = main([str(project)])
    out, err = capsys.readouterr()
    assert status == 1   # error-level findings (and a skipped file)
    lines = out.splitlines()
    assert f"{project / 'train.py'}:10:5: MM101 torch.cuda.set_device is CUDA-only [*]" in lines
    assert (f"{project / 'train.py'}:12:21: MM105 .cuda() moves the tensor or module to a CUDA device"
            " (possible) [*]") in lines
    assert any(line.startswith("MM301  error        2  torch.nn.DataParallel") for line in lines)
    assert lines[-1] == ("15 findings in 2 of 4 files (12 error, 2 warning, 1 info; 4 possible); "
                         "[*] 10 fixable with --fix; 1 file skipped (see stderr)")
    assert ".hidden" not in out   # hidden folders are skipped
    # The file that does not parse: one line naming it, and the run went on.
    broken = [line for line in err.splitlines() if "broken.py" in line]
    assert broken == [f"{project / 'broken.py'}: skipped: cannot parse (error at 2:4: expected one of ), *, **, NAME)"]


def test_a_skipped_file_alone_makes_the_exit_status_1(project: Path, capsys):
    # No finding at all, but a file the analyser could not read: the result is incomplete.
    assert main([str(project / "clean.py")]) == 0
    assert main([str(project / "clean.py"), str(project / "broken.py")]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == ("0 findings in 0 of 2 files (0 error, 0 warning, 0 info; 0 possible); "
                                    "1 file skipped (see stderr)")


def test_warnings_only_exit_zero(project: Path, capsys):
    assert main([str(project / "train.py"), "--select", "MM4"]) == 0
    out = capsys.readouterr().out
    assert "MM401" in out


@pytest.mark.parametrize("argv, message", [
    (["does/not/exist.py"], "path does not exist: does/not/exist.py; pass Python files or folders"),
    (["--select", "MM9", "x.py"], "code prefix 'MM9' matches no rule"),
    (["x.py", "--write"], "--write applies fixes: use it with --fix"),
    (["x.py", "--target", "gpu"], "argument --target: invalid choice: 'gpu'"),
    (["x.py", "--jobs", "-1"], "--jobs must be 0 (one per CPU) or more. Received: -1"),
])
def test_usage_errors_are_one_line_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("import torch\n")
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith("mmrun analyse: error: ") and message in err


def test_output_must_be_a_folder(tmp_path: Path, capsys):
    (tmp_path / "x.py").write_text("import torch\n")
    (tmp_path / "out").write_text("not a folder")
    assert main([str(tmp_path / "x.py"), "--output", str(tmp_path / "out")]) == 2
    assert "--output must be a folder" in capsys.readouterr().err


def test_json_csv_sarif(project: Path, tmp_path: Path, capsys):
    main([str(project), "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert data["files"] == 4 and data["target"] == "both"
    assert len(data["findings"]) == 15 and data["format_version"] == 2
    assert data["skipped"] == [{"path": str(project / "broken.py"),
                                "reason": "cannot parse (error at 2:4: expected one of ), *, **, NAME)"}]
    first = data["findings"][0]
    assert set(first) >= {"path", "line", "col", "code", "level", "confidence", "message", "replacement", "fixable"}
    assert data["summary"]["MM301"] == {"count": 2, "level": "error", "title": "torch.nn.DataParallel"}

    main([str(project), "--format", "sarif"])
    sarif = json.loads(capsys.readouterr().out)
    assert sarif["version"] == "2.1.0"
    results = sarif["runs"][0]["results"]
    assert len(results) == 15
    rule_ids = [r["id"] for r in sarif["runs"][0]["tool"]["driver"]["rules"]]
    assert all(rule_ids[r["ruleIndex"]] == r["ruleId"] for r in results)
    invocation, = sarif["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False
    notification, = invocation["toolExecutionNotifications"]
    assert notification["message"]["text"].startswith("skipped: cannot parse")
    assert notification["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("/broken.py")

    out_dir = tmp_path / "report"
    assert main([str(project), "--format", "csv", "--output", str(out_dir)]) == 1
    stdout = capsys.readouterr().out
    assert "report: " in stdout and "unsupported_api.csv" in stdout
    rows = list(csv.DictReader((out_dir / "findings.csv").open()))
    assert len(rows) == 15
    cuda_rows = list(csv.DictReader((out_dir / "cuda_op_list.csv").open()))
    assert cuda_rows and all(r["code"].startswith("MM1") for r in cuda_rows)
    unsupported = list(csv.DictReader((out_dir / "unsupported_api.csv").open()))
    assert unsupported and all(r["level"] == "error" for r in unsupported)
    # A report with no rows still has its header.
    assert (out_dir / "affinity_api.csv").read_text().startswith("path,line,col,code,")


def test_fix_prints_a_diff_and_writes_nothing(project: Path, capsys, monkeypatch):
    monkeypatch.chdir(project)
    before = (project / "train.py").read_bytes()
    status = main(["train.py", "--fix"])
    out, err = capsys.readouterr()
    assert (project / "train.py").read_bytes() == before
    assert out.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "\n-    torch.cuda.synchronize()\n" in out and "\n+    torch.npu.synchronize()\n" in out
    # The diff applies: `git apply` is not needed, `patch -p1` is in every base image.
    if shutil.which("patch"):
        subprocess.run(["patch", "-p1", "--quiet"], input=out, text=True, cwd=project, check=True)
        assert (project / "train.py").read_bytes() == (FIXTURES / "fix_cuda_calls.out.py").read_bytes()
    assert "proposed in 1 file" in err
    assert status == 1   # torch.cuda.nvtx has no NPU equivalent: an error remains


def test_fix_write_applies_keeps_mode_and_writes_change_list(project: Path, tmp_path: Path, capsys):
    target = project / "train.py"
    os.chmod(target, 0o750)
    out_dir = tmp_path / "out"
    main([str(project), "--fix", "--write", "--output", str(out_dir)])
    out, err = capsys.readouterr()
    assert target.read_bytes() == (FIXTURES / "fix_cuda_calls.out.py").read_bytes()
    assert (project / "wrap.py").read_bytes() == (FIXTURES / "fix_dataparallel.out.py").read_bytes()
    assert os.stat(target).st_mode & 0o777 == 0o750
    assert not [p for p in project.iterdir() if p.name.endswith(".mmrun-tmp")]
    assert f"rewrote {target} (11 changes)" in out
    rows = list(csv.DictReader((out_dir / "change_list.csv").open()))
    assert {"path", "line", "code", "before", "after"} == set(rows[0])
    # Lines are those of the file as it was (an added import: the line it goes before).
    assert {"path": str(target), "line": "10", "code": "MM101", "before": "torch.cuda.set_device",
            "after": "torch.npu.set_device"} in rows
    assert {"path": str(target), "line": "5", "code": "MM302", "before": "", "after": "import torch_npu"} in rows
    # Idempotent on disk too: a second run changes nothing.
    main([str(project), "--fix", "--write", "--output", str(out_dir)])
    out, err = capsys.readouterr()
    assert "rewrote" not in out and "0 changes applied in 0 files" in err


def test_jobs_do_not_change_the_output(capsys):
    main([str(FIXTURES), "--format", "json", "--jobs", "1"])
    one = json.loads(capsys.readouterr().out)
    main([str(FIXTURES), "--format", "json", "--jobs", "2"])
    two = json.loads(capsys.readouterr().out)
    assert one == two and len(one["findings"]) > 150


def test_dispatcher_alias_and_no_framework_import(tmp_path: Path):
    # Through the real `mmrun` entry point, with the `analyze` alias; analysing must not import
    # torch or mindspore (nor run the analysed code: it would create the marker file).
    victim = tmp_path / "victim.py"
    marker = tmp_path / "executed"
    victim.write_text(f"open({str(marker)!r}, 'w').close()\nimport torch\ntorch.cuda.synchronize()\n")
    code = ("import sys; from mmrun.launchers.cli import main; status = main(['analyze', sys.argv[1]]); "
            "assert 'torch' not in sys.modules and 'mindspore' not in sys.modules, 'framework imported'; "
            "sys.exit(status)")
    proc = subprocess.run([sys.executable, "-c", code, str(victim)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert f"{victim}:3:1: MM101 torch.cuda.synchronize is CUDA-only [*]" in proc.stdout
    assert not marker.exists()


def test_help_lists_examples(capsys):
    with pytest.raises(SystemExit) as exc:
        mmrun_main(["analyse", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "mmrun analyse src/ --fix --write" in out and "exit status" in out
    assert '"PATH: skipped: REASON"' in out


def test_write_follows_symlinks_and_keeps_the_link(tmp_path: Path):
    from mmrun.common.atomic_write import atomic_write as write_atomically

    real = tmp_path / "real.py"
    real.write_text("old\n")
    link = tmp_path / "link.py"
    link.symlink_to(real)
    write_atomically(link, b"new\n")
    assert link.is_symlink() and real.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.py", "real.py"]
