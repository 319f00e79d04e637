"""Command-line parsing for `mmrun [mmrun options] [launcher options] SCRIPT [script args]`.

The launcher options come from the table in `launchers/options.py`: every torchrun option in both
spellings, every msrun option, `--opt=v` and `--opt v`. Everything after SCRIPT belongs to the script.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from mmrun import __version__
from mmrun.backend.errors import UsageError
from mmrun.backend.selection import ENV_VAR as FRAMEWORK_ENV_VAR
from mmrun.backend.vocabulary import DEFAULT_FRAMEWORK, FRAMEWORK_FLAGS, framework_name
from mmrun.launchers.option_rules import Value
from mmrun.launchers.option_values import check_values
from mmrun.launchers.options import MSRUN, OPTIONS, TORCHRUN, LauncherOption
from mmrun.launchers.script_target import FRAMEWORK_ARG_MODES

AI_FRAMEWORK_FLAGS = FRAMEWORK_FLAGS

EXAMPLES = """\
examples:
  # 2 workers on this machine with torchrun (gloo on CPU, hccl on NPU, nccl on CUDA)
  mmrun --nproc-per-node 2 models/pretrain_gpt.py --mock-data --train-iters 20

  # the same job on MindSpore: msrun with --local_worker_num 2 --worker_num 2 --join True
  mmrun --ai-framework mindspore --nproc-per-node 2 models/pretrain_gpt.py --mock-data --train-iters 20

  # show the exact launcher command and environment, start nothing
  mmrun --ai-framework mindspore --dry-run --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 train.py

  # two nodes: run on each node with its own --node-rank
  mmrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --master-addr 10.0.0.1 --master-port 6000 train.py

  # stop the job when a rank prints nothing (and calls no heartbeat()) for 10 minutes: exit 124
  mmrun --watchdog-seconds 600 --nproc-per-node 8 train.py

  # a plain argparse script on MindSpore: MMRUN_AI_FRAMEWORK is exported, no --ai-framework appended
  mmrun --ai-framework mindspore --nproc-per-node 2 my_script.py --epochs 3

subcommands (mmrun SUBCOMMAND --help for each):
{subcommands}

Exit status: 0 on success; 2 on a usage error (nothing started); else the failing rank's own exit
code, 128+N for a rank killed by signal N (1 when it cannot be known); 124 when --watchdog-seconds
stopped the job; 128+N when mmrun itself got signal N. However mmrun ends, even by kill -9, no
process of the job outlives it by more than a few seconds. Docs: docs/launcher.md
"""


@dataclass
class LaunchRequest:
    ai_framework: str
    framework_source: str  # "--ai-framework", "MMRUN_AI_FRAMEWORK" or "default"
    given: dict[str, Value]  # launcher options the user gave, by dest, in order
    spelled: dict[str, str]  # dest -> the flag as the user wrote it (for messages)
    from_env: dict[str, str] = field(default_factory=dict)  # dest -> PET_* variable it came from
    script: str = ""
    script_args: list[str] = field(default_factory=list)
    dry_run: bool = False
    on_unsupported: str = "error"
    msadapter_path: str | None = None
    framework_arg: str = "auto"
    watchdog_seconds: float = 0.0


class _Record(argparse.Action):
    """Keeps launcher options in the order given, with the spelling used."""

    def __init__(self, option_strings, dest, launcher_option: LauncherOption, **kwargs):
        self.launcher_option = launcher_option
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault("_given", {})
        spelled = namespace.__dict__.setdefault("_spelled", {})
        given[self.launcher_option.dest] = True if self.nargs == 0 else values
        spelled[self.launcher_option.dest] = option_string


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (what was received, what to do), exit 2; the usage is one --help away."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _watchdog_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds; pass N > 0, or 0 for no watchdog")
    return value


def build_parser(subcommands: dict[str, tuple[str, str]] | None = None) -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<16} {summary}" for name, (_, summary) in (subcommands or {}).items())
    parser = _Parser(
        prog="mmrun",
        usage="mmrun [--ai-framework pytorch|mindspore] [launcher options] SCRIPT [script args]\n"
        "       mmrun {" + ",".join(subcommands or {}) + "} ...",
        description="Start a training job with torchrun (PyTorch) or msrun (MindSpore) from one set of "
        "torchrun-style options; options the chosen launcher cannot honour are refused with the reason.",
        epilog=EXAMPLES.format(subcommands=listing),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    own = parser.add_argument_group("mmrun options")
    own.add_argument(*AI_FRAMEWORK_FLAGS, dest="ai_framework", metavar="{pytorch,mindspore}", default=None,
                     help="framework and launcher: pytorch (torchrun) or mindspore (msrun); default: $MMRUN_AI_FRAMEWORK, else pytorch")
    own.add_argument("--dry-run", "--dry_run", action="store_true", help="print the launcher command and the environment changes; start nothing")
    own.add_argument("--on-unsupported", "--on_unsupported", choices=("error", "warn"), default="error",
                     help="options the launcher cannot honour: stop (error, default) or drop them with a warning")
    own.add_argument("--msadapter-path", "--msadapter_path", default=None, metavar="DIR",
                     help="MSAdapter source tree for user torch code on MindSpore (exported as MSADAPTER_PATH)")
    own.add_argument("--framework-arg", "--framework_arg", choices=FRAMEWORK_ARG_MODES, default="auto",
                     help="append --ai-framework X to the script's arguments: auto (default: only when the script "
                     "takes it, see docs/launcher.md), always, or never; MMRUN_AI_FRAMEWORK is exported in every case")
    own.add_argument("--watchdog-seconds", "--watchdog_seconds", type=_watchdog_seconds, default=0.0, metavar="N",
                     help="stop the job (exit 124) when a rank of this node shows no progress for N seconds: no line "
                     "printed and no mmrun.launchers.heartbeat.heartbeat() call; default 0: no watchdog")
    own.add_argument("--version", action="version", version=f"mmrun {__version__}", help="print mmrun's version and exit")

    groups = {TORCHRUN: parser.add_argument_group("torchrun options (both spellings; translated for msrun)"),
              MSRUN: parser.add_argument_group("msrun options (translated for torchrun)")}
    registered: set[str] = set()
    for option in OPTIONS:
        flags = [f for f in option.flags if f not in registered]
        if not flags:
            continue  # shared with torchrun (master_addr, ...): one argument serves both
        registered.update(flags)
        kwargs: dict = {"nargs": None if option.takes_value else 0, "dest": f"launcher_{option.dest}",
                        "default": argparse.SUPPRESS, "help": option.help}
        if option.takes_value:
            kwargs["metavar"] = option.dest.upper()
        groups[option.launcher].add_argument(*flags, action=_Record, launcher_option=option, **kwargs)

    parser.add_argument("script", nargs="?", metavar="SCRIPT", help="training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...", help="arguments for the script, passed untouched")
    return parser


def parse(argv: list[str], parser: argparse.ArgumentParser | None = None, environ: dict[str, str] | None = None) -> LaunchRequest:
    """Parse argv; usage errors exit 2 through argparse with a one-line message."""
    parser = parser or build_parser()
    env = os.environ if environ is None else environ
    ns = parser.parse_args(argv)
    if ns.script is None:
        parser.error("no SCRIPT given; pass the training script after the launcher options (see --help)")

    if ns.ai_framework is not None:
        framework, source = ns.ai_framework, "--ai-framework"
    elif env.get(FRAMEWORK_ENV_VAR):
        framework, source = env[FRAMEWORK_ENV_VAR], FRAMEWORK_ENV_VAR
    else:
        framework, source = DEFAULT_FRAMEWORK, "default"
    try:
        framework = framework_name(framework, f"--ai-framework {framework}" if source == "--ai-framework"
                                   else f"{source}={framework}")
    except UsageError as err:
        parser.error(str(err))

    given: dict[str, Value] = dict(getattr(ns, "_given", {}))
    spelled = dict(getattr(ns, "_spelled", {}))
    from_env: dict[str, str] = {}
    # torchrun reads PET_<OPTION> for options not on the command line; honour that for msrun too.
    for option in OPTIONS:
        variable = "PET_" + option.dest.upper()
        if option.launcher == TORCHRUN and option.dest not in given and env.get(variable):
            given[option.dest] = True if not option.takes_value else env[variable]
            from_env[option.dest] = variable
            spelled[option.dest] = variable
    problems = check_values(given, spelled)
    if problems:
        parser.error("; ".join(problems))

    return LaunchRequest(
        ai_framework=framework,
        framework_source=source,
        given=given,
        spelled=spelled,
        from_env=from_env,
        script=ns.script,
        script_args=list(ns.script_args),
        dry_run=ns.dry_run,
        on_unsupported=ns.on_unsupported,
        msadapter_path=ns.msadapter_path,
        framework_arg=ns.framework_arg,
        watchdog_seconds=ns.watchdog_seconds,
    )


def carries_framework_arg(script_args: list[str]) -> bool:
    return any(arg in AI_FRAMEWORK_FLAGS or arg.startswith(tuple(f + "=" for f in AI_FRAMEWORK_FLAGS)) for arg in script_args)


def with_framework_arg(script_args: list[str], framework: str, wanted: bool) -> list[str]:
    """Append `--ai-framework X` when `wanted`, unless the script's arguments already carry it."""
    if not wanted or carries_framework_arg(script_args):
        return list(script_args)
    return [*script_args, "--ai-framework", framework]
