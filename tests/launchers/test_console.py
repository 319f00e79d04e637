"""mmrun's copy of msrun's console: MindSpore's own DEBUG/INFO/WARNING lines left out, everything else as written."""
from __future__ import annotations

import os

import pytest

from mmrun.launchers.console import MINDSPORE_LOGS_VAR, Relay, is_mindspore_log_line, shows_mindspore_logs

# Lines as MindSpore 2.10 wrote them in an msrun job on this CPU machine (C++ and Python loggers).
MINDSPORE_LINES = [
    b"[WARNING] DISTRIBUTED(29835,7f4706429b80,python):2026-11-25-17:24:27.080.223 [mindspore/ccsrc/cluster/topology/"
    b"cluster_context.cc:316] BuildCluster] Topology build timed out., retry(1/1200).\n",
    b"[INFO] DISTRIBUTED(29835,7f46b7fff6c0,python):2026-11-25-17:24:31.095.826 [mindspore/ccsrc/cluster/rpc/core/"
    b"communicator/tcp_server.cc:314] Start] Event base dispatch success!\n",
    b"[WARNING] ME(29826:139740179544960,MainProcess):2026-11-25-17:24:23.152.000 [mindspore/parallel/cluster/"
    b"process_entity/_api.py:275] Distributed job is spawned. Waiting all processes to exit...\n",
]
KEPT_LINES = [
    b"[ERROR] DISTRIBUTED(30406,7fbdefddeb80,python):2026-11-25-17:25:42.754.208 [mindspore/ccsrc/include/cluster/"
    b"topology/utils.h:53] FillMetaServerAddress] The port number of meta server node: 0 is invalid\n",
    b"[WARNING] my training script's own warning\n",
    b" [2026-11-25 17:28:51] iteration        1/       2 | lm loss: 6.460293E+00\n",
    b"Start worker process with rank id:0, log file:msrun_log/worker_0.log.\n",
]


def test_only_mindspores_own_info_and_warning_lines_are_recognised():
    assert all(is_mindspore_log_line(line) for line in MINDSPORE_LINES)
    assert not any(is_mindspore_log_line(line) for line in KEPT_LINES)


def test_relay_copies_all_but_mindspores_lines_in_order_and_a_last_line_without_newline():
    read_in, write_in = os.pipe()
    read_out, write_out = os.pipe()
    relay = Relay(os.fdopen(read_in, "rb"), write_out)
    # the blank line after MindSpore's lines ends their message; the one after a kept line is kept
    lines = [KEPT_LINES[2], *MINDSPORE_LINES, b"\n", KEPT_LINES[0], KEPT_LINES[1], b"\n", b"no newline at the end"]
    os.write(write_in, b"".join(lines))
    os.close(write_in)
    relay.join(timeout=10)
    os.close(write_out)
    with os.fdopen(read_out, "rb") as out:
        assert out.read() == KEPT_LINES[2] + KEPT_LINES[0] + KEPT_LINES[1] + b"\n" + b"no newline at the end"
    assert relay.dropped == len(MINDSPORE_LINES) + 1


def test_the_variable_chooses_and_a_wrong_value_is_named():
    assert shows_mindspore_logs({}) is False
    assert shows_mindspore_logs({MINDSPORE_LOGS_VAR: "console"}) is True
    assert shows_mindspore_logs({MINDSPORE_LOGS_VAR: "logdir"}) is False
    with pytest.raises(ValueError, match="MMRUN_MINDSPORE_LOGS=yes: expected one of logdir, console"):
        shows_mindspore_logs({MINDSPORE_LOGS_VAR: "yes"})
