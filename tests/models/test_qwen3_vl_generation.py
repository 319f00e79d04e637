"""Qwen3-VL generation (models/qwen3_vl/generation.py through models/vlm/generation.py's loop): greedy tokens equal
transformers' Qwen3VLForConditionalGeneration.generate with and without an image (DeepStack on the prompt's
visual tokens, interleaved M-RoPE continued past the prompt), the KV cache gives a full re-run's logits,
inference_vlm.py / evaluate_vlm.py run it from the Qwen2.5-VL json with Qwen3-VL's model sections, and PyTorch
and MindSpore choose the same tokens."""
from __future__ import annotations

import base64
import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
WORKER = HERE / "workers" / "qwen2_vl_generate.py"
TINY_MODEL_JSON = HERE.parents[1] / "scripts" / "qwen3vl" / "model_tiny.json"
EXAMPLE = HERE.parents[1] / "docs" / "examples" / "inference" / "make_tiny_qwen3_vl.py"
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def q3(tiny3, tmp_path_factory):
    """(transformers model, its directory, mmrun's model of that directory)."""
    from mmrun.models.qwen3_vl import from_pretrained

    model = tiny3.hf_model(seed=4)
    path = tmp_path_factory.mktemp("qwen3_vl_generate")
    model.save_pretrained(path)
    ours = from_pretrained(str(path))
    ours.eval()
    return model, path, ours


def prompts(tiny3) -> dict[str, dict[str, np.ndarray]]:
    batch = tiny3.image_batch()
    return {"image": {k: batch[k] for k in ("input_ids", "pixel_values", "image_grid_thw")},
            "text": {"input_ids": tiny3.text_batch()["input_ids"][:1, :11]}}


def hf_greedy(model, prompt: dict[str, np.ndarray], new_tokens: int, image_token: int, eos: int) -> list[int]:
    import torch

    ids = prompt["input_ids"]
    kwargs = {k: torch.from_numpy(v) for k, v in prompt.items()}
    kwargs["attention_mask"] = torch.ones(ids.shape, dtype=torch.long)
    kwargs["mm_token_type_ids"] = torch.from_numpy(np.where(ids == image_token, 1, 0))
    with torch.no_grad():
        out = model.generate(**kwargs, max_new_tokens=new_tokens, do_sample=False, eos_token_id=[eos])
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("which", ["image", "text"])
def test_greedy_tokens_equal_transformers_generate(tiny3, q3, which):
    from mmrun.models.vlm.generation import GenerationConfig, Generator, Prompt

    hf, _, ours = q3
    prompt = prompts(tiny3)[which]
    tokens = Generator(ours).generate(Prompt(**prompt), GenerationConfig(max_new_tokens=NEW_TOKENS, eos_token_id=(2,)))
    assert tokens == hf_greedy(hf, prompt, NEW_TOKENS, tiny3.IMAGE, 2)
    assert len(set(tokens)) > 2  # not one repeated token: the comparison sees the positions move on


def test_cache_gives_the_logits_of_a_full_rerun(tiny3, q3):
    from mmrun.models.vlm.generation import GenerationConfig, Generator, Prompt

    prompt, generator = Prompt(**prompts(tiny3)["image"]), Generator(q3[2])
    runs = {}
    for use_cache in (True, False):
        logits: list[np.ndarray] = []
        tokens = generator.generate(prompt, GenerationConfig(max_new_tokens=3, use_cache=use_cache),
                                    on_logits=logits.append)
        runs[use_cache] = (tokens, np.stack(logits))
    assert runs[True][0] == runs[False][0]
    np.testing.assert_allclose(runs[True][1], runs[False][1], rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def q3_job(tmp_path_factory):
    """(root, inference json path, its dict, transformers model, the example's module): docs/inference.md's
    tiny Qwen3-VL (docs/examples/inference/make_tiny_qwen3_vl.py)."""
    spec = importlib.util.spec_from_file_location("mmrun_docs_make_tiny_qwen3_vl", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    root = tmp_path_factory.mktemp("qwen3_inference")
    path, raw, model = example.write(root, str(TINY_MODEL_JSON))
    return root, path, raw, model, example


def test_inference_vlm_streams_transformers_greedy_answer(q3_job, capsys):
    """The entry's answer is transformers' generate on the same prompt (the qwen3_vl_nothink template, the
    processor's image tokens), decoded without the special tokens."""
    from mmrun.data.tokenizers import HuggingFaceTokenizer
    from mmrun.models import inference_vlm

    root, path, raw, model, example = q3_job
    assert inference_vlm.main(["--mm-model", str(path)]) == 0
    out, err = capsys.readouterr()
    tokens = example.transformers_answer(raw, model)
    answer = HuggingFaceTokenizer(raw["tokenizer"]["from_pretrained"]).detokenize([t for t in tokens if t > 6])
    assert len(tokens) == 8 and answer.strip() and out.splitlines()[0] == answer
    assert "weights: Hugging Face directory" in err and "8 new tokens after a prompt of" in err


def test_evaluate_vlm_scores_qwen3_vl(q3_job, capsys, tmp_path):
    from mmrun.models import evaluate_vlm

    root, _, raw, _, _ = q3_job
    tsv = tmp_path / "DocVQA_VAL.tsv"
    with tsv.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["index", "image", "question", "answer"])
        for i in range(2):
            image = base64.b64encode((root / "demo" / "data" / "images" / f"{i:04d}.png").read_bytes()).decode()
            writer.writerow([i, image, "What colour?", repr(["red", "blue"])])
    job = json.loads((root / "evaluate_qwen3_vl.json").read_text())  # docs/inference.md's evaluation json
    job.update({"dataset_path": str(tsv), "evaluation_model": "tiny3", "result_output_path": str(tmp_path / "out")})
    (tmp_path / "evaluate.json").write_text(json.dumps(job))
    assert evaluate_vlm.main(["--mm-model", str(tmp_path / "evaluate.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("> docvqa_val: anls ") and "over 2 questions" in out
    scores = json.loads((tmp_path / "out" / "tiny3_docvqa_val_acc.json").read_text())
    assert scores["rows"] == 2 and 0 <= scores["scores"]["Overall"] <= 100


def test_a_split_qwen3_vl_checkpoint_answers_as_its_hf_directory(q3_job, capsys, tmp_path):
    """--load of the HF directory converted to TP=2 x PP=2 (MindSpeed-MM's names, as a split training run saves
    them) prints the HF directory's answer; a --load holding neither is one line, exit 2."""
    from mmrun.models import inference_vlm
    from mmrun.checkpoint.convert_cli import main as convert

    path, raw = q3_job[1], q3_job[2]
    hf_dir = raw["tokenizer"]["from_pretrained"]
    layers = json.loads(TINY_MODEL_JSON.read_text())["text_decoder"]["num_layers"]
    assert convert(["Qwen3VLMegatronConverter", "hf_to_mm", "--cfg.mm_dir", str(tmp_path / "mm"),
                    "--cfg.hf_config.hf_dir", str(hf_dir), "--cfg.parallel_config.tp_size", "2",
                    "--cfg.parallel_config.vit_pp_layers", "[[2,0]]",
                    "--cfg.parallel_config.llm_pp_layers", json.dumps([[1, layers - 1]])]) == 0
    capsys.readouterr()
    assert inference_vlm.main(["--mm-model", str(path), "--load", str(hf_dir)]) == 0
    expected = capsys.readouterr().out
    assert inference_vlm.main(["--mm-model", str(path), "--load", str(tmp_path / "mm")]) == 0
    out, err = capsys.readouterr()
    assert out == expected and expected.strip()
    assert f"weights: checkpoint {tmp_path / 'mm'}" in err and "tp_size 2" in err, err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exit_:
        inference_vlm.main(["--mm-model", str(path), "--load", str(tmp_path / "empty")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err[-1].startswith("error: ") and str(tmp_path / "empty") in err[-1], err


@pytest.mark.slow
def test_pytorch_and_mindspore_choose_the_same_tokens(tiny3, q3, tmp_path):
    """The image prompt, greedy and sampled (numpy-seeded draws), four tokens each."""
    pytest.importorskip("mindspore")
    spec = importlib.util.spec_from_file_location("mmrun_tests_qwen3_vl_generate", WORKER)
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    sampling = {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.3,
                "max_new_tokens": 4, "seed": 5}
    cases: dict[str, np.ndarray] = {}
    for case, config in (("greedy", {"max_new_tokens": 4}), ("sampled", sampling)):
        cases.update({f"{case}/{k}": v for k, v in prompts(tiny3)["image"].items()})
        cases[f"{case}/dir"], cases[f"{case}/config"] = np.array(str(q3[1])), np.array(json.dumps(config))
    np.savez(tmp_path / "cases.npz", **cases)
    env = {**os.environ, "MMRUN_AI_FRAMEWORK": "mindspore", "GLOG_v": "3"}
    done = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "cases.npz"), str(tmp_path / "ms.npz")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    mindspore, pytorch = dict(np.load(tmp_path / "ms.npz")), generate.generate_cases(cases)
    assert sorted(mindspore) == sorted(pytorch) == ["greedy", "sampled"]
    for case in pytorch:
        np.testing.assert_array_equal(mindspore[case], pytorch[case], err_msg=case)
    assert not np.array_equal(pytorch["greedy"], pytorch["sampled"])
