"""docs/training.md embeds the table of megatron_flags.yaml; it must be current."""
from __future__ import annotations

from pathlib import Path

from mmrun.training.arguments import ignored_and_refused_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "training.md"
BEGIN, END = "<!-- BEGIN training/megatron_flags.yaml -->\n", "<!-- END training/megatron_flags.yaml -->"


def test_ignored_and_refused_flags_table_is_current():
    text = DOC.read_text(encoding="utf-8")
    embedded = text[text.index(BEGIN) + len(BEGIN): text.index(END)].strip()
    assert embedded == ignored_and_refused_markdown(), (
        "docs/training.md's flag table is stale: run python scripts/update_docs.py --only training --skip-slow")


def test_docs_show_the_loss_curve_that_exists():
    assert "![loss curves](loss_curve.png)" in DOC.read_text(encoding="utf-8")
    assert (DOC.parent / "loss_curve.png").stat().st_size > 10_000
