"""Framework choice: precedence, argv left intact, unknown names, conflicts (no framework imported)."""
from __future__ import annotations

import os
import sys
import warnings

import pytest

from mmrun.backend import selection
from mmrun.backend.errors import FrameworkChoiceError, FrameworkConflictError, UsageError

ENV = selection.ENV_VAR


@pytest.fixture
def fresh(monkeypatch):
    """A process that has not chosen yet, with no launcher variables and a plain command line."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(sys, "argv", ["train.py", "--lr", "0.1"])
    selection._reset_for_tests()
    yield monkeypatch
    selection._reset_for_tests()


@pytest.mark.parametrize(
    "argv, env, framework, source",
    [
        ([], {}, "pytorch", "the default"),
        ([], {ENV: "mindspore"}, "mindspore", f"{ENV}=mindspore"),
        (["--ai-framework", "mindspore"], {}, "mindspore", "--ai-framework mindspore in the command line"),
        (["--ai_framework", "MindSpore"], {}, "mindspore", "command line"),
        (["--lr", "1", "--ai-framework=pytorch", "--ai-framework", "mindspore"], {}, "mindspore", "command line"),
        (["--ai-framework", "pytorch"], {ENV: "pytorch"}, "pytorch", "command line"),
        # After `--` argparse treats everything as positional, so it is not an option there either.
        (["--", "--ai-framework", "mindspore"], {}, "pytorch", "the default"),
    ],
)
def test_precedence(argv, env, framework, source):
    made = selection.resolve(argv, env)
    assert made.framework == framework
    assert source in made.source


def test_command_line_beats_environment_with_a_warning():
    with pytest.warns(UserWarning, match=f"overrides {ENV}=pytorch"):
        made = selection.resolve(["--ai-framework=mindspore"], {ENV: "pytorch"})
    assert made.framework == "mindspore"


@pytest.mark.parametrize("argv, env, received", [
    (["--ai-framework", "tensorflow"], {}, "'tensorflow' from --ai-framework tensorflow"),
    ([], {ENV: "jax"}, f"'jax' from {ENV}=jax"),
])
def test_unknown_framework_lists_the_choices(argv, env, received):
    with pytest.raises(FrameworkChoiceError) as caught:
        selection.resolve(argv, env)
    message = str(caught.value)
    assert received in message and "pytorch, mindspore" in message
    assert "\n" not in message and caught.value.exit_code == 2


def test_option_without_value_is_a_usage_error():
    with pytest.raises(UsageError, match="--ai-framework needs a value"):
        selection.resolve(["--ai-framework"], {})


def test_choice_leaves_argv_for_the_scripts_own_parser(fresh):
    fresh.setattr(sys, "argv", ["train.py", "--ai-framework", "mindspore", "--lr", "0.1"])
    assert selection.framework() == "mindspore"
    assert sys.argv == ["train.py", "--ai-framework", "mindspore", "--lr", "0.1"]


def test_choice_is_made_once_and_exported_to_children(fresh):
    fresh.setenv(ENV, "mindspore")
    assert selection.framework() == "mindspore"
    fresh.setenv(ENV, "pytorch")  # a later change of the environment does not switch the process
    assert selection.framework() == "mindspore"
    fresh.delenv(ENV)
    selection._reset_for_tests()
    selection.framework()
    assert os.environ[ENV] == "pytorch"


def test_code_asking_for_the_other_framework_names_both_sources(fresh):
    fresh.setattr(sys, "argv", ["train.py", "--ai-framework", "pytorch"])
    with pytest.raises(FrameworkConflictError) as caught:
        selection.select("mindspore")
    message = str(caught.value)
    assert "already chosen: pytorch, from --ai-framework pytorch in the command line" in message
    assert "Received: mindspore, from code: mmrun.backend.select('mindspore')" in message
    assert "\n" not in message and caught.value.exit_code == 2


def test_conflict_with_the_launcher_environment(fresh):
    fresh.setenv(ENV, "mindspore")
    with pytest.raises(FrameworkConflictError, match=f"from {ENV}=mindspore in the environment"):
        selection.select("pytorch")


def test_code_may_choose_when_the_launcher_did_not(fresh):
    assert selection.select("mindspore") == "mindspore"
    assert selection.framework() == "mindspore"
    assert selection.select("MindSpore") == "mindspore"  # agreeing again is fine
    with pytest.raises(FrameworkConflictError, match=r"from code: mmrun.backend.select\('mindspore'\)"):
        selection.select("pytorch")


def test_code_cannot_switch_after_the_default_was_used(fresh):
    assert selection.framework() == "pytorch"
    with pytest.raises(FrameworkConflictError, match="from the default"):
        selection.select("mindspore")


def test_agreeing_with_the_launcher_is_fine(fresh):
    fresh.setattr(sys, "argv", ["train.py", "--ai-framework=mindspore"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert selection.select("mindspore") == "mindspore"
    assert "command line" in selection.choice().source


def test_msadapter_request_prefers_the_command_line():
    env = {"MSADAPTER_PATH": "/from/env"}
    assert selection.msadapter_request(["--msadapter_path", "/from/argv"], env)[0] == "/from/argv"
    assert selection.msadapter_request(["--msadapter-path=/x"], {})[0] == "/x"
    path, source = selection.msadapter_request([], env)
    assert path == "/from/env" and "MSADAPTER_PATH=/from/env" in source
    assert selection.msadapter_request([], {}) is None
