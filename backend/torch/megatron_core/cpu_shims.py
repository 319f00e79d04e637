"""The shims megatron-core needs to run on a CPU, all of them, in one place; installed only on CPU.

megatron-core 0.16 assumes CUDA in a few hundred lines (571 lines in 103 files hard-code it). On a CUDA
GPU nothing here is installed; on an Ascend NPU torch_npu's `transfer_to_npu` maps CUDA to the NPU
(backend/torch/megatron_core/runtime.py imports it there) and nothing here is installed either. On a
CPU, `install()` (idempotent, process-wide) makes these narrow substitutions, each for a measured reason:

| shim | why megatron-core needs it on CPU |
|---|---|
| `torch.cuda.current_device()` -> `cpu` | used as the `device=` of buffers and layers (DDP grad buffers, `gather_output`, p2p shapes) |
| `device="cuda"` / `cuda:N` / `.to("cuda")` / `Tensor.cuda()` -> CPU (a TorchFunctionMode) | literal CUDA tensors in schedules (token counts), the causal mask, grad clipping, the optimizers |
| `Module.cuda()` -> the module itself | language_module moves tied weights with `.cuda()` |
| `Tensor.type()` says `torch.cuda.FloatTensor` for a CPU float tensor (same mode) | the distributed and fp16/bf16 optimizers accept only `torch.cuda.*Tensor` parameters |
| `torch.cuda.synchronize()` -> no-op | pipeline p2p calls it after every send/receive |
| the alltoall MoE dispatcher's device-to-host stream -> none (`_maybe_dtoh_and_synchronize` a no-op) | it makes a `torch.cuda.Stream` when built and copies token counts to the host on it; on the CPU they are there |
| a CPU RNG tracker instead of `CudaRNGStatesTracker` | `model_parallel_cuda_manual_seed` seeds and forks CUDA generators; the tracker keeps Megatron's per-TP-rank dropout streams in the CPU generator |

The mode costs one Python call per torch function call on the CPU (measured in benchmarks/parallel_scaling.py).
Nothing here changes what is computed: every substitution only moves a tensor from the absent CUDA
device to the CPU, where everything else already is.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_lock = threading.Lock()
_installed = False


def _on_cpu(device: Any) -> Any:
    """A CUDA device spec (name, index, torch.device) -> cpu; anything else unchanged."""
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cpu")  # an index means a CUDA device in megatron-core
    if isinstance(device, str) and device.startswith("cuda"):
        return torch.device("cpu")
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


class CudaOnCpu(TorchFunctionMode):
    """Torch calls that name a CUDA device get the CPU instead; `Tensor.type()` of a CPU tensor reads
    as its CUDA twin (the optimizers' type checks)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(kwargs["device"])
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to and len(args) > 1 and not isinstance(args[1], (torch.dtype, torch.Tensor)):
            args = (args[0], _on_cpu(args[1]), *args[2:])
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if args[0].device.type == "cpu" else name
        return func(*args, **kwargs)


def _cpu_rng_tracker_class() -> type:
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """Megatron's RNG tracker over the CPU generator: named states (data-parallel, model-parallel,
        expert) that `fork()` swaps in and out, as CudaRNGStatesTracker does with the CUDA generator."""

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            original = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(original)

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            original = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(original)

    return CpuRNGStatesTracker


def _host_split_sizes(self: Any, point: str, tokens_per_expert: Any = None) -> Any:
    """MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize on the CPU: at its copy point the all-to-all split
    sizes become numpy, as its device-to-host copy makes them (all_to_all_single takes sizes, not tensors); no
    stream, nothing to wait for (the counts are on the host already)."""
    if not self.drop_and_pad and point == self.cuda_dtoh_point:
        for name in ("input_splits", "output_splits", "output_splits_tp"):
            value = getattr(self, name, None)
            if torch.is_tensor(value):
                setattr(self, name, value.numpy())
    return tokens_per_expert


def install() -> None:
    """Install every shim (once per process). Call only when the job runs on the CPU."""
    global _installed
    with _lock:
        if _installed:
            return
        from megatron.core.tensor_parallel import random as mrandom

        torch.cuda.current_device = lambda: torch.device("cpu")
        torch.cuda.synchronize = lambda device=None: None
        torch.nn.Module.cuda = lambda self, device=None: self
        CudaOnCpu().__enter__()  # for the rest of the process: megatron-core allocates at any time
        mrandom._CUDA_RNG_STATE_TRACKER = _cpu_rng_tracker_class()()
        mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
        # Activation recomputation (--recompute-*: tensor_parallel.checkpoint) saves and restores the "CUDA" RNG state
        # around the recomputed forward; on the CPU every random op draws from the CPU generator, so that one.
        mrandom._get_cuda_rng_state = lambda *_args, **_kwargs: torch.get_rng_state()
        mrandom._set_cuda_rng_state = lambda state, *_args, **_kwargs: torch.set_rng_state(state)
        # The recomputed forward runs inside autograd's backward, where the mode entered above is not active.
        forward_again = mrandom.CheckpointFunction.backward

        def backward(ctx: Any, *grads: Any) -> Any:
            with CudaOnCpu():
                return forward_again(ctx, *grads)
        mrandom.CheckpointFunction.backward = staticmethod(backward)
        from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

        MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = "host"  # set: no torch.cuda.Stream() is made
        MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize = _host_split_sizes
        _installed = True


def installed() -> bool:
    return _installed
