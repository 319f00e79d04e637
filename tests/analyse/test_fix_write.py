"""`--fix --write` loses nothing: it writes through mmrun.common.atomic_write, or not at all.

A symlink stays a link and its target is rewritten; a file in a read-only folder, a read-only
file or a file that changed meanwhile is left byte for byte as it was, with one line saying why;
a file with nothing to fix is not touched at all.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from mmrun.analyse.cli import _write_fix
from mmrun.analyse.findings import FileResult
from mmrun.analyse.rules import load_rules
from mmrun.analyse.runner import RunConfig, analyse_source, make_index

FIXTURES = Path(__file__).parent / "fixtures"
BEFORE = (FIXTURES / "fix_cuda_calls.in.py").read_bytes()
AFTER = (FIXTURES / "fix_cuda_calls.out.py").read_bytes()


def _state(folder: Path) -> dict[str, tuple]:
    """Every entry below `folder`: content (or link target), mode, inode, modification time."""
    state = {}
    for path in sorted(folder.rglob("*")):
        st = os.lstat(path)
        body = os.readlink(path) if path.is_symlink() else (path.read_bytes() if path.is_file() else None)
        state[str(path.relative_to(folder))] = (body, st.st_mode, st.st_ino, st.st_mtime_ns)
    return state


def test_a_symlinked_file_is_rewritten_through_the_link(tmp_path: Path, cli):
    real = tmp_path / "src" / "train.py"
    real.parent.mkdir()
    real.write_bytes(BEFORE)
    os.chmod(real, 0o640)
    (tmp_path / "link.py").symlink_to(real)
    # Named through the link, and found twice in the folder walk: rewritten once, through the link.
    for args in ([str(tmp_path / "link.py")], [str(tmp_path)]):
        real.write_bytes(BEFORE)
        proc = cli.run(*args, "--fix", "--write", "--output", str(tmp_path / "out"))
        cli.assert_clean_failure(proc)
        assert proc.stdout.count("rewrote ") == 1, proc.stdout
        assert (tmp_path / "link.py").is_symlink() and os.readlink(tmp_path / "link.py") == str(real)
        assert real.read_bytes() == AFTER and os.stat(real).st_mode & 0o777 == 0o640
        assert sorted(p.name for p in real.parent.iterdir()) == ["train.py"]   # no temporary left


def test_a_read_only_folder_is_one_line_and_nothing_changes(tmp_path: Path, cli):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "train.py").write_bytes(BEFORE)
    os.chmod(folder, 0o555)
    before = _state(folder)
    try:
        proc = cli.run(str(folder), "--fix", "--write", cwd=tmp_path, unprivileged=True)
    finally:
        os.chmod(folder, 0o755)
    cli.assert_clean_failure(proc)
    assert proc.returncode == 1 and "rewrote" not in proc.stdout
    assert [line for line in proc.stderr.splitlines() if ": not rewritten: " in line] == [
        f"{folder / 'train.py'}: not rewritten: cannot write (Permission denied): --write replaces the file "
        f"with a new one made in its folder {folder}, which must be writable"]
    assert "0 changes applied in 0 files" in proc.stderr and "1 file not rewritten" in proc.stderr
    assert _state(folder) == before
    assert not (tmp_path / "change_list.csv").exists()   # no change was made, so none is listed


def test_a_read_only_file_is_left_alone(tmp_path: Path, cli):
    target = tmp_path / "train.py"
    target.write_bytes(BEFORE)
    os.chmod(target, 0o444)
    before = _state(tmp_path)
    proc = cli.run(str(target), "--fix", "--write", cwd=tmp_path, unprivileged=True)
    cli.assert_clean_failure(proc)
    assert proc.returncode == 1
    assert f"{target}: not rewritten: the file is read-only" in proc.stderr.splitlines()
    assert _state(tmp_path) == before


def test_nothing_to_fix_leaves_every_byte_and_inode(tmp_path: Path, cli):
    # Findings without a fix (the rule fixtures of rules that have none), files already fixed,
    # and files that are skipped.
    project = tmp_path / "p"
    project.mkdir()
    index = make_index(RunConfig(fix=True))
    unfixable = [source for source in (FIXTURES / f"{rule.code}.py" for rule in load_rules() if rule.fix is None)
                 if analyse_source(source.read_bytes(), source.name, index, fix=True).new_source is None]
    assert len(unfixable) > 20
    for source in unfixable + sorted(FIXTURES.glob("*.out.py")):
        shutil.copy(source, project)
    (project / "deep.py").write_text("x = " + "(" * 500 + ")" * 500 + "\n")
    (project / "broken.py").write_text("def f(:\n    torch.cuda.synchronize()\n")
    before = _state(project)
    for args in (["--fix", "--write"], ["--fix"], []):
        proc = cli.run(str(project), *args, cwd=tmp_path)
        cli.assert_clean_failure(proc)
        assert "rewrote" not in proc.stdout
        assert _state(project) == before, args


def test_a_file_that_changed_meanwhile_is_not_overwritten(tmp_path: Path):
    target = tmp_path / "train.py"
    target.write_bytes(BEFORE)
    result = analyse_source(BEFORE, "train.py", make_index(RunConfig(fix=True)), fix=True)
    assert result.new_source == AFTER
    target.write_bytes(BEFORE + b"# edited meanwhile\n")
    assert _write_fix(str(target), result, 1 << 20) == "it changed on disk while being analysed; run again"
    assert target.read_bytes() == BEFORE + b"# edited meanwhile\n"
    target.write_bytes(BEFORE)
    assert _write_fix(str(target), result, 1 << 20) is None and target.read_bytes() == AFTER


def test_unchanged_files_are_not_in_the_result(tmp_path: Path):
    result = analyse_source(AFTER, "train.py", make_index(RunConfig(fix=True)), fix=True)
    assert result.new_source is None and result.diff == "" and result.changes == []
    assert isinstance(result, FileResult)
