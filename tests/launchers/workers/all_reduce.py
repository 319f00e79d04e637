"""All-reduce (sum) of [rank + 1] through mmrun.backend; writes the result and rank variables to $OUT."""
import json
import os

import numpy as np

from mmrun import backend

info = backend.init_distributed()
x = backend.tensors.from_numpy(np.array([info.rank + 1.0], dtype=np.float32))
total = float(backend.tensors.to_numpy(backend.distributed.all_reduce(x, op="sum"))[0])
record = {"rank": info.rank, "world_size": info.world_size, "framework": info.framework,
          "dist_backend": info.dist_backend, "sum": total, "RANK": os.environ["RANK"]}
with open(os.path.join(os.environ["OUT"], f"reduce_{info.rank}.json"), "w") as handle:
    json.dump(record, handle)
