"""Option values that are shell, not text: default expansions, command substitutions, launch lines inside text.

The translated scripts are run by bash with a stub `msrun`/`torchrun` on PATH that records its argv (these are
our scripts, not a user's), so that what is checked is what the launcher would receive.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmrun.launchers.translate import Options, TranslationRefused, translate_script
from mmrun.launchers.translate.cli import main

STUB = '#!/bin/bash\nprintf "%s\\n" "LWS=${LOCAL_WORLD_SIZE-unset}" "$(basename "$0")" "$@" > "$STUB_OUT"\n'
TRANSLATE = Path(__file__).resolve().parents[2] / "launchers" / "translate"


@pytest.fixture
def stub_path(tmp_path: Path) -> Path:
    directory = tmp_path / "bin"
    directory.mkdir()
    for name in ("msrun", "torchrun"):
        (directory / name).write_text(STUB)
        (directory / name).chmod(0o755)
    return directory


def launched(script: bytes, stub_path: Path, tmp_path: Path, **env: str) -> list[str]:
    """What the stub launcher received when bash ran `script`: [LWS=..., launcher, args...]."""
    path, out = tmp_path / "run.sh", tmp_path / "argv.txt"
    path.write_bytes(script)
    environment = {"PATH": f"{stub_path}:{os.environ['PATH']}", "STUB_OUT": str(out), "HOME": str(tmp_path), **env}
    result = subprocess.run(["bash", str(path)], cwd=tmp_path, env=environment, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return out.read_text().splitlines()


def msrun_form(text: str, **options) -> str:
    return translate_script(text.encode(), Options(device="cpu", **options), "t.sh").output.decode()


# ------------------------------------------------------------------------------- default expansions


def test_a_default_expansion_is_a_node_count_not_an_elastic_range(stub_path: Path, tmp_path: Path) -> None:
    source = "#!/bin/bash\ntorchrun --nproc_per_node 2 --nnodes ${NNODES:-1} train.py\n"
    output = msrun_form(source)
    assert "--worker_num $((2*${NNODES:-1}))" in output
    assert launched(output.encode(), stub_path, tmp_path)[:6] == ["LWS=2", "msrun", "--local_worker_num", "2", "--worker_num", "2"]
    assert launched(output.encode(), stub_path, tmp_path, NNODES="3")[4:6] == ["--worker_num", "6"]
    back = translate_script(output.encode(), Options(target="torchrun", device="cpu"), "t.sh")
    assert back.output.decode() == source


@pytest.mark.parametrize("value", ["1:4", "$MIN:$MAX", "${MIN:-1}:${MAX:-4}", "1:${MAX}"])
def test_real_elastic_ranges_are_still_refused(value: str) -> None:
    with pytest.raises(TranslationRefused, match="elastic node ranges"):
        msrun_form(f"torchrun --nproc_per_node 2 --nnodes {value} train.py\n")


def test_a_colon_inside_other_expansions_is_part_of_the_value() -> None:
    output = msrun_form("torchrun --nproc_per_node ${GPUS:-8} --nnodes ${NNODES:-1} --master_addr ${ADDR:-localhost} train.py\n")
    assert "--local_worker_num ${GPUS:-8} --worker_num $((${GPUS:-8}*${NNODES:-1})) --master_addr ${ADDR:-localhost}" in output
    assert "export LOCAL_WORLD_SIZE=${GPUS:-8}" in output


# ------------------------------------------------------------------------------- command substitutions


def test_a_command_substitution_runs_once(stub_path: Path, tmp_path: Path) -> None:
    """`--nproc_per_node $(count)`: msrun needs the value three times (--local_worker_num, the --worker_num product,
    LOCAL_WORLD_SIZE); the translation assigns it once, so that the command runs once, as in the original."""
    counter = tmp_path / "runs"
    source = (f"#!/bin/bash\ncount() {{ echo x >> {counter}; echo 4; }}\n"
              "torchrun --nproc_per_node $(count) --nnodes 2 train.py\n")
    output = msrun_form(source)
    assert "NPROC_PER_NODE=$(count)\nexport LOCAL_WORLD_SIZE=$NPROC_PER_NODE\n" in output
    assert 'msrun --local_worker_num "$NPROC_PER_NODE" --worker_num $((NPROC_PER_NODE*2))' in output
    argv = launched(output.encode(), stub_path, tmp_path)
    assert argv[:6] == ["LWS=4", "msrun", "--local_worker_num", "4", "--worker_num", "8"]
    assert counter.read_text() == "x\n"  # once, not three times
    back = translate_script(output.encode(), Options(target="torchrun", device="cpu"), "t.sh")
    assert back.output.decode() == source


def test_a_command_substitution_in_an_options_string_and_the_way_back(stub_path: Path, tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    source = (f"#!/bin/bash\ncount() {{ echo x >> {counter}; echo 2; }}\nNPROC_PER_NODE=taken\n"
              'DISTRIBUTED_ARGS="--nproc_per_node `count` --nnodes 1"\ntorchrun $DISTRIBUTED_ARGS train.py\n')
    output = msrun_form(source)
    assert "NPROC_PER_NODE_2=`count`\n" in output  # the script's own NPROC_PER_NODE is left alone
    assert launched(output.encode(), stub_path, tmp_path)[:6] == ["LWS=2", "msrun", "--local_worker_num", "2", "--worker_num", "2"]
    assert counter.read_text() == "x\n"
    msrun_source = f"#!/bin/bash\ncount() {{ echo x >> {counter}; echo 2; }}\nmsrun --local_worker_num $(count) --worker_num 4 train.py\n"
    torchrun_form = translate_script(msrun_source.encode(), Options(target="torchrun", device="cpu"), "ms.sh").output.decode()
    assert "LOCAL_WORKER_NUM=$(count)\n" in torchrun_form
    counter.unlink()
    assert launched(torchrun_form.encode(), stub_path, tmp_path)[1:6] == ["torchrun", "--nproc_per_node", "2", "--nnodes", "2"]
    assert counter.read_text() == "x\n"


def test_a_value_used_once_is_left_as_written() -> None:
    output = msrun_form("torchrun --nproc_per_node 2 --nnodes $(cat nodes) --master_port $(free_port) train.py\n")
    assert '--worker_num "$((2*$(cat nodes)))" --master_port $(free_port)' in output
    assert "NNODES=" not in output and "MASTER_PORT=" not in output


# ------------------------------------------------------------------------------- launch lines inside text


HIDDEN = """#!/bin/bash
GPUS=2
eval "torchrun --nproc_per_node $GPUS train.py"
CMD="python -m torch.distributed.run --nproc_per_node 2 train.py"
$CMD
LAUNCHER=/opt/bin/torchrun
ssh node2 "cd /work && torchrun --nproc_per_node=2 train.py"
cat > run_node.sh <<EOF
torchrun --nproc_per_node \\$GPUS train.py
EOF
echo "torchrun finished"
torchrun --nproc_per_node $GPUS train.py
"""


def test_launch_lines_inside_text_are_reported_and_fail_check(tmp_path: Path, capsysbinary) -> None:
    path = tmp_path / "hidden.sh"
    path.write_text(HIDDEN)
    assert main([str(path), "--device", "cpu"]) == 0  # the visible launch line is translated
    captured = capsysbinary.readouterr()
    out, err = captured.out.decode(), captured.err.decode()
    warnings = [line for line in err.splitlines() if ": warning: " in line]
    assert [w.split(": warning: ")[0] for w in warnings] == [f"{path}:{n}" for n in (3, 4, 6, 7, 9)]
    assert "a torchrun launch line inside eval is not translated" in warnings[0]
    assert "a python -m torch.distributed.run launch line in the variable CMD" in warnings[1]
    assert "named by the variable LAUNCHER" in warnings[2]
    assert "inside a quoted string" in warnings[3] and "inside a heredoc" in warnings[4]
    for line in HIDDEN.splitlines()[2:11]:  # left exactly as written
        assert line + "\n" in out
    assert "msrun --local_worker_num $GPUS" in out
    assert main([str(path), "--check"]) == 1
    done = tmp_path / "done.sh"
    assert main([str(path), "--device", "cpu", "-o", str(done)]) == 0
    assert main([str(done), "--check", "--device", "cpu"]) == 1  # the hidden lines still need a hand
    capsysbinary.readouterr()
    assert main([str(path), "--report", "json"]) == 0
    assert '"hidden_launches": 5' in capsysbinary.readouterr().err.decode()


def test_text_that_only_mentions_a_launcher_is_no_launch(tmp_path: Path) -> None:
    path = tmp_path / "quiet.sh"
    path.write_text('#!/bin/bash\necho "torchrun finished" "msrun -h"\n# torchrun --nproc_per_node 8 train.py\ntorchrun train.py\n')
    assert main([str(path), "--check"]) == 1
    result = translate_script(path.read_bytes(), Options(), "quiet.sh")
    assert result.report.hidden_launches == 0 and not result.report.warnings


def test_msrun_lines_inside_text_are_reported_on_the_way_back() -> None:
    result = translate_script(b'bash -c "msrun --worker_num 2 train.py"\nmsrun --local_worker_num 2 --worker_num 2 train.py\n', Options(target="torchrun"), "m.sh")
    assert result.report.hidden_launches == 1 and "a msrun launch line inside a quoted string" in result.report.warnings[0].message


# ------------------------------------------------------------------------------- module structure


def _imports(module: str) -> set[str]:
    tree = ast.parse((TRANSLATE / f"{module}.py").read_text())
    return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module} | {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}


def test_no_import_cycle_between_marker_and_rewrite() -> None:
    """rewrite (the rules) knows nothing of the marker; the marker builds on the rules; entry sits above both."""
    assert "mmrun.launchers.translate.marker" not in _imports("rewrite")
    assert "mmrun.launchers.translate.rewrite" in _imports("marker")
    assert {"mmrun.launchers.translate.marker", "mmrun.launchers.translate.rewrite"} <= _imports("entry")
    for first in ("marker", "rewrite", "entry"):  # each imports on its own, in a fresh interpreter
        result = subprocess.run([sys.executable, "-c", f"import mmrun.launchers.translate.{first}"], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
