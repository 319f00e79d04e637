"""What every MindSpeed-MM-style entry (pretrain_vlm.py, pretrain_sora.py) reads and says before the arguments
are parsed: its --mm-* json files, and rank 0's one-line notices (rank from the launcher's env, not from args)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mmrun.backend.errors import UsageError


def read_mm_json(path: str, flag: str) -> Any:
    """The json file a --mm-model / --mm-data / --mm-tool flag names; one line and exit 2 when it is missing or
    not JSON."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{flag} {path}: no such file; pass the path of MindSpeed-MM's {flag[5:]}.json")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise UsageError(f"{flag} {path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
                         "fix the file") from None


def say_rank0(prefix: str, message: str) -> None:
    """`prefix: message` on stderr from rank 0 only (every rank reads the same files and would repeat it)."""
    from mmrun.backend import rank_env

    if rank_env.read_rank_info().rank == 0:
        print(f"{prefix}: {message}", file=sys.stderr, flush=True)
