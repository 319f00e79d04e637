"""What each launcher option's value may be, checked before any launcher starts.

Without these checks a bad value reaches torchrun (a traceback ending in a bare AssertionError for
`--nproc-per-node 0`) or msrun (an error in msrun's own option names). Each check returns None for a
good value, else what a good value looks like; `check_values` turns that into one line per problem,
naming the option as the user spelled it and the value received.

Only `mmrun` checks: `mmrun translate` reads shell scripts whose values are often `$VARIABLES`.
"""
from __future__ import annotations

import re
from typing import Callable, Mapping

from mmrun.launchers.option_rules import Value

NPROC_WORDS = ("auto", "cpu", "gpu", "xpu")  # torchrun's device counts, resolved at launch
MAX_PORT = 65535


def _int(text: str) -> int | None:
    return int(text) if re.fullmatch(r"[+-]?\d+", text.strip()) else None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _at_least(low: int, what: str) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        value = _int(text)
        return None if value is not None and value >= low else f"{what}: a whole number of at least {low}"
    return check


def _nproc(text: str) -> str | None:
    value = _int(text)
    if text in NPROC_WORDS or (value is not None and value >= 1):
        return None
    return f"workers per node: a whole number of at least 1, or one of {'|'.join(NPROC_WORDS)}"


def _nnodes(text: str) -> str | None:
    low, sep, high = text.partition(":")
    first, last = _int(low), _int(high) if sep else _int(low)
    if first is not None and last is not None and 1 <= first <= last:
        return None
    return "number of nodes: a whole number of at least 1, or MIN:MAX with 1 <= MIN <= MAX"


def _port(text: str) -> str | None:
    value = _int(text)
    if value is not None and 0 <= value <= MAX_PORT:
        return None
    return f"a TCP port: a whole number from 1 to {MAX_PORT}, or 0 to pick a free one"


def _endpoint(text: str) -> str | None:
    host, sep, port = text.rpartition(":")
    if not text or (sep and (not host or _int(port) is None or not 1 <= int(port) <= MAX_PORT)):
        return f"HOST or HOST:PORT, with PORT from 1 to {MAX_PORT}"
    return None


def _positive_seconds(text: str) -> str | None:
    value = _number(text)
    return None if value is not None and value > 0 else "seconds: a number above 0"


def _non_negative_seconds(text: str) -> str | None:
    value = _number(text)
    return None if value is not None and value >= 0 else "seconds: a number of at least 0"


def _any_int(text: str) -> str | None:
    return None if _int(text) is not None else "a whole number"


def _std_streams(text: str) -> str | None:
    # torchrun's Std: 0-3 for every rank, or LOCAL_RANK:N,... per rank
    if re.fullmatch(r"[0-3]|\d+:[0-3](,\d+:[0-3])*", text.strip()):
        return None
    return "0 (none), 1 (stdout), 2 (stderr) or 3 (both), or per local rank as 0:1,1:2"


def _ranks(text: str) -> str | None:
    if re.fullmatch(r"\d+(,\d+)*", text.strip()):
        return None
    return "local ranks: a whole number or a comma-separated list of them"


def _bool_word(text: str) -> str | None:
    return None if text in ("True", "False") else "True or False (msrun's spelling)"


def _sim_level(text: str) -> str | None:
    return None if text in ("0", "1", "2", "3") else "0, 1, 2 or 3"


def _worker_ranks(text: str) -> str | None:
    return None if text.strip() == "-1" or _ranks(text) is None else "-1 (none), or ranks as 0 or 0,1"


# option dest -> check; options not listed take any text (names, paths, handler names)
CHECKS: dict[str, Callable[[str], str | None]] = {
    "nnodes": _nnodes,
    "nproc_per_node": _nproc,
    "rdzv_endpoint": _endpoint,
    "max_restarts": _at_least(0, "restarts"),
    "monitor_interval": _positive_seconds,
    "redirects": _std_streams,
    "tee": _std_streams,
    "local_ranks_filter": _ranks,
    "node_rank": _at_least(-1, "node rank (-1: msrun assigns it)"),
    "master_port": _port,
    "shutdown_timeout": _non_negative_seconds,
    "worker_num": _at_least(1, "total workers"),
    "local_worker_num": _at_least(1, "workers on this node"),
    "join": _bool_word,
    "cluster_time_out": _any_int,
    "sim_level": _sim_level,
    "sim_rank_id": _any_int,
    "tail_worker_log": _worker_ranks,
}


def check_values(given: Mapping[str, Value], spelled: Mapping[str, str]) -> list[str]:
    """One line per bad value, naming the option as spelled and the value received; [] when all are good."""
    problems = []
    for dest, value in given.items():
        check = CHECKS.get(dest)
        if check is None or value is True:
            continue
        expected = check(str(value))
        if expected:
            problems.append(f"{_show(spelled.get(dest, '--' + dest), value)}: expected {expected}")
    problems.extend(_node_rank_in_range(given, spelled))
    return problems


def _show(flag: str, value: Value) -> str:
    text = str(value)
    return f"{flag} {text}" if text and not re.search(r"\s", text) else f"{flag} {text!r}"


def _node_count(given: Mapping[str, Value]) -> int | None:
    """Nodes in the job when the options say so with numbers: --nnodes N (or MIN:MAX), or msrun's totals."""
    if "nnodes" in given:
        return _int(str(given["nnodes"]).rpartition(":")[2])
    total, local = _int(str(given.get("worker_num", ""))), _int(str(given.get("local_worker_num", given.get("nproc_per_node", ""))))
    return total // local if total and local and total >= local else None


def _node_rank_in_range(given: Mapping[str, Value], spelled: Mapping[str, str]) -> list[str]:
    rank, nodes = _int(str(given.get("node_rank", ""))), _node_count(given)
    if rank is None or nodes is None or rank < nodes:
        return []
    return [f"{_show(spelled.get('node_rank', '--node-rank'), given['node_rank'])}: expected a node rank from 0 to "
            f"{nodes - 1}, as the job has {nodes} node{'s' if nodes > 1 else ''} (node ranks count from 0)"]
