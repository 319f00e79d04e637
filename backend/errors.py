"""Error types and one-time warnings of mmrun.backend, framework-free so launchers can catch them
without importing a framework.

Every message is one line that says what was received and what to do (keras 3 style for
unsupported features). `exit_code` is what a command line should exit with: 2 for a usage error
the user can fix by changing a flag or variable, 1 otherwise.
"""
from __future__ import annotations

import threading
import warnings

# framework name -> the extra that installs it (pyproject.toml [project.optional-dependencies]).
INSTALL_EXTRA: dict[str, str] = {"pytorch": "torch", "mindspore": "mindspore"}


class BackendError(Exception):
    """Base of every error raised by mmrun.backend."""

    exit_code = 1


class UsageError(BackendError, ValueError):
    """A bad value in a command-line option or environment variable read by the backend."""

    exit_code = 2


class FrameworkChoiceError(UsageError):
    """An unknown framework name in --ai-framework or MMRUN_AI_FRAMEWORK."""


class FrameworkConflictError(BackendError, RuntimeError):
    """A second, different framework was asked for after the choice was made."""

    exit_code = 2


class FrameworkNotInstalledError(BackendError, ImportError):
    """The chosen framework cannot be imported because it is not installed."""

    def __init__(self, framework: str, module: str, source: str) -> None:
        self.framework = framework
        super().__init__(
            f"The {framework} backend needs the '{module}' package, which is not installed "
            f"(framework chosen by {source}). Install it with: pip install \"mmrun[{INSTALL_EXTRA[framework]}]\""
        )


class UnsupportedError(BackendError, NotImplementedError):
    """A feature or value the chosen framework or device cannot provide."""

    exit_code = 2

    def __init__(self, what: str, framework: str, received: str, hint: str = "") -> None:
        message = f"{what} is not supported with the {framework} backend. Received: {received}"
        super().__init__(f"{message}. {hint}" if hint else message)


class DistributedNotInitializedError(BackendError, RuntimeError):
    """A collective was called in a multi-process job before init_distributed()."""


class MSAdapterError(BackendError, RuntimeError):
    """MSAdapter was requested but its tree is missing or `import torch` resolves elsewhere."""

    exit_code = 2


class TorchImportError(BackendError, RuntimeError):
    """torch itself failed to import (typically a torch_npu device extension without CANN)."""


class BackendWarning(UserWarning):
    """A notice from the backend: something was adjusted (device, distributed backend) and works."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(message: str) -> None:
    """Warn once per process per message, however often the situation is met (every collective, every step)."""
    with _warned_lock:
        if message in _warned:
            return
        _warned.add(message)
    warnings.warn(message, BackendWarning, stacklevel=3)
