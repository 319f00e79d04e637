"""Fuzzing `mmrun analyse` and `--fix`: random and deep Python-ish input never crashes, hangs or writes.

Inputs: random bytes; fragments of Python around the analyser's trigger words; nesting thousands
deep (brackets, unary operators, lambdas, ternaries); call chains tens of thousands long; lines
up to 300 KB long; odd encodings (UTF-16 with BOM, a latin-1 or unknown coding cookie,
invalid UTF-8, NUL bytes, lone CR). Each example runs the command three ways in-process
(`PATH`, `PATH --fix`, `PATH -j 2 --format json`), each under a watchdog: exit status 0 or 1, no
exception, only the command's own one-line messages on stderr, the files byte-identical. Then
`--fix --write`: what it rewrites still parses, and a second `--fix` finds nothing left to change.
"""
from __future__ import annotations

import contextlib
import io
import json
import signal
from pathlib import Path

import libcst as cst
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmrun.analyse.cli import main

pytestmark = pytest.mark.slow
# Per command. Most runs take a second; the heaviest legitimate input here (3 files of 30000
# `x.cuda()` on one line: 90000 findings and fixes) about 15 s of CPU, more on a loaded machine.
SECONDS_PER_RUN = 120

FRAGMENTS = [
    "import torch\n", "import torch.distributed as dist\n", "from torch.cuda import amp\n", "torch.cuda.synchronize()",
    "x.cuda()", "'cuda'", "'cuda:0'", "\"nccl\"", "dist.init_process_group(backend='nccl')", "torch.nn.DataParallel(m)",
    "def f(x):\n", "    return x\n", "class A:\n", "    pass\n", "lambda: ", "if x:\n", "else:\n", "try:\n",
    "except ImportError:\n", "    import apex\n", "(", ")", "[", "]", "{", "}", ",", ".", " + ", "-", "not ", " if ",
    " else ", ":", " = ", "\n", "\\\n", "'''", '"', "#", "\t", "\x0c", "\r", "\r\n", "\x00", "\ufeff", "é", "中文",
    "f'{x}'", "f'{", "async ", "await ", ":=", "*", "**", "@", "yield ", "    ", "\udcff",
]
OPENERS = [("(", ")"), ("[", "]"), ("{", "}"), ("f(", ")"), ("-", ""), ("not ", ""), ("lambda: ", ""),
           ("1 if c else ", ""), ("x[", "]"), ("torch.cuda.f(", ")"), ("{'k': ", "}")]
LINKS = [".f()", "[0]", ".a", "(1)", " + 1", " or b", ".cuda()", "()"]

python_ish = st.lists(st.sampled_from(FRAGMENTS), max_size=120).map("".join)
deep = st.builds(lambda pair, n, inner: "import torch\nx = " + pair[0] * n + inner + pair[1] * n + "\n",
                 st.sampled_from(OPENERS), st.integers(0, 3000), python_ish)
chains = st.builds(lambda link, n: "import torch\nx = torch.cuda" + link * n + "\n",
                   st.sampled_from(LINKS), st.integers(0, 30000))
long_lines = st.builds(lambda atom, n: "import torch\ntorch.cuda.synchronize()\nx = " + atom * n + "1\n",
                       st.sampled_from(["'a' ", "1+", "a, ", "(", "x.cuda(), "]), st.integers(1000, 30000))
texts = st.one_of(python_ish, deep, chains, long_lines)


def _encode(text: str, how: str) -> bytes:
    raw = text.encode("utf-8", "surrogateescape")
    if how == "utf-16":
        return text.encode("utf-16", "surrogatepass")
    if how == "latin-1":
        return b"# -*- coding: latin-1 -*-\n" + text.encode("latin-1", "replace")
    if how == "unknown cookie":
        return b"# coding: no-such-codec\n" + raw
    if how == "invalid utf-8":
        return raw[: len(raw) // 2] + b"\xff\xfe\xc3" + raw[len(raw) // 2:]
    if how == "lone cr":
        return raw.replace(b"\n", b"\r")
    return raw


sources = st.one_of(
    st.binary(max_size=4000),
    st.builds(_encode, texts, st.sampled_from(["utf-8", "utf-8", "utf-8", "utf-16", "latin-1", "unknown cookie",
                                               "invalid utf-8", "lone cr"])),
)


class Hang(BaseException):
    """Raised by the watchdog; a BaseException, so that nothing in the command catches it."""


@contextlib.contextmanager
def watchdog(seconds: int):
    def expired(signum, frame):
        raise Hang(f"mmrun analyse ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with watchdog(SECONDS_PER_RUN), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


def _check_messages(err: str) -> None:
    for line in err.splitlines():
        assert (": skipped: " in line or ": not followed: " in line or ": not rewritten: " in line
                or line.startswith("mmrun analyse: ")), line
        assert "Traceback" not in line and "internal error" not in line, line


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(files=st.lists(sources, min_size=1, max_size=3))
def test_fuzz_analyse_and_fix(tmp_path_factory, files):
    folder = tmp_path_factory.mktemp("fuzz")
    for i, data in enumerate(files):
        (folder / f"f{i}.py").write_bytes(data)
    before = _snapshot(folder)
    for argv in ([str(folder)], [str(folder), "--fix"], [str(folder), "-j", "2", "--format", "json"]):
        status, out, err = _run(argv)
        assert status in (0, 1), (argv, err)
        _check_messages(err)
        assert _snapshot(folder) == before, argv
        if "--format" in argv:
            report = json.loads(out)
            assert report["files"] == len(files)
            assert {s["path"] for s in report["skipped"]} <= {str(folder / name) for name in before}

    status, out, err = _run([str(folder), "--fix", "--write", "--output", str(folder.with_name(folder.name + "-out"))])
    assert status in (0, 1), err
    _check_messages(err)
    for name, data in _snapshot(folder).items():
        if data != before[name]:
            cst.parse_module(data)   # a rewrite is still source LibCST parses
    status, out, err = _run([str(folder), "--fix"])
    assert out == "", "a second --fix still changes something"
