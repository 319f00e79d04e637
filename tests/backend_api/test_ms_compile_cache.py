"""--ms-compile-cache: MindSpore's compile cache in a directory per job (engines/compile_cache.py,
backend/mindspore/device.compile_cache). MindSpore reuses saved graphs by compile order without checking what is
baked into them, so the directory's name must change with anything the graphs depend on, and only with that."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from mmrun.engines import compile_cache


def _args(tmp_path, **changes) -> argparse.Namespace:
    model = tmp_path / "model.json"
    if not model.exists():
        model.write_text('{"hidden_size": 64}')
    values = dict(clip_grad=1.0, seq_length=128, mm_model=str(model), metrics_file="a.jsonl", train_iters=12,
                  save=None, ms_compile_cache=str(tmp_path / "cache"))
    values.update(changes)
    return argparse.Namespace(**values)


def _directory(args, shapes=((2, 128),), world_size=1) -> str:
    return compile_cache.job_directory(args, shapes, str(args.ms_compile_cache), "2.10.0", world_size, entry="")


def test_the_directory_follows_what_the_graphs_depend_on(tmp_path):
    base = _directory(_args(tmp_path))
    assert os.path.dirname(base) == str(tmp_path / "cache")
    # where to write and how long to run: the same graphs, the same directory
    assert _directory(_args(tmp_path, metrics_file="b.jsonl", train_iters=50, save="ckpt")) == base
    # every rank of a job: one directory (MindSpore keeps each rank's graphs in its rank_N/)
    assert _directory(_args(tmp_path, rank=1, local_rank=1)) == _directory(_args(tmp_path, rank=0, local_rank=0))
    # baked constants, shapes, world size, a named file's content: another directory
    others = [_directory(_args(tmp_path, clip_grad=0.5)), _directory(_args(tmp_path, seq_length=96)),
              _directory(_args(tmp_path), shapes=((2, 96),)), _directory(_args(tmp_path), world_size=2)]
    (tmp_path / "model.json").write_text('{"hidden_size": 32}')
    others.append(_directory(_args(tmp_path)))
    assert len({base, *others}) == 6
    assert not compile_cache.has_graphs(base)


# In fresh processes: MindSpore reads the cache variables at each compile, process-wide.
CODE = """
import sys
import numpy as np
import mindspore
from mmrun.backend.mindspore import device
print("directory", device.compile_cache(sys.argv[1]))

@mindspore.jit
def scaled_sum(x):
    return (x * 3).sum()

print("result", float(scaled_sum(mindspore.Tensor(np.arange(4, dtype=np.float32)))))
"""


def test_mindspore_saves_then_loads_the_graphs_and_the_users_setting_wins(tmp_path):
    script = tmp_path / "cached.py"  # mindspore.jit reads the function's source from a file
    script.write_text(CODE)
    cache = tmp_path / "job"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MS_COMPILER_CACHE") and k != "MMRUN_MS_DEVICE"}
    runs = [subprocess.run([sys.executable, str(script), str(cache)], env=env, capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        assert f"directory {cache}" in run.stdout and "result 18.0" in run.stdout
    assert compile_cache.has_graphs(str(cache))
    assert "Use the compilation cache" not in runs[0].stderr and "Use the compilation cache" in runs[1].stderr
    mine = subprocess.run([sys.executable, str(script), str(tmp_path / "other")], capture_output=True, text=True,
                          env={**env, "MS_COMPILER_CACHE_ENABLE": "0"}, timeout=300)
    assert mine.returncode == 0 and "directory None" in mine.stdout, mine.stderr[-2000:]
    assert not (tmp_path / "other").exists()
