"""MindSpore tensor/pipeline parallelism through mmrun's trainer: the same losses as megatron-core on PyTorch.

Real jobs: `mmrun --ai-framework mindspore --nproc-per-node 2 models/pretrain_gpt.py ...` (msrun, mccl, CPU) with
--tensor-model-parallel-size 2 or --pipeline-model-parallel-size 2 train the engine of
engines/mindspore/parallel/engine.py; the reference is the same arguments on PyTorch (torchrun, gloo,
megatron-core: conftest's `mcore_runs`). fp32, dropout 0, one --seed: both start from mmrun's GPT weights
(models/gpt_names.py), so per-iteration losses agree within 1e-5. A TP=2 checkpoint written by MindSpore
resumes on PyTorch (megatron-core) and on MindSpore (bit-exact).
"""
from __future__ import annotations

import json

import pytest
from safetensors.numpy import load_file

TOLERANCE = 1e-5
# name -> (extra arguments, the PyTorch run of conftest.MCORE_RUNS it must match)
MS_RUNS = {
    "tp2": (["--use-mcore-models", "--tensor-model-parallel-size", "2", "--save-interval", "4"], "tp2"),
    "pp2": (["--pipeline-model-parallel-size", "2"], "pp2"),  # without --use-mcore-models: the notice
    # the distributed optimizer over 2 data-parallel ranks (backend/mindspore/parallel/zero.py), saved at 4 and 8
    "dp2-distopt": (["--use-mcore-models", "--use-distributed-optimizer", "--save-interval", "4"], "dp2-distopt"),
    # dropout on (hash dropout, MindSpore's generator): its state must travel in the checkpoint
    "tp2-dropout": (["--use-mcore-models", "--tensor-model-parallel-size", "2", "--save-interval", "4",
                     "--hidden-dropout", "0.1", "--attention-dropout", "0.1"], None),
}


@pytest.fixture(scope="module")
def ms_runs(mcore_runs, tmp_path_factory, tk):
    base = tmp_path_factory.mktemp("ms_parallel")
    done: dict = {}

    class Runs:
        def __call__(self, name: str):
            if name not in done:
                extra, _ = MS_RUNS[name]
                done[name] = tk.run_training(base / name, [*mcore_runs.args, *extra, "--save", str(self.ckpt(name))],
                                             framework="mindspore", nproc=2, timeout=400)
                assert done[name].returncode == 0, done[name].output[-4000:]
            return done[name]

        @staticmethod
        def ckpt(name: str):
            return base / name / "ckpt"
    return Runs()


def _differences(run, reference) -> tuple[float, float, float]:
    """Largest |difference| of the train losses, gradient norms and validation/test losses."""
    losses, expected = run.losses(), reference.losses()
    assert sorted(losses) == sorted(expected) and losses
    norms = {m["iteration"]: m["grad_norm"] for m in run.metrics if m["kind"] == "train"}
    ref_norms = {m["iteration"]: m["grad_norm"] for m in reference.metrics if m["kind"] == "train"}
    evals = [(a, b) for kind in ("valid", "test") for a, b in zip(run.evals(kind), reference.evals(kind))]
    for kind in ("valid", "test"):
        assert len(run.evals(kind)) == len(reference.evals(kind))
    return (max(abs(losses[i] - expected[i]) for i in expected), max(abs(norms[i] - ref_norms[i]) for i in ref_norms),
            max((abs(a - b) for a, b in evals), default=0.0))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pp2", "tp2", "dp2-distopt"])
def test_mindspore_trains_like_megatron_core_on_pytorch(ms_runs, mcore_runs, name):
    run, reference = ms_runs(name), mcore_runs(MS_RUNS[name][1])
    assert sorted(run.losses()) == list(range(1, 9)) and run.evals("valid") and run.evals("test")
    loss, norm, evals = _differences(run, reference)
    print(f"\n  {name}: largest difference to megatron-core: train loss {loss:.1e}, grad norm {norm:.1e}, "
          f"validation/test loss {evals:.1e}", end="")  # docs/parallelism-mindspore.md
    assert loss < TOLERANCE and evals < TOLERANCE and norm < 10 * TOLERANCE
    assert "engine mindspore-parallel" in run.output
    summary = [m for m in run.metrics if m["kind"] == "summary"][0]
    assert summary["engine"] == "mindspore-parallel" and summary["parallel"][name[:2]] == 2


@pytest.mark.slow
def test_a_parallel_flag_alone_says_which_model_trains(ms_runs):
    assert ("notice: --pipeline-model-parallel-size 2: mmrun's GPT implements none of this, so this run trains "
            "megatron-core's GPTModel rebuilt on MindSpore") in ms_runs("pp2").output
    assert "notice:" not in ms_runs("tp2").output.split("training ...")[0].replace("notice: --dropout", "")


@pytest.mark.slow
def test_the_tp2_checkpoint_has_megatron_cores_names_and_shards(ms_runs, mcore_runs):
    iteration = ms_runs.ckpt("tp2") if ms_runs("tp2") else None
    ranks = sorted(p.name for p in (iteration / "iter_0000004").iterdir() if p.is_dir())
    assert ranks == ["mp_rank_00", "mp_rank_01"]
    model = load_file(str(iteration / "iter_0000004" / "mp_rank_01" / "model.safetensors"))
    assert model["embedding.word_embeddings.weight"].shape[1] == 64
    assert model["decoder.layers.3.self_attention.linear_qkv.weight"].shape == (96, 64)  # 3 x 64 rows / TP 2
    optimizer = load_file(str(iteration / "iter_0000004" / "mp_rank_01" / "optimizer.safetensors"))
    assert {f"{n}.{k}" for n in model for k in ("exp_avg", "exp_avg_sq")} == set(optimizer)
    meta = json.loads((iteration / "iter_0000004" / "mp_rank_01" / "meta.json").read_text())
    assert meta["model_names"] == "megatron-core"


@pytest.mark.slow
@pytest.mark.parametrize("framework, name", [("mindspore", "tp2-dropout"), ("pytorch", "tp2"),
                                             ("pytorch", "dp2-distopt")])
def test_a_mindspore_tp2_checkpoint_resumes(ms_runs, mcore_runs, tmp_path, tk, framework, name):
    """Saved at iteration 4 by MindSpore. Resumed on MindSpore, iterations 5-8 are bit-exact, with dropout on:
    the engine keeps no RNG of its own (rng_state None), the dropout generator's offset is the backend's
    seeding state, which the checkpoint saves, so the resumed run draws the same masks. Resumed on PyTorch
    (megatron-core, the same layout, dropout 0: the frameworks draw different masks there) within 1e-5."""
    full = ms_runs(name)
    copy = tk.resume_copy(ms_runs.ckpt(name), tmp_path / "ckpt", 4)
    extra, _ = MS_RUNS[name]
    run = tk.run_training(tmp_path / "resume", [*mcore_runs.args, *extra, "--load", str(copy)],
                          framework=framework, nproc=2, timeout=400)
    assert run.returncode == 0, run.output[-4000:]
    assert "successfully loaded checkpoint" in run.output
    losses, expected = run.losses(), full.losses()
    assert sorted(losses) == [5, 6, 7, 8]
    worst = max(abs(losses[i] - expected[i]) for i in losses)
    print(f"\n  resumed on {framework}: largest train-loss difference {worst:.1e}", end="")
    if framework == "mindspore":
        assert expected != ms_runs("tp2").losses()  # dropout acted
        assert losses == {i: loss for i, loss in expected.items() if i > 4}
        assert run.evals("valid")[-1] == full.evals("valid")[-1]
    else:
        assert worst < TOLERANCE, {i: (losses[i], expected[i]) for i in losses}


@pytest.mark.slow
@pytest.mark.parametrize("extra, message", [
    (["--tensor-model-parallel-size", "2", "--fp16"],
     "error: the MindSpore tensor/pipeline-parallel engine cannot run --fp16: it trains in fp32 only"),
    (["--context-parallel-size", "2"],
     "error: [mmrun trainer] --context-parallel-size 2 (context parallelism) is not supported with the mindspore "
     "backend on cpu"),
])
def test_what_it_does_not_do_is_refused_in_one_line(mcore_runs, tmp_path, tk, extra, message):
    run = tk.run_training(tmp_path, [*mcore_runs.args, *extra], framework="mindspore", nproc=2, timeout=200)
    assert run.returncode == 2, run.output[-3000:]
    lines = [line.strip() for line in run.output.splitlines() if message in line]
    assert lines and "Traceback" not in run.output
