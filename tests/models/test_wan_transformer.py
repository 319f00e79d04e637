"""mmrun's Wan2.1 transformer against diffusers' WanTransformer3DModel, PyTorch against MindSpore, its diffusers
directories both ways, and its configuration (diffusers' config.json, MindSpeed-MM's predictor, one-line errors).

Tiny random diffusers models (t2v, i2v) with every weight perturbed by noise first (diffusers initialises some
projections to zero, behind which a wrong layer would hide), saved by diffusers' save_pretrained; latents with an
odd frame count and odd height and width (the Conv3d drops the last row and column, and so does mmrun). PyTorch
runs in this process, MindSpore in one subprocess (workers/wan_run.py). Tolerance: 1e-5 of each tensor's largest
magnitude (at least 1e-5 absolute), in fp32.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mmrun.models.wan import WanConfigError, WanTransformerConfig

WORKER = Path(__file__).resolve().parent / "workers" / "wan_run.py"
TINY = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
            text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True)
# i2v with one block: its 257 + 512 context tokens make it the slow case (MindSpore's PyNative runs op by op).
CONFIGS = {"t2v": TINY, "i2v": {**TINY, "image_dim": 8, "added_kv_proj_dim": 24, "cross_attn_norm": False,
                                "num_layers": 1}}
# diffusers' i2v attention takes everything before the last 512 context tokens as image tokens.
TEXT_LEN = {"t2v": 9, "i2v": 512}
LATENT = (2, 4, 3, 5, 7)  # batch, channels, frames, height, width: odd frames, odd H and W
OUTPUT = (2, 4, 3, 4, 6)
# The official Wan2.1 1.3B t2v / i2v predictors (MindSpeed-MM's examples/wan2.1/1.3b/*/pretrain_model.json).
MINDSPEED_T2V = {
    "model_id": "wandit", "dtype": "bf16", "model_type": "t2v", "patch_size": [1, 2, 2], "text_len": 512,
    "in_dim": 16, "hidden_size": 1536, "ffn_dim": 8960, "freq_dim": 256, "text_dim": 4096, "img_dim": 1280,
    "out_dim": 16, "num_heads": 12, "num_layers": 30, "pipeline_num_layers": [7, 8, 8, 7], "qk_norm": True,
    "qk_norm_type": "rmsnorm", "cross_attn_norm": True, "eps": 1e-6, "max_seq_len": 1024,
    "attention_async_offload": False, "use_fused_rmsnorm": True, "FPDT": False, "FPDT_chunk_number": 4,
    "FPDT_with_offload": False}
MINDSPEED_I2V = {**{k: v for k, v in MINDSPEED_T2V.items() if not k.startswith("FPDT")}, "model_type": "i2v",
                 "in_dim": 36, "clip_token_len": 257}


def close(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5 * scale, err_msg=what)


@pytest.fixture(scope="module")
def wan_worker():
    """workers/wan_run.py imported into this process, on PyTorch."""
    from mmrun import backend
    try:
        backend.select("pytorch", "tests/models: the in-process side of the comparisons runs PyTorch")
    except backend.BackendError as error:  # a session started with MMRUN_AI_FRAMEWORK=mindspore
        pytest.skip(str(error))
    spec = importlib.util.spec_from_file_location("mmrun_tests_wan_run", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """{task: (diffusers model, its save_pretrained dir, the case arrays for workers/wan_run.py)}."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    out = {}
    for seed, (task, kwargs) in enumerate(CONFIGS.items()):
        torch.manual_seed(seed)
        model = diffusers.WanTransformer3DModel(**kwargs)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        path = tmp_path_factory.mktemp(f"wan-{task}")
        model.save_pretrained(path)
        rng = np.random.default_rng(seed)
        case = {"dir": np.array(str(path)), "hidden_states": rng.standard_normal(LATENT, np.float32),
                "timestep": np.array([999.0, 37.5], np.float32),  # the ends of the training schedule, one fractional
                "encoder_hidden_states": rng.standard_normal((2, TEXT_LEN[task], 16), np.float32),
                "cotangent": rng.standard_normal(OUTPUT, np.float32)}
        if task == "i2v":
            case["encoder_hidden_states_image"] = rng.standard_normal((2, 257, 8), np.float32)
        out[task] = (model, path, case)
    return out


def all_cases(reference) -> dict[str, np.ndarray]:
    """The forward cases of both tasks, and an init_weights case (seed 7) of the i2v config."""
    cases = {f"{task}/{k}": v for task, (_, _, case) in reference.items() for k, v in case.items()}
    cases["init/dir"], cases["init/seed"] = cases["i2v/dir"], np.array(7)
    return cases


@pytest.fixture(scope="module")
def torch_results(reference, wan_worker):
    return wan_worker.run_cases(all_cases(reference))


@pytest.mark.parametrize("task", ["t2v", "i2v"])
def test_outputs_and_gradients_equal_diffusers(reference, torch_results, task):
    import torch

    model, _, case = reference[task]
    args = {k: torch.from_numpy(v) for k, v in case.items() if k not in ("dir", "cotangent")}
    out = model(**args, return_dict=False)[0]
    names, params = zip(*model.named_parameters())
    grads = torch.autograd.grad((out * torch.from_numpy(case["cotangent"])).sum(), params)
    assert out.shape == OUTPUT and torch_results[f"{task}/output"].shape == OUTPUT
    close(torch_results[f"{task}/output"], out.detach().numpy(), "output")
    ours = sorted(k.split("/grad/", 1)[1] for k in torch_results if k.startswith(f"{task}/grad/"))
    assert ours == sorted(names)  # parameter names are diffusers' state-dict keys
    for name, grad in zip(names, grads):
        close(torch_results[f"{task}/grad/{name}"], grad.numpy(), name)


@pytest.mark.slow
def test_mindspore_equals_pytorch(reference, torch_results, tmp_path):
    pytest.importorskip("mindspore")
    np.savez(tmp_path / "cases.npz", **all_cases(reference))
    env = {**os.environ, "MMRUN_AI_FRAMEWORK": "mindspore", "GLOG_v": "3"}
    done = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "cases.npz"), str(tmp_path / "ms.npz")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ms = dict(np.load(tmp_path / "ms.npz"))
    assert sorted(ms) == sorted(torch_results) and len(ms) > 90
    for key, expected in torch_results.items():
        if key.startswith("init/"):  # the same seed, the same initial weights
            np.testing.assert_array_equal(ms[key], expected, err_msg=key)
        else:
            close(ms[key], expected, key)


def test_init_weights_follows_wan_and_is_framework_independent(reference, torch_results):
    from mmrun.models.wan import WanTransformerConfig, initial_state

    _, path, _ = reference["i2v"]
    expected = initial_state(WanTransformerConfig.from_diffusers(path), 7)
    params = {k.split("/param/", 1)[1]: v for k, v in torch_results.items() if k.startswith("init/param/")}
    assert sorted(params) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(params[name], value, err_msg=name)
    # Wan2.1's init_weights: xavier-uniform Linears, zero biases, N(0, 0.02) time/text embedders, a zero head.
    assert not params["proj_out.weight"].any() and not params["blocks.0.attn1.to_q.bias"].any()
    assert np.all(params["blocks.0.attn2.norm_added_k.weight"] == 1)
    assert abs(params["condition_embedder.time_embedder.linear_1.weight"].std() - 0.02) < 0.004
    bound = np.sqrt(6 / (24 + 32))
    ffn = params["blocks.0.ffn.net.0.proj.weight"]
    assert np.abs(ffn).max() <= bound and np.abs(ffn).max() > 0.9 * bound
    assert not np.array_equal(initial_state(WanTransformerConfig.from_diffusers(path), 8)["blocks.0.attn1.to_q.weight"],
                              params["blocks.0.attn1.to_q.weight"])


def test_from_pretrained_loads_every_diffusers_weight_from_one_file_or_shards(reference, wan_worker, tmp_path):
    from mmrun.backend import tensors
    from mmrun.models.wan import WanTransformer3DModel

    model, path, _ = reference["i2v"]
    model.save_pretrained(tmp_path, max_shard_size="20KB")  # diffusers' shards + index, as the 14B models come
    assert len(list(tmp_path.glob("diffusion_pytorch_model-*-of-*.safetensors"))) > 1
    theirs = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    for directory in (path, tmp_path):
        ours = WanTransformer3DModel.from_pretrained(directory)
        assert ours.config == WanTransformerConfig.from_diffusers(dict(model.config))
        state = tensors.state_dict_to_numpy(ours.state_dict())
        assert sorted(state) == sorted(theirs)
        for name, value in theirs.items():
            np.testing.assert_array_equal(state[name], value, err_msg=name)


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_save_pretrained_is_read_back_by_diffusers(reference, wan_worker, tmp_path, dtype):
    import torch
    from diffusers import WanTransformer3DModel as DiffusersWan
    from safetensors import safe_open

    from mmrun.models.wan import WanTransformer3DModel

    model, path, case = reference["t2v"]
    ours = WanTransformer3DModel.from_pretrained(path)
    saved = ours.save_pretrained(tmp_path / "transformer", dtype=dtype)
    assert sorted(p.name for p in saved.iterdir()) == ["config.json", "diffusion_pytorch_model.safetensors"]
    back = DiffusersWan.from_pretrained(saved)

    def arguments(config):
        return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items() if not k.startswith("_")}

    assert arguments(back.config) == arguments(model.config)
    stored = back.state_dict()
    for name, value in model.state_dict().items():
        # diffusers keeps its _keep_in_fp32_modules (scale_shift_table, norms) in fp32 whatever the file holds.
        expected = value if dtype is None else value.to(torch.bfloat16).to(stored[name].dtype)
        torch.testing.assert_close(stored[name], expected, rtol=0, atol=0, msg=name)
    with safe_open(saved / "diffusion_pytorch_model.safetensors", "pt") as f:
        assert f.get_slice("blocks.0.ffn.net.2.weight").get_dtype() == ("BF16" if dtype else "F32")
    if dtype is None:  # the round trip computes what the original does
        args = {k: torch.from_numpy(v) for k, v in case.items() if k not in ("dir", "cotangent")}
        with torch.no_grad():
            torch.testing.assert_close(back(**args, return_dict=False)[0], model(**args, return_dict=False)[0],
                                       rtol=0, atol=0)
    # Saving again over its own directory is allowed; over a foreign non-empty one it is refused.
    ours.save_pretrained(saved)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.txt").write_text("user data")
    with pytest.raises(WanConfigError, match="refusing to replace"):
        ours.save_pretrained(tmp_path / "data")
    assert (tmp_path / "data" / "keep.txt").read_text() == "user data"


def test_forward_refuses_a_missing_or_unexpected_image_and_bad_timesteps(reference, wan_worker):
    from mmrun.backend import tensors
    from mmrun.models.wan import WanTransformer3DModel

    for task, message in (("i2v", "pass encoder_hidden_states_image"), ("t2v", "takes no encoder_hidden_states_image")):
        _, path, case = reference[task]
        model = WanTransformer3DModel.from_pretrained(path)
        args = {k: tensors.from_numpy(case[k]) for k in ("hidden_states", "timestep", "encoder_hidden_states")}
        image = None if task == "i2v" else tensors.from_numpy(np.zeros((2, 257, 8), np.float32))
        with pytest.raises(ValueError, match=message):
            model(**args, encoder_hidden_states_image=image)
    args["timestep"] = tensors.from_numpy(np.array([1.0], np.float32))
    with pytest.raises(ValueError, match=r"timestep has shape \(1,\); pass one timestep per sample, shape \(2,\)"):
        model(**args)


def test_weights_that_do_not_fit_the_config_fail_in_one_line(reference, wan_worker, tmp_path):
    from mmrun.models.wan import WanTransformer3DModel

    _, path, _ = reference["t2v"]
    broken = tmp_path / "broken"
    broken.mkdir()
    config = json.loads((path / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "num_layers": 3}))
    (broken / "diffusion_pytorch_model.safetensors").write_bytes(
        (path / "diffusion_pytorch_model.safetensors").read_bytes())
    with pytest.raises(WanConfigError) as error:
        WanTransformer3DModel.from_pretrained(broken)
    assert "\n" not in str(error.value) and "missing 27: blocks.2." in str(error.value)
    (broken / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(WanConfigError, match="has no diffusion_pytorch_model.safetensors"):
        WanTransformer3DModel.from_pretrained(broken)


# ------------------------------------------------------------------------------------------ configuration

def test_mindspeed_predictors_map_to_diffusers_configs():
    t2v = WanTransformerConfig.from_mindspeed(MINDSPEED_T2V)
    # diffusers' Wan2.1-T2V-1.3B-Diffusers transformer/config.json
    assert t2v.to_diffusers() == {
        "_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2], "num_attention_heads": 12,
        "attention_head_dim": 128, "in_channels": 16, "out_channels": 16, "text_dim": 4096, "freq_dim": 256,
        "ffn_dim": 8960, "num_layers": 30, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads",
        "eps": 1e-6, "image_dim": None, "added_kv_proj_dim": None, "rope_max_seq_len": 1024,
        "pos_embed_seq_len": None}
    assert WanTransformerConfig.from_diffusers(t2v.to_diffusers()) == t2v and t2v.model_type == "t2v"
    i2v = WanTransformerConfig.from_mindspeed(MINDSPEED_I2V)
    assert (i2v.model_type, i2v.in_channels, i2v.image_dim, i2v.added_kv_proj_dim) == ("i2v", 36, 1280, 1536)
    flf2v = WanTransformerConfig.from_mindspeed({**MINDSPEED_I2V, "model_type": "flf2v"})
    assert (flf2v.model_type, flf2v.pos_embed_seq_len) == ("flf2v", 514)


def test_from_diffusers_reads_a_directory_and_its_bookkeeping(tmp_path):
    raw = {"_class_name": "WanTransformer3DModel", "_diffusers_version": "0.33.0.dev0", **TINY,
           "patch_size": [1, 2, 2], "qk_norm": None, "image_dim": None, "added_kv_proj_dim": None}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    config = WanTransformerConfig.from_diffusers(tmp_path)
    assert config == WanTransformerConfig(**TINY) and config.rope_dims == (4, 4, 4)


@pytest.mark.parametrize("predictor, pp, message", [
    ({**MINDSPEED_T2V, "model_id": "hunyuanvideo15dit"}, 1, "predictor.model_id is 'hunyuanvideo15dit'; "
     "mmrun's video generation builds 'wandit' (Wan2.1) only"),
    ({**MINDSPEED_T2V, "model_type": "ti2v"}, 1, "predictor.model_type is 'ti2v'"),
    ({**MINDSPEED_T2V, "hidden_size": "1536"}, 1, "predictor.hidden_size is '1536' (str); expected int"),
    ({**MINDSPEED_T2V, "cross_attn_norm": 1}, 1, "predictor.cross_attn_norm is 1 (int); expected bool"),
    ({**{k: v for k, v in MINDSPEED_T2V.items() if k != "num_heads"}, "num_head": 12}, 1,
     "predictor: unknown key 'num_head'; did you mean num_heads?"),
    ({**MINDSPEED_T2V, "qk_norm": False}, 1, "predictor: qk_norm False with qk_norm_type 'rmsnorm'"),
    ({**MINDSPEED_T2V, "hidden_size": 1000}, 1, "hidden_size 1000 is not a multiple of num_heads 12"),
    (MINDSPEED_T2V, 4, "pipeline parallelism of the Wan DiT is not supported (received "
     "--pipeline-model-parallel-size 4, predictor.pipeline_num_layers [7, 8, 8, 7])"),
])
def test_bad_mindspeed_predictors_fail_in_one_line(predictor, pp, message):
    with pytest.raises(WanConfigError) as error:
        WanTransformerConfig.from_mindspeed(predictor, pipeline_model_parallel_size=pp)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert error.value.exit_code == 2


def test_unknown_mindspeed_keys_get_one_warning():
    with pytest.warns(UserWarning, match=r"does not read 'my_switch', 'zz'; ignored") as record:
        WanTransformerConfig.from_mindspeed({**MINDSPEED_T2V, "my_switch": 1, "zz": None})
    assert len(record) == 1
    lines = []
    WanTransformerConfig.from_mindspeed({**MINDSPEED_T2V, "zz": 1}, where="m.json: predictor", warn=lines.append)
    assert lines == ["m.json: predictor: mmrun's Wan DiT does not read 'zz'; ignored"]


@pytest.mark.parametrize("raw, message", [
    ({**TINY, "num_layer": 2}, "unknown key 'num_layer'; did you mean num_layers?"),
    ({**TINY, "_class_name": "AutoencoderKLWan"}, "describes a AutoencoderKLWan, not a WanTransformer3DModel"),
    ({**TINY, "attention_head_dim": 13}, "attention_head_dim 13 must be even"),
    ({**TINY, "num_layers": 0}, "num_layers 0 must be a positive integer"),
    ({**TINY, "image_dim": 8}, "image_dim 8 with added_kv_proj_dim None: image-to-video needs both"),
    ({**TINY, "image_dim": 8, "added_kv_proj_dim": 16}, "added_kv_proj_dim 16 must equal the hidden size 24"),
    ({**TINY, "patch_size": [1, 2]}, "patch_size (1, 2) must be three positive integers"),
    ({**TINY, "eps": "1e-6"}, "config.eps is '1e-6' (str); expected int or float"),
])
def test_bad_diffusers_configs_fail_in_one_line(raw, message):
    with pytest.raises(WanConfigError) as error:
        WanTransformerConfig.from_diffusers(raw)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_mindspeed_parameter_names_map_both_ways():
    from mmrun.models.wan import mindspeed_names
    from mmrun.models.wan.transformer import parameter_shapes

    flf2v = WanTransformerConfig(**{**CONFIGS["i2v"], "pos_embed_seq_len": 514, "cross_attn_norm": True})
    names = [n for config in (WanTransformerConfig(**TINY), flf2v) for n in parameter_shapes(config)]
    theirs = [mindspeed_names.to_mindspeed(n) for n in names]
    assert [mindspeed_names.from_mindspeed(n) for n in theirs] == names
    assert len(set(theirs)) == len(set(names))
    # MindSpeed-MM's WanDiT names (mindspeed_mm/models/predictor/dits/wan_dit.py), spot checks.
    for ours, mindspeed in (("blocks.1.attn2.norm_added_k.weight", "blocks.1.cross_attn.k_norm_img.weight"),
                            ("blocks.1.attn2.norm_k.weight", "blocks.1.cross_attn.k_norm.weight"),
                            ("blocks.0.attn1.to_out.0.bias", "blocks.0.self_attn.proj_out.bias"),
                            ("blocks.0.norm2.weight", "blocks.0.norm3.weight"),
                            ("blocks.0.scale_shift_table", "blocks.0.modulation"),
                            ("scale_shift_table", "head.modulation"), ("proj_out.weight", "head.head.weight"),
                            ("blocks.0.ffn.net.0.proj.weight", "blocks.0.ffn.0.weight"),
                            ("patch_embedding.weight", "patch_embedding.weight")):
        assert mindspeed_names.to_mindspeed(ours) == mindspeed and mindspeed_names.from_mindspeed(mindspeed) == ours
    # finetune_lora.sh's --lora-target-modules: MindSpeed-MM's proj_out is the attention output, not the head.
    assert mindspeed_names.lora_targets_from_mindspeed(["ffn.2", "ffn.0", "proj_q", "proj_k", "proj_v", "proj_out"]) \
        == ["ffn.net.2", "ffn.net.0.proj", "to_q", "to_k", "to_v", "to_out.0"]
