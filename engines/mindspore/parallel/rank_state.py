"""One rank's parameters as numpy and back, for the MindSpore parallel models (the GPT and the VLM): what the
trainer's checkpoints hold per (TP, PP) rank, named as the model names them on that rank."""
from __future__ import annotations

from typing import Any

import numpy as np

from mmrun.backend.errors import UsageError
from mmrun.backend.mindspore import tensors


class RankState:
    """Mixin for an nn.Module with `state` (ParallelState): its parameters as numpy and back, strictly.
    `layout_error` is the one-line error class of the model's layout (exit 2)."""

    layout_error: type[UsageError] = UsageError

    def rank_state_dict(self) -> dict[str, np.ndarray]:
        """name -> numpy: this rank's parameters."""
        return {name: tensors.to_numpy(param) for name, param in self.named_parameters()}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        """Load this rank's parameters (numpy or tensors, this rank's names); one-line error naming a missing,
        unexpected or mis-shaped entry."""
        own = dict(self.named_parameters())
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        wrong = sorted(f"{n} {tuple(np.shape(state[n]))} (expected {tuple(own[n].shape)})"
                       for n in set(own) & set(state) if tuple(np.shape(state[n])) != tuple(own[n].shape))
        if missing or unexpected or wrong:
            raise self.layout_error(
                f"the state does not fit (tp, pp) rank ({self.state.tp_rank}, {self.state.pp_rank}): missing "
                f"{missing[:3]}, unexpected {unexpected[:3]}, wrong shapes {wrong[:3]}; load the shard saved by the "
                "same rank with the same --tensor/--pipeline-model-parallel-size")
        for name, param in own.items():
            param.set_data(tensors.from_numpy(np.asarray(tensors.to_numpy(state[name]), dtype=np.float32),
                                              dtype=param.dtype))
