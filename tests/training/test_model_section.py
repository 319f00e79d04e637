"""The `model:` section of pretrain_transformers.py's YAML / model.json (issue 29, item 4): MindSpeed-MM's
model-file keys are accepted with one notice, typos of the keys mmrun reads get a did-you-mean, and the
transformers model still builds from such a section."""
from __future__ import annotations

import pytest

from mmrun.engines.base import ModelConfigError
from mmrun.engines.model_section import check_model_section, frozen_name_pieces

# examples/qwen2.5vl/model_3b.json's top level (sections abridged) and examples/qwen3vl/qwen3vl_full_sft_8B.yaml's
QWEN25_MODEL_JSON = {"model_id": "qwen2_5vl", "img_context_token_id": 151655, "vision_start_token_id": 151652,
                     "image_encoder": {"vision_encoder": {"num_layers": 32}}, "text_decoder": {"num_layers": 36},
                     "text_encoder": None, "video_encoder": None, "patch": {"bridge_patch": False}}
QWEN3_YAML = {"model_id": "qwen3_vl", "init_from_hf_path": "ckpt/hf", "attn_implementation": "flash_attention_2",
              "image_encoder": {}, "text_decoder": {}, "loss_cfg": {"compute_mode": "default"}, "patch": {}}


def test_mindspeed_mm_keys_are_accepted_with_one_notice():
    notice = check_model_section({**QWEN25_MODEL_JSON, "init_from_hf_path": "x"})
    assert notice.startswith("model: MindSpeed-MM key(s) img_context_token_id, vision_start_token_id, "
                             "image_encoder, text_decoder, text_encoder, video_encoder, patch ignored")
    assert "attn_implementation" in check_model_section(QWEN3_YAML)
    assert check_model_section({"init_from_hf_path": "x", "freeze": []}) is None


@pytest.mark.parametrize("key, hint", [("init_from_hf_pth", "'init_from_hf_pth' (did you mean init_from_hf_path?)"),
                                       ("torch_dtpye", "'torch_dtpye' (did you mean torch_dtype?)"),
                                       ("banana", "'banana'; mmrun reads")])
def test_typos_of_read_keys_still_stop_with_did_you_mean(key, hint):
    with pytest.raises(ModelConfigError) as error:
        check_model_section({**QWEN3_YAML, key: 1})
    assert f"model: unknown key(s) {hint}" in str(error.value)


def test_the_transformers_model_builds_from_a_mindspeed_mm_section():
    pytest.importorskip("transformers")
    from mmrun.engines.torch.transformers_models import build_model

    section = {**QWEN25_MODEL_JSON, "model_id": "tiny", "hf_config": {
        "model_type": "qwen2", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64}}
    model = build_model(section)
    assert type(model).__name__ == "Qwen2ForCausalLM"


def test_mindspeed_mms_freeze_switches_freeze_what_its_qwen3_vl_freezes():
    """examples/qwen3vl/qwen3vl_full_sft_8B.yaml freezes the vision encoder and the projector: the same parameters as
    MindSpeed-MM's Qwen3VL.freeze() (name contains visual.patch_embed / blocks / pos_embed / merger; the DeepStack
    mergers and the language model train). A switch for a model mmrun has no mapping for stops in one line."""
    pytest.importorskip("transformers")
    import yaml
    from pathlib import Path

    from mmrun.engines.torch.transformers_models import build_model
    from tests.models.tiny_qwen3_vl import IDS, TEXT, VISION

    real = Path(__file__).resolve().parents[1] / "fixtures" / "mindspeed_mm" / "qwen3vl" / "qwen3vl_full_sft_8B.yaml"
    section = yaml.safe_load(real.read_text())["model"]
    del section["init_from_hf_path"]
    section["hf_config"] = {"model_type": "qwen3_vl", "text_config": TEXT, "vision_config": VISION, **IDS}
    assert "but their freeze switches, applied as MindSpeed-MM's qwen3_vl applies them" in check_model_section(section)
    model = build_model(section)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert frozen and all(n.startswith("model.visual.") and "deepstack_merger_list" not in n for n in frozen)
    assert {n.split(".")[2] for n in frozen} == {"patch_embed", "blocks", "pos_embed", "merger"}
    assert all(not n.startswith("model.visual.") or "deepstack_merger_list" in n for n in trained)
    assert any("language_model" in n for n in trained) and any(n.startswith("lm_head") for n in trained)
    with pytest.raises(ModelConfigError, match=r"^model: image_encoder.vision_encoder.freeze is true for model_id "
                                               r"'qwen2_5vl'; mmrun knows MindSpeed-MM's freeze switches of qwen3_vl"):
        frozen_name_pieces({**QWEN25_MODEL_JSON, "image_encoder": {"vision_encoder": {"freeze": True}}})


def test_the_real_30b_yamls_loss_keys_pass_and_a_router_loss_stops():
    """qwen3vl_full_sft_30B.yaml (MoE): its freeze switches are the same mixin's as 8B's, router_aux_loss_coef 0.0
    adds nothing; a router loss mmrun does not add stops in one line (features/mindspeed_mm_keys.yaml)."""
    import yaml
    from pathlib import Path

    real = Path(__file__).resolve().parents[1] / "fixtures" / "mindspeed_mm" / "qwen3vl" / "qwen3vl_full_sft_30B.yaml"
    section = yaml.safe_load(real.read_text())["model"]
    assert "applied as MindSpeed-MM's qwen3_vl_moe applies them" in check_model_section(section)
    assert frozen_name_pieces(section) == ("visual.patch_embed", "visual.blocks", "visual.pos_embed", "visual.merger")
    section["loss_cfg"]["router_aux_loss_coef"] = 0.01
    with pytest.raises(ModelConfigError, match=r"^model.loss_cfg.router_aux_loss_coef: 0.01 is refused \(accepted: "
                                               r"0, 0.0\): a MoE router's auxiliary loss is not added"):
        check_model_section(section)
