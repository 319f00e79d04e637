"""FSDP2 end to end on CPU/gloo, 2 processes through mmrun, against one unsharded process (fp32, 1e-5).

One slow test, many variants folded into few runs (each start costs seconds on 2 cores):
  mmrun's GPT:   reference: one process, mmrun's own engine, 10 iterations
                 A: 2 ranks, full shard, recompute (reentrant), forward/backward prefetch, CPU offload with an
                    ignored module, DCP saves at 5 and 10                             -> losses 1-10 equal
                 B: 2 ranks, hybrid (sharding_size 1: 2 replicas), ZeRO-2, resumes A's DCP at 5 -> 6-10 equal
                 C: 1 rank, FSDP2, resumes A's DCP at 5 (saved by 2 ranks)         -> 6-10 equal
                 C2: 2 ranks resume C's DCP at 7 (saved by 1 rank)                  -> 8-10 equal
                 D: A's DCP at 5 -> safetensors -> MindSpore resumes mmrun's GPT    -> 6-10 equal
  transformers:  reference: tiny Qwen2ForCausalLM from a config (offline), one process
                 E: 2 ranks, the single-YAML launch form, FSDP2 + recompute, DCP at 6 -> losses 1-6 equal;
                    DCP -> Hugging Face directory -> transformers gives the same logits
  multimodal:    the offline demo (mllm_format JSON + images, MindSpeed-MM's data.json), 4 iterations each
                 F: a tiny transformers Qwen2VLForConditionalGeneration (saved offline, init_from_hf_path) through
                    pretrain_transformers.py, 2 ranks FSDP2 (model.visual.blocks, model.language_model.layers)
                    vs one process, on a mixed batch (a rank with text only beside one with images: the
                    vision tower runs on a dummy image there)                        -> losses 1-4 equal
  (mmrun's own Qwen2-VL, pretrain_vlm.py, under FSDP2: tests/training/test_pretrain_vlm.py, sharing its runs)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from mmrun.launchers.supervisor import processes_with

from .conftest import ROOT, clean_env

GPT = ROOT / "models" / "pretrain_gpt.py"
TRANSFORMERS = ROOT / "models" / "pretrain_transformers.py"
GPT_ARGS = ["--mock-data", "--train-iters", "10", "--log-interval", "1", "--eval-iters", "0", "--global-batch-size", "8",
            "--micro-batch-size", "2", "--hidden-dropout", "0", "--attention-dropout", "0", "--distributed-backend", "gloo"]
QWEN2 = {"model_type": "qwen2", "vocab_size": 640, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": False}
TOL = 1e-5


def _run(workdir: Path, entry: Path, args: list[str], nproc: int | None, framework: str = "pytorch") -> dict[int, float]:
    metrics = workdir / f"metrics-{uuid.uuid4().hex[:6]}.jsonl"
    marker = uuid.uuid4().hex
    env = clean_env(MMRUN_TRAINING_TEST=marker, OMP_NUM_THREADS="1")
    launch = ([sys.executable, str(entry)] if nproc is None else
              [sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", framework, "--nproc-per-node", str(nproc),
               "--master-port", "0", str(entry)])
    try:
        proc = subprocess.run([*launch, *args, "--metrics-file", str(metrics), "--ai-framework", framework],
                              cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    finally:
        for pid in processes_with(f"MMRUN_TRAINING_TEST={marker}"):
            os.kill(pid, 9)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {r["iteration"]: r["lm_loss"] for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "train"}


def _assert_equal(got: dict[int, float], ref: dict[int, float], iterations: range) -> None:
    assert sorted(got) == list(iterations)
    worst = max(abs(got[i] - ref[i]) for i in iterations)
    assert worst < TOL, f"max loss difference {worst:.2e} over iterations {iterations}: {got} vs {ref}"


@pytest.mark.slow
def test_fsdp2_equals_one_process_and_its_dcp_checkpoints_resume_anywhere(tmp_path):
    (tmp_path / "a.yaml").write_text(
        "sharding_size: auto\nsub_modules_to_wrap: ['h.{1}']\nignored_modules: ['h.0']\nrecompute_modules: ['h.{*}']\n"
        "offload_to_cpu: true\nnum_to_forward_prefetch: 1\nnum_to_backward_prefetch: 2\n")
    (tmp_path / "b.yaml").write_text("sharding_size: 1\nsub_modules_to_wrap: ['h.{0-1}']\nreshard_after_forward: false\n")
    ref = _run(tmp_path, GPT, GPT_ARGS, None)
    assert len(ref) == 10 and ref[10] < ref[1]

    a = _run(tmp_path, GPT, [*GPT_ARGS, "--use-torch-fsdp2", "--fsdp2-config-path", "a.yaml", "--ckpt-format", "torch_dcp",
                             "--save", "ckpt", "--save-interval", "5"], 2)
    _assert_equal(a, ref, range(1, 11))
    assert sorted(p.name for p in (tmp_path / "ckpt" / "iter_0000005").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "meta.json"]

    resume = ["--load", "ckpt", "--ckpt-step", "5", "--ckpt-format", "torch_dcp", "--use-torch-fsdp2"]
    b = _run(tmp_path, GPT, [*GPT_ARGS, *resume, "--fsdp2-config-path", "b.yaml"], 2)  # another sharding_size
    _assert_equal(b, ref, range(6, 11))
    c = _run(tmp_path, GPT, [*GPT_ARGS, *resume, "--save", "ckpt_c", "--save-interval", "7"], None)  # another world size
    _assert_equal(c, ref, range(6, 11))
    # and back: a DCP checkpoint saved by one rank resumes on two
    e = _run(tmp_path, GPT, [*GPT_ARGS, "--load", "ckpt_c", "--ckpt-step", "7", "--ckpt-format", "torch_dcp",
                             "--use-torch-fsdp2"], 2)
    _assert_equal(e, ref, range(8, 11))

    from mmrun.checkpoint.dcp import main as convert

    assert convert(["--load", str(tmp_path / "ckpt"), "--ckpt-step", "5", "--save", str(tmp_path / "st"),
                    "--to", "safetensors"]) == 0
    d = _run(tmp_path, GPT, [*GPT_ARGS, "--load", "st", "--no-ms-jit"], None, framework="mindspore")
    assert max(abs(d[i] - ref[i]) for i in range(6, 11)) < 1e-4  # across frameworks: float32 kernels differ in ulps

    # A transformers model as it is, launched MindSpeed-MM's single-YAML way (anchors included).
    (tmp_path / "q.yaml").write_text("sharding_size: auto\nsub_modules_to_wrap: ['model.layers.{*}']\n"
                                     "recompute_modules: ['model.layers.{0}']\n")
    (tmp_path / "model.json").write_text(json.dumps({"hf_config": QWEN2}))
    (tmp_path / "data.json").write_text(json.dumps({"dataset_param": {"dataset_type": "mock"}}))
    common = ["--train-iters", "6", "--log-interval", "1", "--eval-iters", "0", "--global-batch-size", "8",
              "--micro-batch-size", "2", "--seq-length", "16"]
    ref_t = _run(tmp_path, TRANSFORMERS, [*common, "--mm-model", "model.json", "--mm-data", "data.json"], None)
    job = tmp_path / "job.yaml"
    job.write_text("FSDP2: &FSDP2 q.yaml\nSAVE: &SAVE hf_ckpt\ngpt_args:\n"
                   + "".join(f"  {k}: {v}\n" for k, v in {
                       "use_torch_fsdp2": "true", "fsdp2_config_path": "*FSDP2", "ckpt_format": "torch_dcp",
                       "save": "*SAVE", "train_iters": 6, "log_interval": 1, "eval_iters": 0, "global_batch_size": 8,
                       "micro_batch_size": 2, "seq_length": 16, "distributed_backend": "gloo"}.items())
                   + "data:\n  dataset_param: {dataset_type: mock}\nmodel:\n  hf_config: " + json.dumps(QWEN2) + "\n")
    e = _run(tmp_path, TRANSFORMERS, [str(job)], 2)
    _assert_equal(e, ref_t, range(1, 7))

    import torch
    from transformers import AutoModelForCausalLM

    from mmrun.backend.torch.fsdp2.dcp import read_whole
    from mmrun.engines.torch.transformers_models import build_model

    assert convert(["--load", str(tmp_path / "hf_ckpt"), "--save", str(tmp_path / "hf"), "--to", "hf"]) == 0
    trained = build_model({"hf_config": QWEN2})
    trained.load_state_dict(read_whole(tmp_path / "hf_ckpt" / "iter_0000006")["model"])
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True)
    ids = torch.arange(12).reshape(1, 12) * 37 % 600
    with torch.no_grad():
        assert torch.equal(trained(input_ids=ids).logits, reloaded(input_ids=ids).logits)


def tiny_hf_qwen2_vl(tokenizer_dir: str, out: Path) -> Path:
    """A random transformers Qwen2-VL whose token ids are the demo tokenizer's, saved offline (no download)."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from mmrun.data.multimodal.demo import special_token_ids_for_model_config

    ids = special_token_ids_for_model_config(tokenizer_dir)
    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 256, "vocab_size": ids["vocab_size"],
            "bos_token_id": ids["bos_token_id"], "eos_token_id": ids["eos_token_id"], "pad_token_id": ids["pad_token_id"],
            "rope_parameters": {"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0}}
    vision = {"depth": 2, "embed_dim": 32, "hidden_size": 32, "num_heads": 4, "mlp_ratio": 2, "patch_size": 14,
              "spatial_merge_size": 2, "temporal_patch_size": 2}
    tokens = {k: ids[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")}
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False,
                                                          **tokens))
    model.save_pretrained(str(out))
    return out


@pytest.mark.slow
def test_fsdp2_trains_vision_language_models_on_the_multimodal_data(tmp_path):
    from mmrun.data.multimodal.demo import TEXT_ONLY, make_demo

    demo = make_demo(str(tmp_path / "demo"), num_samples=16, seed=7)  # read in file order (shuffle false)
    # A mixed data mix: samples 2, 3, 10, 11 text-only, so in each step's first micro-batch rank 0 has images and
    # rank 1 none (Megatron's sampler: rank r takes [2r, 2r + 2) of each 4), and 7, 15 text-only beside an image.
    # The vision tower must run on every rank all the same (a dummy image times zero), else FSDP2's all-gathers
    # of model.visual.blocks run on rank 0 only and gloo aborts.
    samples = json.loads(Path(demo["dataset"]).read_text())
    for index, (question, answer) in zip((2, 3, 10, 11), TEXT_ONLY):
        samples[index] = {"messages": [{"role": "user", "content": question},
                                       {"role": "assistant", "content": answer}], "images": []}
    Path(demo["dataset"]).write_text(json.dumps(samples))
    hf = tiny_hf_qwen2_vl(demo["model_dir"], tmp_path / "hf_qwen2_vl")
    (tmp_path / "model.json").write_text(json.dumps({"init_from_hf_path": str(hf)}))
    (tmp_path / "hf.yaml").write_text("sharding_size: auto\nsub_modules_to_wrap: ['model.visual.blocks.{*}', "
                                      "'model.language_model.layers.{*}']\n")
    common = ["--train-iters", "4", "--log-interval", "1", "--eval-iters", "0", "--global-batch-size", "8",
              "--micro-batch-size", "2", "--seq-length", "128", "--distributed-backend", "gloo"]
    hf_args = [*common, "--lr", "1e-3", "--mm-model", "model.json", "--mm-data", demo["data_json"]]
    ref = _run(tmp_path, TRANSFORMERS, hf_args, None)
    assert ref[4] < ref[1]
    f = _run(tmp_path, TRANSFORMERS, [*hf_args, "--use-torch-fsdp2", "--fsdp2-config-path", "hf.yaml"], 2)
    _assert_equal(f, ref, range(1, 5))
