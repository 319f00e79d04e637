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
