"""The README's quick start stays true: CI runs its test command, its links and demo script exist."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _quick_start_commands() -> list[str]:
    return [line for line in re.findall(r"```bash\n(.*?)\n```", README, flags=re.S) if "pip install -e" in line]


def test_ci_runs_exactly_the_readme_test_command():
    demo, tests = _quick_start_commands()
    test_command = tests.split(". .venv/bin/activate && ", 1)[1]
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci_lines


def test_demo_command_names_an_existing_script():
    demo, _ = _quick_start_commands()
    script = re.search(r"bash (\S+)", demo).group(1)
    assert (ROOT / script).is_file()


def test_readme_links_exist():
    for link in re.findall(r"\]\(((?:docs)/[^)]+)\)", README):
        assert (ROOT / link).is_file(), link
