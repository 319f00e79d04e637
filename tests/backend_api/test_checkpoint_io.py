"""Framework-neutral checkpoints: safetensors + JSON, atomic, no pickle, clear errors."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from mmrun.backend import checkpoint_io

MODEL = {"wte.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "ln_f.bias": np.zeros(4, np.float32)}
OPTIMIZER = {"step": 7, "lr": 2.5e-4, "tensors": {"wte.weight.exp_avg": np.ones((3, 4), np.float32),
                                                  "wte.weight.exp_avg_sq": np.full((3, 4), 2, np.float32)}}


def test_roundtrip_model_optimizer_and_meta(tmp_path):
    path = checkpoint_io.save_checkpoint(tmp_path / "iter_0000007", MODEL, OPTIMIZER,
                                         meta={"iteration": 7, "rng": {"seed": 1234}})
    assert sorted(os.listdir(path)) == ["meta.json", "model.safetensors", "optimizer.safetensors"]
    # plain safetensors with torch-style names: readable by any safetensors loader, no pickle
    assert sorted(load_file(str(path / "model.safetensors"))) == ["ln_f.bias", "wte.weight"]
    assert json.loads((path / "meta.json").read_text())["optimizer"] == {"step": 7, "lr": 2.5e-4}
    ckpt = checkpoint_io.load_checkpoint(path)
    np.testing.assert_array_equal(ckpt.model["wte.weight"], MODEL["wte.weight"])
    assert ckpt.optimizer["step"] == 7 and ckpt.optimizer["lr"] == 2.5e-4
    np.testing.assert_array_equal(ckpt.optimizer["tensors"]["wte.weight.exp_avg_sq"], 2.0)
    assert ckpt.meta == {"iteration": 7, "rng": {"seed": 1234}}


def test_model_only_checkpoint(tmp_path):
    ckpt = checkpoint_io.load_checkpoint(checkpoint_io.save_checkpoint(tmp_path / "c", MODEL))
    assert ckpt.optimizer is None and sorted(ckpt.model) == ["ln_f.bias", "wte.weight"]


def test_overwrite_replaces_whole_directory_and_leaves_no_temporaries(tmp_path):
    target = tmp_path / "latest"
    checkpoint_io.save_checkpoint(target, MODEL, OPTIMIZER, meta={"iteration": 1})
    checkpoint_io.save_checkpoint(target, {"wte.weight": MODEL["wte.weight"] * 2}, meta={"iteration": 2})
    ckpt = checkpoint_io.load_checkpoint(target)
    assert ckpt.meta["iteration"] == 2 and ckpt.optimizer is None
    assert not (target / "optimizer.safetensors").exists()  # nothing stale from the old save
    assert os.listdir(tmp_path) == ["latest"]


@pytest.mark.parametrize("model, meta, error", [
    ({"w": [1.0, 2.0]}, None, TypeError),  # not numpy: convert with tensors.state_dict_to_numpy first
    (MODEL, {"callback": print}, TypeError),  # meta not JSON-serialisable
])
def test_failed_save_keeps_the_previous_checkpoint(tmp_path, model, meta, error):
    target = tmp_path / "ckpt"
    checkpoint_io.save_checkpoint(target, MODEL, meta={"iteration": 3})
    with pytest.raises(error):
        checkpoint_io.save_checkpoint(target, model, meta=meta)
    assert checkpoint_io.load_checkpoint(target).meta == {"iteration": 3}
    assert os.listdir(tmp_path) == ["ckpt"]


def test_loading_something_else_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not an mmrun checkpoint"):
        checkpoint_io.load_checkpoint(tmp_path)
    path = checkpoint_io.save_checkpoint(tmp_path / "c", MODEL)
    (path / "meta.json").write_text(json.dumps({"format": "other", "version": 9}))
    with pytest.raises(ValueError, match="has format 'other' version 9"):
        checkpoint_io.load_checkpoint(path)
