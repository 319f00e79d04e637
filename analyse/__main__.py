"""`python -m mmrun.analyse ...`: the same command as `mmrun analyse ...`."""
import sys

from .cli import main

sys.exit(main())
