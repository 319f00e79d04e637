"""The launcher option table: every torchrun and msrun option, and how it crosses to the other launcher.

One table serves `mmrun` (run a job), `mmrun translate` (rewrite a script) and the docs. The rule
names in `to_other` are implemented once, in `launchers/option_rules.py`.

Measured against torch 2.13 (`torch.distributed.run.get_args_parser()`) and mindspore 2.10
(`mindspore.parallel.cluster.run.get_args()`); tests compare this table with both parsers.
"""
from __future__ import annotations

from dataclasses import dataclass

TORCHRUN = "torchrun"
MSRUN = "msrun"
LAUNCHER_OF: dict[str, str] = {"pytorch": TORCHRUN, "mindspore": MSRUN}  # framework -> its launcher
FRAMEWORK_OF: dict[str, str] = {launcher: framework for framework, launcher in LAUNCHER_OF.items()}


@dataclass(frozen=True)
class LauncherOption:
    dest: str  # canonical key, underscore form (also the msrun spelling)
    launcher: str  # TORCHRUN or MSRUN
    takes_value: bool
    default: str | None  # the launcher's own default, as text
    help: str
    to_other: str  # translation rule name, see option_rules.RULES
    short: tuple[str, ...] = ()  # extra short flags, e.g. ("-m",)

    @property
    def flags(self) -> tuple[str, ...]:
        """Every spelling the launcher accepts: torchrun takes dashes and underscores, msrun only underscores."""
        underscore = "--" + self.dest
        if self.launcher == MSRUN:
            return (underscore, *self.short)
        dashed = "--" + self.dest.replace("_", "-")
        spellings = (dashed,) if dashed == underscore else (dashed, underscore)
        return (*self.short, *spellings) if self.short else spellings

    @property
    def canonical_flag(self) -> str:
        """The spelling mmrun writes: torchrun's documented dashed form, msrun's only form."""
        return "--" + (self.dest if self.launcher == MSRUN else self.dest.replace("_", "-"))


def _t(dest: str, takes_value: bool, default: str | None, to_other: str, help: str, short: tuple[str, ...] = ()) -> LauncherOption:
    return LauncherOption(dest, TORCHRUN, takes_value, default, help, to_other, short)


def _m(dest: str, takes_value: bool, default: str | None, to_other: str, help: str) -> LauncherOption:
    return LauncherOption(dest, MSRUN, takes_value, default, help, to_other)


OPTIONS: tuple[LauncherOption, ...] = (
    # --- torchrun ---------------------------------------------------------------------------
    _t("nnodes", True, "1", "nnodes", "number of nodes, or MIN:MAX (elastic; torchrun only)"),
    _t("nproc_per_node", True, "1", "nproc_per_node", "workers per node: an integer (auto|cpu|gpu|xpu resolved at launch)"),
    _t("rdzv_backend", True, "static", "rdzv_backend", "rendezvous backend: static|c10d (kept by msrun's scheduler) or etcd|etcd-v2 (refused)"),
    _t("rdzv_endpoint", True, "", "rdzv_endpoint", "rendezvous endpoint host:port (becomes the master address and port)"),
    _t("rdzv_id", True, "none", "ignore", "rendezvous job id (msrun has none; dropped)"),
    _t("rdzv_conf", True, "", "rdzv_conf", "rendezvous config k=v,...; join_timeout becomes msrun's --cluster_time_out"),
    _t("standalone", False, None, "standalone", "single node with a local rendezvous on a free port"),
    _t("max_restarts", True, "0", "max_restarts", "worker group restarts (msrun has no restarts: only 0 translates)"),
    _t("monitor_interval", True, "0.1", "ignore", "seconds between worker health checks (msrun has its own; dropped)"),
    _t("start_method", True, "spawn", "ignore", "multiprocessing start method (msrun starts processes itself; dropped)"),
    _t("event_log_handler", True, "null", "ignore", "torchelastic event log handler (dropped)"),
    _t("role", True, "default", "ignore", "worker role name (dropped)"),
    _t("module", False, None, "same", "run SCRIPT as a module, like python -m", short=("-m",)),
    _t("no_python", False, None, "refuse", "run SCRIPT as an executable, not a Python file"),
    _t("run_path", False, None, "refuse", "run SCRIPT with runpy.run_path in the launcher's interpreter"),
    _t("log_dir", True, None, "same", "directory for worker logs"),
    _t("redirects", True, "0", "stdio_files", "redirect worker stdout/stderr to files (0|1|2|3, per rank 0:1,1:2)", short=("-r",)),
    _t("tee", True, "0", "stdio_files", "tee worker stdout/stderr to files and console", short=("-t",)),
    _t("local_ranks_filter", True, "", "local_ranks_filter", "only show these local ranks' output (one rank translates)"),
    _t("duplicate_stdout_filters", True, "", "refuse", "copy matching stdout lines to a file"),
    _t("duplicate_stderr_filters", True, "", "refuse", "copy matching stderr lines to a file"),
    _t("node_rank", True, "0", "same", "rank of this node"),
    _t("master_addr", True, "127.0.0.1", "same", "address of the master node (rank 0)"),
    _t("master_port", True, "29500", "same", "port on the master node; 0 picks a free one"),
    _t("local_addr", True, None, "refuse", "address of this node"),
    _t("logs_specs", True, None, "refuse", "torchrun LogsSpecs plugin"),
    _t("numa_binding", True, None, "refuse", "bind workers to NUMA nodes (msrun: use --bind_numa)"),
    _t("signals_to_handle", True, "SIGTERM,SIGINT,SIGHUP,SIGQUIT", "ignore", "signals torchrun forwards (mmrun forwards SIGINT/SIGTERM itself)"),
    _t("shutdown_timeout", True, None, "ignore", "seconds between SIGTERM and SIGKILL at shutdown (dropped)"),
    _t("virtual_local_rank", False, None, "refuse", "give every worker LOCAL_RANK 0"),
    # --- msrun ------------------------------------------------------------------------------
    _m("worker_num", True, "8", "worker_num", "total workers over all nodes (becomes torchrun's --nnodes = worker_num / local_worker_num)"),
    _m("local_worker_num", True, "8", "local_worker_num", "workers on this node (torchrun's --nproc-per-node)"),
    _m("master_addr", True, "127.0.0.1", "same", "scheduler address"),
    _m("master_port", True, "8118", "same", "scheduler port"),
    _m("node_rank", True, "-1", "same", "rank of this node; -1 assigns automatically"),
    _m("log_dir", True, "", "same", "directory for worker_<rank>.log and scheduler.log"),
    _m("join", True, "False", "join", "wait for the workers (mmrun always waits)"),
    _m("cluster_time_out", True, "600", "cluster_time_out", "seconds to wait for the cluster to form (torchrun: --rdzv-conf join_timeout=)"),
    _m("bind_core", True, "False", "ignore", "bind CPU cores to workers (torchrun: no equivalent; on NPU use CPU_AFFINITY_CONF)"),
    _m("bind_numa", True, "False", "ignore", "bind NUMA nodes to workers (torchrun: no equivalent flag kept)"),
    _m("sim_level", True, "-1", "refuse", "dry-run simulation level (msrun only)"),
    _m("sim_rank_id", True, "-1", "refuse", "simulated rank id (msrun only)"),
    _m("rank_table_file", True, "", "refuse", "Ascend rank table file (msrun only)"),
    _m("worker_log_name", True, "", "ignore", "worker log file name pattern (torchrun names its own logs)"),
    _m("tail_worker_log", True, "-1", "tail_worker_log", "tail this worker's log to the console (torchrun: --local-ranks-filter)"),
)

BY_LAUNCHER: dict[str, dict[str, LauncherOption]] = {
    TORCHRUN: {o.dest: o for o in OPTIONS if o.launcher == TORCHRUN},
    MSRUN: {o.dest: o for o in OPTIONS if o.launcher == MSRUN},
}

# Options spelled the same in both launchers (master_addr, master_port, node_rank, log_dir).
SHARED_DESTS = frozenset(BY_LAUNCHER[TORCHRUN]) & frozenset(BY_LAUNCHER[MSRUN])


def find_option(flag: str) -> LauncherOption | None:
    """The option a command-line flag names (either launcher; torchrun's entry for shared names)."""
    for launcher in (TORCHRUN, MSRUN):
        for option in BY_LAUNCHER[launcher].values():
            if flag in option.flags:
                return option
    return None


RULE_WORDS = {
    "same": "same name",
    "ignore": "dropped with a note (no effect on the result)",
    "refuse": "refused (exit 2; `--on-unsupported warn` drops it)",
    "nproc_per_node": "`--local_worker_num` (auto/cpu/gpu resolved to a number)",
    "nnodes": "`--worker_num` = nproc x nnodes; MIN:MAX refused unless MIN = MAX",
    "rdzv_backend": "static/c10d dropped (msrun's scheduler); etcd refused",
    "rdzv_endpoint": "`--master_addr` / `--master_port`",
    "rdzv_conf": "`join_timeout=N` becomes `--cluster_time_out N`; other keys refused or dropped",
    "standalone": "`--master_addr 127.0.0.1 --master_port <free port>`",
    "max_restarts": "0 dropped; above 0 refused",
    "stdio_files": "0 dropped; other values refused",
    "local_ranks_filter": "one rank becomes `--tail_worker_log`; a list is refused",
    "local_worker_num": "`--nproc-per-node`",
    "worker_num": "`--nnodes` = worker_num / local_worker_num",
    "join": "dropped (torchrun always waits)",
    "cluster_time_out": "`--rdzv-conf join_timeout=N`",
    "tail_worker_log": "`--local-ranks-filter`",
}


def options_markdown() -> str:
    """The table in docs/launcher.md, generated from OPTIONS so the doc cannot drift."""
    lines = ["| launcher | option | default | meaning | under the other launcher |", "|---|---|---|---|---|"]
    for option in OPTIONS:
        flags = ", ".join(f"`{flag}`" for flag in option.flags)
        default = "" if option.default is None else f"`{option.default}`"
        lines.append(f"| {option.launcher} | {flags} | {default} | {option.help} | {RULE_WORDS[option.to_other]} |")
    return "\n".join(lines)
