"""Launch lines the rewrite cannot reach: inside `eval`, a variable, a heredoc or a quoted command string.

`eval "torchrun ..."`, `CMD="torchrun ..."; $CMD`, `bash -c '...'`, `ssh node "torchrun ..."` and
`cat > run.sh <<EOF ... EOF` all start (or write) a launch that is text to the parser, not a command.
Rewriting text inside text is guesswork, so they are left alone, and reported: a warning naming the line,
and `--check` fails, so that CI does not take a half-translated script for a finished one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from mmrun.launchers.options import MSRUN, TORCHRUN
from mmrun.launchers.translate.launch_forms import MODULES
from mmrun.launchers.translate.parse import Node, Script
from mmrun.launchers.translate.rules import MMRUN

# Executable names per launcher translated from (mmrun lines are translated as torchrun's).
_NAMES: dict[str, tuple[str, ...]] = {TORCHRUN: (TORCHRUN, MMRUN), MSRUN: (MSRUN,)}
_TEXT_NODES = frozenset({"string", "raw_string", "ansi_c_string", "heredoc_body"})
_EVALUATORS = frozenset({"eval"})  # commands whose plain words are run as a command line


@dataclass(frozen=True)
class HiddenLaunch:
    offset: int  # where the launcher is named
    launcher: str  # the form found: torchrun, python -m torch.distributed.run, ...
    where: str  # "inside eval", "in the variable CMD", ...

    @property
    def message(self) -> str:
        return (f"a {self.launcher} launch line {self.where} is not translated: mmrun translate rewrites launch lines written "
                f"as commands, never text that runs later. Translate it by hand, or write it as a command")


def _pattern(source_launcher: str) -> re.Pattern[bytes]:
    names = "|".join(re.escape(n) for n in _NAMES[source_launcher])
    modules = "|".join(re.escape(m) for m, (launcher, _) in MODULES.items() if launcher == source_launcher)
    # A launcher word starting a command (line start, after ; & | ( ` or a quote, after `env`-style prefixes and
    # paths), followed by an option, an expansion or a .py script: `echo "torchrun finished"` is no launch.
    executable = rf"(?:^|(?<=[\s;&|(`'\"]))(?:[\w./-]*/)?(?P<name>{names})(?=[ \t]+(?:-|\$|[\"']?[\w./-]+\.py\b))"
    module = rf"(?:^|(?<=[\s;&|(`'\"]))(?:[\w./-]*/)?(?P<python>python[0-9.]*)(?:[ \t]+-[A-Za-z]+)*[ \t]+-m[ \t]+(?P<module>{modules})\b"
    return re.compile(f"{executable}|{module}".encode(), re.M)


def find_hidden_launches(script: Script, source_launcher: str) -> list[HiddenLaunch]:
    """Launch lines of `source_launcher` inside text: each outermost string, heredoc, eval or variable value once."""
    pattern = _pattern(source_launcher)
    found: list[HiddenLaunch] = []
    stack: list[tuple[Node, str | None]] = [(script.root, None)]
    while stack:
        node, variable = stack.pop()
        where = _where(script, node, variable)
        if where is not None:
            match = pattern.search(script.source, node.start_byte, node.end_byte)
            if match is not None and match.group("name"):
                found.append(HiddenLaunch(match.start("name"), match.group("name").decode(), where))
            elif match is not None:
                found.append(HiddenLaunch(match.start("python"), f"python -m {match.group('module').decode()}", where))
            continue  # text nested in this text is part of it
        if node.type == "variable_assignment":
            name = node.child_by_field_name("name")
            variable = script.node_text(name) if name is not None else None
            named = _launcher_named(script, node, source_launcher)
            if named is not None and variable:
                found.append(HiddenLaunch(named[0], named[1], f"named by the variable {variable} (`${variable} ...` runs it)"))
        stack.extend((child, variable) for child in reversed(node.children))
    return sorted(found, key=lambda hidden: hidden.offset)


def _where(script: Script, node: Node, variable: str | None) -> str | None:
    """How a launch inside `node` is hidden, or None when `node` is no text that runs later."""
    if node.type == "heredoc_body":
        return "inside a heredoc (translate the script it writes or feeds on its own)"
    if node.type == "command":
        name = node.child_by_field_name("name")
        if name is not None and script.node_text(name) in _EVALUATORS:
            return "inside eval"
        return None
    if node.type in _TEXT_NODES:
        return f"in the variable {variable}" if variable else "inside a quoted string (bash -c, ssh, ...)"
    if node.type == "array" and variable:
        return f"in the array {variable}"
    return None


def _launcher_named(script: Script, assignment: Node, source_launcher: str) -> tuple[int, str] | None:
    """(offset, launcher) for `LAUNCHER=torchrun` or `LAUNCHER=/opt/bin/torchrun`: the launcher's name alone in a variable."""
    value = assignment.child_by_field_name("value")
    if value is None or value.type not in ("word", "string", "raw_string") or value.end_byte - value.start_byte > 256:
        return None
    name = script.node_text(value).strip("\"'").strip().rsplit("/", 1)[-1]
    return (value.start_byte, name) if name in _NAMES[source_launcher] else None
