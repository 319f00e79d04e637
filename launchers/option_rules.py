"""The launcher option rules: how each torchrun option becomes msrun's and back.

Shared by `mmrun` (run a job) and `mmrun translate` (rewrite a script, in `launchers/translate/`).

Input is what the user gave, keyed by option dest (`nproc_per_node`, `local_worker_num`, ...), values as
text. Values may be shell expressions (`$GPUS_PER_NODE`) when a script is translated: arithmetic between
options (`worker_num = nproc_per_node x nnodes`) goes through a `Values` renderer, so a script keeps
`$(($GPUS_PER_NODE*$NNODES))` instead of a number frozen at translation time.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Union

from mmrun.launchers.options import BY_LAUNCHER, MSRUN, TORCHRUN, LauncherOption

Value = Union[str, bool]  # text, or True for a flag that takes no value

# mmrun's own msrun defaults (msrun's differ: no join, no log dir); see docs/launcher.md.
MSRUN_DEFAULT_LOG_DIR = "msrun_log"
MSRUN_DEFAULT_JOIN = "True"
C10D_DEFAULT_PORT = "29400"  # torchrun's port when --rdzv-endpoint names only a host

# rdzv_conf keys: join_timeout maps onto msrun; these only tune torchrun's rendezvous and can be dropped.
RDZV_CONF_DROPPABLE = frozenset({"read_timeout", "last_call_timeout", "close_timeout", "timeout", "is_host", "use_libuv"})


@dataclass(frozen=True)
class Note:
    flag: str
    value: Value | None
    message: str
    level: str = "info"  # "info" (harmless drop/rename) or "warning" (dropped under --on-unsupported warn)

    def __str__(self) -> str:
        return f"{_show(self.flag, self.value)}: {self.message}"


@dataclass(frozen=True)
class Refusal:
    flag: str
    value: Value | None
    target: str
    reason: str
    hint: str

    def __str__(self) -> str:
        return f"{_show(self.flag, self.value)} cannot run under {self.target}: {self.reason}; {self.hint}"


class UntranslatableOptions(ValueError):
    """Raised by `Translation.raise_for_refusals`; one line per refused option."""

    def __init__(self, refusals: list[Refusal]):
        self.refusals = refusals
        super().__init__("\n".join(str(r) for r in refusals))


@dataclass
class Translation:
    target: str  # TORCHRUN or MSRUN
    options: list[tuple[LauncherOption, Value]] = field(default_factory=list)
    module: bool = False  # run SCRIPT as a module (-m); msrun needs mmrun's worker bootstrap for it
    env: dict[str, str] = field(default_factory=dict)  # variables to export for the workers
    notes: list[Note] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    # Target options filled in from defaults rather than from what was given (`mmrun translate` writes only
    # the ones whose defaults differ between the launchers).
    defaulted: set[str] = field(default_factory=set)

    def value(self, dest: str) -> Value | None:
        for option, value in self.options:
            if option.dest == dest:
                return value
        return None

    def set(self, dest: str, value: Value) -> None:
        """Set or replace one target option (e.g. a free port picked at launch)."""
        option = BY_LAUNCHER[self.target][dest]
        for i, (existing, _) in enumerate(self.options):
            if existing.dest == dest:
                self.options[i] = (option, value)
                return
        self.options.append((option, value))

    def argv(self) -> list[str]:
        out: list[str] = []
        for option, value in self.options:
            out.append(option.canonical_flag)
            if option.takes_value:
                out.append(str(value))
        return out

    def raise_for_refusals(self) -> None:
        if self.refusals:
            raise UntranslatableOptions(self.refusals)


class Values:
    """Arithmetic on option values. Literal integers are computed; anything else becomes shell arithmetic."""

    def product(self, a: str, b: str) -> str:
        if _is_int(a) and _is_int(b):
            return str(int(a) * int(b))
        if _is_int(b) and int(b) == 1:
            return a
        return f"$(({_arith(a)}*{_arith(b)}))"

    def quotient(self, a: str, b: str, what: str) -> str:
        if _is_int(a) and _is_int(b):
            if int(b) <= 0 or int(a) % int(b):
                raise ValueError(f"{what}: {a} is not a multiple of {b}; give a total that divides evenly")
            return str(int(a) // int(b))
        if _is_int(b) and int(b) == 1:
            return a
        return f"$(({_arith(a)}/{_arith(b)}))"

    def standalone_port(self) -> str:
        """The master port a --standalone job gets; "0" means: pick a free port at launch."""
        return "0"


def _is_int(text: str) -> bool:
    return bool(re.fullmatch(r"-?\d+", text.strip()))


def _arith(text: str) -> str:
    """An operand for $(( )): `$(( X ))` nests as its inner expression; `$X`/`${X}` stay as written."""
    inner = re.fullmatch(r"\$\(\((.*)\)\)", text.strip(), flags=re.S)
    return f"({inner.group(1)})" if inner else text.strip()


def _show(flag: str, value: Value | None) -> str:
    return flag if value is None or value is True else f"{flag} {value}"


# ----------------------------------------------------------------------------------------------
# Rules. Each takes (context, option, value) and writes into the Translation through the context.


@dataclass
class _Context:
    given: Mapping[str, Value]
    spelled: Mapping[str, str]
    values: Values
    out: Translation

    def flag(self, dest: str) -> str:
        if dest in self.spelled:
            return self.spelled[dest]
        option = BY_LAUNCHER[TORCHRUN].get(dest) or BY_LAUNCHER[MSRUN][dest]
        return option.canonical_flag

    def emit(self, dest: str, value: Value) -> None:
        self.out.set(dest, value)

    def note(self, dest: str, value: Value | None, message: str) -> None:
        self.out.notes.append(Note(self.flag(dest), value, message))

    def refuse(self, dest: str, value: Value | None, reason: str, hint: str) -> None:
        self.out.refusals.append(Refusal(self.flag(dest), value, self.out.target, reason, hint))


Rule = Callable[[_Context, LauncherOption, Value], None]


def _same(ctx: _Context, option: LauncherOption, value: Value) -> None:
    if option.dest == "module":
        ctx.out.module = True
    else:
        ctx.emit(option.dest, value)


def _ignore(ctx: _Context, option: LauncherOption, value: Value) -> None:
    ctx.note(option.dest, value, f"has no {ctx.out.target} equivalent and does not change the job's result; dropped ({option.help})")


def _refuse(ctx: _Context, option: LauncherOption, value: Value) -> None:
    hints = {
        "no_python": "run a Python training script instead",
        "run_path": "drop --run-path: mmrun starts each worker with the same interpreter anyway",
        "numa_binding": "use msrun's --bind_numa True, or drop it",
        "virtual_local_rank": "drop it and select devices per LOCAL_RANK",
        "local_addr": "drop it; msrun binds to the address that reaches --master_addr",
        "logs_specs": "drop it; msrun writes <log_dir>/worker_<rank>.log",
        "duplicate_stdout_filters": "drop it; msrun writes every worker's output to <log_dir>/worker_<rank>.log",
        "duplicate_stderr_filters": "drop it; msrun writes every worker's output to <log_dir>/worker_<rank>.log",
        "sim_level": "run the dry run with msrun itself, or drop it",
        "sim_rank_id": "run the dry run with msrun itself, or drop it",
        "rank_table_file": "drop it; torchrun forms the group from --master-addr/--master-port",
    }
    ctx.refuse(option.dest, value, f"{option.help}, which {ctx.out.target} cannot do", hints.get(option.dest, "drop it"))


# --- torchrun -> msrun ---------------------------------------------------------------------------


def _nproc_per_node(ctx: _Context, option: LauncherOption, value: Value) -> None:
    if str(value) in ("auto", "cpu", "gpu", "xpu"):
        ctx.refuse(option.dest, value, "msrun needs a worker count", "pass a number (mmrun resolves auto|cpu|gpu when it launches)")
        return
    ctx.emit("local_worker_num", value)


def _nnodes(ctx: _Context, option: LauncherOption, value: Value) -> None:
    text = str(value)
    if ":" in text:
        low, _, high = text.partition(":")
        if low != high:
            ctx.refuse(option.dest, value, "elastic node ranges need torchrun's elastic agent and msrun has no elastic mode", "pass a fixed node count")
            return
        text = low
    if "worker_num" in ctx.given:
        return  # an explicit msrun total wins; checked for consistency in to_msrun
    nproc = str(ctx.given.get("nproc_per_node", ctx.given.get("local_worker_num", "1")))
    ctx.emit("worker_num", ctx.values.product(nproc, text))


def _rdzv_backend(ctx: _Context, option: LauncherOption, value: Value) -> None:
    if str(value) in ("static", "c10d"):
        ctx.note(option.dest, value, "msrun's scheduler on --master_addr/--master_port takes the rendezvous role; dropped")
    else:
        ctx.refuse(option.dest, value, "msrun has no external rendezvous store", "use --master-addr/--master-port (static rendezvous)")


def _rdzv_endpoint(ctx: _Context, option: LauncherOption, value: Value) -> None:
    text = str(value)
    if not text:
        return
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, C10D_DEFAULT_PORT
    ctx.emit("master_addr", host)
    ctx.emit("master_port", port)


def _rdzv_conf(ctx: _Context, option: LauncherOption, value: Value) -> None:
    for item in filter(None, str(value).split(",")):
        key, _, setting = item.partition("=")
        if key == "join_timeout":
            ctx.emit("cluster_time_out", setting)
        elif key in RDZV_CONF_DROPPABLE:
            ctx.note(option.dest, item, "tunes torchrun's rendezvous only; dropped")
        else:
            ctx.refuse(option.dest, item, f"rendezvous setting {key!r} has no msrun equivalent", "drop it (join_timeout is the one msrun understands, as --cluster_time_out)")


def _standalone(ctx: _Context, option: LauncherOption, value: Value) -> None:
    ctx.emit("master_addr", "127.0.0.1")
    ctx.emit("master_port", ctx.values.standalone_port())


def _max_restarts(ctx: _Context, option: LauncherOption, value: Value) -> None:
    if str(value).strip() not in ("0", ""):
        ctx.refuse(option.dest, value, "msrun does not restart failed workers", "pass --max-restarts 0 and restart the job from its last checkpoint (--load)")


def _stdio_files(ctx: _Context, option: LauncherOption, value: Value) -> None:
    if str(value).strip() != "0":
        ctx.refuse(option.dest, value, "msrun always writes each worker's output to <log_dir>/worker_<rank>.log and chooses the console copy itself", "drop it (--tail_worker_log picks the rank shown on the console)")


def _local_ranks_filter(ctx: _Context, option: LauncherOption, value: Value) -> None:
    text = str(value).strip()
    if not text:
        return
    if _is_int(text):
        ctx.emit("tail_worker_log", text)
    else:
        ctx.refuse(option.dest, value, "msrun can show one rank's log on the console, not a list", "pass a single local rank")


# --- msrun -> torchrun ---------------------------------------------------------------------------


def _local_worker_num(ctx: _Context, option: LauncherOption, value: Value) -> None:
    ctx.emit("nproc_per_node", value)


def _worker_num(ctx: _Context, option: LauncherOption, value: Value) -> None:
    if "nnodes" in ctx.given:
        return  # an explicit torchrun node count wins; checked for consistency in to_torchrun
    nproc = str(ctx.given.get("local_worker_num", ctx.given.get("nproc_per_node", "1")))
    try:
        ctx.emit("nnodes", ctx.values.quotient(str(value), nproc, "--worker_num"))
    except ValueError as error:
        ctx.refuse(option.dest, value, str(error).split(": ", 1)[1], "make --worker_num a multiple of --local_worker_num")


def _join(ctx: _Context, option: LauncherOption, value: Value) -> None:
    if str(value) != "True":
        ctx.note(option.dest, value, "torchrun always waits for its workers")


def _cluster_time_out(ctx: _Context, option: LauncherOption, value: Value) -> None:
    ctx.emit("rdzv_conf", f"join_timeout={value}")


def _tail_worker_log(ctx: _Context, option: LauncherOption, value: Value) -> None:
    if str(value).strip() not in ("-1", ""):
        ctx.emit("local_ranks_filter", value)


RULES: dict[str, Rule] = {
    "same": _same,
    "ignore": _ignore,
    "refuse": _refuse,
    "nproc_per_node": _nproc_per_node,
    "nnodes": _nnodes,
    "rdzv_backend": _rdzv_backend,
    "rdzv_endpoint": _rdzv_endpoint,
    "rdzv_conf": _rdzv_conf,
    "standalone": _standalone,
    "max_restarts": _max_restarts,
    "stdio_files": _stdio_files,
    "local_ranks_filter": _local_ranks_filter,
    "local_worker_num": _local_worker_num,
    "worker_num": _worker_num,
    "join": _join,
    "cluster_time_out": _cluster_time_out,
    "tail_worker_log": _tail_worker_log,
}

_MSRUN_ORDER = ("local_worker_num", "worker_num", "master_addr", "master_port", "node_rank", "log_dir", "join")
_TORCHRUN_ORDER = ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port")


def _source_launcher(dest: str, target: str) -> str:
    """Which table an option is read from: the target's own options pass through untouched."""
    if dest in BY_LAUNCHER[target]:
        return target
    return MSRUN if target == TORCHRUN else TORCHRUN


def _translate(given: Mapping[str, Value], target: str, spelled: Mapping[str, str] | None, values: Values | None) -> Translation:
    ctx = _Context(given, spelled or {}, values or Values(), Translation(target))
    for dest, value in given.items():
        source = _source_launcher(dest, target)
        option = BY_LAUNCHER[source].get(dest)
        if option is None:
            raise KeyError(f"unknown launcher option {dest!r}")
        if source == target:
            _same(ctx, option, value)
        else:
            RULES[option.to_other](ctx, option, value)
    return ctx.out


def _order(out: Translation, first: tuple[str, ...]) -> None:
    rank = {dest: i for i, dest in enumerate(first)}
    out.options.sort(key=lambda item: rank.get(item[0].dest, len(rank)))


def to_msrun(given: Mapping[str, Value], *, spelled: Mapping[str, str] | None = None, values: Values | None = None) -> Translation:
    """msrun options for a job given in torchrun and/or msrun options.

    msrun's defaults differ from torchrun's (8 workers, port 8118, automatic node rank), so every
    distributed setting is written explicitly; `--join True` and `--log_dir msrun_log` are added
    unless given, and LOCAL_WORLD_SIZE is exported (msrun does not set it).
    """
    out = _translate(given, MSRUN, spelled, values)
    vals = values or Values()
    defaults = {
        "local_worker_num": "1",
        "master_addr": "127.0.0.1",
        "master_port": "29500",
        "node_rank": "0",
        "log_dir": MSRUN_DEFAULT_LOG_DIR,
        "join": MSRUN_DEFAULT_JOIN,
    }
    for dest, default in defaults.items():
        if out.value(dest) is None:
            out.set(dest, default)
            out.defaulted.add(dest)
    if out.value("worker_num") is None:
        out.set("worker_num", vals.product(str(out.value("local_worker_num")), "1"))
        out.defaulted.add("worker_num")
    _check_total(out, given)
    out.env["LOCAL_WORLD_SIZE"] = str(out.value("local_worker_num"))
    _order(out, _MSRUN_ORDER)
    return out


def to_torchrun(given: Mapping[str, Value], *, spelled: Mapping[str, str] | None = None, values: Values | None = None) -> Translation:
    """torchrun options for a job given in msrun and/or torchrun options (torchrun's own pass through)."""
    if "worker_num" in given and not {"local_worker_num", "nproc_per_node"} & given.keys():
        # A job given in msrun's terms gets msrun's default of 8 workers per node, not torchrun's 1.
        given = {"local_worker_num": BY_LAUNCHER[MSRUN]["local_worker_num"].default, **given}
    out = _translate(given, TORCHRUN, spelled, values)
    # log_dir is spelled alike in both launchers; mmrun's own msrun default is not a user choice.
    if out.value("log_dir") == MSRUN_DEFAULT_LOG_DIR:
        out.options = [(o, v) for o, v in out.options if o.dest != "log_dir"]
    if str(out.value("node_rank")) == "-1":  # msrun's automatic node rank; torchrun needs a number
        out.set("node_rank", "0")
        out.notes.append(Note("--node_rank", "-1", "automatic node rank; torchrun uses 0 (give each node its own --node-rank)"))
    _order(out, _TORCHRUN_ORDER)
    return out


def _check_total(out: Translation, given: Mapping[str, Value]) -> None:
    """An explicit --worker_num must agree with nproc x nnodes when both are literal numbers."""
    nnodes, total, local = str(given.get("nnodes", "")), str(out.value("worker_num")), str(out.value("local_worker_num"))
    if "worker_num" in given and _is_int(nnodes) and _is_int(total) and _is_int(local) and int(local) * int(nnodes) != int(total):
        out.refusals.append(Refusal("--worker_num", total, MSRUN, f"it disagrees with --nproc-per-node {local} x --nnodes {nnodes}", "give one of them, or make them agree"))
