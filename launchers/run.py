"""`mmrun [options] SCRIPT [args]`: plan the launcher command, then start, supervise and report it.

The plan (command line, environment changes, notes, refusals) is computed without starting anything,
so `--dry-run` prints exactly what a real run would do.
"""
from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from mmrun.backend.cann import AUTOLOAD_VAR, guard_torch_npu_autoload
from mmrun.backend.errors import FrameworkNotInstalledError, UsageError
from mmrun.backend.selection import argv_option
from mmrun.backend.vocabulary import framework_name
from mmrun.common import ports
from mmrun.launchers import launch_args, script_target
from mmrun.launchers.ascend_env import check_ascend_env
from mmrun.launchers.console import shows_mindspore_logs
from mmrun.launchers.guardian import Guardian
from mmrun.launchers.option_rules import Note, Refusal, Translation, to_msrun, to_torchrun
from mmrun.launchers.options import LAUNCHER_OF, MSRUN, TORCHRUN
from mmrun.launchers.supervisor import Supervisor, reap, wait_for_workers
from mmrun.launchers.watchdog import RankWatch, Stop
from mmrun.launchers.worker_bootstrap import NODE_RANK_VAR, STATUS_DIR_VAR

BOOTSTRAP = str(Path(__file__).with_name("worker_bootstrap.py"))
LAUNCHER_MODULES = {TORCHRUN: "torch.distributed.run", MSRUN: "mindspore.parallel.cluster.run"}
# the package each launcher (and the workers it starts) needs
FRAMEWORK_MODULE = {TORCHRUN: "torch", MSRUN: "mindspore"}
DISTRIBUTED_TIMEOUT_FLAGS = ("--distributed-timeout-minutes", "--distributed_timeout_minutes")

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
    framework: str = ""
    framework_source: str = ""  # words for messages: where the choice came from
    watchdog_seconds: float = 0.0
    script_path: Path | None = None  # None: not found here (a dry run for another machine)
    quiet_mindspore: bool = False  # msrun: MindSpore's own INFO/WARNING lines stay in the worker logs (console.py)


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


def _choose_framework(request: launch_args.LaunchRequest) -> tuple[str, str]:
    """The framework and where it came from (words for messages)."""
    in_script = argv_option(request.script_args, launch_args.AI_FRAMEWORK_FLAGS)
    if in_script is None:
        source = {"--ai-framework": f"--ai-framework {request.ai_framework}", "default": "the default"}
        return request.ai_framework, source.get(request.framework_source, f"{request.framework_source}={request.ai_framework}")
    where = f"--ai-framework {in_script} in the script's arguments"
    in_script = framework_name(in_script, where)
    if request.framework_source == "--ai-framework" and in_script != request.ai_framework:
        raise UsageError(f"--ai-framework {request.ai_framework} (for mmrun) disagrees with --ai-framework {in_script} "
                         "in the script's arguments; give it once")
    return in_script, where


def _passes_framework_arg(request: launch_args.LaunchRequest, script_path: Path | None) -> bool:
    if request.framework_arg != "auto":
        return request.framework_arg == "always"
    return script_path is not None and script_target.takes_framework_arg(script_target.read_source(script_path))


# MindSpore's CPU collectives give up after MS_CPU_COMM_OP_TIMEOUT seconds, 30 by default: a rank waiting in an
# all-reduce while another compiles a graph for longer (a pipeline stage's first backward, on a loaded machine)
# fails with "AllReduce failed". Megatron's --distributed-timeout-minutes (default 10) bounds torch's collectives;
# msrun's workers get the same bound unless the environment sets the variable.
CPU_COMM_TIMEOUT_VAR = "MS_CPU_COMM_OP_TIMEOUT"
DEFAULT_DISTRIBUTED_TIMEOUT_S = 600


def _distributed_timeout(request: launch_args.LaunchRequest) -> tuple[str, int] | None:
    """Megatron's --distributed-timeout-minutes in the script's arguments: (as given, seconds), or None."""
    minutes = argv_option(request.script_args, DISTRIBUTED_TIMEOUT_FLAGS)
    if minutes is None:
        return None
    try:
        return minutes, int(float(minutes) * 60)
    except ValueError:
        raise UsageError(f"--distributed-timeout-minutes {minutes} in the script's arguments is not a number of "
                         "minutes; pass a whole number") from None


def _cluster_time_out_from_training_args(request: launch_args.LaunchRequest, translation: Translation,
                                         timeout: tuple[str, int] | None) -> Note | None:
    """msrun's --cluster_time_out from Megatron's --distributed-timeout-minutes, unless the user set it.

    Both bound how long ranks wait for each other to form the job (torch's process-group timeout
    covers the rendezvous; msrun's scheduler waits --cluster_time_out, default 600 s for both).
    """
    if timeout is None or "cluster_time_out" in request.given or "join_timeout=" in str(request.given.get("rdzv_conf", "")):
        return None
    minutes, seconds = timeout
    translation.set("cluster_time_out", str(seconds))
    return Note("--distributed-timeout-minutes", minutes, f"msrun waits --cluster_time_out {seconds} s for the ranks to join")


def build_plan(request: launch_args.LaunchRequest, environ: dict[str, str] | None = None) -> Plan:
    env = dict(os.environ if environ is None else environ)
    framework, framework_source = _choose_framework(request)
    launcher = LAUNCHER_OF[framework]
    given = dict(request.given)

    if launcher == MSRUN:
        for dest in ("nproc_per_node", "local_worker_num"):
            if dest in given:
                given[dest] = _resolve_nproc(str(given[dest]))
        translation = to_msrun(given, spelled=request.spelled)
    else:
        translation = to_torchrun(given, spelled=request.spelled)

    plan = Plan(launcher=launcher, command=[], notes=list(translation.notes), refusals=list(translation.refusals),
                framework=framework, framework_source=framework_source, watchdog_seconds=request.watchdog_seconds)
    if launcher == MSRUN:
        timeout = _distributed_timeout(request)
        note = _cluster_time_out_from_training_args(request, translation, timeout)
        plan.notes.extend([note] if note else [])
        if CPU_COMM_TIMEOUT_VAR not in env:
            plan.env_set[CPU_COMM_TIMEOUT_VAR] = str(timeout[1] if timeout else DEFAULT_DISTRIBUTED_TIMEOUT_S)
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
        bin_dir, path = str(Path(sys.executable).parent), env.get("PATH", "")
        if path.split(os.pathsep)[0] != bin_dir:
            plan.env_set["PATH"] = os.pathsep.join([bin_dir, path])
        plan.wait_for_msrun_workers = str(translation.value("join")) != "True"
        try:
            plan.quiet_mindspore = not shows_mindspore_logs(env)
        except ValueError as err:
            raise UsageError(str(err)) from None

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

    try:
        plan.script_path = script_target.locate(request.script, translation.module)
    except UsageError:
        if not request.dry_run:
            raise
        plan.notes.append(Note(request.script, None, "not found here; a dry run goes on, a real run would stop"))
    _check_fsdp2_file(request.script_args)
    target = [*(["-m"] if translation.module else []), request.script]
    script_args = launch_args.with_framework_arg(request.script_args, framework, _passes_framework_arg(request, plan.script_path))
    plan.command = [sys.executable, "-m", LAUNCHER_MODULES[launcher], *translation.argv(), BOOTSTRAP, *target, *script_args]
    plan.translation = translation
    return plan


def _apply_free_port(plan: Plan) -> None:
    port = ports.free_port()
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


def _check_framework_installed(plan: Plan) -> None:
    module = FRAMEWORK_MODULE[plan.launcher]
    if importlib.util.find_spec(module) is None:
        raise FrameworkNotInstalledError(plan.framework, module, plan.framework_source)


def _check_fsdp2_file(script_args: list[str]) -> None:
    """An FSDP2 file with an unknown key, a bad value, or a conflict with the training flags stops the job
    here, before any worker starts (engines/fsdp2_config.py; module patterns need the model: the
    workers check those before the first step)."""
    from mmrun.training.arguments import ArgumentsError
    from mmrun.training.yaml_launch import check_launch

    try:
        check_launch(script_args)
    except ArgumentsError as err:
        raise UsageError(str(err)) from None


def _error(message: str) -> int:
    print(f"mmrun: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str], subcommands: dict[str, tuple[str, str]] | None = None) -> int:
    """`mmrun [options] SCRIPT [args]`; `subcommands` (name -> (module, summary)) are listed in --help."""
    parser = launch_args.build_parser(subcommands)
    request = launch_args.parse(argv, parser)
    try:
        problems = check_ascend_env(os.environ)
        if problems:
            raise UsageError("; ".join(problems))
        plan = build_plan(request)
        if not request.dry_run:
            _check_framework_installed(plan)
    except (UsageError, ValueError, FrameworkNotInstalledError) as error:
        return _error(str(error))

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
    if plan.master and not ports.is_free(plan.master[1]):
        return _error(f"master port {plan.master[1]} is already in use on this machine; "
                      "free it, pass another --master-port, or --master-port 0 to pick a free one")
    return execute(plan)


def _report(stop: Stop) -> int:
    for line in stop.lines:
        print(line, file=sys.stderr, flush=True)
    return stop.exit_code


def execute(plan: Plan) -> int:
    env = {k: v for k, v in os.environ.items() if k not in plan.env_removed}
    env.update(plan.env_set)
    status_dir = Path(plan.env_set[STATUS_DIR_VAR])
    status_dir.mkdir(parents=True, exist_ok=True)
    run_id = status_dir.parent.name
    # torchrun stops (or restarts) the job itself when a rank fails; msrun lets the others wait.
    watch = RankWatch(status_dir, plan.launcher, plan.log_dir, stop_on_failure=plan.launcher == MSRUN,
                      watchdog_seconds=plan.watchdog_seconds)
    reported: list[Stop] = []

    def stop_when() -> int | None:
        stop = watch.check()
        if stop is None:
            return None
        reported.append(stop)
        return stop.exit_code

    guardian = Guardian(run_id, str(plan.temp_dir) if plan.temp_dir else None)
    try:
        guardian.start()
    except OSError as error:  # no process left to fork: the job still runs, reaped by mmrun itself
        _say(f"warning: no guardian ({error.strerror}): a kill -9 of mmrun would leave the job running")
    try:
        supervisor = Supervisor(plan.command, env, run_id, stop_when=stop_when, quiet_mindspore=plan.quiet_mindspore)
        code = supervisor.run()
        if plan.wait_for_msrun_workers and code == 0 and supervisor.stopped_with is None:
            wait_for_workers(run_id, stop_when=lambda: stop_when() is not None)
        if supervisor.received is not None:
            return code  # stopped by a signal to mmrun: the workers were told, nothing more to report
        if reported:  # said last, after the launcher's own report of the stop
            return _report(reported[0])
        stop = watch.after_exit(code, launcher_waited=not plan.wait_for_msrun_workers)
        if stop is not None:
            return _report(stop)
        if code != 0:
            _say(f"{plan.launcher} exited with code {code} and no worker reported its own; see the output above")
            return code if 0 < code < 256 else 1
        return 0
    finally:
        reap(run_id)
        if plan.temp_dir is not None:
            shutil.rmtree(plan.temp_dir, ignore_errors=True)
        guardian.release()
