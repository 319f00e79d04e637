"""One seed for Python, numpy and MindSpore, the same on every rank."""
from __future__ import annotations

import random

import mindspore
import numpy as np

from mmrun.backend import checks


def seed_everything(seed: int) -> int:
    """Seed every generator this process uses and return the seed.

    Two MindSpore calls, because they feed different generators: set_seed drives ops.* random
    functions, initializers and mindspore.dataset (and numpy); manual_seed drives the default
    Generator behind mint.* random functions.
    """
    checks.seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    mindspore.set_seed(seed)
    mindspore.manual_seed(seed)
    return seed
