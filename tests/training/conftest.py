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

from mmrun.data.multimodal.demo import make_demo
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
    stdout: str = ""  # the stdout part of output (what an entry prints as its result: generated text)

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
    return Run(proc.returncode, proc.stdout + proc.stderr, records, proc.stdout)


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
    # --recompute-*: megatron-core's own recomputation (its TransformerConfig), the same losses
    "mcore-recompute": (1, ["--use-mcore-models", "--recompute-granularity", "full", "--recompute-method", "uniform",
                            "--recompute-num-layers", "1"]),
    # MindSpeed-MM's scripts pass both overlaps: megatron-core's DDP config takes them (same losses)
    "dp2-distopt-overlap": (2, ["--use-mcore-models", "--use-distributed-optimizer", "--overlap-grad-reduce",
                                "--overlap-param-gather"]),
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


# ----------------------------------------------------------------------- the vision-language model

VLM_ENTRY = ROOT / "models" / "pretrain_vlm.py"
MODEL_JSON = ROOT / "scripts" / "qwen2vl" / "model_tiny.json"
MODEL_JSON_PP2 = ROOT / "scripts" / "qwen2vl" / "model_tiny_pp2.json"  # the same model, pipeline_num_layers per stage
# The training arguments of the runs below (MindSpeed-MM's flags; the model comes from model.json).
VLM_ARGS = ["--micro-batch-size", "2", "--global-batch-size", "4", "--seq-length", "128", "--lr", "2e-3",
            "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--weight-decay", "0", "--clip-grad", "1.0",
            "--seed", "42", "--log-interval", "1", "--eval-iters", "0", "--train-iters", "10",
            "--mm-model", str(MODEL_JSON)]


@pytest.fixture(scope="session")
def vlm(tmp_path_factory, tk):
    """vlm(name) -> Run of one training of the demo (VLM_RUNS below, or a run a test module registers with
    `vlm.add(name, framework, processes, extra arguments)`), each trained once per session and shared: the
    parallel layouts' tests compare against the one-process runs here. `vlm.args` are the common arguments."""
    base = tmp_path_factory.mktemp("vlm")
    demo = make_demo(str(base / "demo"), num_samples=24, seed=7)
    done: dict[str, object] = {}
    fsdp2_file = base / "fsdp2.yaml"
    fsdp2_file.write_text("sharding_size: auto\nsub_modules_to_wrap: ['visual.blocks.{*}', 'model.layers.{*}']\n")
    runs = {
        # name: (framework, processes, extra arguments)
        "pytorch": ("pytorch", 1, ["--save-interval", "5"]),
        # its compiled graphs saved for test_pretrain_vlm's rerun, which loads them (--ms-compile-cache)
        "mindspore": ("mindspore", 1, ["--save-interval", "5", "--ms-compile-cache", str(base / "ms_compile_cache")]),
        "pytorch-dp2": ("pytorch", 2, ["--exit-interval", "4", "--num-workers", "1"]),  # same LR schedule; decoded in workers
        # torch's FSDP2 over mmrun's own Qwen2-VL, full shard of the ViT blocks and the decoder layers; one sample
        # per micro-batch, so rank 1's second micro-batch of iteration 2 is the demo's text-only sample 7
        "pytorch-fsdp2": ("pytorch", 2, ["--train-iters", "3", "--micro-batch-size", "1", "--calculate-per-token-loss",
                                         "--use-torch-fsdp2", "--fsdp2-config-path", str(fsdp2_file)]),
        "per-token": ("pytorch", 1, ["--train-iters", "3", "--calculate-per-token-loss"]),
        "per-token-dp2": ("pytorch", 2, ["--train-iters", "3", "--calculate-per-token-loss"]),
        "bf16": ("pytorch", 1, ["--bf16", "--exit-interval", "3"]),
        # one sample per rank and step: at iteration 4 rank 1 holds only the demo's text-only sample 7, so its
        # whole batch has no image (the ViT still runs, on a blank image that counts zero times)
        "text-rank-dp1": ("pytorch", 1, ["--train-iters", "4", "--micro-batch-size", "1", "--global-batch-size", "2"]),
        "text-rank-dp2": ("pytorch", 2, ["--train-iters", "4", "--micro-batch-size", "1", "--global-batch-size", "2"]),
        # megatron-core's VLM at TP=2 x PP=2 with sequence parallelism, saved at 8 (and 10): the PyTorch parallel
        # tests check it against "pytorch", and MindSpore's resume from it and train the same layout against it
        "mcore-tp2pp2-sp": ("pytorch", 4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                           "--mm-model", str(MODEL_JSON_PP2), "--sequence-parallel",
                                           "--save-interval", "8"]),
    }

    class Runs:
        data_json = demo["data_json"]
        model_dir = demo["model_dir"]
        args = tuple(VLM_ARGS)
        entry = VLM_ENTRY

        @staticmethod
        def add(name: str, framework: str, processes: int, extra: list[str]) -> None:
            if runs.setdefault(name, (framework, processes, extra)) != (framework, processes, extra):
                raise ValueError(f"vlm run {name!r} is registered twice with different arguments")

        def __call__(self, name: str, extra: list[str] | None = None, framework: str | None = None):
            if name not in done:
                fw, nproc, args = runs.get(name, (framework or "pytorch", 1, []))
                out = base / name
                done[name] = tk.run_training(out, [*VLM_ARGS, "--mm-data", self.data_json, *args, *(extra or []),
                                                   "--save", str(out / "ckpt")],
                                             framework=fw, nproc=nproc, timeout=600, entry=VLM_ENTRY)
                assert done[name].returncode == 0, done[name].output[-4000:]
            return done[name]

        @staticmethod
        def ckpt(name: str) -> Path:
            return base / name / "ckpt"

        @staticmethod
        def extra(name: str) -> list[str]:
            """The extra arguments a registered run trains with."""
            return list(runs[name][2])

        base_dir = base
    return Runs()
