"""The built wheel holds exactly the product: mmrun.* mapped onto the top-level folders, nothing else.

The repository root is the `mmrun` package (pyproject.toml: package-dir {"mmrun": "."}), so a stray
`.py` at the root, or a folder missing from the explicit package list, would change what users
install without anyone noticing. This builds the wheel from a copy of the tree and reads it.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_PRODUCT = {"tests", "benchmarks", "scripts", "docs", "build", "dist"}
DATA_FILES = ("*.yaml", "*.json", "*.txt", "*.jsonl")


def _product_packages() -> set[str]:
    """mmrun.<dotted> for every folder of the tree that is a Python package."""
    found = {"mmrun"}
    for init in ROOT.rglob("__init__.py"):
        parts = init.parent.relative_to(ROOT).parts
        if parts and parts[0] not in NOT_PRODUCT and not parts[0].startswith("."):
            found.add(".".join(("mmrun", *parts)))
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    source = tmp_path_factory.mktemp("src") / "mmrun-src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                                  "__pycache__", ".hypothesis", ".pytest_cache"))
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (path,) = out.glob("mmrun-*.whl")
    return zipfile.ZipFile(path)


def test_packages_listed_in_pyproject_are_the_folders():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert listed == _product_packages()


def test_wheel_holds_every_package_and_nothing_else(wheel):
    names = wheel.namelist()
    modules = [n for n in names if n.startswith("mmrun/")]
    packages = {n.rsplit("/", 1)[0].replace("/", ".") for n in modules if n.endswith("/__init__.py")}
    assert packages == _product_packages()
    assert sorted(n for n in modules if n.count("/") == 1) == ["mmrun/__init__.py", "mmrun/__main__.py"]
    assert not [n for n in names if n.split("/")[1:2] and n.split("/")[1] in NOT_PRODUCT]


def test_wheel_carries_the_data_tables(wheel):
    names = set(wheel.namelist())
    expected = {f"mmrun/{p.relative_to(ROOT).as_posix()}" for pattern in DATA_FILES for p in ROOT.rglob(pattern)
                if p.relative_to(ROOT).parts[0] not in NOT_PRODUCT and not p.relative_to(ROOT).parts[0].startswith(".")
                and (p.parent / "__init__.py").exists()}
    assert expected and expected <= names, sorted(expected - names)


def test_one_version_source(wheel):
    init = ast.parse((ROOT / "__init__.py").read_text())
    version = next(node.value.value for node in init.body if isinstance(node, ast.Assign)
                   and [t.id for t in node.targets] == ["__version__"])
    metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert re.search(rf"^Version: {re.escape(version)}$", metadata, re.M)
    assert "version =" not in (ROOT / "pyproject.toml").read_text().split("[project]")[1].split("[")[0]


def test_entry_point_and_python_dash_m(wheel):
    entry_points = wheel.read(next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))).decode()
    assert "mmrun = mmrun.launchers.cli:main" in entry_points
    out = subprocess.run([sys.executable, "-m", "mmrun", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("usage: mmrun"), out.stderr
