"""Process plumbing shared by the launcher and the data tools (framework-free)."""
from __future__ import annotations

import ctypes

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel to send `signum` to this process when its parent ends, even by SIGKILL (Linux).

    False where it cannot (not Linux): callers keep another way to stop the process then.
    """
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum) == 0
    except (OSError, AttributeError):
        return False
