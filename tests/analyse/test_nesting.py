"""The nesting check: what it refuses (what CPython refuses too), what it lets through, its fast path."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mmrun.analyse.limits import CPYTHON_MAX_BRACKETS, Limits
from mmrun.analyse.nesting import _token_depth, _upper_bound, nesting_too_deep

REPO = Path(__file__).resolve().parents[2]
LIMITS = Limits()


def _deep(text: str, limits: Limits = LIMITS) -> str | None:
    return nesting_too_deep(text.encode(), limits)


@pytest.mark.parametrize("n", [CPYTHON_MAX_BRACKETS, CPYTHON_MAX_BRACKETS + 1])
def test_the_bracket_limit_is_cpythons(n):
    text = "x = " + "(" * n + "1" + ")" * n + "\n"
    try:
        compile(text, "x.py", "exec")
        cpython_accepts = True
    except SyntaxError as exc:
        assert "too many nested parentheses" in str(exc)
        cpython_accepts = False
    assert (_deep(text) is None) == cpython_accepts
    if not cpython_accepts:
        assert _deep(text) == "brackets nested more than 200 deep at line 1 (more than CPython accepts)"


@pytest.mark.parametrize("text, depth", [
    ("x = a.f().g()\n", 5),                     # attribute, call, attribute, call, its arguments
    ("x = 1 + 1 + 1\n", 2),
    ("x = a * b + c * d\n", 2),                 # the + starts a new term: not 3
    ("x = -(-(x))\n", 4),
    ("x = not not x\n", 2),
    ("x = lambda: lambda: 1\n", 2),
    ("x = a < b < c < d\n", 1),                 # one flat Comparison node in LibCST
    ("x = f(a, b, c)\n", 2),                    # the commas end each argument's expression
    ("x = {'k': [1, 2], 'l': (3,)}\n", 2),
])
def test_the_estimate_on_small_expressions(text, depth):
    assert _token_depth(text.encode(), Limits(max_depth=depth)) is None
    assert _token_depth(text.encode(), Limits(max_depth=depth - 1)) is not None


@pytest.mark.parametrize("text", [
    "x = torch.cuda" + ".f()" * 20000,
    "x = 1" + " + 1" * 20000,
    "x = " + "-" * 5000 + "1",
    "x = " + "lambda: " * 3000 + "1",
    "x = " + "1 if c else " * 3000 + "1",
    "x = a" + "[0]" * 3000,
])
def test_long_chains_are_refused_naming_the_line(text):
    assert _deep("import torch\n\n" + text + "\n") == (
        "an expression nested more than 1000 levels deep at line 3 (chained calls, operators, brackets)")


@pytest.mark.parametrize("text", [
    'x = "' + "(" * 5000 + '"\n',                                 # brackets in a string
    "# " + "(" * 5000 + "\n",                                     # in a comment
    '"""\n' + "((((\n" * 2000 + '"""\n',                          # in a docstring
    "x = (1)\n" * 5000,                                           # each line starts again
    "x = {" + ", ".join(f"'k{i}': [{i}, -{i}]" for i in range(20000)) + "}\n",   # a long flat table
    "x = " + " + ".join(["3*a**2*b"] * 900) + "\n",              # a long generated polynomial
    "x = 1" + " < 1" * 20000 + "\n",
])
def test_long_but_shallow_code_passes(text):
    assert _deep(text) is None


def test_what_the_tokenizer_cannot_read_is_left_to_libcst():
    # Unbalanced or undecodable input: the depth measured before the error stands.
    assert _deep("x = (" * 10 + "\n") is None
    assert _deep("x = " + "(" * 300 + "\n\xff" * 300) is not None
    assert nesting_too_deep(b"x = 1 +\xff\xfe" * 500, LIMITS) is None


def _python_sources() -> list[Path]:
    roots = [REPO] + [Path(p) / name for p in sys.path for name in ("megatron", "libcst")
                      if (Path(p) / name / "__init__.py").is_file()]
    files = []
    for root in roots:
        files += [p for p in root.rglob("*.py") if ".venv" not in p.relative_to(root).parts]
    return files


def test_real_code_is_never_refused_and_the_fast_path_is_an_upper_bound():
    files = _python_sources()
    assert len(files) > 300
    for path in files:
        data = path.read_bytes()
        assert nesting_too_deep(data, LIMITS) is None, path
        bound = _upper_bound(data)
        if bound is None:
            continue
        # Whenever the fast path clears a file for a limit, the tokens agree.
        for limit in (5, 10, 20, 40):
            if bound <= limit:
                assert _token_depth(data, Limits(max_depth=limit, max_brackets=limit)) is None, (path, limit)
