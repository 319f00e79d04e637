"""Megatron's checkpoint layout, verified reads and clear errors on bad checkpoints.

These drive the checkpoint file layer with numpy state: no framework is imported. The save sequence
under SIGKILL is tests/training/test_checkpoint_faults.py; the end-to-end resume tests
(tests/training/test_pretrain_e2e.py) load the same files into real models.
"""
from __future__ import annotations

import json
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


def test_rank_directories_are_named_as_megatron_names_them():
    assert ck.RANK_DIR == ck.rank_dir_name() == "mp_rank_00"
    assert ck.rank_dir_name(tp_rank=3, pp_rank=0, pp_size=1) == "mp_rank_03"
    assert ck.rank_dir_name(tp_rank=1, pp_rank=2, pp_size=4) == "mp_rank_01_002"
    assert ck.rank_dir_name(0, 1, 2, expert_rank=5) == "mp_rank_00_001_005"
    assert ck.iteration_dir("/c", 12345678).name == "iter_12345678"


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


# ------------------------------------------------------------- what --load resumes from (issue 14)

def _find(root: Path, ckpt_step: int | None = None) -> tuple[ck.LoadedCheckpoint | None, list[str]]:
    lines: list[str] = []
    return ck.find_checkpoint(root, ckpt_step, log=lines.append), lines


def test_without_a_tracker_the_newest_verified_checkpoint_is_resumed_and_said_so(tmp_path):
    for iteration in (5, 10, 15):
        _save(tmp_path, iteration)
    (tmp_path / "latest_checkpointed_iteration.txt").unlink()
    model = tmp_path / "iter_0000015" / "mp_rank_00" / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF  # the newest fails its checksum
    model.write_bytes(bytes(data))
    ckpt, lines = _find(tmp_path)
    assert ckpt.iteration == 10
    (line,) = lines
    assert line.startswith("WARNING: ") and "latest_checkpointed_iteration.txt is missing" in line
    assert "resuming from the newest complete checkpoint, iter_0000010 (checksums verified)" in line
    assert "skipped iter_0000015 (incomplete or corrupt)" in line
    # --ckpt-step still picks exactly what it names, and nothing was changed on disk
    assert _find(tmp_path, 5)[0].iteration == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000005", "iter_0000010", "iter_0000015"]


def test_without_a_tracker_and_no_complete_checkpoint_it_stops(tmp_path):
    (tmp_path / "iter_0000010" / "mp_rank_00").mkdir(parents=True)  # an interrupted copy by hand
    with pytest.raises(ck.CheckpointError) as err:
        _find(tmp_path)
    message = str(err.value)
    assert "has no latest_checkpointed_iteration.txt and none of its checkpoints is complete" in message
    assert "iter_0000010" in message and "\n" not in message


@pytest.mark.parametrize("root", ["missing", "empty"])
def test_a_missing_or_empty_directory_starts_fresh(tmp_path, root):
    (tmp_path / "empty").mkdir()
    assert _find(tmp_path / root) == (None, [])


def test_a_missing_load_directory_says_what_the_run_starts_from(tmp_path):
    """Megatron's "will start from random", unless the entry's model already holds weights (issue 37:
    pretrain_transformers.py's init_from_hf_path was used while the line said random)."""
    import argparse

    args = argparse.Namespace(load=str(tmp_path / "missing"), ckpt_step=None, exit_on_missing_checkpoint=False)
    for initial, expected in ((None, "random"), ("the Hugging Face weights of init_from_hf_path hf/Qwen2-VL",
                                                 "the Hugging Face weights of init_from_hf_path hf/Qwen2-VL")):
        lines: list[str] = []
        args.initial_weights = initial
        progress = ck.load_checkpoint(args, engine=None, scheduler=None, log=lines.append)
        assert progress.iteration == 0
        assert lines == [f"WARNING: could not find the metadata file {tmp_path / 'missing'}/"
                         f"latest_checkpointed_iteration.txt; will not load any checkpoint and will start from "
                         f"{expected}"]


@pytest.mark.parametrize("tracker, reason", [
    ("directory", "is a directory, not the tracker file"),
    (b"\xff\xfe1\x000\x00", "is not text (not UTF-8). Received: b'\\xff\\xfe1"),
    (b"", "must hold an iteration number or 'release'. Received: ''"),
    (b"-3\n", "holds a negative iteration"),
    (b"9" * 5000, "must hold an iteration number"),
])
def test_a_broken_tracker_stops_with_one_line_and_the_way_out(tmp_path, tracker, reason):
    _save(tmp_path, 5)
    _save(tmp_path, 10)
    path = tmp_path / "latest_checkpointed_iteration.txt"
    path.unlink()
    if tracker == "directory":
        path.mkdir()
    else:
        path.write_bytes(tracker)
    with pytest.raises(ck.CheckpointError) as err:
        _find(tmp_path)
    message = str(err.value)
    assert reason in message and "\n" not in message and len(message) < 500
    assert "nothing was loaded" in message and "pass --ckpt-step 10" in message
    assert "the checkpoints here: iter_0000010, iter_0000005" in message


def test_a_tracker_naming_a_missing_iteration_lists_the_ones_there(tmp_path):
    _save(tmp_path, 5)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7\n")
    with pytest.raises(ck.CheckpointError, match=r"iter_0000007/mp_rank_00 does not exist \(iteration 7\).*"
                                                 r"the checkpoints here: iter_0000005"):
        _find(tmp_path)


def test_check_save_dir_refuses_what_could_never_take_a_checkpoint(tmp_path):
    ck.check_save_dir(None)
    ck.check_save_dir(tmp_path / "new" / "deeper")  # created at the first save
    (tmp_path / "file").write_text("x")
    with pytest.raises(ck.CheckpointError, match=r"file is not a directory.*pass a directory"):
        ck.check_save_dir(tmp_path / "file" / "ckpt")
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").mkdir(parents=True)
    with pytest.raises(ck.CheckpointError, match=r"is a directory, not the tracker file, so no save could be "
                                                 r"recorded; remove it"):
        ck.check_save_dir(tmp_path / "ckpt")
