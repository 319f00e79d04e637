"""Regenerate the tables in docs/ that come from the code's own data (run after changing a table).

    python scripts/update_docs_tables.py

docs/features.md is generated whole from the feature table (features/*.yaml); the other pages get
a table between two markers.
"""
from __future__ import annotations

import re
from pathlib import Path

from mmrun.common.atomic_write import atomic_write
from mmrun.features.render import docs_page
from mmrun.launchers.options import options_markdown
from mmrun.training.arguments import ignored_and_refused_markdown

DOCS = Path(__file__).resolve().parents[1] / "docs"
# (file, start marker, end marker, what goes between them)
BLOCKS = [
    ("launcher.md", "<!-- options-table:start -->\n", "<!-- options-table:end -->", options_markdown),
    ("training.md", "<!-- BEGIN training/megatron_flags.yaml -->\n", "<!-- END training/megatron_flags.yaml -->",
     ignored_and_refused_markdown),
]
# (file, its whole text)
PAGES = [("features.md", docs_page)]


def replace_block(path: Path, start: str, end: str, content: str) -> None:
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(f"({re.escape(start)}).*?({re.escape(end)})", flags=re.S)
    atomic_write(path, pattern.sub(lambda m: f"{m.group(1)}{content}\n{m.group(2)}", text))


if __name__ == "__main__":
    for name, start, end, render in BLOCKS:
        replace_block(DOCS / name, start, end, render())
        print(f"updated docs/{name}")
    for name, render in PAGES:
        atomic_write(DOCS / name, render())
        print(f"updated docs/{name}")
