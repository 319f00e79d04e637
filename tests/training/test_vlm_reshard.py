"""Resume across layouts for Qwen2-VL: the loop's reshard-on-load (training/checkpoint_reshard_vlm.py) gives a
data-parallel run the whole model in Hugging Face names from a (TP=2, PP=2) checkpoint, a parallel engine's rank
its share from a data-parallel checkpoint, and the optimizer state the same way for the parameters that have it
(a frozen ViT has none). No process is started: the loop calls exactly this with its engine's layout."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from mmrun.engines.base import ParallelLayout
from mmrun.checkpoint.convert_cli import main
from mmrun.models.qwen2_vl import hf_checkpoint
from mmrun.models.vlm import mm_layout
from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig
from mmrun.models.vlm.model_json import read_model_json
from mmrun.models.vlm.mm_layout import VLMLayout
from mmrun.training import checkpoint_reshard
from mmrun.training.checkpoint_store import read_checkpoint, write_checkpoint

ROOT = Path(__file__).resolve().parents[2]
MODEL_JSON = ROOT / "scripts" / "qwen2vl" / "model_tiny.json"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The demo's model.json, random weights as a Hugging Face directory, and their (TP=2, PP=2) conversion."""
    root = tmp_path_factory.mktemp("vlm")
    config = Qwen2VLConfig.from_hf_config(read_model_json(MODEL_JSON).hf_config)
    rng = np.random.default_rng(1)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in mm_layout.hf_shapes(config).items()}
    hf_checkpoint.save_hf_directory(root / "hf", config, arrays)
    assert main(["Qwen2VLConverter", "hf_to_mm", "--cfg.mm_dir", str(root / "mm"), "--cfg.hf_config.hf_dir",
                 str(root / "hf"), "--cfg.parallel_config.tp_size", "2", "--cfg.parallel_config.llm_pp_layers",
                 "[[1,1]]", "--cfg.parallel_config.vit_pp_layers", "[[2,0]]"]) == 0
    return root, config, arrays


def test_a_tp2_pp2_checkpoint_loads_into_the_data_parallel_run_and_another_split(model):
    root, config, arrays = model
    args = argparse.Namespace(mm_model=str(MODEL_JSON))
    probe = read_checkpoint(root / "mm", "release")
    whole = checkpoint_reshard.reshard(probe, root / "mm", args, "mmrun-gpt", ParallelLayout())
    assert sorted(whole.model) == sorted(arrays) and whole.meta["resharded"]
    assert all(np.array_equal(whole.model[n], arrays[n]) for n in arrays)
    assert whole.optimizer is None  # a conversion holds weights only
    target = VLMLayout.build(config, 1, 2, [2, 0], [1, 1])
    for pp_rank in range(2):
        # no vlm_layout from the engine: the split comes from model.json for the run's sizes
        rank = checkpoint_reshard.reshard(probe, root / "mm", args, "mindspeed-mm",
                                          ParallelLayout(world_size=2, pp=2, pp_rank=pp_rank))
        expected = mm_layout.rank_state_from_hf(target, arrays.__getitem__, 0, pp_rank)
        assert list(rank.model) == list(expected)
        assert all(np.array_equal(rank.model[n], expected[n]) for n in expected)


def test_optimizer_state_follows_for_the_trained_parameters(model, tmp_path):
    """A data-parallel run's checkpoint (Hugging Face names, the engine's generic model_names) whose ViT was
    frozen: a (TP=2, PP=2) rank gets Adam's moments of its own share of the text decoder and projector."""
    root, config, arrays = model
    trained = [n for n in arrays if not n.startswith("visual.blocks.") and n != "visual.patch_embed.proj.weight"]
    rng = np.random.default_rng(2)
    moments = {f"{n}.{k}": rng.standard_normal(arrays[n].shape).astype(np.float32) for n in trained
               for k in ("exp_avg", "exp_avg_sq")}
    write_checkpoint(tmp_path, 7, arrays, {"step": 7, "lr": 1e-4, "tensors": moments},
                     {"iteration": 7, "model_names": "mmrun-gpt", "args": {"mm_model": str(MODEL_JSON)}})
    probe = read_checkpoint(tmp_path, 7)
    target = VLMLayout.build(config, 2, 2, [2, 0], [1, 1])
    args = argparse.Namespace(mm_model=str(MODEL_JSON))
    for tp_rank, pp_rank in ((1, 0), (0, 1)):
        shard = checkpoint_reshard.reshard(probe, tmp_path, args, "mindspeed-mm",
                                           ParallelLayout(world_size=4, tp=2, pp=2, tp_rank=tp_rank, pp_rank=pp_rank),
                                           target)
        assert shard.optimizer["step"] == 7 and shard.meta["iteration"] == 7
        for key in ("exp_avg", "exp_avg_sq"):
            expected = mm_layout.rank_state_from_hf(target, lambda n: moments[f"{n}.{key}"] if n in trained
                                                    else np.zeros(arrays[n].shape, np.float32), tp_rank, pp_rank)
            held = {n[:-len(key) - 1]: a for n, a in shard.optimizer["tensors"].items() if n.endswith("." + key)}
            frozen = {n for n in expected if n.startswith("image_encoder.encoder.")}
            assert sorted(held) == sorted(set(expected) - frozen)
            assert all(np.array_equal(held[n], expected[n]) for n in held)
    assert json.loads((tmp_path / "iter_0000007" / "mp_rank_00" / "meta.json").read_text())["iteration"] == 7


def test_a_data_parallel_checkpoint_resplits_like_its_hugging_face_weights(model, tmp_path):
    """resplit takes the one-process run's checkpoint (Hugging Face names; the model's config from the run's
    --mm-model in its meta.json) and writes the same rank files as hf_to_mm of the same weights."""
    root, _, arrays = model
    write_checkpoint(tmp_path / "dp", 3, arrays, None, {"iteration": 3, "model_names": "mmrun-gpt",
                                                        "args": {"mm_model": str(MODEL_JSON)}})
    assert main(["Qwen2VLConverter", "resplit", "--cfg.source_dir", str(tmp_path / "dp"), "--cfg.target_dir",
                 str(tmp_path / "tp2"), "--cfg.target_parallel_config.tp_size", "2",
                 "--cfg.target_parallel_config.llm_pp_layers", "[1,1]",
                 "--cfg.target_parallel_config.vit_pp_layers", "[2,0]"]) == 0
    for rank in ("mp_rank_00_000", "mp_rank_01_000", "mp_rank_00_001", "mp_rank_01_001"):
        ours = read_checkpoint(tmp_path / "tp2", "release", rank)
        theirs = read_checkpoint(root / "mm", "release", rank)
        assert list(ours.model) == list(theirs.model) and ours.iteration == 3
        assert all(np.array_equal(ours.model[n], theirs.model[n]) for n in theirs.model)


def test_is_vlm_decides_from_the_model_json(tmp_path):
    """A run's --mm-model makes it a VLM run only when the json is a VLM's (image_encoder / text_decoder): a Wan
    predictor json (pretrain_sora.py's) is not, nor a missing or unreadable file; a VLM checkpoint always is."""
    from mmrun.training.checkpoint_reshard_vlm import is_vlm

    import importlib.util

    spec = importlib.util.spec_from_file_location("tiny_wan", ROOT / "docs" / "examples" / "generation" /
                                                  "tiny_features.py")
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    wan = tiny.write_files(tmp_path / "wan", pt=False)["model"]  # pretrain_sora.py's pretrain_model.json
    (tmp_path / "broken.json").write_text("{not json")
    for path, expected in ((MODEL_JSON, True), (ROOT / "scripts" / "qwen3vl" / "model_tiny.json", True),
                           (wan, False), (tmp_path / "broken.json", False), (tmp_path / "absent.json", False),
                           (None, False)):
        assert is_vlm({}, argparse.Namespace(mm_model=None if path is None else str(path))) is expected, path
    assert is_vlm({"model_names": "mindspeed-mm"}, argparse.Namespace(mm_model=str(wan)))


def test_a_converted_qwen3_vl_checkpoint_loads_into_the_one_process_run(tmp_path):
    """`mmrun convert Qwen3VLMegatronConverter hf_to_mm` at TP=2, PP=2, then a one-process Qwen3-VL run's --load
    (issue 37: the reshard read its model.json with the Qwen2-VL reader and refused model_id qwen3_vl): the whole
    model back in Hugging Face names, every tensor equal."""
    from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig
    from mmrun.models.vlm.model_json import read_model_json

    model_json = ROOT / "scripts" / "qwen3vl" / "model_tiny.json"
    config = Qwen3VLConfig.from_hf_config(read_model_json(str(model_json)).hf_config)
    rng = np.random.default_rng(3)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in mm_layout.hf_shapes(config).items()}
    hf_checkpoint.save_hf_directory(tmp_path / "hf", config, arrays)
    assert main(["Qwen3VLMegatronConverter", "hf_to_mm", "--cfg.mm_dir", str(tmp_path / "mm"),
                 "--cfg.hf_config.hf_dir", str(tmp_path / "hf"), "--cfg.parallel_config.tp_size", "2",
                 "--cfg.parallel_config.llm_pp_layers", "[[1,1]]", "--cfg.parallel_config.vit_pp_layers",
                 "[[2,0]]"]) == 0
    probe = read_checkpoint(tmp_path / "mm", "release")
    whole = checkpoint_reshard.reshard(probe, tmp_path / "mm", argparse.Namespace(mm_model=str(model_json)),
                                       "mmrun-gpt", ParallelLayout())
    assert sorted(whole.model) == sorted(arrays) and whole.meta["resharded"]
    assert any("deepstack_merger_list" in n for n in arrays)
    assert all(np.array_equal(whole.model[n], arrays[n]) for n in arrays)
