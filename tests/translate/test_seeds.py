"""The users' scripts: seed 001's three torchrun scripts and seed 003's example become seed 003's msrun form."""
from __future__ import annotations

import re

import pytest

from mmrun.launchers.translate import Options, translate_script

SEED001 = ("seed001_pretrain_single", "seed001_pretrain_distributed", "seed001_pretrain_single_load")


def test_fixtures_are_the_seed_scripts(tx) -> None:
    """The fixtures are the seeds' own text, byte for byte (so the tests below test the users' scripts)."""
    for name, text in tx.seed001_scripts().items():
        assert (tx.FIXTURES / f"{name}.sh").read_text(encoding="utf-8") == text
    before, _ = tx.seed003_forms()
    assert (tx.FIXTURES / "seed003_example.sh").read_text(encoding="utf-8") == before


def test_seed003_example_becomes_the_documented_form(tx) -> None:
    """Output == seed 003's "after" form, except for three documented choices (docs/translate.md)."""
    before, after = tx.seed003_forms()
    result = translate_script(before.encode(), Options(), "seed003.sh")
    expected = (
        after
        # 1. The guide rewrites its own comment; mmrun translate never touches comments.
        .replace("# MindSpore后端启动脚本", "# PyTorch后端启动脚本")
        # 2. LOCAL_WORLD_SIZE stays the variable it equals, not a number frozen at translation time.
        .replace("export LOCAL_WORLD_SIZE=8", "export LOCAL_WORLD_SIZE=$NPUS_PER_NODE")
        # 3. --join True: torchrun waits for its workers, msrun only with --join True (else `| tee` gets nothing).
        .replace("    --log_dir msrun_log \\\n", "    --log_dir msrun_log \\\n    --join True \\\n")
    )
    assert tx.without_marker(result.output.decode()) == expected
    assert result.output.decode().splitlines()[1].startswith("# mmrun translate: torchrun -> msrun")


@pytest.mark.parametrize("name", SEED001)
def test_seed001_distributed_args_take_the_documented_form(name: str, tx) -> None:
    source = (tx.FIXTURES / f"{name}.sh").read_bytes()
    output = translate_script(source, Options(), f"{name}.sh").output.decode()
    documented = re.search(r'DISTRIBUTED_ARGS="\n(.*?)"', tx.seed003_forms()[1], re.S).group(1)
    ours = re.search(r'DISTRIBUTED_ARGS="\n(.*?)"', output, re.S).group(1)
    # Seed 001 writes a continuation after the last option too; seed 003 does not. The options are the same.
    words = lambda text: text.replace("\\\n", " ").split()  # noqa: E731
    expected = [w.replace("NPUS_PER_NODE", "GPUS_PER_NODE") for w in words(documented)]
    at = expected.index("msrun_log") + 1
    assert words(ours) == expected[:at] + ["--join", "True"] + expected[at:]
    assert "export LOCAL_WORLD_SIZE=$GPUS_PER_NODE\n" in output
    assert re.search(r"^msrun \$DISTRIBUTED_ARGS pretrain_gpt\.py \\$", output, re.M)
    assert output.rstrip().endswith("\\\n    --ai-framework mindspore")


@pytest.mark.parametrize("name", SEED001 + ("seed003_example",))
def test_seed_translation_is_valid_bash_and_adds_no_shellcheck_finding(name: str, tx, shellcheck_available) -> None:
    source = (tx.FIXTURES / f"{name}.sh").read_bytes()
    output = translate_script(source, Options(), f"{name}.sh").output
    assert tx.bash_n(output).returncode == 0
    assert tx.parses(output)
    assert not tx.shellcheck_findings(output) - tx.shellcheck_findings(source)


@pytest.mark.parametrize("name", SEED001 + ("seed003_example",))
def test_seed_round_trip_needs_no_undo_record(name: str, tx) -> None:
    """For the seeds the reverse rules alone give the original back: the marker is a single header line."""
    source = (tx.FIXTURES / f"{name}.sh").read_bytes()
    there = translate_script(source, Options(), f"{name}.sh").output
    assert b"# mmrun translate undo:" not in there
    assert translate_script(there, Options(target="torchrun"), f"{name}.sh").output == source


def test_seed_lint_finds_the_known_bugs(tx) -> None:
    """Seed 001's `--hidden-size 1024 \\ ` (backslash, space) and `$OUTPUT_ARGS` of an array; seed 003's unset $logfile."""
    load = translate_script((tx.FIXTURES / "seed001_pretrain_single_load.sh").read_bytes(), Options(), "x.sh").report
    codes = {(f.line, f.code) for f in load.lint}
    assert (30, "MT001") in codes  # --hidden-size 1024 \<space>
    assert (66, "MT002") in codes  # $OUTPUT_ARGS is an array
    assert not any(code == "MT003" for _, code in codes)  # MindSpeed's msrun launch line keeps --distributed-backend nccl
    example = translate_script((tx.FIXTURES / "seed003_example.sh").read_bytes(), Options(), "x.sh").report
    assert any(f.code == "MT004" and "$logfile" in f.message for f in example.lint)
