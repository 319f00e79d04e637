"""mmrun's UMT5 text encoder against transformers' UMT5EncoderModel (tiny random config, every weight perturbed):
last_hidden_state with a padding mask within 1e-5 in fp32, the relative position buckets, encode_prompts against
diffusers' WanPipeline procedure (tokenizer padding to max_length, embeddings past each prompt zeroed), MindSpore
equal to PyTorch, from_pretrained of a save_pretrained directory and one-line errors."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from mmrun.backend.errors import UsageError


@pytest.fixture(scope="module")
def torch_umt5(wan_refs):
    from mmrun import backend
    try:
        backend.select("pytorch", "tests/models: the in-process side of the comparisons runs PyTorch")
    except backend.BackendError as error:
        pytest.skip(str(error))
    from mmrun.models.wan.text_encoder import UMT5EncoderModel
    return UMT5EncoderModel.from_pretrained(wan_refs["umt5_dir"])


def test_parameter_names_are_transformers_keys(wan_refs, torch_umt5):
    theirs = {k: tuple(v.shape) for k, v in wan_refs["umt5"].state_dict().items() if k != "encoder.embed_tokens.weight"}
    assert {k: tuple(v.shape) for k, v in torch_umt5.state_dict().items()} == theirs


def test_relative_position_buckets_equal_transformers(wan_refs):
    import torch
    from mmrun.models.wan.text_encoder import relative_position_buckets
    attention = wan_refs["umt5"].encoder.block[0].layer[0].SelfAttention
    for buckets, distance in ((32, 128), (8, 20), (64, 256)):  # Wan's UMT5 uses (32, 128)
        attention.relative_attention_num_buckets, attention.relative_attention_max_distance = buckets, distance
        relative = torch.arange(600)[None, :] - torch.arange(600)[:, None]
        expected = attention._relative_position_bucket(relative).numpy()
        np.testing.assert_array_equal(relative_position_buckets(600, 600, buckets, distance), expected)
    attention.relative_attention_num_buckets, attention.relative_attention_max_distance = 8, 20


def test_hidden_states_equal_transformers_with_mask(wan_tiny, wan_refs, torch_umt5):
    import torch
    cases = wan_tiny.umt5_cases(wan_refs["umt5_dir"], wan_refs["tokenizer_dir"])
    ids, mask = torch.from_numpy(cases["umt5/input_ids"]), torch.from_numpy(cases["umt5/attention_mask"])
    with torch.no_grad():
        expected = wan_refs["umt5"](input_ids=ids, attention_mask=mask).last_hidden_state
        ours = torch_umt5(ids, mask)
        np.testing.assert_allclose(ours.numpy(), expected.numpy(), rtol=0, atol=1e-5)
        # The mask is respected: changing a padded token changes nothing at the real positions of that row.
        changed = ids.clone()
        changed[1, 10:] = (changed[1, 10:] + 1) % wan_tiny.UMT5_CONFIG["vocab_size"]
        again = torch_umt5(changed, mask)
        np.testing.assert_allclose(again[1, :9].numpy(), ours[1, :9].numpy(), rtol=0, atol=1e-6)
        assert not np.allclose(torch_umt5(changed, torch.ones_like(mask))[1, :9].numpy(), ours[1, :9].numpy())


def test_encode_prompts_equal_wan_pipeline(wan_tiny, wan_refs, torch_umt5):
    """diffusers' WanPipeline._get_t5_prompt_embeds, step for step with transformers' tokenizer and encoder."""
    import torch
    from transformers import AutoTokenizer
    from mmrun.data.tokenizers import HuggingFaceTokenizer
    from mmrun.models.wan.text_encoder import encode_prompts
    reference_tokenizer = AutoTokenizer.from_pretrained(wan_refs["tokenizer_dir"])
    inputs = reference_tokenizer(wan_tiny.PROMPTS, padding="max_length", max_length=wan_tiny.MAX_LENGTH,
                                 truncation=True, add_special_tokens=True, return_attention_mask=True,
                                 return_tensors="pt")
    lengths = inputs.attention_mask.gt(0).sum(dim=1).long()
    with torch.no_grad():
        hidden = wan_refs["umt5"](inputs.input_ids, inputs.attention_mask).last_hidden_state
    expected = torch.stack([torch.cat([u[:v], u.new_zeros(wan_tiny.MAX_LENGTH - v, u.size(1))])
                            for u, v in zip(hidden, lengths)])
    embeddings, mask = encode_prompts(torch_umt5, HuggingFaceTokenizer(str(wan_refs["tokenizer_dir"])),
                                      wan_tiny.PROMPTS, wan_tiny.MAX_LENGTH)
    np.testing.assert_array_equal(mask, inputs.attention_mask.numpy())
    assert mask[2].all() and lengths.tolist()[:2] == [6, 9]  # the long prompt was truncated, </s> kept last
    assert int(inputs.input_ids[2, -1]) == 1
    np.testing.assert_allclose(embeddings.numpy(), expected.numpy(), rtol=0, atol=1e-5)
    assert not embeddings[0, 6:].any()


@pytest.mark.slow
@pytest.mark.parametrize("key", ["hidden", "prompt_embeds", "prompt_mask"])
def test_mindspore_equals_pytorch(wan_frameworks, key):
    cases, torch_out, ms_out = wan_frameworks
    np.testing.assert_allclose(ms_out[f"umt5/{key}"], torch_out[f"umt5/{key}"], rtol=0, atol=1e-5)


def test_from_pretrained_errors_are_one_line(wan_refs, tmp_path):
    from mmrun.models.wan.text_encoder import UMT5EncoderModel
    broken = {"not a directory": tmp_path / "absent", "has model_type None, not 'umt5'": wan_refs["vae_dir"]}
    no_weights = shutil.copytree(wan_refs["umt5_dir"], tmp_path / "no_weights")
    (no_weights / "model.safetensors").unlink()
    broken["has no model.safetensors or diffusion_pytorch_model.safetensors"] = no_weights
    other = shutil.copytree(wan_refs["umt5_dir"], tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "num_layers": 3}))
    broken["does not hold the tensors of its config.json (missing 10: encoder.block.2."] = other
    relu = shutil.copytree(wan_refs["umt5_dir"], tmp_path / "relu")
    (relu / "config.json").write_text(json.dumps({**config, "feed_forward_proj": "relu"}))
    broken["feed_forward_proj='relu' is not supported"] = relu
    for expected, path in broken.items():
        with pytest.raises(UsageError) as error:
            UMT5EncoderModel.from_pretrained(path)
        assert expected in str(error.value) and "\n" not in str(error.value)
