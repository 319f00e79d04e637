"""--ai-framework goes to a script's arguments only where the script takes it; MMRUN_AI_FRAMEWORK always."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmrun.launchers import script_target
from mmrun.backend.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_plain_argparse_script_runs_on_both_frameworks(framework, job_env, tmp_path, jobs):
    result = jobs.run(["--ai-framework", framework, "--nproc-per-node", "2", "--master-port", "0",
                       str(jobs.workers / "plain_argparse.py"), "--epochs", "3"], job_env, tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        assert json.loads((tmp_path / f"plain_{rank}.json").read_text()) == {"epochs": 3, "framework": framework}


@pytest.mark.slow
def test_script_that_declares_the_option_gets_it(job_env, tmp_path, jobs):
    result = jobs.run(["--ai-framework", "mindspore", "--nproc-per-node", "1", "--master-port", "0",
                       str(jobs.workers / "takes_framework.py")], job_env, tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "framework_0.json").read_text()) == {"ai_framework": "mindspore"}


@pytest.mark.slow
def test_always_forces_it_and_never_withholds_it(job_env, tmp_path, jobs):
    forced = jobs.run(["--framework-arg", "always", "--nproc-per-node", "1", "--master-port", "0",
                       str(jobs.workers / "plain_argparse.py"), "--epochs", "1"], job_env, tmp_path)
    assert forced.returncode == 2 and "unrecognized arguments: --ai-framework pytorch" in forced.stderr
    withheld = jobs.run(["--framework_arg=never", "--nproc-per-node", "1", "--master-port", "0",
                         str(jobs.workers / "takes_framework.py")], job_env, tmp_path)
    assert withheld.returncode == 2 and "the following arguments are required: --ai-framework" in withheld.stderr


def test_dry_run_shows_the_rule(job_env, tmp_path, jobs):
    plain = jobs.run(["--dry-run", str(jobs.workers / "plain_argparse.py"), "--epochs", "1"], job_env, tmp_path)
    declares = jobs.run(["--dry-run", "--ai-framework", "mindspore", str(REPO / "models" / "pretrain_gpt.py")], job_env, tmp_path)
    assert plain.stdout.splitlines()[0].endswith("plain_argparse.py --epochs 1")
    assert declares.stdout.splitlines()[0].endswith("pretrain_gpt.py --ai-framework mindspore")
    assert "export MMRUN_AI_FRAMEWORK=pytorch" in plain.stdout.splitlines()


@pytest.mark.parametrize("source, takes", [
    ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--epochs')\n", False),
    ("p.add_argument('--ai-framework', default='pytorch')\n", True),
    ("if args.ai_framework == 'mindspore':\n    pass\n", True),
    ("import mindspeed.megatron_adaptor\nfrom megatron.training import pretrain\n", True),
    ("from mindspeed_mm.training import pretrain\n", True),
    ("from mmrun.training import pretrain\n", True),
    ("import mindspeedy\n# the ai framework is chosen elsewhere\n", False),
    ("from mmrun.models.gpt import GPT\n", False),
])
def test_auto_rule(source, takes):
    assert script_target.takes_framework_arg(source) is takes


def test_mmruns_own_trainer_takes_it():
    assert script_target.takes_framework_arg((REPO / "models" / "pretrain_gpt.py").read_text())


def test_locate_script_and_module(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "pkg" / "app").mkdir(parents=True)
    (tmp_path / "pkg" / "job.py").write_text("")
    (tmp_path / "pkg" / "app" / "__main__.py").write_text("")
    assert script_target.locate("train.py", False, cwd=str(tmp_path)) == tmp_path / "train.py"
    assert script_target.locate("pkg.job", True, cwd=str(tmp_path), path=[]) == tmp_path / "pkg" / "job.py"
    assert script_target.locate("pkg.app", True, cwd=str(tmp_path), path=[]) == tmp_path / "pkg" / "app" / "__main__.py"
    with pytest.raises(UsageError, match=r"SCRIPT pkg is a directory"):
        script_target.locate("pkg", False, cwd=str(tmp_path))
    with pytest.raises(UsageError, match=r"-m pkg.nothing: no module pkg.nothing found in"):
        script_target.locate("pkg.nothing", True, cwd=str(tmp_path), path=[])
