"""models/pretrain_sora.py end to end with MindSpeed-MM's files and its pretrain.sh flags: the same losses on
PyTorch and MindSpore over 10 iterations, a MindSpore checkpoint resumed on PyTorch and converted to a diffusers
directory that diffusers loads; bad inputs as the entry meets them, one line each.

The features are tiny and random (two MindSpeed-MM .pt files written with torch.save, two mmrun .safetensors), the
DiT has one layer, one micro-batch of 2 per step. The one-rank MindSpore run is compiled (--ms-jit, one compile
line), the two-rank one PyNative (recomputation on a CPU): both step kinds meet PyTorch's losses. Each run trains
once per module. Two data-parallel ranks (one sample each) on both frameworks and FSDP2
on PyTorch train the losses of one rank with the same micro-batches (2 iterations). LoRA through the entry is shown
with real output in
docs/generation.md; the LoRA module itself is tests/models/test_lora.py.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "models" / "pretrain_sora.py"
ITERS = 10
DP_ITERS = 2
TOLERANCE = 1e-5
# examples/wan2.1/1.3b/t2v/pretrain.sh's GPT_ARGS (sizes and schedule made tiny), as the script passes them.
PRETRAIN_SH = [
    "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
    "--virtual-pipeline-model-parallel-size", "1", "--context-parallel-size", "1",
    "--context-parallel-algo", "ulysses_cp_algo", "--micro-batch-size", "2", "--global-batch-size", "2",
    "--num-workers", "8", "--lr", "1e-3", "--min-lr", "1e-3", "--adam-beta1", "0.9", "--adam-beta2", "0.999",
    "--adam-eps", "1e-8", "--lr-decay-style", "constant", "--weight-decay", "1e-2", "--lr-warmup-init", "0",
    "--lr-warmup-iters", "0", "--clip-grad", "1.0", "--train-iters", str(ITERS), "--no-gradient-accumulation-fusion",
    "--bf16", "--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "20",
    "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--attention-mask-type",
    "general", "--log-interval", "1", "--save-interval", "5", "--eval-interval", "10000", "--eval-iters", "10",
    "--ckpt-format", "torch", "--distributed-backend", "nccl", "--on-unsupported", "warn"]
TINY_FEATURES = ROOT / "docs" / "examples" / "generation" / "tiny_features.py"  # docs/generation.md's try-out files


def write_files(root: Path, layers: int = 1) -> dict[str, Path]:
    """feature_data.json + data.jsonl + 4 feature files (2 MindSpeed-MM .pt, 2 mmrun .safetensors) and a
    pretrain_model.json in MindSpeed-MM's form, for a one-layer DiT."""
    spec = importlib.util.spec_from_file_location("mmrun_tests_tiny_features", TINY_FEATURES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_files(root, layers)


@pytest.fixture(scope="module")
def sora(tmp_path_factory, tk):
    base = tmp_path_factory.mktemp("sora")
    files = write_files(base / "data")
    # fp32 for the equality runs: bf16 rounds differently on the two frameworks
    args = [a for a in PRETRAIN_SH if a != "--bf16"] + ["--mm-data", str(files["data"]), "--mm-model",
                                                         str(files["model"])]
    done: dict[str, object] = {}
    fsdp2 = base / "fsdp2.yaml"
    fsdp2.write_text("sharding_size: auto\nsub_modules_to_wrap: ['blocks.{*}']\n")
    split = ["--micro-batch-size", "1", "--train-iters", str(DP_ITERS), "--save-interval", str(DP_ITERS)]
    # the one-rank MindSpore run compiled (--ms-jit: pretrain.sh's recomputation alone would keep it PyNative on a
    # CPU, engines/portable.py); the two-rank one runs PyNative, so both MindSpore steps meet PyTorch's losses
    runs = {"pytorch": ("pytorch", 1, []), "mindspore": ("mindspore", 1, ["--ms-jit"]),
            # a global batch of 2 as two micro-batches of 1 (each draws its own timestep) on one rank, then as one
            # on each of two ranks
            "pytorch-mb1": ("pytorch", 1, split), "pytorch-dp2": ("pytorch", 2, split),
            "mindspore-dp2": ("mindspore", 2, split),
            "pytorch-fsdp2": ("pytorch", 2, [*split, "--use-torch-fsdp2", "--fsdp2-config-path", str(fsdp2)])}

    class Runs:
        def __call__(self, name: str, framework: str = "pytorch", extra: tuple[str, ...] = ()):
            if name not in done:
                fw, nproc, more = runs.get(name, (framework, 1, list(extra)))
                done[name] = tk.run_training(base / name, [*args, *more, "--save", str(base / name / "ckpt")],
                                             framework=fw, nproc=nproc, timeout=600, entry=ENTRY)
                assert done[name].returncode == 0, done[name].output[-4000:]
            return done[name]

        def ckpt(self, name: str) -> Path:
            self(name)  # trained here when no earlier test did: each test stands alone
            return base / name / "ckpt"

        base_dir = base
    return Runs()


def _gap(a: dict[int, float], b: dict[int, float], iterations) -> float:
    return max(abs(a[i] - b[i]) for i in iterations)


@pytest.mark.slow
def test_pytorch_and_mindspore_train_the_same_losses(sora):
    pt, ms = sora("pytorch").losses(), sora("mindspore").losses()
    assert sorted(pt) == sorted(ms) == list(range(1, ITERS + 1))
    assert _gap(pt, ms, range(1, ITERS + 1)) <= TOLERANCE, (pt, ms)
    output = sora("mindspore").output
    assert "MindSpore train step: mindspore.jit (graph)" in output
    assert output.count("> MindSpore compiled the train step (fused graph) for batch shapes") == 1, output[-3000:]


@pytest.mark.slow
def test_a_mindspore_checkpoint_resumes_on_pytorch_and_converts_for_diffusers(sora, tk):
    from diffusers import WanTransformer3DModel

    from mmrun.checkpoint import convert_cli
    from mmrun.training.checkpoint_store import find_checkpoint

    copy = tk.resume_copy(sora.ckpt("mindspore"), sora.base_dir / "ms-at-5", 5)
    resumed = sora("resume-on-pytorch", extra=("--load", str(copy)))
    assert "saved by mindspore; resuming on pytorch" in resumed.output
    losses = resumed.losses()
    assert sorted(losses) == list(range(6, ITERS + 1))
    assert _gap(losses, sora("mindspore").losses(), range(6, ITERS + 1)) <= TOLERANCE
    hf = sora.base_dir / "transformer"
    assert convert_cli.main(["WanConverter", "mm_to_hf", "--cfg.source_path", str(sora.ckpt("resume-on-pytorch")),
                             "--cfg.target_path", str(hf)]) == 0
    trained = find_checkpoint(sora.ckpt("resume-on-pytorch"), log=lambda _: None).model
    loaded = WanTransformer3DModel.from_pretrained(str(hf)).state_dict()
    assert sorted(loaded) == sorted(trained)
    for name, value in loaded.items():
        np.testing.assert_array_equal(value.numpy(), trained[name], err_msg=name)


@pytest.mark.slow
def test_data_parallel_on_both_frameworks_and_fsdp2_train_the_one_rank_losses(sora):
    one = sora("pytorch-mb1").losses()
    for name in ("pytorch-dp2", "mindspore-dp2", "pytorch-fsdp2"):
        run = sora(name)
        assert "world size 2 (data-parallel 2)" in run.output, run.output[-3000:]
        assert sorted(run.losses()) == list(range(1, DP_ITERS + 1))
        assert _gap(run.losses(), one, range(1, DP_ITERS + 1)) <= TOLERANCE, (name, run.losses(), one)
    assert "engine torch-fsdp2" in sora("pytorch-fsdp2").output
    assert "MindSpore train step: PyNative" in sora("mindspore-dp2").output  # recomputation on a CPU: PyNative


def test_pipeline_num_layers_with_a_pipeline_split_is_refused_in_one_line(tmp_path, capsys):
    """pipeline_num_layers is read: with one stage it is ignored (MindSpeed-MM's rule), with more the DiT's
    pipeline split is refused in one line, exit 2, before any training."""
    from mmrun.models import pretrain_sora

    files = write_files(tmp_path / "data", layers=2)
    with pytest.raises(SystemExit) as info:
        pretrain_sora.main([*PRETRAIN_SH, "--mm-data", str(files["data"]), "--mm-model", str(files["model"]),
                            "--pipeline-model-parallel-size", "2"])
    assert info.value.code == 2
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if "pipeline parallelism of the Wan DiT" in line]
    assert len(lines) == 1, out


def test_bad_inputs_are_one_line(tmp_path):
    """What the entry reads before training (model json, then the first feature file against it) refuses with
    one line (UsageError: exit 2), nothing written."""
    from mmrun.backend.errors import UsageError
    from mmrun.data.video.feature_files import FeatureDataset
    from mmrun.models.wan.model_json import read_sora_model_json

    files = write_files(tmp_path / "data")
    model = json.loads(files["model"].read_text())
    model["predictor"]["text_dim"] = 4096
    (tmp_path / "wrong_text_dim.json").write_text(json.dumps(model))
    spec = read_sora_model_json(str(tmp_path / "wrong_text_dim.json"))
    data = json.loads(files["data"].read_text())["dataset_param"]
    before = sorted(p.stat().st_mtime_ns for p in (tmp_path / "data").rglob("*"))
    with pytest.raises(UsageError, match=r"'prompt_ids' last dimension \(text_dim\) expected 4096, received 12"):
        FeatureDataset.from_dataset_param(data, spec.task, text_dim=spec.predictor.text_dim)[0]
    for change, expected in ((("load_video_features", False), "mmrun trains Wan2.1 from extracted features"),
                             (("task", "i2v"), "task 'i2v' but predictor.model_type 't2v'"),
                             (("diffusion", {"model_id": "ddpm"}), "diffusion.model_id 'ddpm' is not trainable")):
        bad = {**json.loads(files["model"].read_text()), change[0]: change[1]}
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(UsageError, match=expected) as info:
            read_sora_model_json(str(tmp_path / "bad.json"))
        assert "\n" not in str(info.value) and info.value.exit_code == 2
    assert sorted(p.stat().st_mtime_ns for p in (tmp_path / "data").rglob("*")) == before
