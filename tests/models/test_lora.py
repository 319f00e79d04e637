"""models/lora.py on the Wan DiT: MindSpeed-MM's target names mapped to diffusers', only the adapters train, the
adapter in PEFT's layout loads into diffusers' own WanTransformer3DModel with the real peft and computes the same
output, and merging (in the model, or into a diffusers directory) gives that output without adapters."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mmrun.models import lora
from mmrun.models.wan import WanTransformerConfig
from mmrun.models.wan.mindspeed_names import LORA_TARGETS
from mmrun.models.wan.transformer import WanTransformer3DModel

TINY = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
            text_dim=12, freq_dim=16, ffn_dim=24, num_layers=2, cross_attn_norm=True)
FINETUNE_LORA_SH = ["ffn.2", "ffn.0", "proj_q", "proj_k", "proj_v", "proj_out"]  # MindSpeed-MM's names


@pytest.fixture(scope="module")
def models():
    """(diffusers' model, mmrun's model with LoRA r 4 alpha 8, inputs): the same random weights, adapters whose
    B is random too (zero at init would hide a wrong layout)."""
    from mmrun import backend
    try:
        backend.select("pytorch", "tests/models/test_lora.py runs PyTorch in process")
    except backend.BackendError as error:
        pytest.skip(str(error))
    from diffusers import WanTransformer3DModel as Reference

    torch.manual_seed(0)
    reference = Reference(**TINY).eval()
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ours = WanTransformer3DModel(WanTransformerConfig(**TINY))
    ours.load_state_dict(reference.state_dict())
    adapted = lora.apply_lora(ours, lora.expand_targets(FINETUNE_LORA_SH, LORA_TARGETS), r=4, alpha=8.0)
    with torch.no_grad():
        for _, layer in lora.lora_modules(ours):
            layer.lora_B.weight.copy_(torch.randn_like(layer.lora_B.weight) * 0.1)
    g = torch.Generator().manual_seed(1)
    inputs = (torch.randn(1, 4, 3, 4, 6, generator=g), torch.tensor([700.0]), torch.randn(1, 5, 12, generator=g))
    return reference, ours, adapted, inputs


def test_mindspeed_names_map_to_every_attention_and_ffn_layer(models):
    _, ours, adapted, _ = models
    per_block = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k", "attn2.to_v",
                 "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2"]
    assert sorted(adapted) == sorted(f"blocks.{i}.{name}" for i in range(2) for name in per_block)
    trainable = {n for n, p in ours.named_parameters() if p.requires_grad}
    assert trainable == {f"{m}.lora_{ab}.weight" for m in adapted for ab in "AB"}
    # the base weights keep their names: a checkpoint of the base model still loads
    assert "blocks.0.attn1.to_q.weight" in ours.state_dict()


def test_only_adapters_get_gradients(models):
    _, ours, _, inputs = models
    ours.zero_grad()
    ours(*inputs).square().mean().backward()
    with_grad = {n for n, p in ours.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert with_grad and all(".lora_" in n for n in with_grad)
    assert all(p.grad is None for n, p in ours.named_parameters() if ".lora_" not in n)


def test_peft_loads_the_adapter_into_diffusers_model_and_merges_the_same(models, tmp_path):
    from peft import PeftModel

    reference, ours, _, inputs = models
    lora.save_adapter(ours, tmp_path / "adapter")
    peft_model = PeftModel.from_pretrained(reference, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        expected = ours(*inputs).numpy()
        got = peft_model(hidden_states=inputs[0], timestep=inputs[1], encoder_hidden_states=inputs[2],
                         return_dict=False)[0].numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    base = {k.replace("base_layer.", ""): v.numpy().copy() for k, v in peft_model.get_base_model().state_dict().items()
            if "lora_" not in k}
    merged = peft_model.merge_and_unload().state_dict()  # in place: `base` was read before
    config, adapter = lora.read_adapter(tmp_path / "adapter")
    ours_merged = lora.merged_weights(base, config, adapter)
    for name, value in merged.items():
        np.testing.assert_allclose(ours_merged[name], value.numpy(), rtol=0, atol=1e-6, err_msg=name)


def test_diffusers_wan_pipeline_loads_the_adapter_in_its_own_layout(models, tmp_path):
    """The adapter also in diffusers' own LoRA layout (pytorch_lora_weights.safetensors, keys `transformer.<module>
    .lora_A.weight`, the LoraConfig in its metadata), beside PEFT's: WanPipeline.load_lora_weights(directory) takes
    it and its transformer computes our output; the keys are those diffusers' own save_lora_weights writes."""
    import copy

    from diffusers import WanPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict
    from safetensors import safe_open

    from diffusers import WanTransformer3DModel as Reference

    _, ours, adapted, inputs = models
    reference = Reference(**TINY).eval()  # the base weights (the fixture's reference may hold a merged adapter)
    reference.load_state_dict({k: v for k, v in ours.state_dict().items() if ".lora_" not in k})
    lora.save_adapter(ours, tmp_path / "adapter", diffusers_component="transformer")
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "pytorch_lora_weights.safetensors"]
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, transformer=copy.deepcopy(reference),
                       scheduler=None)
    pipe.load_lora_weights(str(tmp_path / "adapter"))
    with torch.no_grad():
        expected = ours(*inputs).numpy()
        got = pipe.transformer(hidden_states=inputs[0], timestep=inputs[1], encoder_hidden_states=inputs[2],
                               return_dict=False)[0].numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)

    assert np.abs(got - reference(*inputs, return_dict=False)[0].detach().numpy()).max() > 0.1  # the adapter acts
    theirs = copy.deepcopy(reference)  # diffusers' own save of the same adapters
    theirs.add_adapter(LoraConfig(r=4, lora_alpha=8.0, target_modules=adapted))
    WanPipeline.save_lora_weights(tmp_path / "theirs", transformer_lora_layers=get_peft_model_state_dict(theirs))
    keys = {}
    for name in ("adapter", "theirs"):
        with safe_open(tmp_path / name / "pytorch_lora_weights.safetensors", "pt") as f:
            keys[name] = sorted(f.keys())
    assert keys["adapter"] == keys["theirs"] and keys["adapter"][0].startswith("transformer.blocks.0.")


def test_merge_in_the_model_keeps_the_output(models):
    reference, ours, _, inputs = models
    copy = WanTransformer3DModel(WanTransformerConfig(**TINY))
    copy.load_state_dict(reference.state_dict())
    lora.apply_lora(copy, lora.expand_targets(FINETUNE_LORA_SH, LORA_TARGETS), r=4, alpha=8.0)
    copy.load_state_dict(ours.state_dict())
    with torch.no_grad():
        before = copy(*inputs).numpy()
        assert lora.merge_lora(copy) == 20 and not lora.lora_modules(copy)
        after = copy(*inputs).numpy()
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-5)
    assert sorted(copy.state_dict()) == sorted(reference.state_dict())


def test_targets_that_match_nothing_are_one_line(models):
    reference, *_ = models
    fresh = WanTransformer3DModel(WanTransformerConfig(**TINY))
    with pytest.raises(lora.UsageError) as info:
        lora.apply_lora(fresh, lora.expand_targets(["q_proj,v_proj"], LORA_TARGETS), r=4, alpha=8.0)
    message = str(info.value)
    assert "\n" not in message and info.value.exit_code == 2
    assert "--lora-target-modules q_proj v_proj match no Linear layer" in message and "to_q" in message
