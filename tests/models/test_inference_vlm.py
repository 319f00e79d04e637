"""models/inference_vlm.py: MindSpeed-MM's inference json as it is, weights from a Hugging Face directory or a
TP2 x PP2 checkpoint, the answer streamed; bad input is one line and exit 2. (PyTorch and MindSpore choosing the
same tokens: test_qwen2_vl_generation.py; the entry on MindSpore under mmrun: docs/inference.md.)"""
from __future__ import annotations

import json

import pytest

@pytest.fixture(scope="module")
def job(vlm_job):
    return vlm_job


def write_json(job, **changes) -> str:
    root, _, raw = job
    path = root / f"changed-{len(list(root.glob('changed-*')))}.json"
    path.write_text(json.dumps({**raw, **changes}))
    return str(path)


def expected_answers(job, new_tokens: int = 8) -> list[str]:
    """The answers straight from the generation loop (what the entry must print)."""
    from mmrun.data.multimodal.image_processing import ImageProcessorConfig
    from mmrun.data.multimodal.templates import QWEN2VL
    from mmrun.data.multimodal.vlm_prompt import encode_prompt, open_image, with_pixel_limits
    from mmrun.data.tokenizers import HuggingFaceTokenizer
    from mmrun.models.qwen2_vl import from_pretrained
    from mmrun.models.vlm.generation import GenerationConfig, Generator, Prompt

    root, _, raw = job
    tokenizer = HuggingFaceTokenizer(str(root / "hf"))
    images = [open_image(raw["image_path"], "test")]
    processor = with_pixel_limits(ImageProcessorConfig.from_pretrained(str(root / "hf")), 3136, 12544)
    generator = Generator(from_pretrained(str(root / "hf")))
    config = GenerationConfig.from_dict(raw["generation_config"]).replace(seed=1234, max_new_tokens=new_tokens)
    answers = []
    for text in raw["prompts"][:1 if new_tokens != 8 else None]:
        tokens = generator.generate(Prompt(**encode_prompt(tokenizer, QWEN2VL, text, images, processor)), config)
        answers.append(tokenizer.detokenize([t for t in tokens if t not in (0, 1, 2, 3, 4, 5, 6)]))
    return answers


def run_entry(capsys, *argv) -> tuple[int, str, str]:
    from mmrun.models import inference_vlm

    try:
        code = inference_vlm.main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_streams_the_answers_of_the_generation_loop_from_an_hf_directory(job, capsys):
    root, path, _ = job
    code, out, err = run_entry(capsys, "--mm-model", str(path), "--load", str(root / "hf"), "--use-mcore-models",
                               "--tensor-model-parallel-size", "1", "--bf16")
    assert code == 0, err
    answers = expected_answers(job)
    assert out == "".join(a + "\n" for a in answers) and all(answers)
    assert "notice: ignored (one process runs the whole model): --use-mcore-models --tensor-model-parallel-size" in err
    assert "generation_config keys not used by mmrun's generation: 6 (bos_token_id, output_attentions" in err
    assert err.count("new tokens after a prompt of") == 2


def test_mindspeed_mm_inference_json_keys_are_read_without_a_warning(job):
    from mmrun.models.inference_vlm import model_spec

    root, path, raw = job
    text = {**raw["text_decoder"], "is_encoder_decoder": False, "sequence_parallel": False,
            "tokenizer_type": "PretrainedFromHF", "use_infer_fa": True}
    spec = model_spec({**raw, "text_decoder": text, "patch": {"infer_fa": True}}, str(path))
    assert spec.warnings == [] and spec.hf_config["model_type"] == "qwen2_vl"


@pytest.mark.parametrize("change, message", [
    ({"generation_config": {"temperature": "hot"}},
     "error: generation_config.temperature: received 'hot' (str); pass a number >= 0 (0: greedy)"),
    ({"prompts": "many words " * 600}, "error: the prompt has 4227 tokens and 8 new ones are asked for, more than"),
    ({"pipeline_class": "InternVLPipeline"}, "error: --mm-model"),
])
def test_bad_input_is_one_line_and_exit_2(job, capsys, change, message):
    if "generation_config" in change:
        change = {"generation_config": {**job[2]["generation_config"], **change["generation_config"]}}
    code, out, err = run_entry(capsys, "--mm-model", write_json(job, **change))
    lines = [line for line in err.splitlines() if not line.startswith("notice:")]
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith(message), err


def test_a_bf16_json_on_mindspore_cpu_is_refused_in_one_line_as_training_is(job):
    """MindSpore has no bf16 CPU kernels: the json's dtype bf16 stops before the model is built (issue 37: a
    TypeError inside Gather), exit 2, one line naming the dtype and what to set."""
    import subprocess
    import sys
    from pathlib import Path

    entry = Path(__file__).resolve().parents[2] / "models" / "inference_vlm.py"
    done = subprocess.run([sys.executable, str(entry), "--mm-model", write_json(job, dtype="bf16"), "--load",
                           str(job[0] / "hf"), "--ai-framework", "mindspore"], capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and done.stdout == "", done.stderr[-3000:]
    assert len(lines) == 1 and "dtype 'bf16' cannot run with the mindspore backend on cpu" in lines[0], done.stderr
    assert lines[0].endswith("set dtype to fp16 or fp32 in the json") and "Traceback" not in done.stderr


def test_an_image_that_will_not_decode_is_one_line_and_exit_2(job, capsys):
    root = job[0]
    broken = root / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    code, _, err = run_entry(capsys, "--mm-model", write_json(job, image_path=str(broken)))
    assert code == 2 and err.strip().startswith(f"error: image_path {broken}: cannot decode the image")
    assert len(err.strip().splitlines()) == 1


def test_a_split_checkpoint_prints_what_the_hf_directory_prints(job, capsys, tmp_path):
    from mmrun.checkpoint import vlm as convert

    root, path, _ = job
    convert.hf_to_mm("Qwen2VLConverter", {"mm_dir": str(tmp_path / "mm"), "hf_config": {"hf_dir": str(root / "hf")},
                                          "parallel_config": {"tp_size": 2, "vit_pp_layers": [2, 0],
                                                              "llm_pp_layers": [1, 1]}})
    capsys.readouterr()
    short = write_json(job, prompts=job[2]["prompts"][:1],
                       generation_config={**job[2]["generation_config"], "max_new_tokens": 3})
    code, out, err = run_entry(capsys, "--mm-model", short, "--load", str(tmp_path / "mm"))
    assert code == 0, err
    assert "tp_size 2, vit_pp_layers [2, 0], llm_pp_layers [1, 1]" in err and "> 3 new tokens after a prompt" in err
    answer = expected_answers(job, new_tokens=3)[0]
    assert answer and out == answer + "\n"


def test_a_peft_adapter_generates_the_tokens_of_transformers_and_peft(job, capsys, tmp_path):
    """An adapter written by peft itself (random B, so it changes the answer) on --load's HF directory: greedy
    tokens equal transformers + peft's `generate` on the same prompt; the json's lora_path and --lora-load agree."""
    import numpy as np
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2VLForConditionalGeneration

    from mmrun.data.multimodal.templates import QWEN2VL
    from mmrun.data.multimodal.vlm_prompt import encode_prompt, open_image
    from mmrun.models import inference_vlm

    root, path, raw = job
    torch.manual_seed(0)
    targets = ["q_proj", "v_proj", "o_proj", "down_proj", "attn.qkv", "mlp.fc2"]
    peft = get_peft_model(Qwen2VLForConditionalGeneration.from_pretrained(str(root / "hf")),
                          LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)).eval()
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)  # strong enough to change greedy tokens
    peft.save_pretrained(str(tmp_path / "adapter"))

    greedy = {**raw["generation_config"], "do_sample": False, "repetition_penalty": 1.0}
    pipe = inference_vlm.Qwen2VlPipeline({**raw, "generation_config": greedy, "lora_path": str(tmp_path / "adapter")},
                                         str(path), str(root / "hf"), seed=1234, quiet=True)
    base = inference_vlm.Qwen2VlPipeline({**raw, "generation_config": greedy}, str(path), str(root / "hf"), seed=1234,
                                         quiet=True)
    text, images = raw["prompts"][0], [open_image(raw["image_path"], "test")]
    ours, _, _ = pipe.answer(text, images)
    assert ours != base.answer(text, images)[0]  # the adapter is really applied

    prompt = encode_prompt(pipe.tokenizer, QWEN2VL, text, images, pipe.image_config)
    ids = prompt["input_ids"]
    image_token = peft.base_model.model.config.image_token_id
    with torch.no_grad():
        out = peft.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                            pixel_values=torch.from_numpy(prompt["pixel_values"]),
                            image_grid_thw=torch.from_numpy(prompt["image_grid_thw"]),
                            mm_token_type_ids=torch.from_numpy(np.where(ids == image_token, 1, 0)),
                            max_new_tokens=greedy["max_new_tokens"], do_sample=False,
                            eos_token_id=list(pipe.generation.eos_token_id))
    assert ours == out[0, ids.shape[1]:].tolist()

    code, printed, err = run_entry(capsys, "--mm-model", write_json(job, generation_config=greedy), "--load",
                                   str(root / "hf"), "--lora-load", str(tmp_path / "adapter"))
    assert code == 0 and "LoRA adapter" in err and "layers folded in" in err, err
    assert printed.splitlines()[0] == pipe.tokenizer.detokenize([t for t in ours if t not in pipe.hidden])
