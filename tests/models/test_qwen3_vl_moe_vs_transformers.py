"""mmrun's Qwen3-VL MoE (models/qwen3_vl/moe.py) against transformers' Qwen3VLMoeForConditionalGeneration (fp32),
and PyTorch against MindSpore.

One tiny random MoE (tests/models/tiny_qwen3_vl.py's hf_moe_model: layers 0 and 2 with six experts, two per token,
layer 1 dense by mlp_only_layers; the dense model's ViT and DeepStack) written by transformers' save_pretrained,
loaded by mmrun from that directory (fused gate_up_proj / down_proj as stored). On the image + video batch
(two samples, one right-padded): logits at real tokens, the loss and every gradient within 1e-5 of transformers',
without and with the load-balancing loss (output_router_logits, router_aux_loss_coef 0.05); MindSpore within
1e-5 of PyTorch on the same cases (one subprocess, workers/qwen2_vl_run.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TOL = 1e-5
CASES = {"plain": {}, "aux": {"output_router_logits": True}}


@pytest.fixture(scope="module")
def moe_runs(tiny3, worker, tmp_path_factory):
    """case -> (directory, batch with transformers' positions, transformers' results, mmrun PyTorch results)."""
    pytest.importorskip("transformers")
    from mmrun.models.qwen3_vl import from_pretrained

    out = {}
    for case, text in CASES.items():
        model = tiny3.hf_moe_model(**text)
        path = tmp_path_factory.mktemp(f"qwen3_vl_moe_{case}")
        model.save_pretrained(path)
        batch = tiny3.image_video_batch()
        reference = tiny3.hf_forward_backward(model, batch)
        batch = {**batch, "position_ids": tiny3.hf_position_ids(model, batch)}
        out[case] = (path, batch, reference, worker.forward_backward(from_pretrained(str(path)), batch))
    return out


@pytest.mark.parametrize("case", CASES)
def test_logits_loss_and_every_gradient_equal_transformers(moe_runs, case):
    _, batch, reference, ours = moe_runs[case]
    real = batch["attention_mask"] == 1
    np.testing.assert_allclose(ours["logits"][real], reference["logits"][real], rtol=0, atol=TOL)
    np.testing.assert_allclose(ours["loss"], reference["loss"], rtol=0, atol=TOL)
    assert sorted(k[5:] for k in ours if k.startswith("grad/")) == sorted(reference["grads"])
    for name, grad in reference["grads"].items():
        np.testing.assert_allclose(ours[f"grad/{name}"], grad, rtol=0, atol=TOL, err_msg=name)
    # Routers, experts and the dense middle layer all learn; the vision side took part.
    for name in ("model.language_model.layers.0.mlp.gate.weight", "model.language_model.layers.2.mlp.experts.down_proj",
                 "model.language_model.layers.1.mlp.gate_proj.weight", "model.visual.deepstack_merger_list.1.norm.weight"):
        assert np.abs(ours[f"grad/{name}"]).max() > 1e-4, name


def test_aux_loss_is_transformers_and_changes_the_loss(moe_runs):
    """The load-balancing term is there (loss differs by router_aux_loss_coef x aux) and equals transformers'."""
    import torch

    from mmrun.backend import tensors
    from mmrun.models.qwen3_vl import from_pretrained

    path, batch, reference, _ = moe_runs["aux"]
    assert abs(float(reference["loss"]) - float(moe_runs["plain"][2]["loss"])) > 1e-3
    model = from_pretrained(str(path))
    keys = ("input_ids", "attention_mask", "labels", "pixel_values", "image_grid_thw", "pixel_values_videos",
            "video_grid_thw", "position_ids")
    out = model(**{k: tensors.from_numpy(batch[k]) for k in keys})
    theirs = _hf_aux(path, batch)
    np.testing.assert_allclose(tensors.to_numpy(out["loss_dict"]["aux_loss"]), theirs, rtol=0, atol=TOL)
    assert torch.is_tensor(out["loss_dict"]["loss"])


def _hf_aux(path, batch) -> float:
    import torch
    import transformers

    model = transformers.Qwen3VLMoeForConditionalGeneration.from_pretrained(path).eval()
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in batch.items() if k != "position_ids"})
    return out.aux_loss.numpy()


def test_config_round_trips_through_transformers_and_bad_routing_is_refused(moe_runs, tmp_path):
    import transformers

    from mmrun.backend.errors import UsageError
    from mmrun.models.qwen3_vl import load_hf_config
    from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig

    config = load_hf_config(moe_runs["plain"][0])
    assert config.model_type == "qwen3_vl_moe" and config.text.moe.num_experts == 6
    assert [config.text.moe.is_sparse(i) for i in range(3)] == [True, False, True]
    theirs = transformers.Qwen3VLMoeConfig(**config.to_hf_config())
    assert Qwen3VLConfig.from_hf_config(theirs.to_dict()) == config
    raw = json.loads((moe_runs["plain"][0] / "config.json").read_text())
    raw["text_config"]["num_experts_per_tok"] = 7
    with pytest.raises(UsageError, match=r"^num_experts_per_tok \(moe_router_topk\) 7 must be between 1 and "
                                         r"num_experts \(num_moe_experts\) 6"):
        Qwen3VLConfig.from_hf_config(raw)


@pytest.mark.slow
def test_mindspore_equals_pytorch(moe_runs, tmp_path):
    pytest.importorskip("mindspore")
    cases: dict[str, np.ndarray] = {}
    for name, (path, batch, _, _) in moe_runs.items():
        cases.update({f"{name}/{k}": v for k, v in batch.items()})
        cases[f"{name}/dir"] = np.array(str(path))
    np.savez(tmp_path / "cases.npz", **cases)
    env = {**os.environ, "MMRUN_AI_FRAMEWORK": "mindspore", "GLOG_v": "3"}
    worker = Path(__file__).resolve().parent / "workers" / "qwen2_vl_run.py"
    done = subprocess.run([sys.executable, str(worker), str(tmp_path / "cases.npz"), str(tmp_path / "ms.npz")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ms = dict(np.load(tmp_path / "ms.npz"))
    for name, (_, batch, _, torch_out) in moe_runs.items():
        real = batch["attention_mask"] == 1
        np.testing.assert_allclose(ms[f"{name}/logits"][real], torch_out["logits"][real], rtol=0, atol=TOL)
        np.testing.assert_allclose(ms[f"{name}/loss"], torch_out["loss"], rtol=0, atol=TOL)
        grads = [k for k in torch_out if k.startswith("grad/")]
        assert sorted(grads) == sorted(k[len(name) + 1:] for k in ms if k.startswith(f"{name}/grad/"))
        for key in grads:
            np.testing.assert_allclose(ms[f"{name}/{key}"], torch_out[key], rtol=0, atol=TOL, err_msg=key)


@pytest.mark.parametrize("which", ["image", "text"])
def test_greedy_tokens_equal_transformers_generate(tiny3, moe_runs, which):
    """Generation (models/vlm/generation.py's loop, the KV cache) with the MoE decoder: transformers' greedy tokens."""
    import torch
    import transformers

    from mmrun.models.vlm.generation import GenerationConfig, Generator, Prompt
    from mmrun.models.qwen3_vl import from_pretrained

    path = moe_runs["plain"][0]
    batch = tiny3.image_batch() if which == "image" else tiny3.text_batch()
    keys = ("input_ids", "pixel_values", "image_grid_thw") if which == "image" else ("input_ids",)
    prompt = {k: batch[k][:1, :11] if k == "input_ids" and which == "text" else batch[k] for k in keys}
    ours = from_pretrained(str(path))
    ours.eval()
    tokens = Generator(ours).generate(Prompt(**prompt), GenerationConfig(max_new_tokens=8, eos_token_id=(2,)))
    hf = transformers.Qwen3VLMoeForConditionalGeneration.from_pretrained(path).eval()
    ids = prompt["input_ids"]
    kwargs = {k: torch.from_numpy(v) for k, v in prompt.items()}
    kwargs.update(attention_mask=torch.ones(ids.shape, dtype=torch.long),
                  mm_token_type_ids=torch.from_numpy(np.where(ids == tiny3.IMAGE, 1, 0)))
    with torch.no_grad():
        expected = hf.generate(**kwargs, max_new_tokens=8, do_sample=False, eos_token_id=[2])[0, ids.shape[1]:]
    assert tokens == expected.tolist() and len(set(tokens)) > 2


def test_inference_vlm_answers_as_transformers_moe(tmp_path, capsys):
    """inference_vlm.py with model_30B.json's sections (shrunk, tests/training/qwen3_vl_moe_job.py) and a transformers
    Qwen3VLMoeForConditionalGeneration directory (docs/examples/inference/make_tiny_qwen3_vl.py): transformers'
    greedy answer."""
    import importlib.util

    from mmrun.data.tokenizers import HuggingFaceTokenizer
    from mmrun.models import inference_vlm
    from tests.training.qwen3_vl_moe_job import tiny_model_json

    example_path = Path(__file__).resolve().parents[2] / "docs" / "examples" / "inference" / "make_tiny_qwen3_vl.py"
    spec = importlib.util.spec_from_file_location("mmrun_docs_make_tiny_qwen3_vl_moe", example_path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    path, raw, model = example.write(tmp_path, str(tiny_model_json(tmp_path / "model_30B.json")))
    assert type(model).__name__ == "Qwen3VLMoeForConditionalGeneration"
    assert inference_vlm.main(["--mm-model", str(path)]) == 0
    out, err = capsys.readouterr()
    tokens = example.transformers_answer(raw, model)
    answer = HuggingFaceTokenizer(raw["tokenizer"]["from_pretrained"]).detokenize([t for t in tokens if t > 6])
    assert len(tokens) == 8 and answer.strip() and out.splitlines()[0] == answer
