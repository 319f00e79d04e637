"""One seed for Python, numpy and torch (every device), the same on every rank."""
from __future__ import annotations

import random

import numpy as np
import torch

from mmrun.backend import checks


def seed_everything(seed: int) -> int:
    """Seed every generator this process uses and return the seed.

    torch.manual_seed also seeds every CUDA device and the registered custom device (torch_npu's NPU),
    so no per-device call is needed.
    """
    checks.seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return seed
