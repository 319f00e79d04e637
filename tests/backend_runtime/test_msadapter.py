"""MSAdapter path logic against a small fake tree (MSAdapter itself cannot be installed here:
its PyPI packages are stale and do not import on any MindSpore available for Python 3.11)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def fake_msadapter(tmp_path: Path) -> Path:
    """<root>/msadapter/torch and <root>/msadapter/msa_thirdparty/apex, as MindSpeed-Core-MS lays them out."""
    tree = tmp_path / "root" / "msadapter"
    (tree / "torch").mkdir(parents=True)
    (tree / "torch" / "__init__.py").write_text("IS_MSADAPTER = True\n__version__ = '2.1.0+fake-msadapter'\n")
    (tree / "msa_thirdparty" / "apex").mkdir(parents=True)
    (tree / "msa_thirdparty" / "apex" / "__init__.py").write_text("IS_MSADAPTER_THIRD_PARTY = True\n")
    return tmp_path / "root"


ACTIVATED = """
import json, os, sys
import mmrun.backend as backend
backend.load()
import torch, apex
print(json.dumps({"path": sys.path[:2], "pythonpath": os.environ["PYTHONPATH"].split(os.pathsep)[:2],
                  "torch": torch.__file__, "msadapter_torch": getattr(torch, "IS_MSADAPTER", False),
                  "apex": getattr(apex, "IS_MSADAPTER_THIRD_PARTY", False)}))
"""


def test_msadapter_from_environment_shadows_torch(run_python, clean_env, last_json, fake_msadapter):
    env = clean_env(MMRUN_AI_FRAMEWORK="mindspore", MSADAPTER_PATH=str(fake_msadapter))
    out = last_json(run_python(ACTIVATED, env=env))
    tree = fake_msadapter.resolve() / "msadapter"
    assert out["path"] == [str(tree), str(tree / "msa_thirdparty")]
    assert out["pythonpath"] == out["path"]  # child processes see the same torch
    assert out["torch"] == str(tree / "torch" / "__init__.py") and out["msadapter_torch"] and out["apex"]


def test_msadapter_from_the_command_line_pointing_at_the_tree_itself(run_python, last_json, fake_msadapter):
    tree = fake_msadapter / "msadapter"
    out = last_json(run_python(ACTIVATED, args=["--ai-framework", "mindspore", "--msadapter-path", str(tree)]))
    assert out["msadapter_torch"] and out["path"][0] == str(tree.resolve())


ERRORS = """
import json, sys
import mmrun.backend as backend
backend.load()
from mmrun.backend.mindspore import msadapter
from mmrun.backend.errors import MSAdapterError
cases = {{}}
def attempt(name, root):
    try:
        msadapter.activate(root, source="test")
        cases[name] = "activated"
    except MSAdapterError as exc:
        cases[name] = str(exc)
attempt("missing", {empty!r})
attempt("no_torch", {no_torch!r})
import torch  # the real one: the tree above has no torch/
attempt("too_late", {good!r})
print(json.dumps(cases))
"""


def test_msadapter_errors(run_python, clean_env, last_json, fake_msadapter, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "no_torch" / "msadapter" / "msa_thirdparty").mkdir(parents=True)
    code = ERRORS.format(empty=str(tmp_path / "empty"), no_torch=str(tmp_path / "no_torch"), good=str(fake_msadapter))
    cases = last_json(run_python(code, env=clean_env(MMRUN_AI_FRAMEWORK="mindspore")))
    assert cases["missing"].startswith(f"MSAdapter tree not found: {(tmp_path / 'empty').resolve()} has no msadapter/")
    no_torch_tree = (tmp_path / "no_torch" / "msadapter").resolve()
    assert "site-packages/torch/__init__.py, not into " + str(no_torch_tree) in cases["no_torch"]
    assert cases["too_late"].startswith("torch was already imported from ")
    assert all("\n" not in message for message in cases.values())


def test_msadapter_with_the_pytorch_backend(run_python, clean_env, fake_msadapter):
    code = "import mmrun.backend as b; b.load(); print('loaded')"
    inherited = run_python(code, env=clean_env(MSADAPTER_PATH=str(fake_msadapter)))
    assert inherited.returncode == 0 and inherited.stdout.strip() == "loaded"
    assert "is ignored with the pytorch backend" in inherited.stderr
    asked = run_python(code, args=["--msadapter-path", str(fake_msadapter)])
    assert asked.returncode == 1
    assert ("UnsupportedError: MSAdapter (--msadapter-path) is not supported with the pytorch backend. "
            f"Received: {fake_msadapter}. MSAdapter runs torch code on MindSpore") in asked.stderr
