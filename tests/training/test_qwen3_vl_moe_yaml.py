"""MindSpeed-MM's Qwen3-VL MoE PyTorch form: `pretrain_transformers.py qwen3vl_full_sft_30B.yaml` with its
examples/qwen3vl/fsdp2_config.yaml (tests/fixtures/mindspeed_mm/qwen3vl, 57069cd5): `model_id: qwen3_vl_moe`,
transformers' own Qwen3VLMoeForConditionalGeneration, `expert_parallel_size: 1`, `reshard_local_experts`,
`moe_modules: model.language_model.layers.{*}.mlp.experts` (MindSpeed-MM uses the last two only with expert
parallelism: at 1 the experts are sharded with the rest of their FSDP unit, as here). The user's edits only: the
paths, the sizes of a CPU test, gloo, and the NPU kernels off with a warning."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from .conftest import clean_env, processes_with
from .qwen3_vl_job import tiny_hf_qwen3_vl
from .test_fsdp2_e2e import TRANSFORMERS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "mindspeed_mm" / "qwen3vl"


def write_30b_job(root: Path, global_batch_size: int = 2) -> Path:
    """The real qwen3vl_full_sft_30B.yaml and fsdp2_config.yaml, edited as a user would for this machine."""
    from mmrun.data.multimodal.demo import make_demo

    demo = root / "demo"
    make_demo(str(demo), num_samples=8, seed=7, model="qwen3_vl")
    tiny_hf_qwen3_vl(str(demo / "model"), moe=True)
    (root / "fsdp2_config.yaml").write_text((FIXTURES / "fsdp2_config.yaml").read_text())  # as MindSpeed-MM ships it
    job = yaml.safe_load((FIXTURES / "qwen3vl_full_sft_30B.yaml").read_text())
    job["gpt_args"].update({
        "fsdp2_config_path": str(root / "fsdp2_config.yaml"), "save": str(root / "save_dir"), "load": None,
        "micro_batch_size": 1, "global_batch_size": global_batch_size, "train_iters": 2, "eval_iters": 0, "seq_length": 256,
        "vocab_size": 512, "num_workers": 0, "distributed_backend": "gloo", "on_unsupported": "warn"})
    del job["gpt_args"]["load"]  # no MindSpeed-MM checkpoint: the model comes from init_from_hf_path
    params = job["data"]["dataset_param"]
    params["preprocess_parameters"].update({"model_name_or_path": str(demo / "model"), "image_max_pixels": 12544})
    params["basic_parameters"].update({"dataset_dir": str(demo / "data"), "dataset": str(demo / "data" / "demo.json"),
                                       "cache_dir": str(root / "cache_dir"), "preprocessing_num_workers": 1})
    job["data"]["dataloader_param"]["shuffle"] = False
    job["model"]["init_from_hf_path"] = str(demo / "model")
    path = root / "qwen3vl_full_sft_30B.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


@pytest.mark.slow
def test_the_real_30b_yaml_trains_transformers_moe_model_on_two_fsdp2_ranks(tmp_path):
    stdout, runs = _run_30b(tmp_path, 2, {})
    assert "2 expert module(s) (moe_modules, expert_parallel_size 1) sharded in their unit" in stdout, stdout[-3000:]
    losses = {iteration: loss for iteration, (loss, _) in runs.items()}
    assert sorted(losses) == [1, 2] and all(math.isfinite(v) and v > 0 for v in losses.values()), losses


def _run_30b(root: Path, nproc: int, fsdp2: dict, global_batch_size: int = 2
             ) -> tuple[str, dict[int, tuple[float, float]]]:
    """The 30B job (write_30b_job) on `nproc` FSDP2 ranks with `fsdp2` changed in its fsdp2_config.yaml -> (stdout,
    {iteration: (loss, gradient norm)})."""
    job = write_30b_job(root, global_batch_size)
    config = yaml.safe_load((root / "fsdp2_config.yaml").read_text())
    (root / "fsdp2_config.yaml").write_text(yaml.safe_dump({**config, **fsdp2}))
    metrics = root / "metrics.jsonl"
    marker = uuid.uuid4().hex
    try:
        done = subprocess.run([sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", "pytorch",
                               "--nproc-per-node", str(nproc), "--master-port", "0", str(TRANSFORMERS), str(job),
                               "--metrics-file", str(metrics)], cwd=root,
                              env=clean_env(MMRUN_TRAINING_TEST=marker, OMP_NUM_THREADS="1"), capture_output=True,
                              text=True, timeout=300)
    finally:
        for pid in processes_with(f"MMRUN_TRAINING_TEST={marker}"):
            os.kill(pid, 9)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, {r["iteration"]: (r["lm_loss"], r["grad_norm"])
                         for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "train"}


@pytest.mark.slow
def test_expert_parallel_2_on_two_and_four_fsdp2_ranks_equals_one_process(tmp_path):
    """expert_parallel_size 2 (MindSpeed-MM's mesh: each rank holds 2 of transformers' 4 experts per layer, tokens
    sent to them by transformers' all-to-all dispatch) on 2 ranks, and on 4 ranks with reshard_local_experts (as
    the file ships it: the local experts fully_shard-ed again over the 2 replicas, 1/4 of every expert tensor per
    rank): the losses of 2 iterations equal one process holding every expert within 1e-5, and so do the gradient
    norms (every gradient, the split experts' summed over the EP ranks; the yaml's warm-up gives iteration 1 a
    learning rate of 0). The file's param_dtype bf16: the split experts compute in it too, as fully_shard makes
    them compute at EP 1. Global batch 4 on every layout."""
    out, split = _run_30b(tmp_path / "ep2", 2, {"expert_parallel_size": 2}, 4)
    assert "2 expert module(s) (moe_modules) split over expert_parallel_size 2 (all-to-all token dispatch), the " \
           "local experts held whole" in out, out[-3000:]
    out, resharded = _run_30b(tmp_path / "ep2x2", 4, {"expert_parallel_size": 2}, 4)
    assert "split over expert_parallel_size 2 (all-to-all token dispatch), the local experts sharded over the 2 " \
           "replicas (reshard_local_experts)" in out, out[-3000:]
    _, whole = _run_30b(tmp_path / "one", 1, {"expert_parallel_size": 1}, 4)
    assert sorted(split) == sorted(resharded) == sorted(whole) == [1, 2] and split[1] != split[2], (split, whole)
    for run in (split, resharded):
        for iteration in (1, 2):
            assert all(abs(a - b) <= 1e-5 for a, b in zip(run[iteration], whole[iteration])), (run, whole)
    # the checkpoint (torch_dcp) holds every expert, gathered from the EP ranks (and their replicas' shards: 2-D
    # DTensors), loaded back here whole in one process, updated as one process updates them
    one = _saved_experts(tmp_path / "one" / "save_dir" / "iter_0000002")
    assert len(one) == 4 and all(v.shape[0] == 4 for v in one.values())
    for run in ("ep2", "ep2x2"):
        saved = _saved_experts(tmp_path / run / "save_dir" / "iter_0000002")
        assert sorted(saved) == sorted(one) and max(float((saved[k] - one[k]).abs().max()) for k in one) <= 1e-6


def _saved_experts(path: Path) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp

    meta = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    state = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in meta.items()
             if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))}
    dcp.load(state, checkpoint_id=str(path))
    return state
