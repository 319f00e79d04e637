"""The one way mmrun picks a free TCP port for a job's master (framework-free).

`bind(("", 0))` hands out a port from the kernel's ephemeral range, the range it also draws the source
ports of outgoing connections from. Between choosing such a port and msrun's scheduler (or torch's
store) binding it, any process's connection can take it as its source port: seen in CI as a one-rank
msrun job whose cluster never formed while the other test worker ran jobs of its own. Ports below the
ephemeral range are only ever taken by an explicit bind, so they are tried first.
"""
from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000  # above the registered services commonly bound by hand
DEFAULT_EPHEMERAL_START = 32768  # Linux's default when the file cannot be read
TRIES = 64


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_START


def is_free(port: int, host: str = "") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "") -> int:
    """A port nothing listens on now, below the ephemeral range where the machine leaves room for one."""
    top = _ephemeral_start()
    if top - LOWEST > TRIES:
        for port in random.sample(range(LOWEST, top), TRIES):
            if is_free(port, host):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded or unusual range
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
