"""engines/torch/megatron_core/gloo_uneven.py on a real 2-process gloo group: megatron-core's own autograd Functions
(gather_from_sequence_parallel_region with output_split_sizes, reduce_scatter_to_sequence_parallel_region with
input_split_sizes, as its alltoall token dispatcher calls them over the tensor-parallel ranks) on ranks holding 3 and
5 rows: forward and backward equal the collectives' definition computed in one process, exactly."""
from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [3, 5]


def _rows(rank: int, salt: int) -> torch.Tensor:
    return torch.arange(SIZES[rank] * 4, dtype=torch.float32).reshape(SIZES[rank], 4) * (rank + 1) + salt


def _worker(rank: int, port: int) -> None:
    """One rank: the collectives through megatron-core's Functions, checked against their definition (an
    AssertionError fails the rank, and start_processes raises it in the test)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from megatron.core.tensor_parallel import mappings

    from mmrun.engines.torch.megatron_core import gloo_uneven

    group = dist.new_group([0, 1])
    assert gloo_uneven.install() and not gloo_uneven.install()  # once per process
    rows = slice(0, 3) if rank == 0 else slice(3, 8)  # this rank's part of the 8 gathered rows
    weights = torch.arange(1.0, 9.0)[:, None].expand(8, 4)
    x = _rows(rank, 0).requires_grad_()
    gathered = mappings.gather_from_sequence_parallel_region(x, group=group, output_split_sizes=SIZES)
    (gathered * weights * (rank + 1)).sum().backward()  # each rank its own loss
    assert torch.equal(gathered, torch.cat([_rows(0, 0), _rows(1, 0)]))
    # d/dx_r of both ranks' losses: the reduce-scatter of the two ranks' output gradients, rank r's rows
    assert torch.equal(x.grad, (weights * 1 + weights * 2)[rows])
    y = torch.cat([_rows(r, 10 * rank) for r in (0, 1)]).requires_grad_()  # 3 rows for rank 0, 5 for rank 1
    scattered = mappings.reduce_scatter_to_sequence_parallel_region(y, group=group, input_split_sizes=SIZES)
    (scattered * (rank + 2)).sum().backward()
    summed = torch.cat([_rows(r, 0) for r in (0, 1)]) + torch.cat([_rows(r, 10) for r in (0, 1)])
    assert torch.equal(scattered, summed[rows])
    # d/dy of both ranks' losses: the gather of each rank's output gradient (rank + 2) over its rows
    assert torch.equal(y.grad, torch.cat([torch.full((3, 4), 2.0), torch.full((5, 4), 3.0)]))
    dist.destroy_process_group()


def test_uneven_gather_and_reduce_scatter_on_gloo_through_megatron_cores_autograd():
    import megatron.core.tensor_parallel  # noqa: F401  imported once here; the forked ranks inherit it

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_worker, args=(port,), nprocs=2, join=True, start_method="fork")
