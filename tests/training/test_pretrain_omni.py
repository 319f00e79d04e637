"""models/pretrain_vlm.py trains Qwen2.5-Omni's thinker from MindSpeed-MM's own job files (scripts/qwen2_5omni/:
model_7b.json shrunk, data_7b.json as it is) on a synthetic audio dataset, unsplit, with the same losses on
PyTorch and MindSpore; split over pipeline stages (the real script's PP=2) on megatron-core and on MindSpore's parallel
engine with the unsplit run's losses; audio layers beyond the first stage are refused in one line."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLM_ENTRY = ROOT / "models" / "pretrain_vlm.py"
ITERS = 3
ARGS = ["--micro-batch-size", "2", "--global-batch-size", "4", "--seq-length", "256", "--lr", "2e-3",
        "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--weight-decay", "0", "--clip-grad", "1.0",
        "--seed", "42", "--log-interval", "1", "--eval-iters", "0", "--train-iters", str(ITERS)]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    pytest.importorskip("av")
    spec = importlib.util.spec_from_file_location("mmrun_tests_omni_job", Path(__file__).with_name("omni_job.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root = tmp_path_factory.mktemp("omni_job")
    return module.make_job(root / "files"), root


def _train(tk, job, framework, extra=()):
    paths, root = job
    return tk.run_training(root / framework, [*ARGS, "--mm-model", str(paths["model_json"]), "--mm-data",
                                              str(paths["data_json"]), *extra],
                           framework=framework, nproc=1, timeout=600, entry=VLM_ENTRY)


@pytest.mark.slow
def test_pytorch_and_mindspore_train_the_same_losses(tk, job):
    pt = _train(tk, job, "pytorch")
    assert pt.returncode == 0, pt.output[-3000:]
    assert "frozen (no gradients, no optimizer state): audio_encoder, vision_encoder, vision_projector" in pt.output
    ms = _train(tk, job, "mindspore")
    assert ms.returncode == 0, ms.output[-3000:]
    pt_losses, ms_losses = pt.losses(), ms.losses()
    assert sorted(pt_losses) == sorted(ms_losses) == list(range(1, ITERS + 1))
    assert max(abs(pt_losses[i] - ms_losses[i]) for i in pt_losses) <= 1e-5, (pt_losses, ms_losses)
    assert pt_losses[ITERS] < pt_losses[1] - 0.2, pt_losses


def test_audio_layers_beyond_the_first_stage_are_refused_in_one_line(tk, job):
    import json

    paths, root = job
    moved = json.loads(paths["model_json"].read_text())
    moved["audio_encoder"]["audio_encoder"]["pipeline_num_layers"] = [1, 1]
    (root / "model_moved.json").write_text(json.dumps(moved))
    done = tk.run_training(root / "moved", [*ARGS, "--mm-model", str(root / "model_moved.json"), "--mm-data",
                                            str(paths["data_json"]), "--use-mcore-models",
                                            "--pipeline-model-parallel-size", "2"],
                           framework="pytorch", nproc=1, timeout=600, entry=VLM_ENTRY)
    assert done.returncode == 2
    assert "mmrun keeps the whole audio encoder (2 layers) on the first pipeline stage, beside the ViT" in done.output


@pytest.mark.slow
def test_mmrun_converts_split_loads_into_the_unsplit_run_as_its_hf_directory(tk, job):
    """MindSpeed-MM's README flow: `mm-convert Qwen2_5_OmniConverter hf_to_mm` (here TP=2 x PP=2, the audio encoder
    and ViT on stage 0), then LOAD_PATH = the converted directory: the run trains from the same weights as from the
    Hugging Face directory itself (the same losses), and not from its own initial ones. The launch script's own
    split, PP=2 on megatron-core and on MindSpore's parallel engine (the audio encoder and ViT on stage 0), loads the
    same directory and trains the same losses (1e-5) with every part trainable (the audio encoder's and ViT's
    gradients cross the stages)."""
    import json

    import torch
    import transformers

    from mmrun.checkpoint.convert_cli import main as convert
    from mmrun.models.qwen2_5_omni import model_json

    paths, root = job
    raw = json.loads(paths["model_json"].read_text())
    torch.manual_seed(0)
    transformers.Qwen2_5OmniThinkerForConditionalGeneration(transformers.Qwen2_5OmniThinkerConfig(
        **model_json.parse_model_json(raw).hf_config)).save_pretrained(root / "hf")
    assert convert(["Qwen2_5_OmniConverter", "hf_to_mm", "--cfg.mm_dir", str(root / "mm"), "--cfg.hf_config.hf_dir",
                    str(root / "hf"), "--cfg.parallel_config.llm_pp_layers", "[[1,1]]",
                    "--cfg.parallel_config.vit_pp_layers", "[[2,0]]", "--cfg.parallel_config.audio_pp_layers",
                    "[[2,0]]", "--cfg.parallel_config.tp_size", "2"]) == 0
    trainable = root / "model_trainable.json"  # model.json with every freeze switch off
    trainable.write_text(json.dumps(_unfrozen(raw)))
    pp2 = ("--no-load-optim", "--no-load-rng", "--use-mcore-models", "--pipeline-model-parallel-size", "2")
    runs = {name: tk.run_training(root / f"run-{name}", [*ARGS, "--mm-model", str(trainable), "--mm-data",
                                                         str(paths["data_json"]), "--load", str(root / source),
                                                         *extra, "--train-iters", "2"],
                                  framework=framework, nproc=nproc, timeout=600, entry=VLM_ENTRY)
            for name, framework, source, nproc, extra in (
                ("hf", "pytorch", "hf", 1, ()), ("mm", "pytorch", "mm", 1, ("--no-load-optim", "--no-load-rng")),
                ("pp2", "pytorch", "mm", 2, pp2), ("ms-pp2", "mindspore", "mm", 2, pp2[:2] + pp2[3:]))}
    for run in runs.values():
        assert run.returncode == 0, run.output[-3000:]
    assert "successfully loaded checkpoint from" in runs["mm"].output and "loaded Hugging Face weights" in runs[
        "hf"].output
    assert "on megatron-core" in runs["pp2"].output and "for (tp, pp) rank (0, 0)" in runs["ms-pp2"].output
    for name in ("pp2", "ms-pp2"):
        assert "successfully loaded checkpoint from" in runs[name].output, runs[name].output[-3000:]
        assert "frozen (no gradients, no optimizer state): nothing" in runs[name].output
    losses = {name: run.losses() for name, run in runs.items()}
    assert sorted(losses["mm"]) == sorted(losses["pp2"]) == sorted(losses["ms-pp2"]) == [1, 2], losses
    assert losses["mm"] == losses["hf"], losses
    assert max(abs(losses[name][i] - losses["hf"][i]) for name in ("pp2", "ms-pp2") for i in (1, 2)) <= 1e-5, losses


def _unfrozen(raw):
    """model.json with every `freeze` switch off."""
    if isinstance(raw, dict):
        return {key: False if key == "freeze" else _unfrozen(value) for key, value in raw.items()}
    return raw


def test_the_split_checks_of_model_json():
    """The real script's placement (audio encoder and ViT on stage 0) passes; audio layers on a later stage and LoRA
    are one line each (exit 2 in pretrain_vlm.py)."""
    import json

    from mmrun.backend.errors import UsageError
    from mmrun.models.qwen2_5_omni import model_json

    raw = json.loads((ROOT / "scripts" / "qwen2_5omni" / "model_tiny.json").read_text())
    pp2 = {"--pipeline-model-parallel-size": "2"}
    model_json.check_split(model_json.parse_model_json(raw), pp2, lora=False)
    moved = json.loads(json.dumps(raw))
    moved["audio_encoder"]["audio_encoder"]["pipeline_num_layers"] = [1, 1]
    refusals = {"keeps the whole audio encoder (2 layers) on the first pipeline stage, beside the ViT; give [2, 0":
                (moved, pp2, False),
                "LoRA is not built for Qwen2.5-Omni": (raw, {}, True)}
    for words, (spec, split, lora) in refusals.items():
        with pytest.raises(UsageError, match=re.escape(words)):
            model_json.check_split(model_json.parse_model_json(spec), split, lora)
