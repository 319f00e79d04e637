import numpy as np
from mmrun import backend

info = backend.init_distributed()          # msrun's scheduler process stops here
backend.seeding.seed_everything(1234)
x = backend.tensors.from_numpy(np.array([info.rank + 1.0], dtype=np.float32))
total = backend.distributed.all_reduce(x, op="sum")
names = backend.distributed.all_gather_object(f"rank{info.rank}")
# one write per rank (newlines included), so the two ranks' lines cannot interleave on a shared terminal
print(f"{info}\nrank {info.rank}: sum={backend.tensors.to_numpy(total).tolist()} gathered={names} "
      f"random={np.random.rand():.4f}\n", end="", flush=True)
backend.distributed.destroy_distributed()
