"""`mmrun analyse` lives in its own top-level package, mmrun.analyse (the folder analyse/)."""
from __future__ import annotations

import tomllib
import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "analyse" / "fixtures" / "MM101.py"


def test_the_package_is_top_level_and_installed_as_such():
    assert importlib.util.find_spec("mmrun.analyse.cli") is not None
    assert importlib.util.find_spec("mmrun.launchers.analyse") is None
    assert not (REPO / "launchers" / "analyse").exists()
    # pyproject.toml lists the packages the wheel carries (tests/test_packaging.py checks the wheel itself).
    assert "mmrun.analyse" in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert "analyse/     mmrun.analyse" in (REPO / "README.md").read_text()


def test_the_three_ways_to_run_it_agree():
    outputs = []
    for command in (["-m", "mmrun.analyse"], ["-m", "mmrun.launchers.cli", "analyse"],
                    ["-m", "mmrun.launchers.cli", "analyze"]):
        proc = subprocess.run([sys.executable, *command, str(FIXTURE)], capture_output=True, text=True,
                              timeout=120, cwd=REPO)
        assert proc.returncode == 1, proc.stderr
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1] == outputs[2] and "MM101" in outputs[0]
