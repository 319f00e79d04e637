"""Which framework this process runs on: chosen once, from the command line, the environment or code.

Precedence: `--ai-framework X` (or `--ai-framework=X`, `--ai_framework`) in sys.argv, else
`MMRUN_AI_FRAMEWORK`, else pytorch. The option is read from sys.argv without removing it, because the
training script's own argparse parser (Megatron's, MindSpeed's) also declares `--ai-framework`.

Once made, the choice is final for the process: a later request for the other framework (from code,
through `select()`) is an error that names where each value came from, as Lightning does for
conflicting accelerator settings. Importing a framework is irreversible, so a silent switch would
leave half the program on each.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Mapping, Sequence

from mmrun.backend.errors import FrameworkConflictError, UsageError
from mmrun.backend.vocabulary import DEFAULT_FRAMEWORK, FRAMEWORK_FLAGS, FRAMEWORKS, framework_name

__all__ = ["FRAMEWORKS", "DEFAULT_FRAMEWORK", "ENV_VAR", "ARGV_NAMES", "Choice", "argv_option", "resolve", "choice",
           "framework", "select", "msadapter_request"]
ENV_VAR = "MMRUN_AI_FRAMEWORK"
ARGV_NAMES: tuple[str, ...] = FRAMEWORK_FLAGS


@dataclass(frozen=True)
class Choice:
    framework: str
    source: str  # words for error messages: where the value came from
    explicit: bool = True  # False for the default, which code may still override with select()


def argv_option(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of an option in argv (`--name v` or `--name=v`), last one wins as in argparse.

    Scanning stops at `--`, after which argparse treats everything as positional.
    """
    value: str | None = None
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--":
            break
        for name in names:
            if arg == name:
                if i + 1 >= len(args) or args[i + 1].startswith("--"):
                    raise UsageError(f"{name} needs a value. Received: nothing after {name}")
                value = args[i + 1]
            elif arg.startswith(name + "="):
                value = arg[len(name) + 1:]
    return value


def resolve(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Choice:
    """The launch-time choice from argv and environment, without remembering it."""
    args = sys.argv[1:] if argv is None else argv
    env = os.environ if environ is None else environ
    from_argv = argv_option(args, ARGV_NAMES)
    from_env = env.get(ENV_VAR) or None
    if from_argv is not None:
        chosen = framework_name(from_argv, f"--ai-framework {from_argv} in the command line")
        if from_env is not None and framework_name(from_env, f"{ENV_VAR}={from_env}") != chosen:
            warnings.warn(
                f"--ai-framework {from_argv} in the command line overrides {ENV_VAR}={from_env} in the environment",
                stacklevel=3,
            )
        return Choice(chosen, f"--ai-framework {chosen} in the command line")
    if from_env is not None:
        chosen = framework_name(from_env, f"{ENV_VAR}={from_env}")
        return Choice(chosen, f"{ENV_VAR}={from_env} in the environment")
    return Choice(DEFAULT_FRAMEWORK, f"the default (no --ai-framework and no {ENV_VAR})", explicit=False)


_lock = threading.Lock()
_choice: Choice | None = None


def _remember(made: Choice) -> Choice:
    global _choice
    _choice = made
    # Child processes (data-loader workers, helper scripts) must make the same choice.
    os.environ[ENV_VAR] = made.framework
    return made


def choice() -> Choice:
    """The process-wide choice, made on first call."""
    with _lock:
        return _choice if _choice is not None else _remember(resolve())


def framework() -> str:
    """`"pytorch"` or `"mindspore"`, fixed for the life of the process."""
    return choice().framework


def select(name: str, source: str | None = None) -> str:
    """Ask for a framework from code; an error if the process already chose another.

    A launch-time choice (argv or environment) wins over nothing: code may only agree with it. When
    the launcher said nothing, code's request becomes the choice, unless the default was already used.
    """
    where = source or f"code: mmrun.backend.select({name!r})"
    wanted = framework_name(name, where)
    with _lock:
        current = _choice
        if current is None:
            launch = resolve()
            if launch.framework == wanted or not launch.explicit:
                return _remember(launch if launch.framework == wanted else Choice(wanted, where)).framework
            current = _remember(launch)
        if current.framework != wanted:
            raise FrameworkConflictError(
                f"The AI framework is already chosen: {current.framework}, from {current.source}. "
                f"Received: {wanted}, from {where}. A process runs one framework; make both say the same"
            )
        return current.framework


def _reset_for_tests() -> None:
    global _choice
    with _lock:
        _choice = None


MSADAPTER_ARGV_NAMES: tuple[str, ...] = ("--msadapter-path", "--msadapter_path")
MSADAPTER_ENV_VAR = "MSADAPTER_PATH"


def msadapter_request(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[str, str] | None:
    """(path, where it came from) when MSAdapter was asked for, from argv first, then the environment."""
    args = sys.argv[1:] if argv is None else argv
    env = os.environ if environ is None else environ
    from_argv = argv_option(args, MSADAPTER_ARGV_NAMES)
    if from_argv is not None:
        return from_argv, f"--msadapter-path {from_argv} in the command line"
    if env.get(MSADAPTER_ENV_VAR):
        return env[MSADAPTER_ENV_VAR], f"{MSADAPTER_ENV_VAR}={env[MSADAPTER_ENV_VAR]} in the environment"
    return None
