"""What the rewrite adds, keeps and drops beyond the shared option table, and the reasons the report gives.

Data only: the option translation itself is launchers/option_rules.py, shared with the `mmrun` launcher.
"""
from __future__ import annotations

from mmrun.backend.vocabulary import DEVICES, FRAMEWORK_FLAGS  # noqa: F401 - re-exported for the rewrite
from mmrun.launchers.options import FRAMEWORK_OF, LAUNCHER_OF, MSRUN, TORCHRUN, LauncherOption  # noqa: F401

MMRUN = "mmrun"  # an `mmrun` launch line: torchrun's (and msrun's) options plus mmrun's own, translated as torchrun's
OTHER: dict[str, str] = {MSRUN: TORCHRUN, TORCHRUN: MSRUN}
ON_UNSUPPORTED: tuple[str, ...] = ("error", "comment", "remove")
MARKER_PREFIX = "# mmrun translate"

# msrun options MindSpeed-MM's MindSpore backend migration guide adds beyond the translation: dest -> (value, devices).
MSRUN_EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {"bind_core": ("True", ("npu",))}
# Defaults the shared translation fills in that a script must still write, because the launchers differ
# (msrun: 8 workers, no join, no log dir). master_addr/master_port/node_rank defaults are left implicit:
# they do not change a job that did not set them.
KEEP_DEFAULTS: frozenset[str] = frozenset({"local_worker_num", "worker_num", "log_dir", "join"})
# Added options written `--flag=value`, as that guide writes them.
INLINE_ADDED: frozenset[str] = frozenset({"bind_core"})

# Why an option became another: (source dest, target dest) -> reason for the report.
WHY_RENAMED: dict[tuple[str, str], str] = {
    ("nproc_per_node", "local_worker_num"): "msrun calls the workers per node --local_worker_num",
    ("nnodes", "worker_num"): "msrun takes the total number of workers over all nodes: --nproc_per_node x --nnodes",
    ("local_worker_num", "nproc_per_node"): "torchrun calls the workers per node --nproc_per_node",
    ("worker_num", "nnodes"): "torchrun takes the number of nodes: --worker_num / --local_worker_num",
    ("rdzv_endpoint", "master_addr"): "msrun's scheduler listens on --master_addr/--master_port",
    ("rdzv_endpoint", "master_port"): "msrun's scheduler listens on --master_addr/--master_port",
    ("standalone", "master_addr"): "one node: msrun's scheduler on this host, at msrun's default port (a script cannot pick a free one)",
    ("standalone", "master_port"): "one node: msrun's scheduler on this host, at msrun's default port (a script cannot pick a free one)",
    ("rdzv_conf", "cluster_time_out"): "msrun's time to wait for the cluster is --cluster_time_out",
    ("cluster_time_out", "rdzv_conf"): "torchrun's time to wait for the nodes is --rdzv_conf join_timeout=",
    ("local_ranks_filter", "tail_worker_log"): "msrun shows one worker's log on the console with --tail_worker_log",
    ("tail_worker_log", "local_ranks_filter"): "torchrun shows selected ranks' output with --local_ranks_filter",
}
WHY_ADDED: dict[str, str] = {
    "local_worker_num": "msrun starts 8 workers per node unless told; torchrun's default was 1",
    "worker_num": "msrun expects 8 workers in total unless told",
    "log_dir": "msrun writes each worker's output to <log_dir>/worker_<rank>.log (msrun_log, as in MindSpeed-MM's MindSpore backend migration guide)",
    "join": "torchrun waits for its workers; msrun returns at once unless --join True (a `| tee` would capture nothing and the exit code would be lost)",
    "bind_core": "MindSpeed-MM's MindSpore backend migration guide binds CPU cores to NPU workers (added for --device npu only)",
    "nproc_per_node": "msrun's default of 8 workers per node, written out (torchrun's default is 1)",
    "nnodes": "msrun's default of 8 workers in total, written out",
}
WHY_DROPPED: dict[str, str] = {
    "log_dir": "msrun_log is the log directory written for msrun; torchrun shows the workers' output itself",
    "join": "torchrun always waits for its workers",
    "max_restarts": "msrun never restarts workers, which is what 0 restarts asks for",
}
WHY_LAUNCHER: dict[str, str] = {
    MSRUN: "msrun starts the workers for the MindSpore backend (MindSpeed-MM's MindSpore backend migration guide)",
    TORCHRUN: "torchrun starts the workers for the PyTorch backend",
}

# mmrun's own options (launchers/launch_args.py, "mmrun options"; a test compares the two), as they may
# appear on an `mmrun` launch line. `to_other` is unused: they never reach the shared translation.
MMRUN_OPTIONS: dict[str, LauncherOption] = {o.dest: o for o in (
    LauncherOption("ai_framework", MMRUN, True, None, "framework and launcher", "mmrun"),
    LauncherOption("dry_run", MMRUN, False, None, "print the launcher command, start nothing", "mmrun"),
    LauncherOption("on_unsupported", MMRUN, True, "error", "launcher options the launcher cannot honour", "mmrun"),
    LauncherOption("msadapter_path", MMRUN, True, None, "MSAdapter source tree", "mmrun"),
    LauncherOption("version", MMRUN, False, None, "print mmrun's version", "mmrun"),
    LauncherOption("framework_arg", MMRUN, True, "auto", "whether the script gets --ai-framework", "mmrun"),
    LauncherOption("watchdog_seconds", MMRUN, True, "0", "stop a job whose rank shows no progress", "mmrun"),
)}
# What `--to mindspore` does with them: ("remove", why) or ("refuse", reason, hint).
MMRUN_OWN_TO_MSRUN: dict[str, tuple[str, ...]] = {
    "ai_framework": ("remove", "mmrun's own choice of launcher: msrun is MindSpore's, and the training command gets --ai-framework mindspore"),
    "dry_run": ("refuse", "msrun has no dry run, it would start the job",
                "remove --dry-run from the script (run the mmrun line with --dry-run to see the msrun command it starts)"),
    "on_unsupported": ("refuse", "msrun has no such switch, and an option msrun cannot honour is refused by the translation itself",
                       "remove it from the script"),
    "msadapter_path": ("refuse", "msrun does not export MSADAPTER_PATH for its workers",
                       "write `export MSADAPTER_PATH=DIR` above the launch line instead"),
    "version": ("refuse", "mmrun --version prints mmrun's version and starts no job", "remove it from the launch line"),
    "framework_arg": ("refuse", "msrun passes the training command's arguments as they are written",
                      "remove it, and write --ai-framework mindspore in the training command only if the script takes it"),
    "watchdog_seconds": ("refuse", "msrun has no progress watchdog (mmrun's --watchdog-seconds watches its ranks)",
                         "remove it, or keep launching with mmrun --ai-framework mindspore to keep the watchdog"),
}
WHY_FROM_MMRUN = "; mmrun's torchrun-style options are translated as torchrun's"
