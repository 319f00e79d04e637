"""Which layers of the table judge a script: the stack always, mmrun's trainer only for mmrun's own entries.

Most launch scripts start the user's own Megatron/MindSpeed entry (`pretrain_gpt.py` of Megatron-LM,
`pretrain_vlm.py` of MindSpeed-MM, ...): what mmrun's trainer implements says nothing about them.
The script is recognised by its path or module name only; it is never opened or run.
"""
from __future__ import annotations

import re
from typing import Iterable

from mmrun.features.table import STACK, TRAINER

# mmrun's entries that run its trainer (training/: the startup gate judges both layers), as a launch line names
# them: a path ending in one of these, or the module (-m). With each, the features the entry implements itself:
# the trainer layer speaks for the training code the entries share, so it is not asked about these (the entry
# passes them to the startup gate; `mmrun features --check --entry` and `mmrun translate` read them here).
TRAINER_ENTRIES: dict[str, tuple[str, ...]] = {
    "models/pretrain_gpt.py": (),
    # LoRA on Qwen2-VL / Qwen2.5-VL, expert parallelism on Qwen3-VL MoE (refused at start-up for a dense model)
    "models/pretrain_vlm.py": ("lora", "expert-parallel", "moe-allgather-dispatcher"),
    "models/pretrain_sora.py": ("lora", "attention-mask-type"),
    "models/pretrain_transformers.py": (),
}
TRAINER_PATHS: tuple[str, ...] = tuple(TRAINER_ENTRIES)
TRAINER_MODULES: tuple[str, ...] = tuple("mmrun." + p.removesuffix(".py").replace("/", ".") for p in TRAINER_PATHS)


def trainer_entry(script: str) -> str | None:
    """The entry of TRAINER_ENTRIES a launch line's script (path or module, quotes already removed) names, or None."""
    text = script.strip().strip("'\"")
    if text in TRAINER_MODULES:
        return TRAINER_PATHS[TRAINER_MODULES.index(text)]
    path = re.sub(r"/+", "/", text.replace("\\", "/"))
    return next((entry for entry in TRAINER_PATHS if path == entry or path.endswith("/" + entry)), None)


def is_mmrun_trainer(script: str) -> bool:
    """Whether a launch line's script (path or module, quotes already removed) is one of mmrun's trainer entries."""
    return trainer_entry(script) is not None


def layers_for_scripts(scripts: Iterable[str]) -> tuple[str, ...]:
    """The layers to check for a launch line whose script is one of `scripts` (if/else alternatives)."""
    return (STACK, TRAINER) if any(is_mmrun_trainer(s) for s in scripts) else (STACK,)


def entry_features(scripts: Iterable[str]) -> tuple[str, ...]:
    """The features every one of mmrun's entries among `scripts` (if/else alternatives) implements itself."""
    entries = [entry for entry in map(trainer_entry, scripts) if entry is not None]
    if not entries:
        return ()
    return tuple(f for f in TRAINER_ENTRIES[entries[0]] if all(f in TRAINER_ENTRIES[e] for e in entries[1:]))
