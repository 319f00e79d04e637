"""megatron-core made ready for this process's device, once: imported quietly, shimmed only on CPU.

- CPU: cpu_shims.install() (every substitution megatron-core needs there, each with its reason).
- Ascend NPU: torch_npu's `transfer_to_npu` maps megatron-core's CUDA calls to the NPU (MindSpeed's way);
  nothing of mmrun's is patched. Not run here (no NPU).
- CUDA: megatron-core as it is. Not run here (no GPU).

megatron-core warns at import that Transformer Engine and Apex are missing (once per module, on every
rank); `prepare()` says it once, on rank 0, in its own words instead.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import warnings
from typing import Any

from mmrun.backend.errors import BackendError

_prepared: str | None = None


class MegatronCoreMissingError(BackendError):
    """megatron-core (or Transformer Engine when asked for) is not installed: one line, exit 2."""

    exit_code = 2


def device_kind() -> str:
    from mmrun.backend.torch import device

    return device.detect().kind


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version("megatron-core")
    except PackageNotFoundError:
        return "unknown"


def prepare() -> str:
    """Import megatron-core for this device (installing the CPU shims on CPU); returns the device kind."""
    global _prepared
    if _prepared is not None:
        return _prepared
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        raise MegatronCoreMissingError(
            "megatron-core is not installed, and the megatron-core engine needs it (--use-mcore-models, or a "
            "tensor/pipeline/context-parallel size above 1, or --use-distributed-optimizer). Received: no "
            "module megatron.core; pip install megatron-core (0.16 is tested)")
    kind = device_kind()
    if kind == "npu":
        import torch_npu.contrib.transfer_to_npu  # noqa: F401  (megatron-core's CUDA calls go to the NPU)
    with warnings.catch_warnings():
        # "Transformer Engine and Apex are not installed. Falling back to ...": said by module, every rank.
        warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex|apex).*")
        warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.core.*")
        import megatron.core.distributed  # noqa: F401
        import megatron.core.models.gpt  # noqa: F401
        import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401
        import megatron.core.optimizer  # noqa: F401
        import megatron.core.pipeline_parallel  # noqa: F401
        import megatron.core.transformer.moe.moe_utils as moe_utils
    # megatron-core 0.16.1's MoE router (router_gating_linear) reads moe_utils.te_general_gemm, a name bound only when
    # Transformer Engine imports (NameError without it, on every device): None takes its torch.mm branch
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    # megatron-core 0.16's distributed optimizer calls torch.distributed.reduce_scatter_tensor /
    # all_gather_into_tensor, which torch 2.13 announces as deprecated, once per rank and name.
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r".*torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated.*")
    # The same optimizer sets .grad on its fp32 shards (views into its buffers, not leaves) and reads it back;
    # torch warns on reading .grad of a non-leaf tensor (every rank, first step).
    warnings.filterwarnings("ignore", category=UserWarning, message=r".*\.grad attribute of a Tensor that is not a leaf.*")
    if kind == "cpu":
        from mmrun.backend.torch.megatron_core import cpu_shims

        cpu_shims.install()
        # A CUDA stream tuning hint, said by every rank at its first tensor-parallel backward; no CUDA here.
        warnings.filterwarnings("ignore", message=".*CUDA_DEVICE_MAX_CONNECTIONS.*")
    _prepared = kind
    return kind


def require_parallel_state() -> None:
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        raise RuntimeError("megatron-core's parallel state is not initialised: build the GPTModel from the entry's "
                           "model_provider while mmrun's pretrain() runs with the megatron-core engine")


def require_transformer_engine() -> None:
    if device_kind() != "cuda" or importlib.util.find_spec("transformer_engine") is None:
        raise MegatronCoreMissingError(
            f"--transformer-impl transformer_engine needs Transformer Engine on an NVIDIA GPU. Received: device "
            f"{device_kind()}, transformer_engine {'installed' if importlib.util.find_spec('transformer_engine') else 'not installed'}; "
            "use --transformer-impl local (megatron-core's local layer spec)")


def installed_kernels() -> dict[str, Any]:
    """What megatron-core found at import (for the start-up log line)."""
    return {"transformer_engine": importlib.util.find_spec("transformer_engine") is not None,
            "apex": importlib.util.find_spec("apex") is not None}


# megatron-core's FusedScaleMaskSoftmax imports these compiled kernels (Apex / Megatron-LM's fused extensions) at
# the first fp16/bf16 attention when masked_softmax_fusion is on; `pip install megatron-core` brings none of them.
SOFTMAX_KERNELS = ("scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda", "scaled_softmax_cuda")


@functools.lru_cache(maxsize=None)
def fused_softmax_kernels() -> bool:
    """Do megatron-core's fused softmax kernels import here? Probed once per process (a real import: a kernel
    built for another CUDA or torch fails only then)."""
    for name in SOFTMAX_KERNELS:
        try:
            importlib.import_module(name)
        except Exception:  # ImportError, or an undefined symbol of a kernel built against another torch
            return False
    return True


def fusions(kind: str | None = None) -> dict[str, bool]:
    """TransformerConfig's fusion flags for this device: the fused paths where their kernels run here. The
    bias + GeLU and bias + dropout fusions are megatron-core's own TorchScript (any CUDA); the masked softmax
    needs SOFTMAX_KERNELS. Unfused, each computes the same."""
    on_cuda = (kind or device_kind()) == "cuda"
    return {"masked_softmax_fusion": on_cuda and fused_softmax_kernels(),
            "bias_activation_fusion": on_cuda, "bias_dropout_fusion": on_cuda}


def fusion_notice(kind: str | None = None) -> str | None:
    """The one line that says a fusion was asked for on this device and its kernel is absent, else None."""
    if (kind or device_kind()) != "cuda" or fused_softmax_kernels():
        return None
    return ("notice: megatron-core's fused masked softmax needs the compiled kernel scaled_masked_softmax_cuda "
            "(Apex or Megatron-LM's fused extensions), which does not import here; attention uses the unfused "
            "softmax (same math, in fp32). Install Apex to use the fused kernel")
