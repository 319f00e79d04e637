"""docs/features.md is generated from backend/features.yaml and must be current."""
from __future__ import annotations

from pathlib import Path

from mmrun.launchers import features_cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "features.md"


def test_docs_features_md_is_current():
    expected = features_cli.render_markdown()
    assert DOC.exists(), f"{DOC} is missing; run: {features_cli.REGENERATE}"
    assert DOC.read_text(encoding="utf-8") == expected, (
        f"{DOC} is stale: the feature table changed. Regenerate it with: {features_cli.REGENERATE}")


def test_docs_name_the_regeneration_command_at_the_top():
    head = DOC.read_text(encoding="utf-8").splitlines()[:6]
    assert any(features_cli.REGENERATE in line for line in head)
