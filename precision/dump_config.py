"""--dump-config: msprobe's config.json, the part mmrun implements (level L0: modules).

    {"task": "statistics", "level": "L0", "dump_path": "./dump", "step": [0, 2], "rank": [],
     "statistics": {"scope": [], "list": []}}

As msprobe: `step` and `rank` empty mean every step/rank; `scope` (two record names: dump from the first
to the second, in execution order) and `list` (substrings of record or module names) filter the modules,
empty means all; they are read from the task's section ("statistics" or "tensor") or the top level.
A step is a training iteration counted from 0 (step 0 = iteration 1), as msprobe's debugger.step() counts.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

TASKS = ("statistics", "tensor")
LEVELS = ("L0",)  # modules; msprobe's L1 (every API call) and mix are not implemented
KNOWN_KEYS = {"task", "level", "dump_path", "step", "rank", "scope", "list", "statistics", "tensor",
              "is_deterministic", "enable_dataloader", "acl_config", "seed", "framework"}


class DumpConfigError(ValueError):
    exit_code = 2


@dataclass(frozen=True)
class DumpConfig:
    task: str = "statistics"
    level: str = "L0"
    dump_path: str = "./dump"
    steps: tuple[int, ...] = ()
    ranks: tuple[int, ...] = ()
    scope: tuple[str, ...] = ()
    names: tuple[str, ...] = ()  # msprobe's "list"
    source: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    def wants_step(self, step: int) -> bool:
        return not self.steps or step in self.steps

    def wants_rank(self, rank: int) -> bool:
        return not self.ranks or rank in self.ranks

    @property
    def last_step(self) -> int | None:
        return max(self.steps) if self.steps else None


def _int_list(path: str, key: str, value) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise DumpConfigError(f"--dump-config {path}: '{key}' must be a list of integers >= 0 (empty: all). "
                              f"Received: {value!r}")
    return tuple(sorted(set(value)))


def _str_list(path: str, key: str, value) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DumpConfigError(f"--dump-config {path}: '{key}' must be a list of names (empty: all). Received: {value!r}")
    return tuple(value)


def load_dump_config(path: str) -> DumpConfig:
    """Read and check a config.json; DumpConfigError (exit 2) names the key and what it holds."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise DumpConfigError(f"--dump-config {path}: cannot be read ({err.strerror}); pass msprobe's config.json") from None
    except json.JSONDecodeError as err:
        raise DumpConfigError(f"--dump-config {path}: not JSON ({err.msg} at line {err.lineno}); pass msprobe's "
                              "config.json") from None
    if not isinstance(data, dict):
        raise DumpConfigError(f"--dump-config {path}: must hold a JSON object. Received: {type(data).__name__}")
    unknown = sorted(set(data) - KNOWN_KEYS)
    if unknown:
        raise DumpConfigError(f"--dump-config {path}: unknown key(s) {', '.join(unknown)}; known: "
                              f"{', '.join(sorted(KNOWN_KEYS))}")
    task = data.get("task", "statistics")
    if task not in TASKS:
        raise DumpConfigError(f"--dump-config {path}: 'task' must be one of {', '.join(TASKS)} (mmrun dumps modules' "
                              f"statistics or tensors). Received: {task!r}")
    level = data.get("level", "L0")
    if level not in LEVELS:
        raise DumpConfigError(f"--dump-config {path}: 'level' must be L0 (modules); msprobe's L1 and mix (every API "
                              f"call) are not implemented by mmrun. Received: {level!r}")
    section = data.get(task) or {}
    if not isinstance(section, dict):
        raise DumpConfigError(f"--dump-config {path}: '{task}' must be an object. Received: {section!r}")
    # msprobe's other keys there (data_mode, summary_mode, ...) are accepted: mmrun dumps all of the data.
    scope = _str_list(path, "scope", section.get("scope", data.get("scope")))
    if len(scope) not in (0, 2):
        raise DumpConfigError(f"--dump-config {path}: 'scope' holds two names (from, to) or none. Received: {list(scope)}")
    dump_path = data.get("dump_path", "./dump")
    if not isinstance(dump_path, str) or not dump_path:
        raise DumpConfigError(f"--dump-config {path}: 'dump_path' must be a directory name. Received: {dump_path!r}")
    return DumpConfig(task=task, level=level, dump_path=dump_path,
                      steps=_int_list(path, "step", data.get("step")), ranks=_int_list(path, "rank", data.get("rank")),
                      scope=scope, names=_str_list(path, "list", section.get("list", data.get("list"))), source=path)
