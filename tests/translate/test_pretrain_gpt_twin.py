"""scripts/pretrain_gpt_msrun.sh is `mmrun translate`'s output for scripts/pretrain_gpt.sh, and it trains under msrun.

The twin is generated, never edited by hand. After changing scripts/pretrain_gpt.sh (or a translation
rule), regenerate it from the repository root with

    mmrun translate scripts/pretrain_gpt.sh --to mindspore --device cpu -o scripts/pretrain_gpt_msrun.sh

and read the diff.
"""
from __future__ import annotations

import re
from pathlib import Path


from mmrun.launchers.launch_args import build_parser
from mmrun.launchers.options import OPTIONS
from mmrun.launchers.translate import Options, translate_script
from mmrun.launchers.translate.cli import main
from mmrun.launchers.translate.rules import MMRUN_OPTIONS, MMRUN_OWN_TO_MSRUN

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "pretrain_gpt.sh"
TWIN = REPO / "scripts" / "pretrain_gpt_msrun.sh"
TRANSLATE_ARGS = ["--to", "mindspore", "--device", "cpu"]  # the command in the docstring above


def test_twin_is_the_fresh_translation(tmp_path: Path) -> None:
    fresh = tmp_path / "pretrain_gpt_msrun.sh"
    assert main([str(SCRIPT), *TRANSLATE_ARGS, "-o", str(fresh)]) == 0
    assert fresh.read_bytes() == TWIN.read_bytes(), "scripts/pretrain_gpt_msrun.sh is stale: regenerate it (see this file's docstring)"
    text = TWIN.read_text(encoding="utf-8")
    launch = re.search(r"^msrun \$DISTRIBUTED_ARGS .*?--ai-framework mindspore$", text, flags=re.M | re.S)
    assert launch is not None and "$AI_FRAMEWORK" not in launch.group(0), "mmrun's own --ai-framework must leave the launcher position"
    assert "--local_worker_num $GPUS_PER_NODE" in text and "--worker_num $WORLD_SIZE" in text
    assert "export LOCAL_WORLD_SIZE=$GPUS_PER_NODE" in text and "mmrun preprocess-data" in text


def test_twin_translates_back_to_the_mmrun_script() -> None:
    back = translate_script(TWIN.read_bytes(), Options(target="torchrun", device="cpu"), str(TWIN))
    assert back.output == SCRIPT.read_bytes() and back.report.undo == "record"


def test_twin_passes_bash_n_and_shellcheck_adds_nothing(tx, shellcheck_available) -> None:
    assert tx.bash_n(TWIN.read_bytes()).returncode == 0
    new = tx.shellcheck_findings(TWIN.read_bytes()) - tx.shellcheck_findings(SCRIPT.read_bytes())
    assert not new, f"shellcheck findings the translation introduced: {dict(new)}"


def test_mmrun_own_options_match_the_launcher_parser() -> None:
    """The options `mmrun translate` knows as mmrun's own are exactly the ones `mmrun` parses as its own."""
    launcher_flags = {flag for option in OPTIONS for flag in option.flags}
    parsed = {tuple(a.option_strings): a.nargs != 0 for a in build_parser()._actions
              if a.option_strings and not set(a.option_strings) & launcher_flags and "--help" not in a.option_strings}
    assert parsed == {o.flags: o.takes_value for o in MMRUN_OPTIONS.values()}
    assert set(MMRUN_OWN_TO_MSRUN) == set(MMRUN_OPTIONS)


# That the twin trains under real msrun (2 workers, losses, the checkpoint) is docs/translate.md's example
# `twin-run`, checked line by line by tests/docs/test_docs_drift.py: one run, not two.
