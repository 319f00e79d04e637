"""`mmrun features` as the launcher's subcommand table names it; the command lives in mmrun.features.cli.

The feature table moved to its own top-level folder (features/ -> mmrun.features). This module only
keeps the subcommand's target in launchers/cli.py valid until that line points at mmrun.features.cli.
"""
from __future__ import annotations

import sys

from mmrun.features.cli import main

if __name__ == "__main__":
    sys.exit(main())
