"""The example machinery itself (scripts/docs_examples.py): spec checks, normalisation, a real run."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import docs_examples  # noqa: E402  (scripts/, put on the path above)
import docs_pages  # noqa: E402
from mmrun.common.yaml_tables import TableError  # noqa: E402


def _spec(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _load(path: Path) -> list[docs_examples.Example]:
    return docs_examples.load_spec(path, docs_examples.load_rules())


def test_a_spec_with_an_unknown_key_names_the_file_and_the_example(tmp_path):
    path = _spec(tmp_path, f"page: {REPO}/docs/launcher.md\nexamples:\n  x:\n    steps: [echo hi]\n    shell: zsh\n")
    with pytest.raises(TableError, match=r"page\.yaml: example x: unknown key\(s\) 'shell'"):
        _load(path)


def test_an_unknown_rule_name_is_refused_with_the_known_ones(tmp_path):
    path = _spec(tmp_path, f"page: {REPO}/docs/launcher.md\nexamples:\n  x:\n    steps: [echo hi]\n"
                           "    normalise: [no-such-rule]\n")
    with pytest.raises(TableError, match=r"no normalisation rule named 'no-such-rule'.*known: .*seconds"):
        _load(path)


def test_drop_collapses_a_stretch_with_its_blank_lines_into_one_note():
    rule = docs_examples.Rule("drop", re.compile(r"^noise"), note="[...]")
    text = "start\nnoise 1\n\nnoise 2\n\nkept\n\nend"
    assert rule.apply(text) == "start\n[...]\nkept\n\nend"


def test_sort_orders_only_the_matching_lines_in_their_places():
    rule = docs_examples.Rule("sort", re.compile(r"^rank \d"))
    assert rule.apply("head\nrank 1: b\nmiddle\nrank 0: a\ntail") == "head\nrank 0: a\nmiddle\nrank 1: b\ntail"


def test_a_real_session_keeps_state_between_steps_and_reports_exit_codes():
    example = docs_examples.Example(
        page="docs/development.md", name="t", steps=(
            docs_examples.Step(run="cd sub && X=5"),
            docs_examples.Step(run="echo \"x=$X in $(basename $PWD)\"; printf 'no newline'"),
            docs_examples.Step(run="python -c 'import sys; print(\"out\"); print(\"err\", file=sys.stderr); sys.exit(3)'",
                               exit=3),
            docs_examples.Step(run="echo $PWD", note="the folder"),
        ),
        files=(("sub/keep.txt", "README.md"),),
    )
    block = docs_examples.produce(example)
    assert block == ("```console\n$ cd sub && X=5\n$ echo \"x=$X in $(basename $PWD)\"; printf 'no newline'\n"
                     "x=5 in sub\nno newline\n"
                     "$ python -c 'import sys; print(\"out\"); print(\"err\", file=sys.stderr); sys.exit(3)'\n"
                     "out\nerr\n(exit 3)\n$ echo $PWD   # the folder\n<tmp>/sub\n```\n")


def test_an_unexpected_exit_status_fails_with_the_step_and_its_output():
    example = docs_examples.Example(page="docs/development.md", name="t",
                                    steps=(docs_examples.Step(run="echo broken; (exit 4)"),))
    with pytest.raises(docs_examples.ExampleError, match=r"step 1 `echo broken; \(exit 4\)` exited 4, expected 0"):
        docs_examples.produce(example)


def test_a_session_over_its_timeout_is_stopped():
    example = docs_examples.Example(page="docs/development.md", name="t", timeout=1,
                                    steps=(docs_examples.Step(run="sleep 30"),))
    with pytest.raises(docs_examples.ExampleError, match="ran over its 1 s timeout"):
        docs_examples.produce(example)


def test_splicing_replaces_only_the_named_example():
    page = "a\n<!-- example: one -->\nold 1\n<!-- /example -->\nb\n<!-- example: two -->\nold 2\n<!-- /example -->\n"
    assert docs_pages.splice_examples(page, {"two": "new 2\n"}) == page.replace("old 2", "new 2")


def test_steps_must_be_a_list_and_exit_a_number(tmp_path):
    base = f"page: {REPO}/docs/launcher.md\nexamples:\n  x:\n"
    with pytest.raises(TableError, match="steps is a list of commands"):
        _load(_spec(tmp_path, base + "    steps: echo hi\n"))
    with pytest.raises(TableError, match="exit is the step's expected exit status"):
        _load(_spec(tmp_path, base + "    steps: [{run: echo hi, exit: two}]\n"))


def test_an_example_imports_the_checkout_whose_pages_it_writes():
    # A git worktree is imported through PYTHONPATH (the installed mmrun may be another checkout): the examples'
    # fixed environment passes it on, and the generator refuses to run the code of another checkout.
    docs_examples.check_imports_this_checkout()
    example = docs_examples.Example(page="docs/development.md", name="t", steps=(
        docs_examples.Step(run="python -c 'import mmrun, pathlib; print(pathlib.Path(mmrun.__file__).parent)'"),))
    assert docs_examples.produce(example) == ("```console\n$ python -c 'import mmrun, pathlib; "
                                              "print(pathlib.Path(mmrun.__file__).parent)'\n<repo>\n```\n")
