"""A tiny random Qwen3-VL to chat with and score: the offline demo's Qwen3-VL data, tokenizer and processor
(`demo/`), a transformers Qwen3VLForConditionalGeneration of scripts/qwen3vl/model_tiny.json's shape (or the MoE's,
Qwen3VLMoeForConditionalGeneration, of a model.json with num_moe_experts) saved
beside them (`demo/model`), MindSpeed-MM's Qwen2.5-VL inference and evaluation json with that model.json's
sections (`inference_qwen3_vl.json`, `evaluate_qwen3_vl.json`), and transformers' own greedy answer to the
inference json's first prompt, to compare with inference_vlm.py's.  Usage: python make_tiny_qwen3_vl.py [DIR]"""
from __future__ import annotations

import json
import sys
from pathlib import Path

MODEL_JSON = "scripts/qwen3vl/model_tiny.json"


def write(root: Path, model_json: str = MODEL_JSON) -> tuple[Path, dict, object]:
    """(inference json path, its dict, the transformers model) under root."""
    import torch
    import transformers

    from mmrun.data.multimodal.demo import make_demo
    from mmrun.models.qwen3_vl.model_json import parse_model_json

    transformers.utils.logging.disable_progress_bar()
    demo = make_demo(str(root / "demo"), num_samples=16, model="qwen3_vl")
    sections = json.loads(Path(model_json).read_text())
    hf_config = parse_model_json(sections, model_json).hf_config
    moe = hf_config.pop("model_type") == "qwen3_vl_moe"  # model.json with num_moe_experts: Qwen3-VL MoE
    config_class, model_class = (("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration") if moe
                                 else ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration"))
    torch.manual_seed(1)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**hf_config))
    with torch.no_grad():  # strong random weights: varied tokens, no near-ties between the frameworks' kernels
        for param in model.parameters():
            param.add_(0.3 * torch.randn_like(param))
    model.eval().save_pretrained(demo["model_dir"])
    sections.pop("model_id")
    common = {**sections, "dtype": "fp32", "device": "npu", "min_pixels": 3136, "max_pixels": 12544,
              "generation_config": {"do_sample": False, "max_new_tokens": 8, "eos_token_id": [2], "num_beams": 1},
              "tokenizer": {"hub_backend": "hf", "autotokenizer_name": "AutoTokenizer",
                            "from_pretrained": demo["model_dir"]}}
    raw = {"pipeline_class": "Qwen2VlPipeline", **common,
           "image_path": str(root / "demo" / "data" / "images" / "0000.png"),
           "prompts": ["What is in the picture?"]}
    path = root / "inference_qwen3_vl.json"
    path.write_text(json.dumps(raw, indent=1) + "\n")
    evaluation = {"model_id": "Qwen2VlPipeline", **common, "evaluation_dataset": "docvqa_val",
                  "dataset_path": "DocVQA_VAL.tsv", "evaluation_model": "qwen3_vl_tiny",
                  "result_output_path": "evaluation_outputs"}
    (root / "evaluate_qwen3_vl.json").write_text(json.dumps(evaluation, indent=1) + "\n")
    return path, raw, model


def transformers_answer(raw: dict, model) -> list[int]:
    """transformers' greedy generate on the prompt inference_vlm.py builds (the qwen3_vl_nothink template, the
    processor's image tokens): its new token ids."""
    import numpy as np
    import torch

    from mmrun.data.multimodal.image_processing import ImageProcessorConfig
    from mmrun.data.multimodal.templates import QWEN3_VL_NOTHINK
    from mmrun.data.multimodal.vlm_prompt import encode_prompt, open_image, with_pixel_limits
    from mmrun.data.tokenizers import HuggingFaceTokenizer

    model_dir = raw["tokenizer"]["from_pretrained"]
    processor = with_pixel_limits(ImageProcessorConfig.from_pretrained(model_dir), raw["min_pixels"],
                                  raw["max_pixels"])
    prompt = encode_prompt(HuggingFaceTokenizer(model_dir), QWEN3_VL_NOTHINK, raw["prompts"][0],
                           [open_image(raw["image_path"], "image_path")], processor)
    ids = prompt["input_ids"]
    inputs = {k: torch.from_numpy(v) for k, v in prompt.items()}
    inputs["attention_mask"] = torch.ones(ids.shape, dtype=torch.long)
    inputs["mm_token_type_ids"] = torch.from_numpy(np.where(ids == model.config.image_token_id, 1, 0))
    generation = raw["generation_config"]
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=generation["max_new_tokens"], do_sample=False,
                             eos_token_id=generation["eos_token_id"])
    return out[0, ids.shape[1]:].tolist()


if __name__ == "__main__":
    from mmrun.data.tokenizers import HuggingFaceTokenizer

    path, raw, model = write(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
    tokens = transformers_answer(raw, model)
    text = HuggingFaceTokenizer(raw["tokenizer"]["from_pretrained"]).detokenize([t for t in tokens if t > 6])
    print(f"wrote {path.name}, evaluate_qwen3_vl.json and demo/ (tiny Qwen3-VL in demo/model)")
    print(f"transformers generate, {len(tokens)} greedy tokens: {text}")
