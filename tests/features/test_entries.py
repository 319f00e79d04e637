"""Which layers judge a launch line: the stack always, mmrun's trainer only when the line starts it."""
from __future__ import annotations

import pytest

from mmrun import features as ft


@pytest.mark.parametrize("script, trainer", [
    ("models/pretrain_gpt.py", True),
    ("$ROOT/models/pretrain_gpt.py", True),
    ("/opt/mmrun/models//pretrain_gpt.py", True),
    ('"models/pretrain_gpt.py"', True),
    ("mmrun.models.pretrain_gpt", True),
    ("pretrain_gpt.py", False),  # Megatron-LM's and MindSpeed-LLM's own entry
    ("pretrain_vlm.py", False),  # MindSpeed-MM's
    ("posttrain_gpt.py", False),
    ("mymodels/pretrain_gpt.py", False),
    ("models/pretrain_gpt.py.bak", False),
    ("", False),
])
def test_mmruns_trainer_is_recognised_by_its_path_or_module(script, trainer):
    assert ft.is_mmrun_trainer(script) is trainer
    assert ft.layers_for_scripts([script]) == (("stack", "trainer") if trainer else ("stack",))


def test_any_alternative_that_starts_the_trainer_adds_its_layer():
    assert ft.layers_for_scripts(["pretrain_gpt.py", "models/pretrain_gpt.py"]) == ("stack", "trainer")
    assert ft.layers_for_scripts([]) == ("stack",)


@pytest.mark.parametrize("script, features", [
    ("models/pretrain_vlm.py", ("lora", "expert-parallel", "moe-allgather-dispatcher")),
    ("mmrun.models.pretrain_sora", ("lora", "attention-mask-type")),
    ("models/pretrain_gpt.py", ()),
    ("pretrain_vlm.py", ()),  # MindSpeed-MM's own entry: the stack alone judges it
])
def test_an_entrys_own_features_are_not_asked_of_the_trainer_layer(script, features):
    assert ft.entry_features([script]) == features
    decisions = ft.check_flags(["--lora-target-modules", "linear_qkv"], "mindspore", "cpu",
                               layers=ft.layers_for_scripts([script]), entry_features=ft.entry_features([script]))
    trainer = [d for d in decisions if d.layer == "trainer"]
    assert (trainer == []) if "lora" in features or not ft.is_mmrun_trainer(script) else trainer[0].status == "unsupported"


def test_alternatives_keep_only_the_features_every_entry_implements():
    assert ft.entry_features(["models/pretrain_vlm.py", "models/pretrain_sora.py"]) == ("lora",)
    assert ft.entry_features(["models/pretrain_vlm.py", "models/pretrain_gpt.py"]) == ()


def test_the_entries_own_lists_are_the_tables():
    from mmrun.models import pretrain_sora, pretrain_vlm

    assert set(pretrain_vlm.LORA_FEATURES) | set(pretrain_vlm.MOE_FEATURES) == set(pretrain_vlm.ENTRY_FEATURES)
    assert pretrain_sora.ENTRY_FEATURES == ft.entry_features(["models/pretrain_sora.py"])
