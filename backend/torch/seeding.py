"""One seed for Python, numpy, torch (every device) and the dropout generator, the same on every rank;
their state as JSON."""
from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch

from mmrun.backend import checks, dropout_hash

# What `ops.dropout` draws from: MindSpore's DROPOUT_GENERATOR in Python, so that the same seed gives the
# same masks on both frameworks (backend/dropout_hash.py). A host-side counter, not a torch Generator:
# the key of each call is derived on the host, and the state is two integers on every device.
DROPOUT_GENERATOR = dropout_hash.CounterGenerator()


def seed_everything(seed: int) -> int:
    """Seed every generator this process uses and return the seed.

    torch.manual_seed also seeds every CUDA device and the registered custom device (torch_npu's NPU),
    so no per-device call is needed. DROPOUT_GENERATOR drives the backend's dropout.
    """
    checks.seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    DROPOUT_GENERATOR.manual_seed(seed)
    return seed


def _to_text(state: torch.Tensor) -> str:
    # base64 of the raw ByteTensor: the CPU generator's state is 5056 bytes, three times longer as a list of ints.
    return base64.b64encode(state.cpu().numpy().tobytes()).decode("ascii")


def _from_text(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def _accelerator() -> tuple[str, Any] | None:
    """("npu" | "cuda", its torch module) when this process runs on one, else None."""
    from mmrun.backend.torch import device

    kind = device.detect().kind
    # By the device kind, not torch.cuda.is_available(): transfer_to_npu makes torch.cuda answer for the NPU.
    if kind == "npu":
        return kind, torch.npu
    if kind == "cuda":
        return kind, torch.cuda
    return None


def get_rng_state() -> dict[str, Any]:
    """torch's RNG state as JSON: the dropout generator, the CPU generator, and on an accelerator every
    visible device's generator.

    "dropout" is DROPOUT_GENERATOR's (seed, offset), everything `ops.dropout` draws. The others are what
    torch's own random functions draw from: the CPU default generator (`torch.get_rng_state`), and
    `torch.cuda.get_rng_state_all()` on CUDA or `torch.npu.get_rng_state_all()` on an Ascend NPU
    (torch_npu), each the generator's ByteTensor, base64-encoded. Python's and numpy's generators are
    not here (the checkpoint saves them itself). The CUDA and NPU paths have not been run (CPU-only
    test machine); only the CPU path is tested.
    """
    state: dict[str, Any] = {"cpu": _to_text(torch.get_rng_state()), "dropout": DROPOUT_GENERATOR.get_state()}
    accelerator = _accelerator()
    if accelerator is not None:
        kind, module = accelerator
        state[kind] = [_to_text(s) for s in module.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore a state from `get_rng_state` (after a JSON round trip): the generators draw on as they would have.

    Accelerator states are restored when the saved state has this process's device kind; one device
    count against another, the devices both have are restored. Unverified on CUDA and NPU (see
    `get_rng_state`). Generators without an entry keep their state: `{"dropout": ...}` (the MindSpore
    backend's dropout state has this format) restores just the dropout stream, and a state saved before
    dropout had its own generator leaves it seeded (that run's masks came from torch's generator).
    """
    if "cpu" in state:
        torch.set_rng_state(_from_text(state["cpu"]))
    if "dropout" in state:
        DROPOUT_GENERATOR.set_state(state["dropout"])
    accelerator = _accelerator()
    if accelerator is not None and accelerator[0] in state:
        kind, module = accelerator
        module.set_rng_state_all([_from_text(text) for text in state[kind][:module.device_count()]])


def set_deterministic() -> list[str]:
    """--deterministic-mode on torch: deterministic kernels or an error where an op has none (torch's rule);
    returns what was switched, for the run's notice."""
    import os

    # cuBLAS needs a fixed workspace for reproducible GEMMs; it must be set before the first cuBLAS call.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    return ["torch.use_deterministic_algorithms(True)", "cudnn.deterministic (no benchmark autotuning)",
            f"CUBLAS_WORKSPACE_CONFIG={os.environ['CUBLAS_WORKSPACE_CONFIG']}"]
