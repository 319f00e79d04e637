"""scripts/pretrain_gpt_msrun.sh is `mmrun translate`'s output for scripts/pretrain_gpt.sh, and it trains under msrun.

The twin is generated, never edited by hand. After changing scripts/pretrain_gpt.sh (or a translation
rule), regenerate it from the repository root with

    mmrun translate scripts/pretrain_gpt.sh --to mindspore --device cpu -o scripts/pretrain_gpt_msrun.sh

and read the diff.
"""
from __future__ import annotations

import importlib.util

import math
import re
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_twin_trains_under_msrun(tmp_path: Path, tx) -> None:
    """2 MindSpore workers under real msrun, 4 iterations on the demo corpus (about 35 s on the 2-core CPU box)."""
    assert importlib.util.find_spec("mindspore"), "mindspore is missing: install the dev extra (pip install -e '.[dev]')"
    returncode, output = tx.run_msrun_script(TWIN, tmp_path, timeout=300, GPUS_PER_NODE="2", TRAIN_ITERS="4",
                                             LOG_INTERVAL="1", OUT_DIR=str(tmp_path / "out"),
                                             MASTER_PORT=str(tx.free_port()))
    rank0 = tmp_path / "msrun_log" / "worker_0.log"
    log = rank0.read_text(errors="replace") if rank0.exists() else ""
    assert returncode == 0, output[-3000:] + log[-3000:]
    assert "mindspore" in log and "world size 2" in log, log[-3000:]  # MindSpore really ran, data parallel over 2 workers
    losses = [float(x) for x in re.findall(r"iteration\s+\d+/\s*4 \|.*?\| lm loss: ([-+.\dEe]+)", log)]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    assert (tmp_path / "out" / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
