"""Fixtures for the model tests: tiny random Hugging Face models saved to disk, loaded once per session.

This pytest process runs mmrun's models on PyTorch (the default framework); MindSpore runs in one
subprocess (workers/qwen2_vl_run.py). Everything is offline: models are built from configs.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")


def load_helper(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny() -> ModuleType:
    """tests/models/tiny_hf.py: the tiny configs, batches and transformers reference runs."""
    return load_helper("mmrun_tests_tiny_hf", HERE / "tiny_hf.py")


@pytest.fixture(scope="session")
def tiny3() -> ModuleType:
    """tests/models/tiny_qwen3_vl.py: the tiny Qwen3-VL config, batches and transformers reference runs."""
    return load_helper("mmrun_tests_tiny_qwen3_vl", HERE / "tiny_qwen3_vl.py")


@pytest.fixture(scope="session")
def tiny_omni() -> ModuleType:
    """tests/models/tiny_omni.py: the tiny Qwen2.5-Omni thinker, its batches and transformers reference runs."""
    return load_helper("mmrun_tests_tiny_omni", HERE / "tiny_omni.py")


@pytest.fixture(scope="session")
def worker() -> ModuleType:
    """tests/models/workers/qwen2_vl_run.py, imported into this (PyTorch) process."""
    from mmrun import backend
    try:
        backend.select("pytorch", "tests/models: the in-process side of the comparisons runs PyTorch")
    except backend.BackendError as error:  # a session started with MMRUN_AI_FRAMEWORK=mindspore
        pytest.skip(str(error))
    return load_helper("mmrun_tests_qwen2_vl_run", HERE / "workers" / "qwen2_vl_run.py")


@pytest.fixture(scope="session")
def hf_models(tiny) -> dict:
    pytest.importorskip("transformers")
    return {model_type: tiny.hf_model(model_type) for model_type in MODEL_TYPES}


@pytest.fixture(scope="session")
def hf_dirs(hf_models, tmp_path_factory) -> dict[str, Path]:
    """Each tiny model written by transformers' save_pretrained (fp32, hub key layout)."""
    dirs = {}
    for model_type, model in hf_models.items():
        dirs[model_type] = tmp_path_factory.mktemp(model_type)
        model.save_pretrained(dirs[model_type])
    return dirs


@pytest.fixture(scope="session")
def mmrun_models(worker, hf_dirs) -> dict:
    """mmrun's PyTorch models loaded from those directories."""
    from mmrun.models.qwen2_vl import from_pretrained
    return {model_type: from_pretrained(str(path)) for model_type, path in hf_dirs.items()}


# ------------------------------------------------------------------------------------------ Wan VAE + UMT5

@pytest.fixture(scope="session")
def wan_tiny() -> ModuleType:
    """tests/models/wan_tiny.py: the tiny Wan VAE / UMT5 / tokenizer and their inputs."""
    return load_helper("mmrun_tests_wan_tiny", HERE / "wan_tiny.py")


@pytest.fixture(scope="session")
def wan_refs(wan_tiny, tmp_path_factory) -> dict:
    """The diffusers VAE, transformers UMT5 and CLIP image encoder (perturbed), each saved with save_pretrained
    (the CLIP also in transformers 4.x's layout, as the hub's Wan I2V image_encoder/ holds it), and the tokenizer."""
    pytest.importorskip("diffusers")
    folder = tmp_path_factory.mktemp("wan")
    refs = {"vae": wan_tiny.diffusers_vae(), "umt5": wan_tiny.transformers_umt5(), "vae_dir": folder / "vae",
            "umt5_dir": folder / "text_encoder", "tokenizer_dir": wan_tiny.tokenizer_dir(folder / "tokenizer")}
    refs["vae"].save_pretrained(refs["vae_dir"])
    refs["umt5"].save_pretrained(refs["umt5_dir"])
    refs["clip"] = wan_tiny.transformers_clip()
    refs["clip_dir"], refs["clip_processor_dir"] = wan_tiny.clip_dirs(folder, refs["clip"])
    refs["clip_hub_dir"] = wan_tiny.clip_hub_layout(refs["clip"], refs["clip_dir"], folder / "image_encoder_hub")
    return refs


@pytest.fixture(scope="session")
def wan_frameworks(wan_tiny, wan_refs, tmp_path_factory) -> tuple[dict, dict, dict]:
    """(cases, PyTorch results, MindSpore results) of workers/wan_vae_run.py: MindSpore in ONE subprocess for the
    VAE, the text encoder and the image encoder together."""
    import os
    import subprocess
    import sys

    import numpy as np
    pytest.importorskip("mindspore")
    from mmrun import backend
    try:
        backend.select("pytorch", "tests/models: the in-process side of the comparisons runs PyTorch")
    except backend.BackendError as error:
        pytest.skip(str(error))
    cases = {**wan_tiny.vae_cases(wan_refs["vae_dir"]),
             **wan_tiny.umt5_cases(wan_refs["umt5_dir"], wan_refs["tokenizer_dir"]),
             **wan_tiny.clip_cases(wan_refs["clip_hub_dir"])}
    folder = tmp_path_factory.mktemp("wan_frameworks")
    np.savez(folder / "cases.npz", **cases)
    env = {**os.environ, "MMRUN_AI_FRAMEWORK": "mindspore", "GLOG_v": "3"}
    done = subprocess.run([sys.executable, str(HERE / "workers" / "wan_vae_run.py"), str(folder / "cases.npz"),
                           str(folder / "ms.npz")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    worker = load_helper("mmrun_tests_wan_vae_run", HERE / "workers" / "wan_vae_run.py")
    return cases, worker.run_cases(cases), dict(np.load(folder / "ms.npz"))


# MindSpeed-MM's examples/qwen2.5vl/inference_qwen2_5_vl_7b.json generation_config, abridged, max_new_tokens cut
VLM_GENERATION = {"bos_token_id": 0, "do_sample": True, "kv_cache": True, "output_attentions": False,
                  "max_length": 20, "min_length": 0, "min_new_tokens": None, "repetition_penalty": 1.05,
                  "num_beams": 1, "use_cache": True, "eos_token_id": [2, 0], "max_new_tokens": 8, "pad_token_id": 0,
                  "temperature": 0.1, "top_k": 1, "top_p": 0.001, "dola_layers": None, "stop_strings": None}
TINY_MODEL_JSON = HERE.parents[1] / "scripts" / "qwen2vl" / "model_tiny.json"


@pytest.fixture(scope="session")
def vlm_job(tmp_path_factory):
    """(root, inference json path, its dict): a tiny Qwen2-VL (model_tiny.json, strong random weights) as an HF
    directory with the demo's tokenizer and processor, the demo's pictures, and the inference json for them."""
    from mmrun.backend import tensors
    from mmrun.data.multimodal.demo import make_demo
    from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig
    from mmrun.models.qwen2_vl.hf_checkpoint import save_hf_directory
    from mmrun.models.vlm.model_json import read_model_json
    from mmrun.models.qwen2_vl.modeling import Qwen2VLForConditionalGeneration
    from mmrun.models.vlm.blocks import init_weights

    root = tmp_path_factory.mktemp("inference")
    make_demo(str(root / "demo"), num_samples=8)
    config = Qwen2VLConfig.from_hf_config(read_model_json(TINY_MODEL_JSON).hf_config)
    model = Qwen2VLForConditionalGeneration(config)
    init_weights(model, seed=3, std=0.3)  # far from uniform logits: varied tokens, no near-ties
    save_hf_directory(root / "hf", config, tensors.state_dict_to_numpy(model.state_dict()),
                      copy_files_from=root / "demo" / "model")
    raw = json.loads(TINY_MODEL_JSON.read_text())
    raw.pop("model_id")
    raw.update({"pipeline_class": "Qwen2VlPipeline", "generation_config": VLM_GENERATION, "dtype": "fp32",
                "device": "npu", "min_pixels": 3136, "max_pixels": 12544,
                "tokenizer": {"hub_backend": "hf", "autotokenizer_name": "AutoTokenizer",
                              "from_pretrained": str(root / "hf")},
                "image_path": str(root / "demo" / "data" / "images" / "0001.png"),
                "prompts": ["What is in the picture?", "Describe the image."]})
    path = root / "inference.json"
    path.write_text(json.dumps(raw))
    return root, path, raw
