"""Find launch commands in a script and read their launcher options, wherever the script wrote them.

Recognised: `torchrun`, `python -m torch.distributed.run`, `python -m torch.distributed.launch` (legacy),
`msrun`, `python -m mindspore.parallel.cluster.run`, and `mmrun` (torchrun's and msrun's options plus mmrun's
own, like the `mmrun` launcher; `mmrun SUBCOMMAND` is no launch); behind env prefixes (`PYTHONPATH=... torchrun`),
wrappers (`nohup`, `exec`, `env A=1`), inside pipelines (`... 2>&1 | tee log`), with options literal,
in `$VAR` (a string split into words) or `"${VAR[@]}"` (an array), both spellings, `=` or space.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from mmrun.launchers.cli import ALIASES, SUBCOMMANDS
from mmrun.launchers.options import BY_LAUNCHER, MSRUN, TORCHRUN, LauncherOption, find_option
from mmrun.launchers.translate.parse import Node, Script, decode, encode
from mmrun.launchers.translate.rules import MMRUN, MMRUN_OPTIONS
from mmrun.launchers.translate.words import Container, Word, Words

# How each launcher can be invoked: executable names and `python -m` modules.
EXECUTABLES: dict[str, str] = {"torchrun": TORCHRUN, "msrun": MSRUN, "mmrun": TORCHRUN}
MODULES: dict[str, tuple[str, str]] = {  # module -> (launcher, form)
    "torch.distributed.run": (TORCHRUN, "python -m torch.distributed.run"),
    "torch.distributed.launch": (TORCHRUN, "python -m torch.distributed.launch"),
    "mindspore.parallel.cluster.run": (MSRUN, "python -m mindspore.parallel.cluster.run"),
}
# Commands that run their arguments as a command: the launcher is the first word after their own options.
WRAPPERS: dict[str, dict[str, int]] = {  # wrapper -> its options and how many values each takes
    "nohup": {},
    "exec": {"-a": 1, "-c": 0, "-l": 0},
    "env": {"-i": 0, "-u": 1, "--ignore-environment": 0, "--unset": 1},
    "time": {"-p": 0},
    "stdbuf": {"-i": 1, "-o": 1, "-e": 1},
}
# Commands that start a program somewhere among their arguments, with options we do not model (srun -N 2,
# numactl --cpunodebind=0, timeout 3600): the launcher is the first argument that names one.
SCANNED_WRAPPERS: frozenset[str] = frozenset({"srun", "numactl", "taskset", "timeout", "nice", "ionice", "chrt"})
# Python's own options before `-m` (values they take).
PYTHON_OPTIONS: dict[str, int] = {"-u": 0, "-O": 0, "-OO": 0, "-B": 0, "-E": 0, "-s": 0, "-S": 0, "-I": 0, "-b": 0, "-X": 1, "-W": 1}
# torch.distributed.launch's own flag on top of torchrun's options.
LEGACY_LAUNCH_FLAGS = ("--use-env", "--use_env")


@dataclass
class OptionUse:
    """One launcher option as written: a flag word and its value (the next word, or after `=` in the same word)."""

    option: LauncherOption | None  # None: torch.distributed.launch's --use_env
    flag: str
    words: list[Word]
    flag_span: tuple[int, int]
    value: str | bool | None  # text (shell text when not static); True for a flag without value
    value_span: tuple[int, int] | None
    value_word: Word | None
    inline: bool  # --flag=value

    @property
    def dest(self) -> str:
        return self.option.dest if self.option is not None else "use_env"

    @property
    def start(self) -> int:
        return self.words[0].start

    @property
    def end(self) -> int:
        return self.words[-1].end

    @property
    def container(self) -> Container:
        return self.words[0].container


@dataclass
class LauncherArgs:
    """A launch's words split into launcher options, the training script and its arguments (one alternative)."""

    uses: list[OptionUse]
    script: Word | None
    training: list[Word]
    problems: list[tuple[Word, str]] = field(default_factory=list)  # words that block the translation


@dataclass
class Launch:
    launcher: str  # TORCHRUN or MSRUN
    form: str  # "torchrun", "python -m torch.distributed.launch", "msrun", ...
    command: Node
    container: Container
    name_span: tuple[int, int]  # the bytes naming the launcher (`torchrun`, `python -u -m torch.distributed.run`)
    name_word: Word
    args: list[Word]  # the command words after the launcher
    dropped: list[str] = field(default_factory=list)  # python options lost with the `python -m` form

    @property
    def legacy(self) -> bool:
        return self.form.endswith("torch.distributed.launch")

    @property
    def statement(self) -> Node:
        return self.container.statement


# Every launcher executable and module names one of these; a command without them (or a backslash, which may
# hide one: `torchr\un`) is no launch, and is not split into words at all (a script can hold 100k commands).
_LAUNCH_HINTS = (b"run", b"launch", b"\\")


def find_launches(script: Script, words: Words) -> list[Launch]:
    found = []
    for node in script.walk():
        if node.type == "command" and any(script.source.find(hint, node.start_byte, node.end_byte) >= 0 for hint in _LAUNCH_HINTS):
            launch = _launch(script, words, node)
            if launch is not None:
                found.append(launch)
    return found


def _launch(script: Script, words: Words, node: Node) -> Launch | None:
    container = words.command(node)
    if not container.words:
        return None
    position = 0
    # Skip wrappers: `nohup torchrun ...`, `env A=1 torchrun ...`.
    while position < len(container.words):
        name = os.path.basename(container.words[position].text) if container.words[position].static else ""
        if name not in WRAPPERS:
            break
        position += 1
        options = WRAPPERS[name]
        while position < len(container.words):
            text = container.words[position].text
            if name == "env" and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", text, flags=re.S):
                position += 1
            elif text in options:
                position += 1 + options[text]
            else:
                break
    if position < len(container.words) and container.words[position].static \
            and os.path.basename(container.words[position].text) in SCANNED_WRAPPERS:
        position = next((i for i, w in enumerate(container.words) if i > position and w.static
                         and (os.path.basename(w.text) in EXECUTABLES or re.fullmatch(r"python[0-9.]*", os.path.basename(w.text)))),
                        len(container.words))
    if position >= len(container.words):
        return None
    first = container.words[position]
    base = os.path.basename(first.text) if first.static else ""
    if base == MMRUN and position + 1 < len(container.words) and container.words[position + 1].text in {*SUBCOMMANDS, *ALIASES}:
        return None  # `mmrun preprocess-data ...`: a tool, not a launch
    if base in EXECUTABLES:
        return Launch(EXECUTABLES[base], base, node, container, (first.start, first.end), first, container.words[position + 1:])
    # `python [-u ...] -m torch.distributed.run` (the interpreter may be `$PYTHON`).
    index = position + 1
    dropped: list[str] = []
    while index < len(container.words) and container.words[index].text in PYTHON_OPTIONS:
        takes = PYTHON_OPTIONS[container.words[index].text]
        dropped.extend(w.raw for w in container.words[index:index + 1 + takes])
        index += 1 + takes
    if index + 1 < len(container.words) and container.words[index].text == "-m":
        module = container.words[index + 1].text
        if module in MODULES and (re.fullmatch(r"python[0-9.]*", base) or (not first.static and "PYTHON" in first.raw.upper())):
            launcher, form = MODULES[module]
            end_word = container.words[index + 1]
            return Launch(launcher, form, node, container, (first.start, end_word.end), first, container.words[index + 2:], dropped)
    return None


def read_args(launch: Launch, alternative: list[Word]) -> LauncherArgs:
    """Split one alternative of the launch's (expanded) words into launcher options, script, training args."""
    if launch.form == MMRUN:  # as the `mmrun` launcher parses: its own options, then torchrun's, then msrun's
        def lookup(flag: str) -> LauncherOption | None:
            return _find(MMRUN_OPTIONS, flag) or find_option(flag)
    else:
        table = BY_LAUNCHER[launch.launcher]

        def lookup(flag: str) -> LauncherOption | None:
            return _find(table, flag)
    uses: list[OptionUse] = []
    problems: list[tuple[Word, str]] = []
    index = 0
    while index < len(alternative):
        word = alternative[index]
        if word.opaque:
            problems.append((word, f"{word.raw} is not set in the script, so the launcher options it may hold are unknown; define it in the script or write the options out"))
            index += 1
            continue
        if word.problem == "array":
            problems.append((word, f"{word.raw} expands only the first element of the array {word.ref.name if word.ref else ''}; write \"${{{word.ref.name if word.ref else 'ARR'}[@]}}\""))
            index += 1
            continue
        if not word.static and not word.text.startswith("-"):
            break  # the training script, given as an expansion
        text = word.text
        if not text.startswith("-"):
            break
        flag, eq, inline_value = text.partition("=")
        if launch.legacy and flag in LEGACY_LAUNCH_FLAGS:
            uses.append(OptionUse(None, flag, [word], (word.start, word.end), True, None, None, False))
            index += 1
            continue
        option = lookup(flag)
        if option is None and not eq and len(flag) > 2 and not flag.startswith("--"):
            option = lookup(flag[:2])  # -r3: short flag glued to its value
            if option is not None and option.takes_value:
                eq, inline_value, flag = "glued", flag[2:], flag[:2]
        if option is None:
            name = MMRUN if launch.form == MMRUN else launch.launcher
            problems.append((word, f"{flag} is not a{'n' if name == MMRUN else ''} {name} option (received {word.raw}); spell the option out in full, as `{name} --help` lists it"))
            index += 1
            continue
        flag_start = word.start + (1 if word.quote else 0)
        flag_span = (flag_start, flag_start + len(encode(flag)))
        if option.takes_value and eq:
            value_start = flag_span[1] + (0 if eq == "glued" else 1)
            value_end = word.end - (1 if word.quote else 0)
            value_text = inline_value if word.static else _unquoted(decode(encode(word.raw)[value_start - word.start:value_end - word.start]))
            uses.append(OptionUse(option, flag, [word], flag_span, value_text, (value_start, value_end), word, True))
            index += 1
        elif option.takes_value:
            if index + 1 >= len(alternative):
                problems.append((word, f"{flag} needs a value and none follows"))
                index += 1
                continue
            value_word = alternative[index + 1]  # an unset variable is fine here: the value stays shell text
            uses.append(OptionUse(option, flag, [word, value_word], flag_span, value_word.text, (value_word.start, value_word.end), value_word, False))
            index += 2
        else:
            uses.append(OptionUse(option, flag, [word], flag_span, True, None, None, False))
            index += 1
    script_word = alternative[index] if index < len(alternative) else None
    training = alternative[index + 1:] if script_word is not None else []
    return LauncherArgs(uses, script_word, training, problems)


def _find(table: dict[str, LauncherOption], flag: str) -> LauncherOption | None:
    for option in table.values():
        if flag in option.flags:
            return option
    return None


def _unquoted(text: str) -> str:
    """`"$GPUS"` -> `$GPUS`: the value's shell text without the quotes that only wrap it (`--opt="$GPUS"`)."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'" and text[0] not in text[1:-1]:
        return text[1:-1]
    return text
