"""docs/analyse.md stays true: the rule table is the generated one, the example output is real."""
from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from mmrun.analyse.cli import main
from mmrun.analyse.docgen import DOC_PATH, is_current

REPO = Path(__file__).resolve().parents[2]


def test_rule_table_is_current():
    assert is_current(), "regenerate: python -m mmrun.analyse.docgen --write"


def test_example_output_is_what_the_command_prints():
    doc = DOC_PATH.read_text(encoding="utf-8")
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        for argv in (["tests/analyse/fixtures/fix_cuda_calls.in.py", "--target", "npu"],
                     ["tests/analyse/fixtures/fix_cuda_calls.in.py", "--target", "npu", "--fix"]):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert main(argv) == 1
            assert out.getvalue() in doc, f"docs example for {argv} is out of date"
    finally:
        os.chdir(cwd)
