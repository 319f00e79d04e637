"""TorchFix-style fixtures: fixtures/MMxxx.py with the expected findings in MMxxx.txt (that rule
only), and fixtures/NAME.in.py rewritten by --fix into NAME.out.py."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mmrun.analyse.report import format_finding
from mmrun.analyse.rules import load_rules
from mmrun.analyse.runner import RunConfig, analyse_source, make_index

FIXTURES = Path(__file__).parent / "fixtures"
RULE_FIXTURES = sorted(FIXTURES.glob("MM*.py"))
FIX_FIXTURES = sorted(FIXTURES.glob("*.in.py"))


def test_every_rule_has_a_fixture():
    codes = {rule.code for rule in load_rules()}
    assert codes == {path.stem for path in RULE_FIXTURES}


@pytest.mark.parametrize("source", RULE_FIXTURES, ids=lambda p: p.stem)
def test_rule_fixture(source: Path):
    index = make_index(RunConfig(target="both", select=(source.stem,)))
    result = analyse_source(source.read_bytes(), source.name, index)
    assert result.skipped is None
    got = [format_finding(f) for f in result.findings]
    expected = source.with_suffix(".txt").read_text(encoding="utf-8").splitlines()
    assert got == expected
    assert got, "a rule fixture must show the rule firing"


@pytest.mark.parametrize("source", FIX_FIXTURES, ids=lambda p: p.name[: -len(".in.py")])
def test_fix_fixture(source: Path):
    index = make_index(RunConfig(target="both", fix=True))
    expected = source.with_name(source.name.replace(".in.py", ".out.py")).read_bytes()
    result = analyse_source(source.read_bytes(), source.name, index, fix=True)
    assert result.new_source == expected
    ast.parse(result.new_source)   # the rewrite is still valid Python
    assert result.changes and result.diff.startswith(f"--- a/{source.name}\n+++ b/{source.name}\n")
    # Idempotent: a second --fix over the output changes nothing.
    again = analyse_source(expected, source.name, index, fix=True)
    assert again.new_source is None and again.diff == "" and again.changes == []


def test_fix_changes_nothing_for_mindspore_target():
    # The rewrites are NPU migrations; they do not apply when only MindSpore is the target.
    index = make_index(RunConfig(target="mindspore", fix=True))
    source = (FIXTURES / "fix_cuda_calls.in.py").read_bytes()
    result = analyse_source(source, "x.py", index, fix=True)
    assert result.findings and result.new_source is None
    assert not any(f.fixable for f in result.findings)
