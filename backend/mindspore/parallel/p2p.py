"""Point-to-point communication between pipeline stages (megatron/core/pipeline_parallel/p2p_communication.py).

`mindspore.ops.communication.isend/irecv` run on CPU (the `ops.Send`/`ops.Receive` primitives have no CPU
kernel), but in MindSpore 2.10 they look up this process's rank through `get_cache_group_rank()`, whose default
group was bound to "hccl_world_group" when the module was imported, before communication chose its backend; on
CPU (mccl) and GPU (nccl) that group does not exist ("The group hccl_world_group does not exist."). `_rebind`
points those defaults at the world group communication actually created, once.

As Megatron's `_communicate`, a combined exchange (send forward, receive backward) posts both operations
before waiting for either, so two neighbouring stages exchanging at once cannot deadlock.
"""
from __future__ import annotations

from typing import Sequence

import mindspore as ms
import numpy as np

from mmrun.backend.mindspore.parallel.groups import ParallelState

_rebound = False


def _rebind() -> None:
    global _rebound
    if _rebound:
        return
    from mindspore.communication import GlobalComm
    from mindspore.ops.function import comm_func

    world = GlobalComm.WORLD_COMM_GROUP
    comm_func.get_cache_group_rank.__defaults__ = (world,)
    comm_func.get_cache_group_size.__defaults__ = (world,)
    _rebound = True


class PipelineP2P:
    """Send/receive activations [s, b, h] and their gradients between this stage and its neighbours."""

    def __init__(self, state: ParallelState, shape: Sequence[int], dtype=ms.float32) -> None:
        self.state = state
        self.shape, self.dtype = tuple(shape), dtype
        if state.pipeline_model_parallel_size > 1:
            _rebind()
            from mindspore.communication import GlobalComm
            self.world = GlobalComm.WORLD_COMM_GROUP

    def _buffer(self, shape: Sequence[int] | None) -> ms.Tensor:
        return ms.Tensor(np.zeros(self.shape if shape is None else tuple(shape), dtype=ms.dtype_to_nptype(self.dtype)))

    def _exchange(self, send: ms.Tensor | None, send_to: int | None, recv_from: int | None,
                  shape: Sequence[int] | None = None) -> ms.Tensor | None:
        from mindspore.ops import communication as comm

        handles = []
        received = None
        if send is not None and send_to is not None:
            handles.append(comm.isend(send, dst=send_to, group=self.world))
        if recv_from is not None:
            received = self._buffer(shape)
            handles.append(comm.irecv(received, src=recv_from, group=self.world))
        for handle in handles:
            handle.wait()
        return received

    # Megatron's names; each is a no-op at the end of the pipeline it would cross. `shape`: what is received,
    # when micro-batches differ in shape (Megatron's --variable-seq-lengths); default the shape given at creation.
    def recv_forward(self, shape: Sequence[int] | None = None) -> ms.Tensor | None:
        return None if self.state.is_first_stage else self._exchange(None, None, self.state.prev_rank, shape)

    def send_forward(self, output: ms.Tensor) -> None:
        if not self.state.is_last_stage:
            self._exchange(output, self.state.next_rank, None)

    def recv_backward(self, shape: Sequence[int] | None = None) -> ms.Tensor | None:
        return None if self.state.is_last_stage else self._exchange(None, None, self.state.next_rank, shape)

    def send_backward(self, input_grad: ms.Tensor | None) -> None:
        if not self.state.is_first_stage:
            self._exchange(input_grad, self.state.prev_rank, None)

    def send_forward_recv_backward(self, output: ms.Tensor, shape: Sequence[int] | None = None) -> ms.Tensor | None:
        if self.state.is_last_stage:
            return None
        return self._exchange(output, self.state.next_rank, self.state.next_rank, shape)

    def send_backward_recv_forward(self, input_grad: ms.Tensor | None,
                                   shape: Sequence[int] | None = None) -> ms.Tensor | None:
        if self.state.is_first_stage:
            return None
        return self._exchange(input_grad, self.state.prev_rank, self.state.prev_rank, shape)
