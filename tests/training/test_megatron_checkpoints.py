"""Checkpoints of the megatron-core engine: one file set per (tensor, pipeline) rank with megatron-core's own
names, bit-exact resume, the distributed optimizer's state, loading into another layout or engine, the
converter command, and a save killed half-way.

The runs come from conftest's `mcore_runs` (real jobs through `mmrun`, shared with the parity tests).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from mmrun.models import gpt_names as cg
from mmrun.training.checkpoint_layout import TRACKER_FILE

RANK_DIRS = ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]
SHAPE = cg.GPTShape(num_layers=4, hidden_size=64, num_attention_heads=4)


def _resume_copy(runs, name: str, tmp_path: Path, tk, iteration: int = 4) -> Path:
    """A copy of a run's checkpoints that resumes at `iteration` (later ones removed)."""
    runs(name)  # trained (once per session)
    return tk.resume_copy(runs.ckpt(name), tmp_path / f"{name}-ckpt", iteration)


@pytest.fixture
def train(mcore_runs, tmp_path, tk):
    """train(extra, nproc, sub) -> Run: the parity runs' GPT with `extra` arguments, through `mmrun`."""
    def run(extra: list[str], nproc: int, sub: str, env_extra=None):
        return tk.run_training(tmp_path / sub, [*mcore_runs.args, *extra], nproc=nproc, timeout=400,
                               env_extra=env_extra)
    return run


def _later_iterations_equal(run, reference, exact: bool, tolerance: float = 1e-5):
    losses, expected = run.losses(), reference.losses()
    assert sorted(losses) == [5, 6, 7, 8]
    if exact:
        assert {i: losses[i] for i in losses} == {i: expected[i] for i in losses}
        norms = {m["iteration"]: m["grad_norm"] for m in run.metrics if m["kind"] == "train"}
        assert norms == {m["iteration"]: m["grad_norm"] for m in reference.metrics
                         if m["kind"] == "train" and m["iteration"] in norms}
        assert run.evals("valid")[-1] == reference.evals("valid")[-1]
    else:
        assert max(abs(losses[i] - expected[i]) for i in losses) < tolerance


@pytest.mark.slow
def test_each_rank_writes_megatron_cores_names_and_shard_shapes(mcore_runs):
    mcore_runs("tp2pp2")
    iteration = mcore_runs.ckpt("tp2pp2") / "iter_0000004"
    assert sorted(p.name for p in iteration.iterdir()) == RANK_DIRS
    assert not list(iteration.rglob("*.pt")), "no pickle anywhere"
    full = cg.mmrun_to_mcore({n: np.zeros(s, np.float32) for n, s in cg.mmrun_parameter_shapes(
        SHAPE, 640, 32, 256).items()}, SHAPE)  # NullTokenizer 512 + EOD, padded to 640
    expected = cg.split(full, SHAPE, cg.Layout(tp=2, pp=2))
    for (t, p), names in expected.items():
        rank = iteration / f"mp_rank_{t:02d}_{p:03d}"
        model = load_file(str(rank / "model.safetensors"))
        assert {k: v.shape for k, v in model.items()} == {k: v.shape for k, v in names.items()}
        optimizer = load_file(str(rank / "optimizer.safetensors"))
        assert sorted(optimizer) == sorted(f"{k}.{s}" for k in names for s in ("exp_avg", "exp_avg_sq"))
        meta = json.loads((rank / "meta.json").read_text())
        assert meta["model_names"] == "megatron-core" and meta["engine"] == "megatron-core"
        assert (meta["parallel"]["tp"], meta["parallel"]["pp"], meta["parallel"]["tp_rank"], meta["parallel"]["pp_rank"]) \
            == (2, 2, t, p)
    last = load_file(str(iteration / "mp_rank_01_001" / "model.safetensors"))
    assert last["decoder.layers.1.self_attention.linear_qkv.weight"].shape == (96, 64)  # 3 x 64 / TP 2 rows
    assert last["output_layer.weight"].shape == (320, 64)  # the last stage's copy of the tied embeddings, split over TP
    first = load_file(str(iteration / "mp_rank_00_000" / "model.safetensors"))
    np.testing.assert_array_equal(first["embedding.word_embeddings.weight"],
                                  load_file(str(iteration / "mp_rank_00_001" / "model.safetensors"))["output_layer.weight"])


@pytest.mark.slow
def test_a_tp2_x_pp2_run_resumes_bit_exact(mcore_runs, tmp_path, train, tk):
    copy = _resume_copy(mcore_runs, "tp2pp2", tmp_path, tk)
    nproc, extra = 4, ["--use-mcore-models", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]
    run = train([*extra, "--load", str(copy)], nproc, sub="resume")
    assert run.returncode == 0, run.output[-3000:]
    assert "successfully loaded checkpoint" in run.output and "[ t 1/2, p 1/2 ] at iteration 4" in run.output
    _later_iterations_equal(run, mcore_runs("tp2pp2"), exact=True)


@pytest.mark.slow
def test_the_distributed_optimizer_resumes_bit_exact_and_without_itself(mcore_runs, tmp_path, train, tk):
    copy = _resume_copy(mcore_runs, "dp2-distopt", tmp_path, tk)
    same = train(["--use-mcore-models", "--use-distributed-optimizer", "--load", str(copy)], 2, sub="same")
    assert same.returncode == 0, same.output[-3000:]
    _later_iterations_equal(same, mcore_runs("dp2-distopt"), exact=True)
    # the optimizer file holds whole per-parameter moments: a run without the distributed optimizer takes them
    plain = train(["--use-mcore-models", "--load", str(copy)], 2, sub="plain")
    assert plain.returncode == 0, plain.output[-3000:]
    _later_iterations_equal(plain, mcore_runs("dp2-distopt"), exact=False, tolerance=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("nproc, extra", [
    (1, []),  # mmrun's own GPT (its names)
    (2, ["--use-mcore-models", "--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2"]),
])
def test_a_checkpoint_moves_to_another_layout_or_engine(mcore_runs, tmp_path, train, nproc, extra, tk):
    copy = _resume_copy(mcore_runs, "tp2pp2", tmp_path, tk)
    run = train([*extra, "--load", str(copy)], nproc, sub="moved")
    assert run.returncode == 0, run.output[-3000:]
    assert "differs from this run's" in run.output and "joining its shards and splitting them again" in run.output
    _later_iterations_equal(run, mcore_runs("tp2pp2"), exact=False)


@pytest.mark.slow
def test_the_converter_command_round_trips_bit_exact(mcore_runs, tmp_path, tk, train):
    mcore_runs("tp2pp2")
    command = [sys.executable, "-m", "mmrun.checkpoint.gpt"]
    gpt, back = tmp_path / "gpt", tmp_path / "back"
    done = subprocess.run([*command, "--load", str(mcore_runs.ckpt("tp2pp2")), "--ckpt-step", "4", "--save", str(gpt),
                           "--to", "mmrun-gpt"], capture_output=True, text=True, env=tk.clean_env())
    assert done.returncode == 0, done.stderr
    assert (gpt / TRACKER_FILE).read_text().strip() == "4" and (gpt / "iter_0000004" / "mp_rank_00").is_dir()
    assert "wte.weight" in load_file(str(gpt / "iter_0000004" / "mp_rank_00" / "model.safetensors"))
    done = subprocess.run([*command, "--load", str(gpt), "--save", str(back), "--to", "megatron-core",
                           "--tensor_model_parallel_size", "2", "--pipeline-model-parallel-size", "2"],
                          capture_output=True, text=True, env=tk.clean_env())
    assert done.returncode == 0, done.stderr
    for rank in RANK_DIRS:
        for name in ("model.safetensors", "optimizer.safetensors"):
            a = load_file(str(mcore_runs.ckpt("tp2pp2") / "iter_0000004" / rank / name))
            b = load_file(str(back / "iter_0000004" / rank / name))
            assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    # mmrun's GPT resumes the converted checkpoint as it resumes the original on the fly
    run = train(["--load", str(gpt)], 1, sub="gpt")
    assert run.returncode == 0, run.output[-3000:]
    _later_iterations_equal(run, mcore_runs("tp2pp2"), exact=False)
    refused = subprocess.run([*command, "--load", str(gpt), "--save", str(gpt), "--to", "mmrun-gpt"],
                             capture_output=True, text=True, env=tk.clean_env())
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "would be overwritten" in refused.stderr


@pytest.mark.slow
def test_a_save_killed_in_a_writer_leaves_the_previous_checkpoint(tmp_path, train):
    save = tmp_path / "ckpt"
    extra = ["--use-mcore-models", "--tensor-model-parallel-size", "2", "--train-iters", "4", "--save-interval", "2",
             "--save", str(save)]
    killed = train(extra, 2, sub="killed", env_extra={"MMRUN_TEST_KILL_DURING_SAVE": "4:files"})
    assert killed.returncode != 0
    assert (save / TRACKER_FILE).read_text().strip() == "2"
    assert not (save / "iter_0000004").exists()
    resumed = train([*extra, "--load", str(save)], 2, sub="resumed")
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert "at iteration 2" in resumed.output and sorted(resumed.losses()) == [3, 4]
    assert not [p for p in save.iterdir() if p.name.startswith(".")], "the killed save's temporaries are gone"


@pytest.mark.slow
def test_a_corrupt_shard_stops_every_rank_with_one_line(mcore_runs, tmp_path, train, tk):
    copy = _resume_copy(mcore_runs, "tp2pp2", tmp_path, tk)
    broken = copy / "iter_0000004" / "mp_rank_01_001" / "model.safetensors"
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size // 2])
    run = train(["--use-mcore-models", "--tensor-model-parallel-size", "2", "--load", str(copy)], 2,
                 sub="corrupt")
    assert run.returncode == 2, run.output[-3000:]
    errors = [line for line in run.output.splitlines() if line.startswith("error:")]
    assert len(set(errors)) == 1 and "mp_rank_01_001" in errors[0] and "corrupt or truncated" in errors[0]
    assert not re.search(r'File ".*/(training|backend|models)/', run.output), "a worker printed a traceback"
