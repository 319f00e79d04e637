"""What is generated in the docs pages, and how a page's marked parts are found and replaced.

Three kinds of generated part:
- tables rendered from the code's own data, between a start and an end marker (GENERATED_BLOCKS);
- pages rendered whole from data (docs/features.md), whose example blocks are kept or refilled;
- marked blocks: `<!-- example: NAME -->` (the output of commands, docs_examples.py) and
  `<!-- file: PATH -->` (a file of the repository shown whole, e.g. the script an example runs).
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_RE = re.compile(r"<!-- example: (?P<name>[a-z0-9][a-z0-9-]*) -->\n(?P<body>.*?)<!-- /example -->", re.S)
FILE_RE = re.compile(r"<!-- file: (?P<path>\S+) -->\n(?P<body>.*?)<!-- /file -->", re.S)
FENCE_LANGUAGES = {".py": "python", ".sh": "bash", ".yaml": "yaml", ".json": "json", ".jsonl": "json"}


@dataclasses.dataclass(frozen=True)
class Generated:
    """One generated part of a page: `apply(text)` gives the page with that part regenerated."""
    page: str                       # relative to the repository root
    what: str                       # for messages: which part, and where its data lives
    apply: Callable[[str], str]


def _between(start: str, end: str, render: Callable[[], str]) -> Callable[[str], str]:
    pattern = re.compile(f"({re.escape(start)}).*?({re.escape(end)})", flags=re.S)

    def apply(text: str) -> str:
        if not pattern.search(text):
            raise ValueError(f"the page lacks the markers {start.strip()!r} ... {end!r}")
        content = render()
        return pattern.sub(lambda m: f"{m.group(1)}{content}\n{m.group(2)}", text, count=1)
    return apply


def _options_table() -> str:
    from mmrun.launchers.options import options_markdown
    return options_markdown()


def _megatron_flags_table() -> str:
    from mmrun.training.arguments import ignored_and_refused_markdown
    return ignored_and_refused_markdown()


def dist_backends_table() -> str:
    from mmrun.backend.checks import WORKING_DIST_BACKENDS
    rows = ["| framework | device | working backends |", "|---|---|---|"]
    rows += [f"| {framework} | {device} | {', '.join(working)} |"
             for framework, devices in WORKING_DIST_BACKENDS.items() for device, working in devices.items()]
    return "\n".join(rows)


def _mindspeed_keys_table() -> str:
    from mmrun.features.mindspeed_keys import markdown_tables
    return markdown_tables()


def _analyse_tables(text: str) -> str:
    from mmrun.analyse.docgen import render_page
    return render_page(text)


def _features_page(text: str) -> str:
    # The page is rendered whole from features/*.yaml; its example blocks come from running commands,
    # so the ones the page already holds are carried over (refilled separately).
    from mmrun.features.render import docs_page
    return splice_examples(docs_page(), example_blocks(text))


GENERATED: list[Generated] = [
    Generated("docs/launcher.md", "option table (launchers/options.py)",
              _between("<!-- options-table:start -->\n", "<!-- options-table:end -->", _options_table)),
    Generated("docs/training.md", "Megatron flag table (training/megatron_flags.yaml)",
              _between("<!-- BEGIN training/megatron_flags.yaml -->\n", "<!-- END training/megatron_flags.yaml -->",
                       _megatron_flags_table)),
    Generated("docs/backend.md", "distributed backend table (backend/checks.py)",
              _between("<!-- dist-backends:start -->\n", "<!-- dist-backends:end -->", dist_backends_table)),
    Generated("docs/analyse.md", "rule and limit tables (analyse/rules.yaml, analyse/limits.py)", _analyse_tables),
    Generated("docs/features.md", "the whole page (features/*.yaml)", _features_page),
    Generated("docs/mindspeed-mm-keys.md", "key table (features/mindspeed_mm_keys.yaml)",
              _between("<!-- keys-table:start -->\n", "<!-- keys-table:end -->", _mindspeed_keys_table)),
]


def example_blocks(text: str) -> dict[str, str]:
    """NAME -> the text between `<!-- example: NAME -->` and `<!-- /example -->`."""
    blocks: dict[str, str] = {}
    for match in EXAMPLE_RE.finditer(text):
        if match["name"] in blocks:
            raise ValueError(f"the example marker {match['name']!r} appears twice")
        blocks[match["name"]] = match["body"]
    return blocks


def splice_examples(text: str, bodies: dict[str, str]) -> str:
    """`text` with the body of each example named in `bodies` replaced; markers not named are left alone."""
    def sub(match: re.Match) -> str:
        body = bodies.get(match["name"], match["body"])
        return f"<!-- example: {match['name']} -->\n{body}<!-- /example -->"
    return EXAMPLE_RE.sub(sub, text)


def file_block(path: str) -> str:
    source = REPO / path
    if not source.is_file():
        raise ValueError(f"<!-- file: {path} --> names no file of the repository")
    content = source.read_text(encoding="utf-8")
    return f"```{FENCE_LANGUAGES.get(source.suffix, 'text')}\n{content.rstrip(chr(10))}\n```\n"


def splice_files(text: str) -> str:
    """Every `<!-- file: PATH -->` block holds the file as it is now."""
    return FILE_RE.sub(lambda m: f"<!-- file: {m['path']} -->\n{file_block(m['path'])}<!-- /file -->", text)


def regenerate_static(page: str, text: str) -> str:
    """The page with every generated part that needs no command run regenerated: tables, whole pages, files."""
    for part in GENERATED:
        if part.page == page:
            text = part.apply(text)
    return splice_files(text)


def pages() -> list[str]:
    """Every page that may hold generated parts: README.md and docs/*.md."""
    return ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
