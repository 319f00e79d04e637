"""Megatron's checkpoint layout, atomic saves (a real SIGKILL mid-save), and clear errors on bad checkpoints.

These drive training/checkpointing.py's file layer with numpy state: no framework is imported. The
end-to-end resume tests (tests/training/test_pretrain_e2e.py) load the same files into real models.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mmrun.training import checkpointing as ck


def _state(seed: int, hidden: int = 8) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    model = {"wte.weight": rng.standard_normal((16, hidden), dtype=np.float32),
             "h.0.attn.c_attn.bias": rng.standard_normal(3 * hidden, dtype=np.float32)}
    optimizer = {"step": seed, "lr": 0.1,
                 "tensors": {f"{k}.{m}": np.full_like(v, seed) for k, v in model.items()
                             for m in ("exp_avg", "exp_avg_sq")}}
    return model, optimizer


def _save(root: Path, iteration: int, hidden: int = 8) -> Path:
    model, optimizer = _state(iteration, hidden)
    meta = {"iteration": iteration, "consumed_train_samples": 8 * iteration,
            "args": {"num_layers": 1, "hidden_size": hidden, "num_attention_heads": 2}}
    return ck.write_checkpoint(root, iteration, model, optimizer, meta)


def test_layout_is_megatrons_and_the_tracker_names_the_newest(tmp_path):
    _save(tmp_path, 5)
    _save(tmp_path, 10)
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "10\n"
    files = sorted(p.name for p in (tmp_path / "iter_0000010" / "mp_rank_00").iterdir())
    assert files == ["meta.json", "model.safetensors", "optimizer.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000005", "iter_0000010",
                                                          "latest_checkpointed_iteration.txt"]
    loaded = ck.read_checkpoint(tmp_path, ck.read_tracker(tmp_path))
    model, optimizer = _state(10)
    assert loaded.iteration == 10 and loaded.meta["consumed_train_samples"] == 80
    assert all(np.array_equal(loaded.model[k], v) for k, v in model.items())
    assert loaded.optimizer["step"] == 10
    assert all(np.array_equal(loaded.optimizer["tensors"][k], v) for k, v in optimizer["tensors"].items())
    mode = (tmp_path / "iter_0000010" / "mp_rank_00" / "model.safetensors").stat().st_mode & 0o777
    assert mode & 0o044  # readable by others (umask permitting), not mkstemp's 0600


def test_saving_the_same_iteration_again_replaces_it_whole(tmp_path):
    _save(tmp_path, 10, hidden=8)
    _save(tmp_path, 10, hidden=4)
    assert ck.read_checkpoint(tmp_path, 10).model["wte.weight"].shape == (16, 4)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


KILL_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from mmrun.training import checkpointing as ck
    root = sys.argv[1]
    model = {"w": np.ones((256, 256), np.float32)}
    ck.write_checkpoint(root, 10, model, None, {"iteration": 10})
    print("not reached")
""")


def test_sigkill_in_the_middle_of_a_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    _save(tmp_path, 5)
    env = {**os.environ, ck.KILL_DURING_SAVE_VAR: "10"}
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "not reached" not in proc.stdout
    # The killed save left only a temporary directory; the tracker still names iteration 5.
    assert ck.read_tracker(tmp_path) == 5
    assert not (tmp_path / "iter_0000010").exists()
    assert [p.name for p in tmp_path.glob(".iter_0000010.tmp-*")]
    assert ck.read_checkpoint(tmp_path, 5).iteration == 5
    # The next save cleans the leftovers up.
    _save(tmp_path, 15)
    assert not list(tmp_path.glob(".iter_*")) and ck.read_tracker(tmp_path) == 15


def test_truncated_file_is_named_as_corrupt(tmp_path):
    path = _save(tmp_path, 10) / "mp_rank_00" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ck.CheckpointError, match=r"corrupt or truncated .*--ckpt-step N") as err:
        ck.read_checkpoint(tmp_path, 10)
    assert "\n" not in str(err.value) and "mp_rank_00" in str(err.value)


def test_a_changed_byte_in_tensor_data_fails_the_checksum(tmp_path):
    path = _save(tmp_path, 10) / "mp_rank_00" / "optimizer.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # inside the last tensor's data, after the header
    path.write_bytes(bytes(data))
    with pytest.raises(ck.CheckpointError, match=r"optimizer.safetensors is corrupt: its tensors do not match"):
        ck.read_checkpoint(tmp_path, 10)


def test_corrupt_meta_json_is_named(tmp_path):
    (_save(tmp_path, 10) / "mp_rank_00" / "meta.json").write_text("{not json")
    with pytest.raises(ck.CheckpointError, match=r"meta.json is corrupt \(not valid JSON"):
        ck.read_checkpoint(tmp_path, 10)


def test_shape_mismatch_names_the_tensor_both_shapes_and_the_saved_sizes(tmp_path):
    _save(tmp_path, 10, hidden=8)
    loaded = ck.read_checkpoint(tmp_path, 10)
    with pytest.raises(ck.CheckpointError) as err:
        ck.check_model_fits(loaded, {"wte.weight": (16, 4), "h.0.attn.c_attn.bias": (12,), "ln_f.weight": (4,)})
    message = str(err.value)
    assert "shape mismatch: wte.weight (checkpoint (16, 8), model (16, 4))" in message
    assert "missing in checkpoint: ln_f.weight" in message
    assert "--hidden-size 8" in message and "\n" not in message


def test_tracker_with_garbage_and_megatron_pickles_are_refused_clearly(tmp_path):
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("ten\n")
    with pytest.raises(ck.CheckpointError, match="must hold an iteration number or 'release'"):
        ck.read_tracker(tmp_path)
    megatron = tmp_path / "iter_0000010" / "mp_rank_00"
    megatron.mkdir(parents=True)
    (megatron / "model_optim_rng.pt").write_bytes(b"\x80\x02pickle")
    with pytest.raises(ck.CheckpointError, match="Megatron torch \\(pickle\\) checkpoint.*never unpickles"):
        ck.read_checkpoint(tmp_path, 10)
    with pytest.raises(ck.CheckpointError, match="does not exist"):
        ck.read_checkpoint(tmp_path, 20)


def test_host_rng_state_round_trips_through_json():
    import random

    ck.set_host_rng_state(json.loads(json.dumps(ck.host_rng_state())))
    state = json.loads(json.dumps(ck.host_rng_state()))
    expected = (random.random(), np.random.rand())
    ck.set_host_rng_state(state)
    assert (random.random(), np.random.rand()) == expected
