"""Layers and models: torch names, shapes and defaults on both frameworks; state dicts move between them."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from mmrun.backend import side_by_side

FRAMEWORKS = ["pytorch", "mindspore"]
SMALL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=64, max_position_embeddings=16,
             seq_length=16, hidden_dropout=0.0, attention_dropout=0.0)


def gpt(framework, **overrides):
    module = side_by_side.load_module("mmrun.models.gpt", framework)
    return module.GPT(module.GPTConfig(**{**SMALL, **overrides}))


def names_and_shapes(model):
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


@pytest.mark.parametrize("tied", [True, False])
def test_gpt_parameter_names_and_shapes_identical(tied):
    torch_names = names_and_shapes(gpt("pytorch", untie_embeddings_and_output_weights=not tied))
    assert torch_names == names_and_shapes(gpt("mindspore", untie_embeddings_and_output_weights=not tied))
    names = [n for n, _ in torch_names]
    assert names[:4] == ["wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias"]
    assert names[-3:] == (["h.1.mlp.c_proj.bias", "ln_f.weight", "ln_f.bias"] if tied
                          else ["ln_f.weight", "ln_f.bias", "lm_head.weight"])
    assert not any(word in n for n in names for word in ("embedding_table", "gamma", "beta"))


def test_vit_patch_embedding_names_and_output_shape(backends):
    shapes = []
    for fw in FRAMEWORKS:
        be, vit = backends[fw], side_by_side.load_module("mmrun.models.vit", fw)
        model = vit.PatchEmbedding(image_size=16, patch_size=4, in_channels=3, hidden_size=8)
        out = model(be.tensors.from_numpy(np.zeros((2, 3, 16, 16), np.float32)))
        shapes.append((names_and_shapes(model), tuple(out.shape)))
    assert shapes[0] == shapes[1]
    assert shapes[0][1] == (2, 16, 8)
    assert [n for n, _ in shapes[0][0]] == ["position_embeddings", "proj.weight", "proj.bias"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_megatron_init_statistics(backends, framework):
    be = backends[framework]
    model = gpt(framework, num_layers=8, hidden_size=128, vocab_size=512)
    state = be.tensors.state_dict_to_numpy(model.state_dict())
    std = 0.02
    assert state["wte.weight"].std() == pytest.approx(std, rel=0.05)
    assert state["h.0.attn.c_attn.weight"].std() == pytest.approx(std, rel=0.05)
    # Output projections: std / sqrt(2 * num_layers) = 0.02 / 4
    assert state["h.3.attn.c_proj.weight"].std() == pytest.approx(std / 4, rel=0.05)
    assert state["h.3.mlp.c_proj.weight"].std() == pytest.approx(std / 4, rel=0.05)
    assert not state["h.0.mlp.c_fc.bias"].any()
    np.testing.assert_array_equal(state["ln_f.weight"], 1.0)
    np.testing.assert_array_equal(state["h.1.ln_2.bias"], 0.0)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_layer_defaults_follow_torch(backends, framework):
    nn = backends[framework].nn
    assert nn.LayerNorm(8).eps == 1e-5  # MindSpore's own nn.LayerNorm defaults to 1e-7
    linear = nn.Linear(16, 4)
    bound = 1 / np.sqrt(16)
    weight = backends[framework].tensors.to_numpy(linear.weight)
    assert weight.shape == (4, 16) and np.abs(weight).max() <= bound and np.abs(weight).max() > bound / 2
    assert names_and_shapes(nn.Embedding(5, 3)) == [("weight", (5, 3))]
    assert names_and_shapes(nn.Conv2d(3, 6, 2, stride=2)) == [("weight", (6, 3, 2, 2)), ("bias", (6,))]
    conv3d = nn.Conv3d(3, 6, (3, 1, 1), stride=(2, 1, 1), padding=1)
    assert names_and_shapes(conv3d) == [("weight", (6, 3, 3, 1, 1)), ("bias", (6,))]
    assert (conv3d.kernel_size, conv3d.stride, conv3d.padding) == ((3, 1, 1), (2, 1, 1), (1, 1, 1))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_train_eval_switch_dropout(backends, framework):
    be = backends[framework]
    model = gpt(framework, hidden_dropout=0.5, attention_dropout=0.5)
    tokens = be.tensors.from_numpy(np.arange(16).reshape(1, 16) % 64)
    model.eval()
    assert not model.training and not model.h[0].attn.training and not model.h[0].attn.resid_dropout.training
    first = be.tensors.to_numpy(model(tokens))
    np.testing.assert_array_equal(first, be.tensors.to_numpy(model(tokens)))
    model.train()
    assert model.training and model.h[1].mlp.dropout.training
    assert np.abs(be.tensors.to_numpy(model(tokens)) - first).max() > 1e-3


def test_state_dict_moves_between_frameworks_and_logits_match(bt, bm):
    source = gpt("pytorch")
    target = gpt("mindspore")
    target.load_state_dict(bm.tensors.state_dict_from_numpy(bt.tensors.state_dict_to_numpy(source.state_dict())))
    tokens = np.random.default_rng(0).integers(0, 64, (2, 16))
    with bt.autograd.no_grad():
        logits_t = bt.tensors.to_numpy(source(bt.tensors.from_numpy(tokens)))
    logits_m = bm.tensors.to_numpy(target(bm.tensors.from_numpy(tokens)))
    np.testing.assert_allclose(logits_m, logits_t, atol=1e-5)
    back = gpt("pytorch")
    back.load_state_dict(bt.tensors.state_dict_from_numpy(bm.tensors.state_dict_to_numpy(target.state_dict())))
    for name, value in bt.tensors.state_dict_to_numpy(back.state_dict()).items():
        np.testing.assert_array_equal(value, bt.tensors.to_numpy(source.state_dict()[name]))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_load_state_dict_strict_errors_name_every_problem(backends, framework):
    be = backends[framework]
    model = gpt(framework)
    state = be.tensors.state_dict_to_numpy(model.state_dict())
    del state["ln_f.bias"]
    state["head.weight"] = np.zeros((2, 2), np.float32)
    state["wpe.weight"] = np.zeros((3, 32), np.float32)
    with pytest.raises(RuntimeError) as err:
        model.load_state_dict(be.tensors.state_dict_from_numpy(state))
    message = str(err.value)
    assert "Missing key(s)" in message and '"ln_f.bias"' in message
    assert "Unexpected key(s)" in message and '"head.weight"' in message
    assert "size mismatch for wpe.weight" in message


def test_unsupported_feature_error_names_the_backend(bm):
    with pytest.raises(NotImplementedError, match="is not supported with the mindspore backend. Received: "):
        bm.nn.Module().register_buffer("mask", None)
    from mmrun.backend.torch import train_step
    with pytest.raises(NotImplementedError, match="is not supported with the pytorch backend. Received: jit=True"):
        train_step.TrainStep(None, None, jit=True)


def test_gpt_config_rejects_bad_shapes():
    module = side_by_side.load_module("mmrun.models.gpt", "pytorch")
    with pytest.raises(ValueError, match="not divisible by num_attention_heads"):
        module.GPTConfig(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        module.GPTConfig(seq_length=2048, max_position_embeddings=1024)
    assert module.GPTConfig(hidden_size=48, num_attention_heads=4).ffn_hidden_size == 192


@pytest.mark.parametrize("framework, other", [("torch", "mindspore"), ("mindspore", "torch")])
def test_backend_modules_import_without_the_other_framework(framework, other):
    code = (f"import sys\nfrom mmrun.backend.{framework} import nn, ops, optim, autograd, train_step, tensors\n"
            f"import mmrun.backend.checkpoint_io, mmrun.backend.lr_schedule\n"
            f"assert {other!r} not in sys.modules, sorted(m for m in sys.modules if m.startswith({other!r}))\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)


def test_side_by_side_load_binds_each_framework_once():
    torch_gpt = side_by_side.load_module("mmrun.models.gpt", "pytorch")
    assert side_by_side.load_module("mmrun.models.gpt", "torch") is torch_gpt
    assert side_by_side.load_module("mmrun.models.gpt", "mindspore") is not torch_gpt
    assert torch_gpt.nn.__name__ == "mmrun.backend.torch.nn"
    assert side_by_side.load_module("mmrun.models.gpt", "mindspore").ops.__name__ == "mmrun.backend.mindspore.ops"
    with pytest.raises(ValueError, match="unknown framework 'jax'; use one of: pytorch, mindspore"):
        side_by_side.load_module("mmrun.models.gpt", "jax")
    import mmrun.backend
    assert sys.modules["mmrun.backend"] is mmrun.backend  # the stand-in was only there while the file ran
