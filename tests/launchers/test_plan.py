"""What `mmrun --dry-run` plans from the training arguments and the environment (nothing started)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mmrun.launchers import launch_args
from mmrun.launchers.run import build_plan


def _plan(argv: list[str], environ: dict | None = None):
    env = environ if environ is not None else {"PATH": "/usr/bin"}
    return build_plan(launch_args.parse(["--dry-run", *argv], environ=env), environ=env)


def test_distributed_timeout_sets_msruns_cluster_time_out():
    plan = _plan(["--ai-framework", "mindspore", "t.py", "--distributed-timeout-minutes", "20"])
    assert plan.translation.value("cluster_time_out") == "1200"
    assert any("msrun waits --cluster_time_out 1200 s" in str(note) for note in plan.notes)


@pytest.mark.parametrize("given", [["--cluster_time_out", "90"], ["--rdzv-conf", "join_timeout=90"]])
def test_an_explicit_cluster_time_out_wins(given):
    plan = _plan(["--ai-framework", "mindspore", *given, "t.py", "--distributed_timeout_minutes=20"])
    assert plan.translation.value("cluster_time_out") == "90"


@pytest.mark.parametrize("args, environ, expected", [
    ([], {}, "600"),  # Megatron's default 10 minutes, not MindSpore's 30 s
    (["--distributed-timeout-minutes", "20"], {}, "1200"),
    (["--distributed-timeout-minutes", "20"], {"MS_CPU_COMM_OP_TIMEOUT": "45"}, None),  # the user's own stays
])
def test_msruns_workers_wait_in_collectives_as_long_as_megatron_says(args, environ, expected):
    """MindSpore's CPU collectives fail after MS_CPU_COMM_OP_TIMEOUT s (30 by default, measured: an all-reduce
    whose peer came 40 s late failed after 30.0 s, and passed with the variable at 120)."""
    plan = _plan(["--ai-framework", "mindspore", "t.py", *args], {"PATH": "/usr/bin", **environ})
    assert plan.env_set.get("MS_CPU_COMM_OP_TIMEOUT") == expected
    assert "MS_CPU_COMM_OP_TIMEOUT" not in _plan(["t.py", *args]).env_set  # torchrun: the script's own timeout


def test_torchrun_leaves_the_timeout_to_the_script():
    plan = _plan(["t.py", "--distributed-timeout-minutes", "20"])
    assert "--distributed-timeout-minutes 20" in " ".join(plan.command) and "join_timeout" not in " ".join(plan.command)


def test_a_bad_distributed_timeout_is_a_usage_error():
    from mmrun.backend.errors import UsageError

    with pytest.raises(UsageError, match="--distributed-timeout-minutes soon in the script's arguments is not a number"):
        _plan(["--ai-framework", "mindspore", "t.py", "--distributed-timeout-minutes", "soon"])


def test_path_gets_the_interpreter_once():
    bin_dir = str(Path(sys.executable).parent)
    assert _plan(["--ai-framework", "mindspore", "t.py"]).env_set["PATH"] == os.pathsep.join([bin_dir, "/usr/bin"])
    assert "PATH" not in _plan(["--ai-framework", "mindspore", "t.py"], {"PATH": bin_dir + os.pathsep + "/usr/bin"}).env_set


def test_watchdog_and_framework_arg_reach_the_plan():
    plan = _plan(["--watchdog-seconds", "30", "--framework-arg", "always", "t.py"])
    assert plan.watchdog_seconds == 30.0 and plan.command[-2:] == ["--ai-framework", "pytorch"]
