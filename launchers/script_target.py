"""The training script mmrun is asked to run: where it is, and whether it takes `--ai-framework`.

mmrun always exports MMRUN_AI_FRAMEWORK; the argument `--ai-framework X` is added to the script's own
arguments only where the script accepts it, because a plain argparse script stops with
`unrecognized arguments: --ai-framework pytorch`. The rule for `--framework-arg auto` (the default):
the script takes it when its source names the option (`--ai-framework` or `ai_framework`, as
mmrun's own models/pretrain_gpt.py does), or imports a package whose argument parser declares it:
MindSpeed's feature manager registers `--ai-framework` for every MindSpeed-based script, and
`mmrun.training` declares it in Megatron's arguments. The file is read as text, never imported.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from mmrun.backend.errors import UsageError

# packages whose argument parser declares --ai-framework for the scripts that import them
FRAMEWORK_ARG_PACKAGES: tuple[str, ...] = ("mindspeed", "mindspeed_llm", "mindspeed_mm", "mindspeed_rl", "mmrun.training")
FRAMEWORK_ARG_MODES: tuple[str, ...] = ("auto", "always", "never")
_NAMES_OPTION = re.compile(r"--ai[-_]framework|\bai_framework\b")
_IMPORTS_PACKAGE = re.compile(
    r"^\s*(?:from|import)\s+(?:" + "|".join(re.escape(p) for p in FRAMEWORK_ARG_PACKAGES) + r")\b", re.MULTILINE)


def locate(script: str, as_module: bool, cwd: str | None = None, path: list[str] | None = None) -> Path:
    """The file that will run; a UsageError naming what was looked for when there is none."""
    base = Path(cwd or os.getcwd())
    if not as_module:
        found = base / script
        if found.is_file():
            return found
        what = "is a directory" if found.is_dir() else "does not exist"
        raise UsageError(f"SCRIPT {script} {what} (looked in {base}); pass the path of the training script")
    # python -m looks in the working directory first, then on the path; the module is not imported here
    parts = script.split(".")
    for root in [base, *map(Path, path if path is not None else sys.path[1:])]:
        folder = root.joinpath(*parts[:-1])
        for candidate in (folder / f"{parts[-1]}.py", folder / parts[-1] / "__main__.py"):
            if candidate.is_file():
                return candidate
    raise UsageError(f"-m {script}: no module {script} found in {base} or on the Python path; "
                     "pass an importable module name (as for python -m)")


def takes_framework_arg(source: str) -> bool:
    """The auto rule, on the script's source text."""
    return bool(_NAMES_OPTION.search(source) or _IMPORTS_PACKAGE.search(source))


def read_source(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise UsageError(f"SCRIPT {path} cannot be read ({error.strerror}); check its permissions") from None
