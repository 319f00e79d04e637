"""The `mmrun` command: run a job, or one of the subcommands below.

`mmrun [launcher options] SCRIPT [script args]` starts a job; `mmrun SUBCOMMAND ...` runs a tool.
Subcommand modules are imported only when chosen, so `mmrun --help` stays fast and needs no
framework installed.
"""
from __future__ import annotations

import importlib
import sys

# name -> (module with `main(argv) -> int`, one-line summary for --help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "translate": ("mmrun.launchers.translate.cli", "rewrite a torchrun launch script into an msrun one (and back)"),
    "analyse": ("mmrun.analyse.cli", "find code that will not run on Ascend NPUs or MindSpore; fix what is safe"),
    "features": ("mmrun.features.cli", "print the feature support matrix (framework x device)"),
    "env": ("mmrun.launchers.env_report", "print versions and devices as a copy-paste block for bug reports"),
    "preprocess-data": ("mmrun.data.preprocess", "tokenize JSONL into Megatron's indexed .bin/.idx format"),
    "llava-to-mllm": ("mmrun.data.multimodal.llava", "convert LLaVA-Instruct JSON into MindSpeed-MM's mllm_format"),
    "convert": ("mmrun.checkpoint.convert_cli", "convert checkpoints as MindSpeed-MM's mm-convert (Hugging Face <-> mmrun)"),
    "compare": ("mmrun.precision.cli", "do two runs agree? loss curves per iteration, or layer-wise dumps per module"),
}
ALIASES = {"analyze": "analyse"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv:
        name = ALIASES.get(argv[0], argv[0])
        if name in SUBCOMMANDS:
            module = importlib.import_module(SUBCOMMANDS[name][0])
            return int(module.main(argv[1:]) or 0)
    from mmrun.launchers.run import main as run_main

    return int(run_main(argv, SUBCOMMANDS) or 0)


if __name__ == "__main__":
    sys.exit(main())
