"""docs/features.md is generated from the feature table (features/*.yaml) and must be current."""
from __future__ import annotations

import re
from pathlib import Path

from mmrun import features as ft
from mmrun.features import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "features.md"
# The example blocks hold what `mmrun features` prints (tests/docs/test_docs_drift.py runs them); the rest of
# the page is rendered from the table.
EXAMPLE = re.compile(r"(<!-- example: [a-z0-9-]+ -->\n).*?(<!-- /example -->)", re.S)


def test_docs_features_md_is_current():
    assert DOC.exists(), f"{DOC} is missing; run: {render.REGENERATE}"
    assert EXAMPLE.sub(r"\1\2", DOC.read_text(encoding="utf-8")) == render.docs_page(), (
        f"{DOC} is stale: the feature table changed. Regenerate it with: {render.REGENERATE}")


def test_docs_name_the_regeneration_command_at_the_top():
    head = DOC.read_text(encoding="utf-8").splitlines()[:6]
    assert any(render.REGENERATE in line for line in head)


def test_docs_show_both_layers_and_every_source():
    text = DOC.read_text(encoding="utf-8")
    for layer in ft.LAYERS:
        assert f"## Matrix: {ft.table.LAYER_TITLES[layer]}" in text
    for key, source in ft.load_tables().sources.items():
        assert f'<a id="source-{key}"></a>`{key}`: {source.title}' in text
        assert (source.url or source.check) in text
