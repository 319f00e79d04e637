"""The docs show what the code does now: every generated part of every page is regenerated and compared.

- tables rendered from the code's data, pages rendered whole (docs/features.md), files shown whole: always;
- every example block (`<!-- example: NAME -->`, commands in docs/examples/*.yaml), by running its
  commands for real; the examples that start torchrun/msrun or train are marked slow.

A failure names the page, the example and the command that regenerates it (scripts/update_docs.py).
"""
from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import docs_examples  # noqa: E402  (scripts/, put on the path above)
import docs_pages  # noqa: E402

EXAMPLES = docs_examples.load_examples()


def _diff(old: str, new: str, page: str) -> str:
    lines = difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"{page} (now)", f"{page} (regenerated)")
    return "".join(lines)[:6000]


def test_tables_generated_pages_and_shown_files_are_current():
    stale = []
    for page in docs_pages.pages():
        old = (REPO / page).read_text(encoding="utf-8")
        new = docs_pages.regenerate_static(page, old)
        if new != old:
            stale.append(f"{page}:\n{_diff(old, new, page)}")
    assert not stale, ("generated tables or shown files drifted; regenerate them with "
                       "`python scripts/update_docs.py --skip-slow`:\n" + "\n".join(stale))


def test_every_example_marker_has_its_commands_and_back():
    declared = {(e.page, e.name) for e in EXAMPLES}
    marked = {(page, name) for page in docs_pages.pages()
              for name in docs_pages.example_blocks((REPO / page).read_text(encoding="utf-8"))}
    assert not marked - declared, (f"example markers without commands in docs/examples/<page>.yaml: "
                                   f"{sorted(marked - declared)}")
    assert not declared - marked, (f"examples declared in docs/examples/ without a <!-- example: NAME --> marker "
                                   f"in their page: {sorted(declared - marked)}")


FAST = [e for e in EXAMPLES if not e.slow]
SLOW = [e for e in EXAMPLES if e.slow and not e.covered_by]


def test_an_example_left_to_a_test_names_a_test_that_exists():
    """`covered_by`: a slow example whose run a test already makes; that test must exist (file::name)."""
    for example in EXAMPLES:
        if example.covered_by:
            path, _, name = example.covered_by.partition("::")
            assert example.slow and name and f"def {name}(" in (REPO / path).read_text(encoding="utf-8"), example.key
# The slow examples mostly wait (MindSpore's start-up, a watchdog, a rank's death), so two at a time nearly
# halve the drift test on a 2-core machine (4 minutes at a load average of 6 to 10); their outputs do not
# depend on it. Under pytest-xdist (the README's `-n 2`) each slow example is a test of its own that any worker
# takes (its own xdist group), one at a time per worker: the workers are the parallelism.
SLOW_JOBS = 2
XDIST = "PYTEST_XDIST_WORKER" in os.environ


def _check(example: docs_examples.Example, produced: str | docs_examples.ExampleError) -> None:
    shown = docs_pages.example_blocks((REPO / example.page).read_text(encoding="utf-8")).get(example.name)
    assert shown is not None, f"{example.page} has no <!-- example: {example.name} --> marker"
    if isinstance(produced, docs_examples.ExampleError):
        pytest.fail(f"{produced}\nfix the example ({example.spec_file}) or the code, then run: {example.regenerate}")
    assert produced == shown, (f"{example.page}: example {example.name!r} drifted from what its commands print "
                               f"now; regenerate it with: {example.regenerate}\n"
                               f"{_diff(shown, produced, example.page)}")


def _produce(example: docs_examples.Example) -> str | docs_examples.ExampleError:
    try:
        return docs_examples.produce(example)
    except docs_examples.ExampleError as err:
        return err


@pytest.mark.parametrize("example", [pytest.param(e, id=e.key) for e in FAST])
def test_example_output_is_what_its_commands_print_now(example: docs_examples.Example):
    _check(example, _produce(example))


@pytest.fixture(scope="module")
def slow_outputs(request) -> dict | None:
    """The selected slow examples, run SLOW_JOBS at a time, once for all their tests (None under xdist, whose
    workers each hold every collected item, not only theirs: each test then runs its own example)."""
    if XDIST:
        return None
    wanted = [item.callspec.params["example"] for item in request.session.items
              if getattr(item, "originalname", None) == "test_slow_example_output_is_what_its_commands_print_now"]
    return docs_examples.produce_all(wanted, jobs=SLOW_JOBS)


@pytest.mark.slow
@pytest.mark.parametrize("example", [pytest.param(e, id=e.key, marks=pytest.mark.xdist_group(f"docs:{e.key}"))
                                     for e in SLOW])
def test_slow_example_output_is_what_its_commands_print_now(example: docs_examples.Example,
                                                            slow_outputs: dict | None):
    produced = _produce(example) if slow_outputs is None else slow_outputs[example.key]
    shown = docs_pages.example_blocks((REPO / example.page).read_text(encoding="utf-8")).get(example.name)
    if produced != shown:
        # Ranks of one job write at the same moment; on a loaded machine a launcher's log relay can
        # interleave them (seen under a load average of 6 to 10). Drift shows again on a second run,
        # an interleaving does not.
        produced = _produce(example)
    _check(example, produced)
