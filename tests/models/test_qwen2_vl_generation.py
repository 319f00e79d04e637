"""Generation (models/vlm/generation.py): greedy tokens equal transformers' `generate` (same weights, same
image, same prompt), the KV cache gives the logits of a full re-run, the logits processors equal transformers',
generation_config is read as MindSpeed-MM's inference json writes it, and PyTorch and MindSpore choose the same
tokens (greedy and sampled)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).resolve().parent / "workers" / "qwen2_vl_generate.py"
NEW_TOKENS = 10
SAMPLING = {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.3,
            "max_new_tokens": NEW_TOKENS, "seed": 5}


def image_prompt(tiny) -> dict[str, np.ndarray]:
    """Text, image A, text, image B, text (tiny_hf.image_batch's first row) as one prompt."""
    batch = tiny.image_batch()
    ids = batch["input_ids"][0][batch["attention_mask"][0] == 1]
    return {"input_ids": ids[None], "pixel_values": batch["pixel_values"], "image_grid_thw": batch["image_grid_thw"]}


def text_prompt(tiny) -> dict[str, np.ndarray]:
    batch = tiny.text_batch()
    return {"input_ids": batch["input_ids"][:1, :11]}


def hf_greedy(tiny, model, prompt: dict[str, np.ndarray], new_tokens: int) -> list[int]:
    import torch

    ids = prompt["input_ids"]
    kwargs = {k: torch.from_numpy(v) for k, v in prompt.items()}
    kwargs["attention_mask"] = torch.ones(ids.shape, dtype=torch.long)
    kwargs["mm_token_type_ids"] = torch.from_numpy(np.where(ids == tiny.IMAGE, 1, 0))
    out = model.generate(**kwargs, max_new_tokens=new_tokens, do_sample=False, eos_token_id=[2])
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
@pytest.mark.parametrize("which", ["image", "text"])
def test_greedy_tokens_equal_transformers_generate(tiny, hf_models, mmrun_models, model_type, which):
    from mmrun.models.vlm.generation import GenerationConfig, Generator, Prompt

    prompt = (image_prompt if which == "image" else text_prompt)(tiny)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, eos_token_id=(2,))
    ours = Generator(mmrun_models[model_type]).generate(Prompt(**prompt), config)
    assert ours == hf_greedy(tiny, hf_models[model_type], prompt, NEW_TOKENS)
    assert len(ours) == NEW_TOKENS or ours[-1] == 2


def test_cache_gives_the_logits_of_a_full_rerun_and_streams(tiny, mmrun_models):
    from mmrun.models.vlm.generation import GenerationConfig, Generator, Prompt

    prompt, generator = Prompt(**image_prompt(tiny)), Generator(mmrun_models["qwen2_5_vl"])
    runs = {}
    for use_cache in (True, False):
        logits, streamed = [], []
        tokens = generator.generate(prompt, GenerationConfig(max_new_tokens=6, use_cache=use_cache),
                                    streamer=streamed.append, on_logits=logits.append)
        runs[use_cache] = (tokens, np.stack(logits), streamed)
    assert runs[True][0] == runs[False][0] == runs[True][2]
    np.testing.assert_allclose(runs[True][1], runs[False][1], rtol=0, atol=1e-5)


def test_logits_processors_equal_transformers():
    import torch
    from transformers.generation import logits_process as lp

    from mmrun.models.vlm.generation import GenerationConfig, process_logits

    rng = np.random.default_rng(0)
    scores, sequence = rng.standard_normal(300).astype(np.float32) * 3, rng.integers(0, 300, 40)
    config = GenerationConfig(do_sample=True, temperature=0.7, top_k=40, top_p=0.8, repetition_penalty=1.3)
    expected = torch.from_numpy(scores[None].copy())
    ids = torch.from_numpy(sequence[None])
    for processor in (lp.RepetitionPenaltyLogitsProcessor(1.3), lp.TemperatureLogitsWarper(0.7),
                      lp.TopKLogitsWarper(40), lp.TopPLogitsWarper(0.8)):
        expected = processor(ids, expected)
    ours = process_logits(scores, sequence.tolist(), config)
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(expected[0].numpy()))
    kept = ~np.isinf(ours)
    assert 0 < kept.sum() < 40
    np.testing.assert_allclose(ours[kept], expected[0].numpy()[kept], rtol=1e-6)


def test_generation_config_reads_mindspeed_mm_keys_and_refuses_wrong_types():
    from mmrun.models.vlm.generation import GenerationConfig, GenerationConfigError

    raw = {"do_sample": True, "kv_cache": True, "max_length": 20, "max_new_tokens": 256,
           "eos_token_id": [151645, 151643], "temperature": 0.1, "top_k": 1, "top_p": 0.001,
           "repetition_penalty": 1.05, "num_beams": 1, "dola_layers": None, "output_attentions": False,
           "image_token_id": 151655}
    config = GenerationConfig.from_dict(raw)
    assert (config.max_new_tokens, config.eos_token_id, config.top_k, config.use_cache) == (256, (151645, 151643), 1,
                                                                                            True)
    assert config.new_tokens(100) == 256 and config.ignored == ("dola_layers", "output_attentions", "image_token_id")
    for key, value, words in (("temperature", "0.1", "generation_config.temperature: received '0.1' (str)"),
                              ("do_sample", 1, "do_sample: received 1 (int); pass true or false"),
                              ("max_new_tokens", True, "max_new_tokens: received True (bool)"),
                              ("top_p", 0.0, "top_p: received 0.0; pass a number in (0, 1]"),
                              ("num_beams", 4, "num_beams: received 4; only 1")):
        with pytest.raises(GenerationConfigError) as error:
            GenerationConfig.from_dict({**raw, key: value})
        assert words in str(error.value) and error.value.exit_code == 2


def test_a_prompt_past_the_models_positions_is_refused(tiny, mmrun_models):
    from mmrun.models.vlm.generation import GenerationConfig, Generator, Prompt, PromptTooLongError

    model = mmrun_models["qwen2_vl"]
    limit = model.config.text.max_position_embeddings
    with pytest.raises(PromptTooLongError, match=f"more than the model's {limit} positions"):
        Generator(model).generate(Prompt(np.full((1, limit - 3), 5)), GenerationConfig(max_new_tokens=4))


@pytest.mark.slow
def test_pytorch_and_mindspore_choose_the_same_tokens(tmp_path, tiny, worker, hf_dirs):
    """Greedy on Qwen2-VL, sampled on Qwen2.5-VL, five tokens each (MindSpore's PyNative steps are slow on a CPU)."""
    pytest.importorskip("mindspore")
    spec = importlib.util.spec_from_file_location("mmrun_tests_qwen2_vl_generate", WORKER)
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    cases: dict[str, np.ndarray] = {}
    for case, model_type, config in (("greedy", "qwen2_vl", {"max_new_tokens": 5}),
                                     ("sampled", "qwen2_5_vl", {**SAMPLING, "max_new_tokens": 5})):
        cases.update({f"{case}/{k}": v for k, v in image_prompt(tiny).items()})
        cases[f"{case}/dir"], cases[f"{case}/config"] = np.array(str(hf_dirs[model_type])), np.array(json.dumps(config))
    np.savez(tmp_path / "cases.npz", **cases)
    env = {**os.environ, "MMRUN_AI_FRAMEWORK": "mindspore", "GLOG_v": "3"}
    done = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "cases.npz"), str(tmp_path / "ms.npz")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    mindspore = dict(np.load(tmp_path / "ms.npz"))
    pytorch = generate.generate_cases(cases)
    assert sorted(mindspore) == sorted(pytorch) == ["greedy", "sampled"]
    for case in pytorch:
        np.testing.assert_array_equal(mindspore[case], pytorch[case], err_msg=case)
    greedy = generate.generate_cases({**{k.replace("sampled/", "g/"): v for k, v in cases.items()
                                         if k.startswith("sampled/")}, "g/config": np.array('{"max_new_tokens": 5}')})
    assert not np.array_equal(greedy["g"], pytorch["sampled"])  # the sampling settings changed the tokens
