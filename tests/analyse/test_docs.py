"""docs/analyse.md stays true: the tables are the generated ones, the example outputs are real."""
from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

from mmrun.analyse.cli import main
from mmrun.analyse.docgen import DOC_PATH, is_current

REPO = Path(__file__).resolve().parents[2]


def test_generated_tables_are_current():
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


def test_the_odd_input_example_is_real(tmp_path: Path):
    # The console block of "Big, deep and odd input": run its commands in an empty folder and
    # compare what `mmrun analyse .` prints, in the terminal's order, with the page.
    doc = DOC_PATH.read_text(encoding="utf-8")
    block = doc.split("## Big, deep and odd input", 1)[1].split("```console\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    commands = [line[2:] for line in lines if line.startswith("$ ")]
    assert commands[-2:] == ["mmrun analyse .", "echo $?"]
    for command in commands[:-2]:
        subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True, timeout=60,
                       env=dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                                 os.environ["PATH"]])))
    shown = lines[lines.index("$ mmrun analyse .") + 1:lines.index("$ echo $?")]
    proc = subprocess.run([sys.executable, "-m", "mmrun.analyse", "."], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    err = proc.stderr.splitlines()
    printed = err[:-1] + proc.stdout.splitlines() + err[-1:]
    timing = re.compile(r" in \d+\.\d s$")
    assert [timing.sub(" in X s", line) for line in printed] == [timing.sub(" in X s", line) for line in shown]
    assert str(proc.returncode) == lines[lines.index("$ echo $?") + 1]
