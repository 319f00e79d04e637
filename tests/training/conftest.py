"""Fixtures for the end-to-end training tests: the demo corpus tokenized once, and training runs started
through the real `mmrun` launcher (torchrun / msrun), each run once per session and shared by the tests."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from mmrun.launchers.supervisor import processes_with
from mmrun.training.checkpoint_layout import TRACKER_FILE

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "models" / "pretrain_gpt.py"
CORPUS = ROOT / "data" / "corpus"
MMRUN = [sys.executable, "-m", "mmrun.launchers.cli"]


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without launcher variables, the venv first on PATH (msrun needs it)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MS_", "PET_", "TORCHELASTIC_")) and k not in (
               "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK_ID", "RANK_SIZE", "MMRUN_AI_FRAMEWORK")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class Run:
    returncode: int
    output: str
    metrics: list[dict]

    def losses(self) -> dict[int, float]:
        return {m["iteration"]: m["lm_loss"] for m in self.metrics if m["kind"] == "train"}

    def evals(self, kind: str) -> list[float]:
        return [m["lm loss"] for m in self.metrics if m["kind"] == kind]


def run_training(workdir: Path, args: list[str], framework: str = "pytorch", nproc: int | None = 1,
                 timeout: float = 300, env_extra: dict[str, str] | None = None, entry: Path = ENTRY) -> Run:
    """Train through mmrun (nproc given) or a bare `python <entry>` (nproc None); the entry is
    models/pretrain_gpt.py unless given."""
    workdir.mkdir(parents=True, exist_ok=True)
    metrics = workdir / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    marker = uuid.uuid4().hex
    env = clean_env(MMRUN_TRAINING_TEST=marker, **(env_extra or {}))
    if nproc is None:
        cmd = [sys.executable, str(entry), *args, "--ai-framework", framework]
    else:
        cmd = [*MMRUN, "--ai-framework", framework, "--nproc-per-node", str(nproc), "--master-port", "0",
               str(entry), *args]
    try:
        proc = subprocess.run([*cmd, "--metrics-file", str(metrics)], cwd=workdir, env=env, capture_output=True,
                              text=True, timeout=timeout)
    finally:
        for pid in processes_with(f"MMRUN_TRAINING_TEST={marker}"):  # launchers must reap their workers; never leave any behind
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    return Run(proc.returncode, proc.stdout + proc.stderr, records)


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory) -> dict[str, str]:
    """The shipped demo corpus, tokenized with `mmrun preprocess-data` (GPT-2 BPE, EOD appended)."""
    out = tmp_path_factory.mktemp("demo_data")
    subprocess.run([*MMRUN, "preprocess-data", "--input", str(CORPUS / "demo_corpus.jsonl"),
                    "--output-prefix", str(out / "demo"), "--tokenizer-type", "GPT2BPETokenizer",
                    "--vocab-file", str(CORPUS / "gpt2-vocab.json"), "--merge-file", str(CORPUS / "gpt2-merges.txt"),
                    "--append-eod", "--workers", "1"], check=True, capture_output=True, env=clean_env())
    return {"data_path": str(out / "demo_text_document"), "vocab": str(CORPUS / "gpt2-vocab.json"),
            "merges": str(CORPUS / "gpt2-merges.txt")}


# The tiny GPT most end-to-end runs train: 20 iterations, dropout off (runs that want it pass their own).
TINY_GPT = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--max-position-embeddings", "32", "--micro-batch-size", "4", "--global-batch-size", "8",
            "--lr", "2e-3", "--min-lr", "1e-5", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2",
            "--weight-decay", "1e-2", "--clip-grad", "1.0", "--train-iters", "20",
            "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "1234",
            "--split", "949,50,1", "--log-interval", "5", "--eval-interval", "10", "--eval-iters", "1"]


@pytest.fixture(scope="session")
def tk():
    """The helpers above for test modules (conftest is not importable under --import-mode=importlib)."""
    class Toolkit:
        root = ROOT
        entry = ENTRY
        clean_env = staticmethod(clean_env)
        run_training = staticmethod(run_training)
        tiny_gpt = tuple(TINY_GPT)
        tiny_iters = 20

        @staticmethod
        def resume_copy(ckpt: Path, copy: Path, iteration: int) -> Path:
            """A copy of a --save directory that resumes at `iteration` (later iterations removed)."""
            shutil.copytree(ckpt, copy)
            for later in copy.glob("iter_*"):
                if int(later.name[5:]) > iteration:
                    shutil.rmtree(later)
            (copy / TRACKER_FILE).write_text(f"{iteration}\n")
            return copy

        @staticmethod
        def data_args(data: dict) -> list[str]:
            return ["--data-path", data["data_path"], "--vocab-file", data["vocab"], "--merge-file", data["merges"]]
    return Toolkit


# The GPT the megatron-core parity and checkpoint tests train: the tiny GPT with 4 layers (2 pipeline stages x
# 2 virtual stages), 8 iterations, a validation at 4 and 8, synthetic tokens.
MCORE_GPT = [*TINY_GPT, "--num-layers", "4", "--train-iters", "8", "--eval-interval", "4", "--log-interval", "1",
             "--mock-data"]
# name -> (processes, extra arguments). "mmrun-gpt" is mmrun's own GPT on its own engine; the others train
# megatron-core's GPTModel; tp2pp2 and dp2-distopt also save at iteration 4 (and 8).
MCORE_RUNS = {
    "mmrun-gpt": (1, []),
    "mcore": (1, ["--use-mcore-models"]),
    "tp2": (2, ["--use-mcore-models", "--tensor-model-parallel-size", "2"]),
    "pp2": (2, ["--use-mcore-models", "--pipeline-model-parallel-size", "2"]),
    "tp2pp2": (4, ["--use-mcore-models", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                   "--save-interval", "4"]),
    "dp2-distopt": (2, ["--use-mcore-models", "--use-distributed-optimizer", "--save-interval", "4"]),
    "pp2-vpp2": (2, ["--use-mcore-models", "--pipeline-model-parallel-size", "2",
                     "--virtual-pipeline-model-parallel-size", "2"]),
    "tp2-sp": (2, ["--use-mcore-models", "--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    "cp2": (2, ["--use-mcore-models", "--context-parallel-size", "2"]),
}


@pytest.fixture(scope="session")
def mcore_runs(tmp_path_factory):
    """mcore_runs(name) -> Run: each of MCORE_RUNS trained once per session through `mmrun` (torchrun);
    `mcore_runs.ckpt(name)` is its --save directory."""
    base = tmp_path_factory.mktemp("mcore_runs")
    done: dict[str, Run] = {}

    class Runs:
        args = tuple(MCORE_GPT)

        def __call__(self, name: str) -> Run:
            if name not in done:
                nproc, extra = MCORE_RUNS[name]
                done[name] = run_training(base / name, [*MCORE_GPT, *extra, "--save", str(self.ckpt(name))],
                                          nproc=nproc, timeout=400)
                assert done[name].returncode == 0, done[name].output[-4000:]
            return done[name]

        @staticmethod
        def ckpt(name: str) -> Path:
            return base / name / "ckpt"
    return Runs()
