"""`python -m mmrun ...` is the `mmrun` command."""
import sys

from mmrun.launchers.cli import main

sys.exit(main())
