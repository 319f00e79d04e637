"""Several MindSpore ranks on one CPU host: each rank's threads on its own share of the cores
(backend/mindspore/device.py; measured in docs/multimodal.md). The split, and the switch's refusal of a bad value.
The two-process runs (tests/backend_api/test_data_parallel.py, tests/training/test_pretrain_vlm.py) run bound, each
rank bound once the msrun cluster formed."""
from __future__ import annotations

import pytest

from mmrun.backend.errors import UsageError
from mmrun.backend.mindspore import device

SPLITS = [
    # (allowed cores, local rank, local world size) -> this rank's cores
    (([0, 1], 0, 2), [0]),
    (([0, 1], 1, 2), [1]),
    (([0, 1, 2, 3], 1, 2), [2, 3]),
    (([3, 1, 2, 0, 4], 1, 2), [2, 3]),  # in core order; the odd one stays unused
    (([0, 1], 0, 1), None),  # one rank: nothing to split
    (([0, 1], 2, 3), None),  # more ranks than cores: left to the scheduler
]


@pytest.mark.parametrize("given, share", SPLITS)
def test_each_rank_gets_its_own_equal_share_in_core_order(given, share):
    assert device._cores_of_rank(*given) == share


def test_the_switch_takes_0_or_1_and_says_so_otherwise(monkeypatch):
    monkeypatch.setenv(device.BIND_VAR, "0")
    assert device._bind_cores() is None
    monkeypatch.setenv(device.BIND_VAR, "yes")
    with pytest.raises(UsageError, match=r"MMRUN_MS_BIND_CORES must be 1 .* or 0\. Received: MMRUN_MS_BIND_CORES='yes'"):
        device._bind_cores()


@pytest.mark.parametrize("env, waits", [
    ({"MS_ROLE": "MS_WORKER", "RANK_ID": "1", "RANK_SIZE": "2"}, True),   # an msrun worker: bound once init() returned
    ({"MS_ROLE": "MS_SCHED", "RANK_SIZE": "2"}, False),                   # the scheduler is never bound (_bind_cores)
    ({"RANK": "1", "WORLD_SIZE": "2"}, False),                            # torchrun: no msrun cluster to join
    ({}, False),                                                          # one process
])
def test_an_msrun_worker_is_bound_only_after_the_cluster_formed(monkeypatch, env, waits):
    """Bound before registering with msrun's scheduler, a rank stalled 20-75 s in one run in three (device.py)."""
    for name in ("MS_ROLE", "RANK_ID", "RANK_SIZE", "MS_WORKER_NUM", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert device._before_cluster() is waits
