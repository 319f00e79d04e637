"""The README's quick start stays true: CI runs its test command, its links and demo scripts exist, and the
multimodal demo runs in the environment the quick start installs."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _quick_start_commands() -> list[str]:
    return [line for line in re.findall(r"```bash\n(.*?)\n```", README, flags=re.S) if "pip install -e" in line]


def test_ci_runs_exactly_the_readme_test_command():
    demo, tests = _quick_start_commands()
    test_command = tests.split(". .venv/bin/activate && ", 1)[1]
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci_lines


def test_demo_command_names_an_existing_script():
    demo, _ = _quick_start_commands()
    script = re.search(r"bash (\S+)", demo).group(1)
    assert (ROOT / script).is_file()


def test_readme_links_exist():
    for link in re.findall(r"\]\(((?:docs)/[^)]+)\)", README):
        assert (ROOT / link).is_file(), link


def _demo_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This interpreter's environment (the venv first on PATH), launcher variables out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "PET_", "TORCHELASTIC_")) and k not in (
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MMRUN_AI_FRAMEWORK")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


@pytest.mark.slow
def test_the_multimodal_demo_runs_where_the_readme_installs_it(tmp_path):
    """The README's `pip install -e ".[torch]"` brings no megatron-core, yet its multimodal line passes
    --use-mcore-models (MindSpeed-MM's launch line): the demo must train on the engine that is there and say so.
    megatron-core is hidden from every process of the job (a sitecustomize on PYTHONPATH: `import megatron`
    fails and importlib finds no spec), which is what that venv looks like to mmrun."""
    demo, _ = _quick_start_commands()
    assert '".[torch]"' in demo and "megatron" not in demo  # what the extra installs: torch, not megatron-core
    script = re.search(r"`(bash scripts/finetune_qwen2vl\.sh)`", README).group(1).split()
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text('import sys\nsys.modules["megatron"] = None  # not installed\n')
    env = _demo_env(tmp_path, PYTHONPATH=str(hide), NPUS_PER_NODE="1", TRAIN_ITERS="1", LOG_INTERVAL="1",
                    MASTER_PORT="0", OUT_DIR=str(tmp_path / "out"))
    proc = subprocess.run(script, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert out.count("megatron-core is not installed: this run trains the model on mmrun's data-parallel engine") == 1
    assert "engine mmrun" in out and "iteration        1/       1" in out
    assert (tmp_path / "out" / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
