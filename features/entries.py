"""Which layers of the table judge a script: the stack always, mmrun's trainer only for mmrun's own entry.

Most launch scripts start the user's own Megatron/MindSpeed entry (`pretrain_gpt.py` of Megatron-LM,
`pretrain_vlm.py` of MindSpeed-MM, ...): what mmrun's trainer implements says nothing about them.
The script is recognised by its path or module name only; it is never opened or run.
"""
from __future__ import annotations

import re
from typing import Iterable

from mmrun.features.table import STACK, TRAINER

# mmrun's trainer as a launch line names it: a path ending in one of these, or this module (-m).
TRAINER_PATHS: tuple[str, ...] = ("models/pretrain_gpt.py", "models/pretrain_vlm.py")
TRAINER_MODULES: tuple[str, ...] = ("mmrun.models.pretrain_gpt", "mmrun.models.pretrain_vlm")


def is_mmrun_trainer(script: str) -> bool:
    """Whether a launch line's script (path or module, quotes already removed) is mmrun's trainer."""
    text = script.strip().strip("'\"")
    if text in TRAINER_MODULES:
        return True
    path = re.sub(r"/+", "/", text.replace("\\", "/"))
    return any(path == entry or path.endswith("/" + entry) for entry in TRAINER_PATHS)


def layers_for_scripts(scripts: Iterable[str]) -> tuple[str, ...]:
    """The layers to check for a launch line whose script is one of `scripts` (if/else alternatives)."""
    return (STACK, TRAINER) if any(is_mmrun_trainer(s) for s in scripts) else (STACK,)
