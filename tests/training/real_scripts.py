"""MindSpeed-MM's real launch scripts (tests/fixtures/mindspeed_mm/, Ascend/MindSpeed-MM at 57069cd5) read as
`mmrun translate` reads them, and the edits a user makes to run one on tiny files, in one place.

`launch_line` parses the script with tree-sitter-bash (never runs it); a `${VAR}` inside a flag string takes the
script's own literal `VAR=value` (the TP/PP/CP sizes), as the shell would. tests/features/test_mindspeed_mm_scripts.py
checks these arguments with the gate; tests/training/test_mindspeed_mm_real_scripts.py runs them.

The user's edits (`user_edits`): the launcher becomes `mmrun --ai-framework X` with a process count, the entry
becomes mmrun's entry of the same name (models/<entry>), and the values of the flags that name this machine's job
(paths, the number of iterations, the batch sizes a world size implies, the vocabulary size of the tiny tokenizer)
are set; every other flag stays as the script has it. The json/yaml files are copied and shrunk (`shrink`: sizes
only, every key kept, no key added).
"""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from mmrun.launchers.translate.launch_forms import find_launches, read_args
from mmrun.launchers.translate.parse import parse_script
from mmrun.launchers.translate.words import Definitions, Words
from mmrun.training.yaml_launch import gpt_args_of, to_argv

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "mindspeed_mm"
FRAMEWORKS = {"torchrun": "pytorch", "msrun": "mindspore"}
_LITERAL = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=([^\s$`\"'()]+)\s*$", re.M)
_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def _as_written(path: Path) -> tuple[str, str, list[str]]:
    script = parse_script(path.read_bytes(), str(path))
    words = Words(script, Definitions(script))
    launches = find_launches(script, words)
    assert len(launches) == 1, f"{path}: {len(launches)} launch lines"
    launch = launches[0]
    parsed = read_args(launch, [w for arg in launch.args for w in words.expand(arg, union=True)[0]])
    literal = dict(_LITERAL.findall(path.read_text(encoding="utf-8")))
    args = [w.text if w.static else _VARIABLE.sub(lambda m: literal.get(m.group(1), m.group(0)), w.text)
            for w in parsed.training]
    return launch.launcher, Path(parsed.script.text).name, args


def launch_line(path: Path) -> tuple[str, str, list[str]]:
    """(launcher, entry file name, training arguments) of the script's one launch line."""
    launcher, entry, args = _as_written(path)
    if yaml_of(path):  # pretrain_transformers.py's single YAML: its gpt_args are the flags
        args = to_argv(gpt_args_of(FIXTURES / yaml_of(path))) + args[1:]
    return launcher, entry, args


def yaml_of(path: Path) -> str | None:
    """The single YAML of a pretrain_transformers.py launch line, as a path under FIXTURES, or None."""
    args = _as_written(path)[2]
    return args[0].removeprefix("examples/") if args and args[0].endswith(".yaml") else None


def set_flags(args: list[str], values: dict[str, Any]) -> list[str]:
    """`args` with each flag of `values` set: its value words (all up to the next flag: the scripts' unquoted
    placeholder paths are several words) replaced by the one value, a flag the script lacks appended, None drops
    the flag, True leaves a switch alone (appended when missing)."""
    out: list[str] = []
    seen: set[str] = set()
    i = 0
    while i < len(args):
        word = args[i]
        j = i + 1
        while j < len(args) and not args[j].startswith("--"):
            j += 1
        if word in values:
            seen.add(word)
            value = values[word]
            if value is True:
                out += args[i:j]
            elif value is not None:
                out += [word, str(value)]
        else:
            out += args[i:j]
        i = j
    for flag, value in values.items():
        if flag not in seen and value is not None:
            out += [flag] if value is True else [flag, str(value)]
    return out


def flag_value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


def shrink(raw: Any, sizes: dict[str, Any]) -> Any:
    """A copy of a MindSpeed-MM json/yaml with the values at the dotted paths of `sizes` that the file has
    replaced (one table serves the 7B and 72B files, whose keys differ a little): a shrink changes values, it never
    adds or drops a key."""
    out = copy.deepcopy(raw)
    for dotted, value in sizes.items():
        node = out
        *parents, last = dotted.split(".")
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and last in node:
            node[last] = value
    return out
