"""Bad launcher input: one line naming what was received and what to do, exit 2, before any launcher starts."""
from __future__ import annotations

import subprocess
import sys

import pytest

FRAMEWORKS = ["pytorch", "mindspore"]


def _one_line_usage_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmrun: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("options, expected", [
    (["--nproc-per-node", "0"], "--nproc-per-node 0: expected workers per node: a whole number of at least 1, or one of auto|cpu|gpu|xpu"),
    (["--nproc-per-node", "-1"], "--nproc-per-node -1: expected workers per node"),
    (["--nproc_per_node=abc"], "--nproc_per_node abc: expected workers per node"),
    (["--nnodes", "0"], "--nnodes 0: expected number of nodes: a whole number of at least 1, or MIN:MAX with 1 <= MIN <= MAX"),
    (["--nnodes", "two"], "--nnodes two: expected number of nodes"),
    (["--nnodes", "4:2"], "--nnodes 4:2: expected number of nodes"),
    (["--master-port", "65536"], "--master-port 65536: expected a TCP port: a whole number from 1 to 65535, or 0 to pick a free one"),
    (["--master_port", "-1"], "--master_port -1: expected a TCP port"),
    (["--nnodes", "2", "--node-rank", "2"], "--node-rank 2: expected a node rank from 0 to 1, as the job has 2 nodes"),
    (["--local_worker_num", "0"], "--local_worker_num 0: expected workers on this node: a whole number of at least 1"),
    (["--max-restarts", "-2"], "--max-restarts -2: expected restarts: a whole number of at least 0"),
    (["--rdzv-endpoint", "node0:port"], "--rdzv-endpoint node0:port: expected HOST or HOST:PORT, with PORT from 1 to 65535"),
    (["--watchdog-seconds", "soon"], "argument --watchdog-seconds/--watchdog_seconds: 'soon' is not a number of seconds"),
])
def test_bad_option_values(framework, options, expected, job_env, tmp_path, jobs):
    result = jobs.run(["--ai-framework", framework, *options, str(jobs.workers / "record_env.py")], job_env, tmp_path)
    assert expected in _one_line_usage_error(result)
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_values_from_pet_variables_are_checked(job_env, tmp_path, jobs):
    job_env["PET_NPROC_PER_NODE"] = "0"
    result = jobs.run([str(jobs.workers / "record_env.py")], job_env, tmp_path)
    assert "PET_NPROC_PER_NODE 0: expected workers per node" in _one_line_usage_error(result)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_missing_script(framework, job_env, tmp_path, jobs):
    result = jobs.run(["--ai-framework", framework, "--nproc-per-node", "2", "no_such_train.py", "--lr", "1"], job_env, tmp_path)
    line = _one_line_usage_error(result)
    assert line == f"mmrun: error: SCRIPT no_such_train.py does not exist (looked in {tmp_path}); pass the path of the training script"


def test_missing_module(job_env, tmp_path, jobs):
    result = jobs.run(["--ai-framework", "mindspore", "-m", "no_such_pkg.train"], job_env, tmp_path)
    assert "-m no_such_pkg.train: no module no_such_pkg.train found in" in _one_line_usage_error(result)


@pytest.mark.parametrize("framework, extra", [("pytorch", "torch"), ("mindspore", "mindspore")])
def test_framework_not_installed(framework, extra, job_env, tmp_path, jobs):
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    result = jobs.without_frameworks("--ai-framework", framework, "--nproc-per-node", "1", str(script), cwd=tmp_path, env=job_env)
    line = _one_line_usage_error(result)
    module = "torch" if framework == "pytorch" else "mindspore"
    assert f"needs the '{module}' package, which is not installed (framework chosen by --ai-framework {framework})" in line
    assert line.endswith(f'Install it with: pip install "mmrun[{extra}]"')


def test_framework_not_installed_names_the_variable(job_env, tmp_path, jobs):
    (tmp_path / "train.py").write_text("")
    job_env["MMRUN_AI_FRAMEWORK"] = "mindspore"
    line = _one_line_usage_error(jobs.without_frameworks("train.py", cwd=tmp_path, env=job_env))
    assert "(framework chosen by MMRUN_AI_FRAMEWORK=mindspore)" in line


def test_unknown_option_is_one_line(job_env, tmp_path, jobs):
    line = _one_line_usage_error(jobs.run(["--nproc-per-nod", "2", "train.py"], job_env, tmp_path))
    assert "unrecognized arguments" in line or "--nproc-per-nod" in line


def test_version_wins_over_everything_else(job_env, tmp_path, jobs):
    from mmrun import __version__

    for args in (["--version"], ["--dry-run", "--version"], ["--nproc-per-node", "2", "--version"]):
        result = jobs.run(args, job_env, tmp_path)
        assert (result.returncode, result.stdout) == (0, f"mmrun {__version__}\n"), result.stderr


def test_launcher_module_does_not_import_the_cli():
    # run.py gets the subcommand list passed in: no import cycle with cli.py
    code = "import sys, mmrun.launchers.run; print('mmrun.launchers.cli' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout == "False\n"
