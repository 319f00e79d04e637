"""The option table matches the launchers installed here, and every spelling parses."""
from __future__ import annotations

import sys

import pytest

from mmrun.launchers import launch_args
from mmrun.launchers.options import BY_LAUNCHER, MSRUN, OPTIONS, TORCHRUN, find_option


def test_every_torchrun_option_is_in_the_table():
    from torch.distributed.run import get_args_parser

    theirs = {s for action in get_args_parser()._actions for s in action.option_strings} - {"-h", "--help"}
    ours = {flag for option in BY_LAUNCHER[TORCHRUN].values() for flag in option.flags}
    assert theirs == ours


def test_every_msrun_option_is_in_the_table(monkeypatch):
    from mindspore.parallel.cluster import run as msrun

    monkeypatch.setattr(sys, "argv", ["msrun", "train.py"])
    theirs = set(vars(msrun.get_args())) - {"task_script", "task_script_args"}
    assert theirs == set(BY_LAUNCHER[MSRUN])


def test_every_rule_is_implemented():
    from mmrun.launchers.option_rules import RULES

    assert {option.to_other for option in OPTIONS} <= set(RULES)


# a value every option accepts (values are checked at parse time: see test_option_values.py)
GOOD_VALUE = {"join": "True"}


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.takes_value], ids=lambda o: f"{o.launcher}:{o.dest}")
@pytest.mark.parametrize("form", ["space", "equals"])
def test_each_spelling_and_form_parses(option, form):
    value = GOOD_VALUE.get(option.dest, "1")
    for flag in option.flags:
        argv = [f"{flag}={value}"] if form == "equals" and flag.startswith("--") else [flag, value]
        request = launch_args.parse([*argv, "train.py", "--lr", "1"], environ={})
        assert request.given == {option.dest: value}
        assert request.spelled[option.dest] == flag
        assert request.script == "train.py" and request.script_args == ["--lr", "1"]


@pytest.mark.parametrize("option", [o for o in OPTIONS if not o.takes_value], ids=lambda o: o.dest)
def test_boolean_flags_parse(option):
    for flag in option.flags:
        request = launch_args.parse([flag, "train.py"], environ={})
        assert request.given == {option.dest: True}


def test_options_after_the_script_belong_to_the_script():
    request = launch_args.parse(["--nproc-per-node", "2", "train.py", "--nproc-per-node", "9", "--ai-framework", "x"], environ={})
    assert request.given == {"nproc_per_node": "2"}
    assert request.script_args == ["--nproc-per-node", "9", "--ai-framework", "x"]


def test_framework_precedence_flag_then_env_then_default():
    assert launch_args.parse(["t.py"], environ={}).ai_framework == "pytorch"
    assert launch_args.parse(["t.py"], environ={"MMRUN_AI_FRAMEWORK": "mindspore"}).framework_source == "MMRUN_AI_FRAMEWORK"
    request = launch_args.parse(["--ai_framework=mindspore", "t.py"], environ={"MMRUN_AI_FRAMEWORK": "pytorch"})
    assert (request.ai_framework, request.framework_source) == ("mindspore", "--ai-framework")


def test_unknown_framework_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        launch_args.parse(["--ai-framework", "jax", "t.py"], environ={})
    assert exit_info.value.code == 2
    assert "Unknown AI framework 'jax' from --ai-framework jax. Choose one of: pytorch, mindspore" in capsys.readouterr().err


def test_pet_environment_fallback():
    request = launch_args.parse(["t.py"], environ={"PET_NPROC_PER_NODE": "4", "PET_NNODES": "2"})
    assert request.given == {"nproc_per_node": "4", "nnodes": "2"}
    assert request.from_env == {"nproc_per_node": "PET_NPROC_PER_NODE", "nnodes": "PET_NNODES"}


def test_framework_argument_is_appended_once_and_only_when_wanted():
    assert launch_args.with_framework_arg(["--lr", "1"], "mindspore", True) == ["--lr", "1", "--ai-framework", "mindspore"]
    assert launch_args.with_framework_arg(["--ai-framework=mindspore"], "mindspore", True) == ["--ai-framework=mindspore"]
    assert launch_args.with_framework_arg(["--lr", "1"], "mindspore", False) == ["--lr", "1"]
    assert launch_args.with_framework_arg(["--ai_framework", "pytorch"], "pytorch", False) == ["--ai_framework", "pytorch"]


def test_find_option_by_any_spelling():
    assert find_option("--nproc_per_node").dest == "nproc_per_node"
    assert find_option("-r").dest == "redirects"
    assert find_option("--local_worker_num").launcher == MSRUN
    assert find_option("--no-such") is None


def test_docs_table_is_current():
    import re
    from pathlib import Path

    from mmrun.launchers.options import options_markdown

    doc = (Path(__file__).resolve().parents[2] / "docs" / "launcher.md").read_text()
    table = re.search(r"<!-- options-table:start -->\n(.*?)\n<!-- options-table:end -->", doc, flags=re.S)
    assert table and table.group(1) == options_markdown(), "regenerate: python scripts/update_docs.py --skip-slow"
