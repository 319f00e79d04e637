"""Regenerate the tables in docs/ that come from the code's own data (run after changing a table)."""
from __future__ import annotations

import re
from pathlib import Path

from mmrun.launchers.options import options_markdown

DOCS = Path(__file__).resolve().parents[1] / "docs"


def replace_block(path: Path, name: str, content: str) -> None:
    text = path.read_text()
    pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", flags=re.S)
    path.write_text(pattern.sub(lambda m: f"{m.group(1)}{content}\n{m.group(2)}", text))


if __name__ == "__main__":
    replace_block(DOCS / "launcher.md", "options-table", options_markdown())
    print("updated docs/launcher.md")
