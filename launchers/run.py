"""`mmrun [options] SCRIPT [args]`: plan the launcher command, then start, supervise and report it.

The plan (command line, environment changes, notes, refusals) is computed without starting anything,
so `--dry-run` prints exactly what a real run would do.
"""
from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from mmrun.backend.cann import AUTOLOAD_VAR, guard_torch_npu_autoload
from mmrun.backend.errors import UsageError
from mmrun.backend.vocabulary import framework_name
from mmrun.launchers import failure, launch_args
from mmrun.launchers.ascend_env import check_ascend_env
from mmrun.launchers.options import LAUNCHER_OF, MSRUN, TORCHRUN
from mmrun.launchers.supervisor import Supervisor, reap, wait_for_workers
from mmrun.launchers.translation import Note, Refusal, Translation, to_msrun, to_torchrun
from mmrun.launchers.worker_bootstrap import NODE_RANK_VAR, STATUS_DIR_VAR

BOOTSTRAP = str(Path(__file__).with_name("worker_bootstrap.py"))
LAUNCHER_MODULES = {TORCHRUN: "torch.distributed.run", MSRUN: "mindspore.parallel.cluster.run"}

# Variables a launcher sets for its workers. Inherited from an outer job they mislead the inner one
# (msrun's MS_* are a known cause of "Address already in use"), so they never reach the child.
INHERITED_JOB_VARIABLES = (
    "MS_ROLE", "MS_NODE_ID", "MS_WORKER_NUM", "MS_SCHED_HOST", "MS_SCHED_PORT", "MS_TOPO_TIMEOUT",
    "RANK_ID", "RANK_SIZE", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", STATUS_DIR_VAR, NODE_RANK_VAR,
)


@dataclass
class Plan:
    launcher: str
    command: list[str]
    env_set: dict[str, str] = field(default_factory=dict)
    env_removed: list[str] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    master: tuple[str, int] | None = None  # (addr, port) to check before starting, node rank 0 only
    pick_port: bool = False  # --master-port 0: replace with a free port at launch
    log_dir: Path | None = None
    temp_dir: Path | None = None  # mmrun's own: the workers' status files
    wait_for_msrun_workers: bool = False
    translation: Translation | None = None


def _resolve_nproc(value: str) -> str:
    """torchrun resolves auto|cpu|gpu itself; msrun needs a number."""
    npus = len(list(Path("/dev").glob("davinci[0-9]*")))
    gpus = len(list(Path("/proc/driver/nvidia/gpus").glob("*"))) if Path("/proc/driver/nvidia/gpus").exists() else 0
    counts = {"cpu": os.cpu_count() or 1, "gpu": gpus, "auto": npus or gpus or os.cpu_count() or 1, "xpu": 0}
    if value not in counts:
        return value
    if counts[value] == 0:
        raise UsageError(f"--nproc-per-node {value}: no {value} devices found on this machine; pass a number")
    return str(counts[value])


def _framework_in_script_args(args: list[str]) -> str | None:
    for i, arg in enumerate(args):
        if arg in launch_args.AI_FRAMEWORK_FLAGS and i + 1 < len(args):
            return args[i + 1]
        for flag in launch_args.AI_FRAMEWORK_FLAGS:
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None


def _choose_framework(request: launch_args.LaunchRequest) -> str:
    in_script = _framework_in_script_args(request.script_args)
    if in_script is None:
        return request.ai_framework
    in_script = framework_name(in_script, f"--ai-framework {in_script} in the script's arguments")
    if request.framework_source == "--ai-framework" and in_script != request.ai_framework:
        raise UsageError(f"--ai-framework {request.ai_framework} (for mmrun) disagrees with --ai-framework {in_script} "
                         "in the script's arguments; give it once")
    return in_script


def build_plan(request: launch_args.LaunchRequest, environ: dict[str, str] | None = None) -> Plan:
    env = dict(os.environ if environ is None else environ)
    framework = _choose_framework(request)
    launcher = LAUNCHER_OF[framework]
    given = dict(request.given)

    if launcher == MSRUN:
        for dest in ("nproc_per_node", "local_worker_num"):
            if dest in given:
                given[dest] = _resolve_nproc(str(given[dest]))
        translation = to_msrun(given, spelled=request.spelled)
    else:
        translation = to_torchrun(given, spelled=request.spelled)

    plan = Plan(launcher=launcher, command=[], notes=list(translation.notes), refusals=list(translation.refusals))
    plan.temp_dir = Path(tempfile.gettempdir()) / f"mmrun-{uuid.uuid4().hex[:12]}"
    plan.env_set[STATUS_DIR_VAR] = str(plan.temp_dir / "status")
    plan.env_set["MMRUN_AI_FRAMEWORK"] = framework
    plan.env_set.update(translation.env)
    if request.msadapter_path:
        plan.env_set["MSADAPTER_PATH"] = request.msadapter_path

    if launcher == TORCHRUN:
        # A failed rank's last lines come from the bootstrap's status file; per-rank log files are
        # used only when the user asked torchrun for them.
        log_dir = translation.value("log_dir")
        plan.log_dir = Path(str(log_dir)) if log_dir and {"redirects", "tee"} & given.keys() else None
    else:
        plan.log_dir = Path(str(translation.value("log_dir")))
        # msrun starts workers as `python SCRIPT`, taking python from PATH, not this interpreter.
        plan.env_set["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        plan.wait_for_msrun_workers = str(translation.value("join")) != "True"

    probe = dict(env)
    reason = guard_torch_npu_autoload(probe)  # torch_npu installed without CANN breaks `import torch`
    if reason:
        plan.env_set[AUTOLOAD_VAR] = probe[AUTOLOAD_VAR]
        plan.notes.append(Note("torch_npu", None, f"is installed but unusable for the workers: {reason}"))

    if launcher == MSRUN:
        plan.env_set[NODE_RANK_VAR] = str(translation.value("node_rank"))
    plan.env_removed = [name for name in INHERITED_JOB_VARIABLES if name in env and name not in plan.env_set]

    port = str(translation.value("master_port") or "29500")
    standalone = "standalone" in given and launcher == TORCHRUN
    node_rank = str(translation.value("node_rank") or "0")
    if not standalone and node_rank in ("0", "-1"):
        plan.pick_port = port == "0"
        if port.isdigit():
            plan.master = (str(translation.value("master_addr") or "127.0.0.1"), int(port))

    target = [*(["-m"] if translation.module else []), request.script]
    script_args = launch_args.with_framework_arg(request.script_args, framework)
    plan.command = [sys.executable, "-m", LAUNCHER_MODULES[launcher], *translation.argv(), BOOTSTRAP, *target, *script_args]
    plan.translation = translation
    return plan


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return True
    return False


def _apply_free_port(plan: Plan) -> None:
    port = _free_port()
    plan.translation.set("master_port", str(port))
    index = plan.command.index(BOOTSTRAP)
    launcher_args = plan.translation.argv()
    plan.command = [*plan.command[:3], *launcher_args, *plan.command[index:]]
    plan.master = (plan.master[0] if plan.master else "127.0.0.1", port)


def _say(message: str) -> None:
    print(f"mmrun: {message}", file=sys.stderr, flush=True)


def print_dry_run(plan: Plan) -> None:
    print(shlex.join(plan.command))
    for name, value in plan.env_set.items():
        print(f"export {name}={shlex.quote(value)}")
    for name in plan.env_removed:
        print(f"unset {name}")


def main(argv: list[str]) -> int:
    from mmrun.launchers.cli import SUBCOMMANDS

    parser = launch_args.build_parser(SUBCOMMANDS)
    if argv[:1] == ["--version"]:
        from mmrun import __version__

        print(f"mmrun {__version__}")
        return 0
    request = launch_args.parse(argv, parser)
    try:
        problems = check_ascend_env(os.environ)
        if problems:
            raise UsageError("; ".join(problems))
        plan = build_plan(request)
    except (UsageError, ValueError) as error:
        parser.error(str(error))  # exits 2 with the usage line

    for note in plan.notes:
        _say(f"note: {note}")
    if plan.refusals:
        if request.on_unsupported == "error":
            for refusal in plan.refusals:
                print(f"mmrun: error: {refusal}", file=sys.stderr)
            print("mmrun: (pass --on-unsupported warn to drop these options and run anyway)", file=sys.stderr)
            return 2
        for refusal in plan.refusals:
            _say(f"warning: dropped {refusal}")
    if plan.env_removed:
        _say(f"warning: removed variables inherited from an outer job: {', '.join(plan.env_removed)}")

    if plan.pick_port:
        _apply_free_port(plan)
    if request.dry_run:
        print_dry_run(plan)
        return 0
    if plan.master and _port_in_use(plan.master[1]):
        print(f"mmrun: error: master port {plan.master[1]} is already in use on this machine; "
              "free it, pass another --master-port, or --master-port 0 to pick a free one", file=sys.stderr)
        return 2
    return execute(plan)


def execute(plan: Plan) -> int:
    env = {k: v for k, v in os.environ.items() if k not in plan.env_removed}
    env.update(plan.env_set)
    status_dir = Path(plan.env_set[STATUS_DIR_VAR])
    status_dir.mkdir(parents=True, exist_ok=True)
    run_id = status_dir.parent.name
    try:
        # msrun keeps the other workers (and its scheduler) waiting when one fails; torchrun stops them itself.
        stop_when = (lambda: failure.first_failure(failure.read_statuses(status_dir)) is not None) if plan.launcher == MSRUN else None
        code = Supervisor(plan.command, env, run_id, stop_when=stop_when).run()
        if plan.wait_for_msrun_workers and code == 0:
            wait_for_workers(run_id)
        reap(run_id)
        if code >= 128 + 1 and code - 128 in (2, 15):
            return code  # stopped by SIGINT/SIGTERM: the workers were told, nothing more to report
        cause = failure.first_failure(failure.read_statuses(status_dir))
        if cause is not None:
            for line in failure.describe(plan.launcher, plan.log_dir, cause):
                print(line, file=sys.stderr)
            return cause.exit_code if 0 < cause.exit_code < 256 else 1
        if code != 0:
            _say(f"{plan.launcher} exited with code {code} and no worker reported its own; see the output above")
            return code if 0 < code < 256 else 1
        return 0
    finally:
        if plan.temp_dir is not None:
            shutil.rmtree(plan.temp_dir, ignore_errors=True)
