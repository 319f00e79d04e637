"""What reaches mmrun's console from msrun: everything but MindSpore's own DEBUG/INFO/WARNING log lines.

msrun writes each worker's stdout and stderr to <log_dir>/worker_<rank>.log and copies those files to
the console (`tail -f`). MindSpore's internal log lines ("[WARNING] DISTRIBUTED(1234,7f..,python):2026-...")
are dozens per job on a CPU (the ranks' reconnect attempts while the cluster forms), and environment
variables cannot keep them off the console while keeping them: measured on MindSpore 2.10, its C++ logger
copies every WARNING line to stderr whatever GLOG_stderrthreshold says once GLOG_logtostderr=0 sends the
log to files, and GLOG_v=3 drops the lines altogether. So the lines stay where msrun wrote them (the
worker logs) and mmrun leaves them out of the copy it shows; ERROR and CRITICAL lines are shown.
MMRUN_MINDSPORE_LOGS=console shows them all, as msrun itself does.
"""
from __future__ import annotations

import os
import re
import threading
from typing import IO, Mapping

MINDSPORE_LOGS_VAR = "MMRUN_MINDSPORE_LOGS"
# value -> whether MindSpore's own DEBUG/INFO/WARNING lines reach the console
MINDSPORE_LOGS_CHOICES: dict[str, bool] = {"logdir": False, "console": True}
MINDSPORE_LOGS_DEFAULT = "logdir"

# MindSpore's log line: "[LEVEL] SUBMODULE(pid:thread,process):YYYY-MM-DD-HH:MM:SS.mmm.uuu [file:line] message"
# (Python side: "ME(29826:139740179544960,MainProcess)"; C++ side: "DISTRIBUTED(29835,7f4706429b80,python)").
MINDSPORE_LOG_LINE = re.compile(
    rb"^\[(?:DEBUG|INFO|WARNING)\] [A-Z_]+\(\d+[:,][0-9a-fA-F]+,[^)\n]*\):\d{4}-\d\d-\d\d-\d\d:\d\d:\d\d")


def shows_mindspore_logs(environ: Mapping[str, str]) -> bool:
    """Whether MMRUN_MINDSPORE_LOGS asks for MindSpore's own log lines on the console; ValueError when it is not a choice."""
    value = environ.get(MINDSPORE_LOGS_VAR, "").strip() or MINDSPORE_LOGS_DEFAULT
    if value not in MINDSPORE_LOGS_CHOICES:
        raise ValueError(f"{MINDSPORE_LOGS_VAR}={value}: expected one of {', '.join(MINDSPORE_LOGS_CHOICES)} "
                         f"(console shows MindSpore's own INFO/WARNING lines; logdir, the default, leaves them in "
                         f"msrun's worker logs)")
    return MINDSPORE_LOGS_CHOICES[value]


def is_mindspore_log_line(line: bytes) -> bool:
    return MINDSPORE_LOG_LINE.match(line) is not None


class Relay:
    """Copies a pipe to a file descriptor line by line, leaving out MindSpore's own log lines."""

    def __init__(self, source: IO[bytes], fd: int):
        self.source, self.fd = source, fd
        self.dropped = 0
        self.thread = threading.Thread(target=self._copy, name=f"mmrun-console-{fd}", daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        writable, after_dropped = True, False
        for line in iter(self.source.readline, b""):
            # A blank line right after one of MindSpore's lines ends that message (some end with an empty line).
            if is_mindspore_log_line(line) or (after_dropped and not line.strip()):
                self.dropped += 1
                after_dropped = True
                continue
            after_dropped = False
            if writable:
                try:
                    while line:
                        line = line[os.write(self.fd, line):]
                except OSError:  # our own output is gone (a closed pipe): keep draining so msrun never blocks
                    writable = False
        self.source.close()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
