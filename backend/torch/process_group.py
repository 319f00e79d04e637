"""torch.distributed's default process group, with the options only torch has (the wait bound).

`distributed.init_distributed` (the portable face, the same on MindSpore) starts the group through
`start()` with torch's default timeout. The trainer on PyTorch calls `start()` first with Megatron's
`--distributed-timeout-minutes`, as Megatron's `initialize_megatron` passes it to
`torch.distributed.init_process_group(timeout=...)`: how long a collective (and the rendezvous) waits
for a missing rank before it fails. MindSpore has no such knob in `communication.init()`; msrun's
`--cluster_time_out` bounds the wait there (the launcher derives it from the same flag). Listed in
FRAMEWORK_ONLY: no MindSpore twin.
"""
from __future__ import annotations

import datetime
import os

import torch.distributed as dist

from mmrun.common import ports
from mmrun.backend import checks, rank_env
from mmrun.backend.torch import device


def start(backend: str | None = None, *, single_process_group: bool = False,
          timeout_minutes: float | None = None) -> None:
    """Create the default process group when the world size is above 1 (no-op when one exists).

    `single_process_group=True` also creates a one-rank group when there is no launcher, for libraries
    that insist on torch.distributed being initialised (megatron-core's parallel_state).
    `timeout_minutes` None keeps torch's default (30 minutes for gloo, 10 for NCCL).
    """
    if dist.is_initialized():
        return
    info = rank_env.read_rank_info()
    if info.world_size <= 1 and not single_process_group:
        return
    name = checks.dist_backend("pytorch", device.detect().kind, backend)
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        # env:// under torchrun reuses the agent's TCP store at MASTER_ADDR:MASTER_PORT; a tcp:// URL
        # to the same port would try to open a second store there.
        init_method = "env://"
    elif info.world_size <= 1:
        init_method = f"tcp://127.0.0.1:{ports.free_port('127.0.0.1')}"
    else:
        init_method = f"tcp://{info.master_addr}:{info.master_port}"
    options = {} if timeout_minutes is None else {"timeout": datetime.timedelta(minutes=timeout_minutes)}
    dist.init_process_group(name, init_method=init_method, rank=info.rank, world_size=info.world_size, **options)

