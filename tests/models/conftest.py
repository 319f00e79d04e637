"""Fixtures for the model tests: tiny random Hugging Face models saved to disk, loaded once per session.

This pytest process runs mmrun's models on PyTorch (the default framework); MindSpore runs in one
subprocess (workers/qwen2_vl_run.py). Everything is offline: models are built from configs.
"""
from __future__ import annotations

import importlib.util
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
    """The diffusers VAE and transformers UMT5 (perturbed), each saved with save_pretrained, and the tokenizer."""
    pytest.importorskip("diffusers")
    folder = tmp_path_factory.mktemp("wan")
    refs = {"vae": wan_tiny.diffusers_vae(), "umt5": wan_tiny.transformers_umt5(), "vae_dir": folder / "vae",
            "umt5_dir": folder / "text_encoder", "tokenizer_dir": wan_tiny.tokenizer_dir(folder / "tokenizer")}
    refs["vae"].save_pretrained(refs["vae_dir"])
    refs["umt5"].save_pretrained(refs["umt5_dir"])
    return refs


@pytest.fixture(scope="session")
def wan_frameworks(wan_tiny, wan_refs, tmp_path_factory) -> tuple[dict, dict, dict]:
    """(cases, PyTorch results, MindSpore results) of workers/wan_vae_run.py: MindSpore in ONE subprocess for the
    VAE and the text encoder together."""
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
             **wan_tiny.umt5_cases(wan_refs["umt5_dir"], wan_refs["tokenizer_dir"])}
    folder = tmp_path_factory.mktemp("wan_frameworks")
    np.savez(folder / "cases.npz", **cases)
    env = {**os.environ, "MMRUN_AI_FRAMEWORK": "mindspore", "GLOG_v": "3"}
    done = subprocess.run([sys.executable, str(HERE / "workers" / "wan_vae_run.py"), str(folder / "cases.npz"),
                           str(folder / "ms.npz")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    worker = load_helper("mmrun_tests_wan_vae_run", HERE / "workers" / "wan_vae_run.py")
    return cases, worker.run_cases(cases), dict(np.load(folder / "ms.npz"))
