"""models/pretrain_vlm.py end to end: MindSpeed-MM's files and launch lines, the same losses on PyTorch and
MindSpore, resume across frameworks, DP=2 = DP=1, the per-token loss, Hugging Face weights in and out.

The runs share one offline demo (synthetic pictures + captions, the tiny model.json of the demo script) and
are each trained once per session; MindSpore trains once (it is the slow one) and the other checks reuse it.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


ROOT = Path(__file__).resolve().parents[2]
VLM_ENTRY = ROOT / "models" / "pretrain_vlm.py"
MODEL_JSON = ROOT / "scripts" / "qwen2vl" / "model_tiny.json"
ITERS = 10
TOLERANCE = 1e-5  # the bar: per-iteration loss within 1e-5 between frameworks and layouts
# (the runs themselves, and their training arguments `vlm.args`, are conftest.py's `vlm` fixture)


def _close(a: dict[int, float], b: dict[int, float], iterations) -> float:
    return max(abs(a[i] - b[i]) for i in iterations)


@pytest.mark.slow
def test_pytorch_and_mindspore_train_the_same_losses(vlm):
    pt, ms = vlm("pytorch").losses(), vlm("mindspore").losses()
    assert sorted(pt) == sorted(ms) == list(range(1, ITERS + 1))
    assert _close(pt, ms, range(1, ITERS + 1)) <= TOLERANCE, (pt, ms)
    assert pt[ITERS] < pt[1] - 0.3, pt  # it learns: the captions are readable from the pictures
    assert "MindSpore train step: mindspore.jit (graph)" in vlm("mindspore").output


@pytest.mark.slow
def test_a_mindspore_rerun_loads_the_compiled_graphs_and_trains_the_same_losses(vlm):
    # The same job again, stopped after 3 iterations (--save and --exit-interval change no graph): --ms-compile-cache's
    # folder of this job has the first run's graphs, MindSpore loads them instead of compiling, the numbers stay.
    first = vlm("mindspore")
    vlm.add("mindspore-rerun", "mindspore", 1, [*vlm.extra("mindspore"), "--exit-interval", "3"])
    rerun = vlm("mindspore-rerun")
    assert "empty: saving the graphs" in first.output and "graphs of an earlier run of this job" in rerun.output
    assert rerun.losses() == {i: first.losses()[i] for i in (1, 2, 3)}

    def compile_seconds(run) -> float:
        return sum(float(line.split(" in ")[-1].split(" s ")[0]) for line in run.output.splitlines()
                   if line.startswith("> MindSpore compiled the train step"))
    assert compile_seconds(rerun) < compile_seconds(first) / 3, (compile_seconds(rerun), compile_seconds(first))


@pytest.mark.slow
def test_a_mindspore_checkpoint_resumes_on_pytorch(vlm, tk):
    copy = tk.resume_copy(vlm.ckpt("mindspore"), vlm.base_dir / "ms-ckpt-at-5", 5)
    resumed = tk.run_training(vlm.base_dir / "resume", [*vlm.args, "--mm-data", vlm.data_json, "--load", str(copy)],
                              framework="pytorch", nproc=1, timeout=300, entry=VLM_ENTRY)
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert "saved by mindspore; resuming on pytorch" in resumed.output
    losses = resumed.losses()
    assert sorted(losses) == list(range(6, ITERS + 1))
    assert _close(losses, vlm("mindspore").losses(), range(6, ITERS + 1)) <= TOLERANCE
    assert _close(losses, vlm("pytorch").losses(), range(6, ITERS + 1)) <= TOLERANCE


@pytest.mark.slow
def test_two_data_parallel_ranks_equal_one(vlm):
    one, two = vlm("pytorch").losses(), vlm("pytorch-dp2").losses()
    assert _close(one, two, range(1, 5)) <= TOLERANCE, (one, two)


@pytest.mark.slow
def test_a_rank_whose_batch_has_no_image_trains_like_one_process(vlm):
    """Issue 23's check: at iteration 4 rank 1's only sample is text; it still runs the ViT (a blank image with
    zero weight), so the gradient all-reduce matches and DP=2 equals DP=1 on the same samples."""
    one, two = vlm("text-rank-dp1").losses(), vlm("text-rank-dp2").losses()
    assert sorted(one) == sorted(two) == [1, 2, 3, 4]
    assert _close(one, two, range(1, 5)) <= TOLERANCE, (one, two)


@pytest.mark.slow
def test_bf16_follows_fp32(vlm):
    """Megatron's bf16: the model computes in bf16 (pixel values cast by get_batch), fp32 main params; the
    losses stay within bf16's precision of the fp32 run's."""
    fp32, bf16 = vlm("pytorch").losses(), vlm("bf16").losses()
    assert sorted(bf16) == [1, 2, 3]
    assert _close(fp32, bf16, range(1, 4)) < 0.05, (fp32, bf16)
    assert "bf16 model with fp32 main params" in vlm("bf16").output


@pytest.mark.slow
def test_fsdp2_on_two_ranks_equals_the_data_parallel_run(vlm):
    """FSDP2 shards the ViT: a rank whose micro-batch has no image still runs it (on a blank image that counts
    zero times), so the ranks' collectives match; the per-token loss makes the split into micro-batches moot."""
    one, sharded = vlm("per-token").losses(), vlm("pytorch-fsdp2")
    assert _close(one, sharded.losses(), range(1, 4)) <= TOLERANCE, (one, sharded.losses())
    assert "engine torch-fsdp2" in sharded.output and "4 unit(s) + root" in sharded.output


@pytest.mark.slow
def test_per_token_loss_is_the_mean_over_the_global_batch(vlm):
    """Megatron's --calculate-per-token-loss: the step's loss is sum(token losses) / tokens of the global batch,
    which does not depend on how the batch is cut into micro-batches and ranks, and differs from the default
    mean of micro-batch means (micro-batches hold different numbers of label tokens)."""
    one, two = vlm("per-token").losses(), vlm("per-token-dp2").losses()
    assert _close(one, two, range(1, 4)) <= TOLERANCE, (one, two)
    # iteration 2 has a text-only sample: its micro-batches hold 12 and 11 label tokens
    assert abs(one[2] - vlm("pytorch").losses()[2]) > 1e-4


@pytest.mark.slow
def test_hugging_face_weights_in_and_out(vlm, tmp_path):
    """mm_to_hf writes a directory transformers loads; --load takes it as it is; hf_to_mm -> mm_to_hf gives the
    same bytes back."""
    vlm("pytorch")  # its checkpoint is the source (trained here when this test runs alone)
    mmrun = [sys.executable, "-m", "mmrun.launchers.cli", "convert", "Qwen2VLConverter"]
    hf_config = tmp_path / "hf-original"
    hf_config.mkdir()
    # the original download's config.json and tokenizer files (mm_to_hf reads no weights from it)
    config = json.loads(json.dumps(_hf_config()))
    config["torch_dtype"] = "float32"
    (hf_config / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "preprocessor_config.json"):
        (hf_config / name).write_bytes((Path(vlm.model_dir) / name).read_bytes())
    hf = tmp_path / "hf"
    out = subprocess.run([*mmrun, "mm_to_hf", "--cfg.save_hf_dir", str(hf), "--cfg.mm_dir", str(vlm.ckpt("pytorch")),
                          "--cfg.hf_config.hf_dir", str(hf_config), "--cfg.parallel_config.llm_pp_layers", "[2]",
                          "--cfg.parallel_config.vit_pp_layers", "[2]", "--cfg.parallel_config.tp_size", "1"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (hf / "tokenizer.json").is_file() and (hf / "model.safetensors").is_file()

    from transformers import Qwen2VLForConditionalGeneration

    from mmrun.training.checkpoint_store import find_checkpoint

    model = Qwen2VLForConditionalGeneration.from_pretrained(hf)
    saved = find_checkpoint(vlm.ckpt("pytorch"), log=lambda m: None).model
    loaded = {name: p.detach().numpy() for name, p in model.named_parameters()}
    np.testing.assert_array_equal(loaded["model.language_model.embed_tokens.weight"], saved["model.embed_tokens.weight"])
    np.testing.assert_array_equal(loaded["model.visual.merger.mlp.2.weight"], saved["visual.merger.mlp.2.weight"])

    mm = tmp_path / "mm"
    out = subprocess.run([*mmrun, "hf_to_mm", "--cfg.mm_dir", str(mm), "--cfg.hf_config.hf_dir", str(hf),
                          "--cfg.parallel_config.llm_pp_layers", "[[2]]", "--cfg.parallel_config.vit_pp_layers", "[[2]]",
                          "--cfg.parallel_config.tp_size", "1"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    back = tmp_path / "hf-back"
    out = subprocess.run([*mmrun, "mm_to_hf", "--cfg.save_hf_dir", str(back), "--cfg.mm_dir", str(mm),
                          "--cfg.hf_config.hf_dir", str(hf)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    from safetensors.numpy import load_file
    first, second = load_file(hf / "model.safetensors"), load_file(back / "model.safetensors")
    assert sorted(first) == sorted(second)
    assert all(first[k].tobytes() == second[k].tobytes() and first[k].dtype == second[k].dtype for k in first)

    # --load takes the Hugging Face directory as it is, and training starts from its weights
    run = vlm("from-hf", ["--load", str(hf), "--train-iters", "2"])
    assert f"loaded Hugging Face weights from {hf}" in run.output
    assert run.losses()[1] < vlm("pytorch").losses()[1] - 0.3  # trained weights, not a fresh init


def _hf_config() -> dict:
    from mmrun.models.vlm.model_json import read_model_json

    return read_model_json(MODEL_JSON).hf_config


# MindSpeed-MM's examples/qwen2vl/finetune_qwen2vl_2b.sh GPT_ARGS and OUTPUT_ARGS as published (sizes of the
# job and paths aside): what a user brings.
MM_2B_FLAGS = ["--use-mcore-models", "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
               "--context-parallel-size", "1", "--context-parallel-algo", "ulysses_cp_algo", "--tokenizer-type",
               "NullTokenizer", "--vocab-size", "151936", "--make-vocab-size-divisible-by", "1", "--normalization",
               "RMSNorm", "--use-fused-rmsnorm", "--swiglu", "--use-fused-swiglu", "--no-masked-softmax-fusion",
               "--lr-decay-style", "cosine", "--weight-decay", "0", "--lr-warmup-fraction", "0.1", "--clip-grad",
               "0.0", "--adam-beta1", "0.9", "--adam-beta2", "0.999", "--no-gradient-accumulation-fusion",
               "--use-distributed-optimizer", "--use-flash-attn", "--no-load-optim", "--no-load-rng",
               "--no-save-optim", "--no-save-rng", "--num-workers", "8", "--distributed-timeout-minutes", "20",
               "--ckpt-format", "torch", "--log-tps", "--distributed-backend", "nccl"]


@pytest.mark.slow
def test_mindspeed_mm_launch_line_is_judged_by_the_gate_not_crashed(vlm, tk):
    """On a CPU FlashAttention of MindSpeed-MM's script is refused at startup in one line, before any model
    exists, while its fused kernels only say (notice) that the unfused math runs; with --on-unsupported warn the
    same line trains."""
    warmup = vlm.args.index("--lr-warmup-iters")  # the script gives --lr-warmup-fraction instead
    common = [*vlm.args[:warmup], *vlm.args[warmup + 2:], "--mm-data", vlm.data_json, *MM_2B_FLAGS, "--train-iters", "1"]
    refused = tk.run_training(vlm.base_dir / "mm-line", common, nproc=None, entry=VLM_ENTRY)
    assert refused.returncode == 2, refused.output[-2000:]
    errors = [line for line in refused.output.splitlines() if line.startswith("error:")]
    assert any("--use-flash-attn" in e for e in errors) and not any("--use-fused" in e for e in errors), errors
    assert "Traceback" not in refused.output and "building qwen2_vl model" not in refused.output
    warned = tk.run_training(vlm.base_dir / "mm-line-warn", [*common, "--on-unsupported", "warn"], nproc=None,
                             entry=VLM_ENTRY)
    assert warned.returncode == 0, warned.output[-3000:]
    assert "notice: [mmrun trainer] --use-fused-rmsnorm" in warned.output  # the unfused RMSNorm runs
    assert sorted(warned.losses()) == [1]
    # --use-mcore-models is honoured: the model trains on megatron-core (engines/torch/megatron_core/vlm.py)
    assert "ignoring --swiglu" in warned.output and "> megatron-core " in warned.output


def _model_json_with(tmp_path: Path, **top: object) -> str:
    raw = json.loads(MODEL_JSON.read_text())
    raw.update(top)
    path = tmp_path / "model.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.slow
def test_bad_inputs_stop_with_one_line_and_exit_2(vlm, tk, tmp_path):
    cases = {
        "no model.json": (["--mm-data", vlm.data_json, "--train-iters", "1"],
                          "error: --mm-model is required"),
        "ids disagree": ([*vlm.args, "--mm-model", _model_json_with(tmp_path, img_context_token_id=7),
                          "--mm-data", vlm.data_json],
                         "img_context_token_id is 7 but the tokenizer of --mm-data gives <|image_pad|> the id 5"),
        # both frameworks split the model (tests/training/test_vlm_parallel*.py), over as many processes as it asks
        "tensor parallel on one process on mindspore": ([*vlm.args, "--mm-data", vlm.data_json,
                                                         "--tensor-model-parallel-size", "2"],
                                                        "must be a multiple of --tensor-model-parallel-size"),
    }
    for name, (args, message) in cases.items():
        framework = "mindspore" if name.endswith("mindspore") else "pytorch"
        run = tk.run_training(tmp_path / name.replace(" ", "-"), args, framework=framework, nproc=None,
                              entry=VLM_ENTRY)
        errors = [line for line in run.output.splitlines() if line.startswith("error:")]
        assert run.returncode == 2 and len(errors) == 1 and message in errors[0], (name, run.output[-2000:])
        assert "Traceback" not in run.output, name


@pytest.mark.slow
def test_mindspore_compiles_video_batches_from_mindspeed_mm_flags_alone_and_trains_pytorchs_losses(tk, tmp_path):
    """A data.json whose samples have videos (attr.videos set, MindSpeed-MM's video form) on MindSpore without
    --no-ms-jit (issue 37 stopped on the first video batch, issue 40 ran it in PyNative): the step compiles
    (fixed-shape video and image batches, one bucket) and trains PyTorch's losses."""
    from mmrun.data.multimodal.demo import make_demo

    demo = make_demo(str(tmp_path / "demo"), num_samples=4, seed=7)
    samples = json.loads(Path(demo["dataset"]).read_text())
    for sample in samples[:2]:  # step 1's two samples: a two-frame clip each instead of their picture
        sample["messages"][0]["content"] = sample["messages"][0]["content"].replace("<image>", "<video>")
        sample["videos"], sample["images"] = [[sample["images"][0]] * 2], []
    Path(demo["dataset"]).write_text(json.dumps(samples))
    config = json.loads(Path(demo["data_json"]).read_text())
    config["dataset_param"]["attr"]["videos"] = "videos"
    Path(demo["data_json"]).write_text(json.dumps(config))
    args = ["--micro-batch-size", "1", "--global-batch-size", "2", "--seq-length", "256", "--lr", "1e-3",
            "--log-interval", "1", "--eval-iters", "0", "--train-iters", "2", "--mm-data", demo["data_json"],
            "--mm-model", str(MODEL_JSON)]
    runs = {framework: tk.run_training(tmp_path / framework, args, framework=framework, nproc=None, entry=VLM_ENTRY)
            for framework in ("mindspore", "pytorch")}
    for run in runs.values():
        assert run.returncode == 0, run.output[-3000:]
    assert "MindSpore train step: mindspore.jit (graph)" in runs["mindspore"].output
    assert "PyNative" not in runs["mindspore"].output and "reads videos" not in runs["mindspore"].output
    ms, pt = runs["mindspore"].losses(), runs["pytorch"].losses()
    assert sorted(ms) == sorted(pt) == [1, 2] and all(np.isfinite(v) for v in ms.values())
    assert _close(ms, pt, [1, 2]) <= TOLERANCE, (ms, pt)
