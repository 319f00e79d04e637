"""A MindSpeed-style script that initialises MindSpore communication itself, not through mmrun.backend."""
import json
import os

import mindspore
from mindspore.communication import get_group_size, get_rank, init

mindspore.set_device("CPU")
init()
with open(os.path.join(os.environ["OUT"], f"direct_{get_rank()}.json"), "w") as handle:
    json.dump({"rank": get_rank(), "size": get_group_size()}, handle)
