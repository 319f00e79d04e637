"""docs/analyse.md stays true: the tables are the generated ones.

Its example outputs are run and compared by tests/docs/test_docs_drift.py (commands in
docs/examples/analyse.yaml).
"""
from __future__ import annotations

from mmrun.analyse.docgen import is_current


def test_generated_tables_are_current():
    assert is_current(), "regenerate: python -m mmrun.analyse.docgen --write (or python scripts/update_docs.py)"
