"""`mmrun --help`, `--dry-run`, `env`, `translate`, `analyse`, `features` work with neither framework importable."""
from __future__ import annotations

import json

import pytest

@pytest.mark.parametrize("args", [
    ["--help"],
    ["--ai-framework", "mindspore", "--dry-run", "--nproc-per-node", "2", "train.py"],
    ["--dry-run", "--nproc-per-node", "2", "train.py"],
    ["env"],
    ["features", "--format", "json"],
    ["translate", "--help"],
    ["analyse", "--help"],
    ["preprocess-data", "--help"],
    ["compare", "--help"],
])
def test_runs_with_neither_framework(args, jobs):
    result = jobs.without_frameworks(*args)
    assert result.returncode == 0, result.stderr
    assert "No module named" not in result.stderr


def test_help_lists_examples_options_and_subcommands(jobs):
    out = jobs.without_frameworks("--help").stdout
    for text in ("examples:", "--nproc-per-node NPROC_PER_NODE, --nproc_per_node NPROC_PER_NODE", "--local_worker_num",
                 "translate", "analyse", "features", "env", "preprocess-data", "Exit status"):
        assert text in out


def test_env_reports_versions_as_json(jobs):
    from importlib.metadata import version

    report = json.loads(jobs.without_frameworks("env", "--json").stdout)
    assert report["torch"] == version("torch") and report["mindspore"] == version("mindspore")  # metadata, not imports
    assert report["mmrun"] == version("mmrun")
    assert report["torch_npu"] == "not installed" and report["CANN"] == "not found"
    assert report["devices"]["cpu cores"] >= 1


def test_env_text_block_is_copy_paste_ready(jobs):
    out = jobs.without_frameworks("env").stdout.splitlines()
    assert out[0] == "```" and out[-1] == "```"
    assert any(line.startswith("python: ") for line in out)


def test_no_script_is_a_usage_error(jobs):
    result = jobs.without_frameworks("--nproc-per-node", "2")
    assert result.returncode == 2 and "no SCRIPT given" in result.stderr
